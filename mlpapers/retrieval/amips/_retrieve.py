"""The solve-and-retrieve path of :class:`AmortizedMIPS`: the trained network's value
and key in the data's units, the ranking of the database by the predicted key, and the
re-ranking of candidates by their true inner product.

Kept apart from the estimator shell (:mod:`._estimator`), which validates the queries
and the parameters and calls these functions with validated ``(n, d)`` float32 tensors.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mlpapers._utils._blocks import collect_row_blocks
from mlpapers.retrieval.amips._kernels import _KeyStats, _rank_by_key, gather_dot

__all__ = ["float32_similarities", "predict_top1", "rank_by_predicted_key", "rerank",
           "retrieve", "score_and_key", "uncentre"]


def score_and_key(est, Q: torch.Tensor, key_units: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Value (n,) and key (n, d) of the fitted ``est`` in the data's units, in the
    coordinates of the training: centred (``sigma_{K-m}`` and ``k - m``) when the
    estimator was fitted with ``center_keys`` (see :func:`uncentre`).

    The network works in scaled units: it takes ``x / query_scale_`` and predicts keys
    ``k / key_scale_``; queries are fed in chunks of ``est.batch_size``. With
    ``key_units`` the keys are returned in those units (``k / key_scale_``), which do not
    overflow where ``k`` itself leaves float32.
    """
    # (getattr: files and pickles from before the training units hold none: unit 1)
    ks, qs = getattr(est, "key_scale_", 1.0), getattr(est, "query_scale_", 1.0)
    unit = float(ks) * float(qs)
    # one multiplication (one rounding) while the product of the units fits float32;
    # beyond (2**64 * 2**64 at keys and queries of 1e19, where the values still fit)
    # one unit at a time, the smaller first. Both units are powers of two >= 2**-149.
    units = (unit,) if unit <= 2.0**127 else tuple(sorted((float(ks), float(qs))))

    def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        v, k = est.model_.score_and_key(Q[rows] / qs)
        for u in units:
            v = v * u
        return v, (k if key_units else k * ks)

    # written into one preallocated output: lists of the blocks and their concatenation
    # held the (n, d) keys twice
    with torch.no_grad():
        return collect_row_blocks(block, Q.shape[0], est.batch_size)


def check_predicted_keys(key: torch.Tensor | None) -> torch.Tensor:
    """``key`` when every entry is finite, else a ``ValueError``: an infinite or NaN
    predicted key ranked every database key alike (``predict`` returned index 0)."""
    assert key is not None
    # (from the extremes, NaN included: no mask of the size of the keys)
    if key.numel() and not all(map(math.isfinite, torch.aminmax(key))):
        raise ValueError("the predicted keys of some queries are not finite (the network's "
                         "output overflows float32 at this scale of queries or keys); "
                         "rescale the queries or the keys, or use ExactMIPS.")
    return key


