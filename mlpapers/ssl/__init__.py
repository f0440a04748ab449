"""Self-supervised representation learning."""

from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    DefaultAugment,
    GlobalSSLEncoder,
    exact_linear_feedback,
    update_similarity,
)

__all__ = [
    "CLAPPEncoder",
    "DefaultAugment",
    "GlobalSSLEncoder",
    "exact_linear_feedback",
    "update_similarity",
]
