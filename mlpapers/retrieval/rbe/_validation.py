"""Hyper-parameter validation of the heavy-ranker retrievers (raised in ``fit``).

Every check raises a ``ValueError`` or ``TypeError`` naming the parameter, before any
heavy-ranker call is made.
"""

from __future__ import annotations

import numbers
from typing import Any, Literal, TypeAlias, get_args

from mlpapers._utils import (
    check_bool,
    check_in_options,
    check_learning_rate,
    check_positive,
)
from mlpapers.retrieval.rbe._kernels import check_rcond
from mlpapers.retrieval.rbe._selection import SUPPORT_METHODS, check_support_indices

__all__ = ["check_adacur_params", "check_head_params", "check_retriever_params",
           "check_solve_params"]

#: ``RelevanceBasedRetriever(head=...)`` and ``loss=...``; ``HEADS`` and ``LOSSES`` list them.
Head: TypeAlias = Literal["linear", "mlp"]
Loss: TypeAlias = Literal["softmax_signed", "mse"]
HEADS: tuple[str, ...] = get_args(Head)
LOSSES: tuple[str, ...] = get_args(Loss)


def _check_fraction(value: Any, name: str, *, low_open: bool) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        ok = (0.0 < value < 1.0) if low_open else (0.0 <= value < 1.0)
    if not ok:
        bounds = "(0, 1)" if low_open else "[0, 1)"
        raise ValueError(f"{name} must be in {bounds}, got {value!r}.")


def check_solve_params(est) -> None:
    """``ridge``, ``rcond`` and ``batch_size``: read by ``fit`` and again at inference
    (ADACUR solves per query), where a value set after fit is checked too."""
    check_positive(est.ridge, "ridge", strict=False)
    check_rcond(est.rcond)
    check_positive(est.batch_size, "batch_size", integer=True)


def check_head_params(est) -> None:
    """Validate the neural-head parameters of a :class:`RelevanceBasedRetriever`.

    Checked whatever ``head`` is, as scikit-learn checks every parameter: a value that
    is wrong now fails at once, not when the same settings later train the MLP head.
    """
    check_positive(est.mlp_hidden, "mlp_hidden", strict=False, integer=True)
    check_in_options(est.loss, "loss", LOSSES)
    check_positive(est.item_batch, "item_batch", integer=True)
    check_positive(est.max_iter, "max_iter", strict=False, integer=True)
    check_learning_rate(est.lr, adam=True)  # the neural head trains with Adam
    check_positive(est.eval_every, "eval_every", integer=True)
    _check_fraction(est.top_quantile, "top_quantile", low_open=True)
    _check_fraction(est.validation_fraction, "validation_fraction", low_open=False)


def check_retriever_params(est, n_items: int) -> None:
    """Validate a :class:`RelevanceBasedRetriever` (or AnnCUR) for ``n_items`` items."""
    est._check_relevance_fn()
    check_positive(est.n_support, "n_support", integer=True)
    if isinstance(est.support, str):
        check_in_options(est.support, "support", SUPPORT_METHODS)
        if est.n_support > n_items:
            raise ValueError(f"n_support={est.n_support} must be <= the number of "
                             f"items ({n_items}).")
    else:  # explicit indices: refused before the offline heavy calls, not after them
        check_support_indices(est.support, n_items)
    check_in_options(est.head, "head", HEADS)
    check_positive(est.n_rerank, "n_rerank", strict=False, integer=True)
    if est.n_rerank > n_items:
        raise ValueError(f"n_rerank={est.n_rerank} must be <= the number of items "
                         f"({n_items}).")
    check_solve_params(est)
    check_bool(est.standardize, "standardize")


def check_adacur_params(est, n_items: int) -> None:
    """Validate an :class:`AdaCURRetriever` for ``n_items`` items."""
    est._check_relevance_fn()
    check_positive(est.n_calls, "n_calls", integer=True)
    if est.n_calls > n_items:
        raise ValueError(f"n_calls={est.n_calls} must be <= the number of items "
                         f"({n_items}).")
    check_positive(est.n_rounds, "n_rounds", integer=True)
    if est.n_rounds > est.n_calls:
        raise ValueError(f"n_rounds={est.n_rounds} must be <= n_calls={est.n_calls} "
                         "(at least one heavy call per round).")
    check_in_options(est.init, "init", SUPPORT_METHODS)
    check_solve_params(est)