def uncentre(est, Q: torch.Tensor, value: torch.Tensor | None,
             key: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Value and key of :func:`score_and_key` in the original coordinates: with
    ``key_mean_`` m, ``sigma_K(x) = sigma_{K-m}(x) + <x, m>`` and ``k = (k - m) + m``
    (unchanged without centring)."""
    m = est._key_mean()
    if m is None:
        return value, key
    if value is not None:
        value = value + Q @ m
    if key is not None:
        key = key + m
    return value, key


def rank_by_predicted_key(est, Q: torch.Tensor, n_neighbors: int, return_distance: bool,
                          for_reranking: bool = False):
    """The ``n_neighbors`` keys ranked by similarity to the predicted key (``retrieval``).

    ``n_neighbors`` is in ``[1, n_keys]`` (checked by the callers). Returns numpy
    ``(sims, idx)`` of shape (n, n_neighbors), ``sims`` the true inner products
    ``<x, k_j>`` in the predicted order, or ``idx`` alone. With ``for_reranking``,
    ``sims`` are float64 (see below).
    """
    k = int(n_neighbors)
    keys = est._keys()
    # the predicted keys in the network's units, k / ks: multiplied by ks (then divided
    # again below) they overflowed float32 for keys of 1e20 (ks = 2**66), and every
    # key ranked alike (predict returned index 0)
    _, key_hat = score_and_key(est, Q, key_units=True)
    if k < keys.shape[0]:  # (ranking every key, the order of the scores is not used)
        check_predicted_keys(key_hat)
    # the ranking is in the coordinates of the training: with center_keys the centred
    # keys (the same ranking for "ip", <k_hat, k_j - m> = <k_hat, k_j> - <k_hat, m>,
    # but without the float32 cancellation of a large offset; "l2" compares the
    # predicted key with the centred keys it learned). The returned similarities are
    # the original <x, k_j>, from the original keys (see below)
    ranked, stats = est._search_keys()
    # rank in the training units: <k_hat, k_j> ~ ||k||^2 overflows float32 for keys
    # of norm ~1e19 and underflows for ~1e-23 (the power-of-two scale is exact). For
    # inner products scaling the predicted keys by 1/s^2 is the same ranking without
    # a copy of the database per call; "l2" needs both sides in training units
    # The cached scale statistics of the keys are passed down: recomputing them (a
    # pass over the database) per call tripled the cost of a single-query predict
    ks = getattr(est, "key_scale_", 1.0)
    if ks == 1.0:
        k_hat, ranked_keys = key_hat, ranked
    elif est.retrieval == "ip":
        # (far from 1, key_hat / ks**2 ~ 1 / ks leaves float32: 2**128 for subnormal keys;
        # divided once, the products ~ ||k|| are rescaled by the search itself)
        # (in place: key_hat is not used again, and a scaled copy held the (n, d)
        # predicted keys twice)
        k_hat = key_hat.div_(ks) if 2.0**-60 <= ks <= 2.0**60 else key_hat
        ranked_keys = ranked
    else:
        k_hat, ranked_keys = key_hat, ranked / ks
        stats = _KeyStats(ranked_keys, amax=stats.amax / ks)  # exact: ks is a power of 2
    idx = _rank_by_key(k_hat, ranked_keys, k, est.retrieval, est.search_batch_size, stats)
    if not return_distance:
        return est._to_numpy(idx)
    # A re-ranking compares the candidates by float64 products (exact for the float32
    # keys and queries up to the sum's rounding): float32 ones rounded away differences
    # between keys of a large norm, so with n_candidates = n_keys (exact search, as
    # documented) keys + 1e6 returned a key short of the maximum for 10% of the queries.
    # With center_keys too, the products are those of the ORIGINAL float32 keys: the
    # centred copy is rounded to float32 (k_j - m loses the low bits of keys far from
    # the mean: 0.001 and 0.001001 beside a key of 200 both became -49.9995), so
    # <x, k_j - m> + <x, m> tied keys that differ, and a re-ranking of every key was
    # not exact search. The float64 products of the original keys keep every
    # difference the float32 keys hold, whatever the offset (no cancellation either)
    sims = gather_dot(keys, idx, Q, exact=for_reranking or est._key_mean() is not None)
    if not for_reranking:
        sims = sims.to(Q.dtype)
    return est._to_numpy(sims), est._to_numpy(idx)


def rerank(sims: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` candidates of each row by true inner product, descending (a stable
    sort: ties keep the predicted order)."""
    if k == 1:  # the first maximum, as the stable sort's first column, without a sort
        order = sims.argmax(axis=1)[:, None]
    else:
        order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(idx, order, axis=1)


def retrieve(est, Q: torch.Tensor, k: int, return_distance: bool):
    """The ``k`` keys of :meth:`AmortizedMIPS.kneighbors` (``k`` in ``[1, n_keys]``).

    With ``n_candidates == 1`` the keys ranked by the predicted key
    (:func:`rank_by_predicted_key`); otherwise the best ``k`` of the first
    ``max(n_candidates, k)`` of them by true inner product (:func:`rerank`), so that
    ``k = 1`` is :meth:`AmortizedMIPS.predict`. Returns numpy ``(sims, idx)`` of shape
    (n, k), ``sims`` float32 without re-ranking and float64 with it, or ``idx`` alone.
    """
    if int(est.n_candidates) == 1:
        return rank_by_predicted_key(est, Q, k, return_distance)
    n_cand = min(max(int(est.n_candidates), k), est.database_.shape[0])
    cand_sims, cand_idx = rank_by_predicted_key(est, Q, n_cand, return_distance=True,
                                                for_reranking=True)
    sims, idx = rerank(cand_sims, cand_idx, k)
    return (sims, idx) if return_distance else idx


def float32_similarities(sims: np.ndarray) -> np.ndarray:
    """The similarities returned by ``kneighbors``, as float32; a ``ValueError`` where
    one does not fit float32 (as :meth:`ExactMIPS.kneighbors`).

    The queries and keys are finite, so an infinite similarity is an overflow: the
    float64 products of a re-ranking became ``inf`` in the cast with only numpy's
    "overflow in cast" warning (and silently in the float32 products without
    re-ranking), while exact search raised for the same data.
    """
    with np.errstate(over="ignore"):
        out = sims.astype(np.float32, copy=False)
    if not np.isfinite(out).all():
        raise ValueError("inner products of X with the keys overflow float32 (beyond "
                         "3.4e38) and cannot be returned; rescale the queries or the "
                         "keys (MIPS answers do not depend on it), or call kneighbors "
                         "with return_distance=False (predict is unaffected).")
    return out


def predict_top1(est, Q: torch.Tensor) -> np.ndarray:
    """Top-1 index (n,): the first key of :func:`retrieve` (with ``n_candidates > 1``
    the best of the first ``n_candidates`` keys by true inner product)."""
    return retrieve(est, Q, 1, return_distance=False)[:, 0]
