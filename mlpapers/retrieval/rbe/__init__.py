"""Relevance-based embeddings (RBE) for candidate retrieval under a heavy-ranker budget.

Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings: Lightweight
Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).
"""

from mlpapers.retrieval.rbe._baselines import AdaCURRetriever, AnnCURRetriever
from mlpapers.retrieval.rbe._estimator import RelevanceBasedRetriever
from mlpapers.retrieval.rbe._heads import NeuralRBEHead
from mlpapers.retrieval.rbe._kernels import (
    cur_query_weights,
    fit_linear_embeddings,
    hit_rate,
    softmax_signed_loss,
)
from mlpapers.retrieval.rbe._selection import greedy_selection, select_support

__all__ = [
    "AdaCURRetriever",
    "AnnCURRetriever",
    "NeuralRBEHead",
    "RelevanceBasedRetriever",
    "cur_query_weights",
    "fit_linear_embeddings",
    "greedy_selection",
    "hit_rate",
    "select_support",
    "softmax_signed_loss",
]
