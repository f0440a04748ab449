"""Amortized maximum inner product search (SupportNet / KeyNet).

Olausson, Monteiro, Klein, Cuturi, "Amortizing Maximum Inner Product Search with
Learned Support Functions", ICML 2026, arXiv:2603.08001.
"""

from mlpapers.datasets._mips import GaussianMixtureQuerySampler
from mlpapers.retrieval.amips._estimator import AmortizedMIPS
from mlpapers.retrieval.amips._exact import ExactMIPS, build_faiss_ivf
from mlpapers.retrieval.amips._kernels import (
    amips_loss,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    rank_by_key,
    recall_at_k,
    support_function,
)
from mlpapers.retrieval.amips._networks import (
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
    soft_leaky_relu,
    solve_width,
)

__all__ = [
    "AmortizedMIPS",
    "ExactMIPS",
    "GaussianMixtureQuerySampler",
    "Homogenize",
    "KeyNet",
    "SupportFunction",
    "SupportNet",
    "amips_loss",
    "build_faiss_ivf",
    "match_rate",
    "mean_reciprocal_rank",
    "mips_topk",
    "rank_by_key",
    "recall_at_k",
    "soft_leaky_relu",
    "solve_width",
    "support_function",
]
