"""RAD: retrieval-based, training-free image anomaly detection, with a PatchCore baseline.

Zhang, Li, Henderson, Aragon-Camarasa and Long, "Is Task-Specific Training
Necessary for Anomaly Detection?", ICML 2026, arXiv:2601.22763.
"""

from mlpapers.anomaly.rad._estimator import PatchCoreDetector, RADDetector
from mlpapers.anomaly.rad._extractors import (
    DinoViTExtractor,
    RandomConvExtractor,
    TorchFeatureExtractor,
    efficientnet_lite0_extractor,
)
from mlpapers.anomaly.rad._images import check_images

__all__ = [
    "DinoViTExtractor",
    "PatchCoreDetector",
    "RADDetector",
    "RandomConvExtractor",
    "TorchFeatureExtractor",
    "check_images",
    "efficientnet_lite0_extractor",
]
