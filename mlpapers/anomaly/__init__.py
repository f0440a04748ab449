"""Anomaly detection algorithms.

* :mod:`mlpapers.anomaly.rad` -- RAD, retrieval-based training-free image anomaly
  detection, and the PatchCore baseline.
"""

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
    efficientnet_lite0_extractor,
)

__all__ = [
    "DinoViTExtractor",
    "PatchCoreDetector",
    "RADDetector",
    "RandomConvExtractor",
    "TorchFeatureExtractor",
    "efficientnet_lite0_extractor",
]
