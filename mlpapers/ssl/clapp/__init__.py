"""CLAPP / CLAPP++: layer-local self-supervised learning vs global backprop SSL.

From Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning Match
Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.
"""

from mlpapers.ssl.clapp._augment import DefaultAugment
from mlpapers.ssl.clapp._estimator import VARIANTS, CLAPPEncoder
from mlpapers.ssl.clapp._global import GlobalSSLEncoder
from mlpapers.ssl.clapp._kernels import (
    clapp_layer_loss,
    contrastive_loss,
    exact_linear_feedback,
    infonce_loss,
    three_factor_grad,
)
from mlpapers.ssl.clapp._memory import training_step_activation_bytes
from mlpapers.ssl.clapp._patches import PatchPredictor, extract_patches, patch_prediction_loss
from mlpapers.ssl.clapp._similarity import update_similarity

__all__ = [
    "VARIANTS",
    "CLAPPEncoder",
    "DefaultAugment",
    "GlobalSSLEncoder",
    "PatchPredictor",
    "clapp_layer_loss",
    "contrastive_loss",
    "exact_linear_feedback",
    "extract_patches",
    "infonce_loss",
    "patch_prediction_loss",
    "three_factor_grad",
    "training_step_activation_bytes",
    "update_similarity",
]
