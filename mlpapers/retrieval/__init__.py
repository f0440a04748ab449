"""Retrieval algorithms."""

from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    ExactMIPS,
    GaussianMixtureQuerySampler,
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
    amips_loss,
    build_faiss_ivf,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    recall_at_k,
    soft_leaky_relu,
    solve_width,
    support_function,
)
from mlpapers.retrieval.rbe import (
    AnnCURRetriever,
    NeuralRBEHead,
    RelevanceBasedRetriever,
    fit_linear_embeddings,
    greedy_selection,
    hit_rate,
    select_support,
    softmax_signed_loss,
)

__all__ = [
    # amips
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
    "recall_at_k",
    "soft_leaky_relu",
    "solve_width",
    "support_function",
    # rbe
    "AnnCURRetriever",
    "NeuralRBEHead",
    "RelevanceBasedRetriever",
    "fit_linear_embeddings",
    "greedy_selection",
    "hit_rate",
    "select_support",
    "softmax_signed_loss",
]
