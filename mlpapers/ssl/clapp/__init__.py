"""CLAPP / CLAPP++: layer-local self-supervised learning vs global backprop SSL.

From Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning Match
Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.
"""

from mlpapers.ssl.clapp._augment import DefaultAugment
from mlpapers.ssl.clapp._estimator import VARIANTS, CLAPPEncoder, GlobalSSLEncoder
from mlpapers.ssl.clapp._kernels import (
    clapp_layer_loss,
    contrastive_loss,
    exact_linear_feedback,
    infonce_loss,
    three_factor_grad,
)
from mlpapers.ssl.clapp._similarity import update_similarity

__all__ = [
    "VARIANTS",
    "CLAPPEncoder",
    "DefaultAugment",
    "GlobalSSLEncoder",
    "clapp_layer_loss",
    "contrastive_loss",
    "exact_linear_feedback",
    "infonce_loss",
    "three_factor_grad",
    "update_similarity",
]
