"""Pure torch math of relevance-based embeddings: the linear head, MIPS, metrics, loss."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from mlpapers._utils import (
    ArrayLike,
    check_bool,
    check_finite,
    check_positive,
    check_tensor,
    common_float_dtype,
    on_inputs_device,
    power_of_two_unit,
    requires_tensors,
    to_numpy,
    torch_compatible_array,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for, collect_row_blocks

__all__ = [
    "abs_max",
    "check_rcond",
    "cur_query_weights",
    "fit_linear_embeddings",
    "hit_rate",
    "softmax_signed_loss",
    "stable_topk",
    "topk_scores",
]


def check_rcond(rcond: Any) -> None:
    """``rcond`` is a relative singular-value cutoff: ``None`` or a real number in [0, 1).

    A cutoff of 1 or more drops every singular value (the largest too), so the
    pseudo-inverse is zero and every item scores alike: refused rather than returning
    a ranking without signal.
    """
    if rcond is None:
        return
    if not isinstance(rcond, numbers.Real) or isinstance(rcond, bool):
        raise TypeError(f"rcond must be a real number in [0, 1) or None, got {rcond!r}.")
    if not 0.0 <= float(rcond) < 1.0:
        raise ValueError(f"rcond must be in [0, 1) (a relative cutoff; 1 or more drops "
                         f"every singular value) or None, got {rcond!r}.")


def abs_max(t: torch.Tensor) -> float:
    """``max |t_ij|`` as a Python float (0.0 when empty), in one pass (``aminmax``: no
    ``|t|`` copy of a relevance matrix); the scale statistic of the power-of-two units."""
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t.detach())
    return max(float(hi), -float(lo))


def check_matrix(R: Any, name: str, device: Any = None) -> torch.Tensor:
    """A validated float64 matrix (:func:`~mlpapers._utils.check_tensor`, whose NaN/inf
    check runs in row blocks: no temporary of the size of a large relevance matrix)."""
    return check_tensor(R, name=name, ndim=2, dtype=torch.float64, device=device)


@on_inputs_device
@requires_tensors
def fit_linear_embeddings(
    R_sup: torch.Tensor,
    R: torch.Tensor,
    *,
    ridge: float = 0.0,
    rcond: float | None = None,
    standardize: bool = True,
) -> dict[str, torch.Tensor]:
    r"""Closed-form item embeddings of linear RBE (CUR with anchor queries = training queries).

    Without standardisation, :math:`E^\top = R_S^{+} R` (the pseudo-inverse with
    relative cutoff ``rcond``) or, with ``ridge > 0``,
    :math:`E^\top = (R_S^\top R_S + \lambda I)^{-1} R_S^\top R`. With
    standardisation, the support columns are centred and scaled,
    :math:`U = (R_S - \mu) / \sigma`, each item column is centred by its mean
    :math:`c_i`, and the same solve gives :math:`E` for the centred targets, so the
    score is :math:`\hat s(q, i) = \langle u_q, e_i\rangle + c_i` (an affine
    least-squares fit per item).

    Parameters
    ----------
    R_sup : Tensor of shape (n_queries, k)
        Training relevance to the support items, ``R[:, S]``.
    R : Tensor of shape (n_queries, n_items)
        Training relevance to all items.
    ridge : float, default=0.0
        Ridge penalty :math:`\lambda` on the embedding coefficients.
    rcond : float in [0, 1) or None
        Relative singular-value cutoff of the pseudo-inverse (``ridge == 0``);
        ``None`` uses ``max(n_queries, k) * eps`` and, with ``standardize``, also drops
        the directions that the rounding error of the centring can create: the
        pseudo-inverse is taken of :math:`U` with each column divided by
        :math:`\max_q |R_{qj}| / \sigma_j` (its rounding error per entry, over
        :math:`2\epsilon`), with the absolute cutoff :math:`2\,\epsilon \sqrt{n_q k'}`
        over the :math:`k'` support columns that are not constant (affinely dependent
        columns, e.g. :math:`r_1 + r_2` constant, differ from it only by that rounding,
        which the pseudo-inverse would otherwise amplify; a column varying only at the
        rounding level of its offset is dropped, the others kept; a constant column is
        an exact zero).
    standardize : bool, default=True
        Centre and scale the support columns and centre the item columns.

    Returns
    -------
    dict
        ``embeddings`` (n_items, k), ``offsets`` (n_items,), ``mean`` (k,),
        ``scale`` (k,): the query embedding of support relevance ``r`` is
        ``(r - mean) / scale`` and the approximate relevance of item ``i`` is
        ``<(r - mean) / scale, embeddings[i]> + offsets[i]`` (``mean`` and
        ``offsets`` zero, ``scale`` one, without standardisation). Float64 when the
        inputs are. ``rank`` (0-d integer tensor): the number of directions of the
        (standardised) support relevance the solve keeps, ``k`` with ``ridge > 0``.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).

    Examples
    --------
    A relevance matrix of rank 3 is reproduced exactly from 3 of its columns:

    >>> import torch
    >>> from mlpapers.retrieval.rbe import fit_linear_embeddings
    >>> g = torch.Generator().manual_seed(0)
    >>> R = (torch.randn(20, 3, generator=g, dtype=torch.float64)
    ...      @ torch.randn(3, 10, generator=g, dtype=torch.float64))
    >>> lin = fit_linear_embeddings(R[:, :3], R)
    >>> lin["embeddings"].shape
    torch.Size([10, 3])
    >>> U = (R[:, :3] - lin["mean"]) / lin["scale"]
    >>> torch.allclose(U @ lin["embeddings"].T + lin["offsets"], R)
    True
    """
    check_bool(standardize, "standardize")
    # (validated here: a public function, and a mismatch failed deep in a matmul, a
    # negative ridge silently fell back to the pseudo-inverse)
    if R_sup.ndim != 2 or R.ndim != 2 or R_sup.shape[0] != R.shape[0]:
        raise ValueError("R_sup and R must be 2-D tensors with one row per training query, "
                         f"(n_queries, k) and (n_queries, n_items), got shapes "
                         f"{tuple(R_sup.shape)} and {tuple(R.shape)}.")
    if R.shape[0] == 0:  # (failed with a torch IndexError in amax)
        raise ValueError("R_sup and R have no row: the embeddings need at least one "
                         "training query.")
    # (a NaN in R_sup failed in torch's SVD, one in R gave NaN embeddings silently)
    check_finite(R_sup, "R_sup")
    check_finite(R, "R")
    # one dtype of at least float32 (mixed or integer inputs failed in the matmuls and
    # float16 in the pseudo-inverse)
    dtype = common_float_dtype(R_sup, R, min_bits=32)
    R_sup, R = R_sup.to(dtype), R.to(dtype)
    check_positive(ridge, "ridge", strict=False)
    check_rcond(rcond)
    return _fit_linear_embeddings(R_sup, R, ridge, rcond, standardize)


def _fit_linear_embeddings(R_sup: torch.Tensor, R: torch.Tensor, ridge: float,
                           rcond: float | None, standardize: bool) -> dict[str, torch.Tensor]:
    """:func:`fit_linear_embeddings` on checked inputs of one floating dtype (of at
    least 32 bits): the estimator's relevance matrix is validated once in ``fit``, and
    its second NaN check here made the fit 1.5 times as slow."""
    n_q, k = R_sup.shape
    if standardize:
        # mean and std in units of a power of two per column (exact): the squares of
        # |R| > 1e154 overflowed (std inf: U = 0, then NaN or item means) and those of
        # |R| < 1e-154 underflowed (std 0: U left unscaled, so ridge swamped it)
        amax = R_sup.abs().amax(dim=0) if n_q else R_sup.new_zeros(k)
        unit = torch.where(amax > 0, torch.exp2(torch.log2(amax).floor()), 1.0)
        mean = (R_sup / unit).mean(dim=0) * unit
        # (no support column: greedy found nothing to explain; std would warn on 0 columns)
        scale = (R_sup / unit).std(dim=0, correction=0) * unit if k else R_sup.new_ones(0)
        # a column constant over the training queries carries nothing: centred on its
        # value (an exactly 0 column of U) with unit scale, whatever rounding its computed
        # mean (0.1 + 1.4e-17 for a column of 0.1) and std have; the rounding bound
        # below divides by the scale
        const = (R_sup.amax(dim=0) == R_sup.amin(dim=0)) if n_q else scale == 0
        if bool(const.any()):
            mean = torch.where(const, R_sup[0], mean)
        scale = torch.where((scale > 0) & ~const, scale, torch.ones_like(scale))
        U = (R_sup - mean) / scale
        offsets = R.mean(dim=0)
    else:
        mean = R_sup.new_zeros(k)
        scale = R_sup.new_ones(k)
        U, offsets = R_sup, R.new_zeros(R.shape[1])
    # P @ (R - 1 c^T) = P @ R - (P 1) c^T: no centred copy of R (n_queries x n_items)
    if ridge > 0:
        A = U.T @ U + ridge * torch.eye(k, dtype=U.dtype, device=U.device)
        P = torch.linalg.solve(A, U.T)
        rank = torch.tensor(k)
    elif rcond is None and standardize and k:
        # centring a column of offset |R| and spread sigma leaves errors up to
        # 2 eps |R| / sigma in U. The pseudo-inverse is taken of W = U / spread, whose
        # errors are at most 2 eps in every entry, so the cutoff bounds the singular
        # values rounding can create column by column: a cutoff from the largest spread
        # let one support column of rounding noise (values 5 and the next float) drop
        # every singular value, and linear RBE predicted the item means
        eps = torch.finfo(U.dtype).eps
        # (constant columns are exact zeros in U: no rounding, whatever their value)
        spread = (R_sup.abs().amax(dim=0) / scale).masked_fill(const, 1.0)
        noise = 2.0 * eps * (n_q * int((~const).sum())) ** 0.5
        W, rtol = U / spread, max(n_q, k) * eps
        P = torch.linalg.pinv(W, atol=noise, rtol=rtol) / spread[:, None]
        # (the same cutoff as the pseudo-inverse: the directions it keeps)
        rank = torch.linalg.matrix_rank(W, atol=noise, rtol=rtol)
    else:
        P = torch.linalg.pinv(U, rtol=rcond)
        rank = torch.linalg.matrix_rank(U, rtol=rcond)
    Et = P @ R
    if standardize:
        Et -= torch.outer(P.sum(dim=1), offsets)
    return {"embeddings": Et.T.contiguous(), "offsets": offsets, "mean": mean, "scale": scale,
            "rank": rank}


def _shape(x: Any) -> str:
    return f"shape {tuple(x.shape)}" if hasattr(x, "shape") else type(x).__name__


@on_inputs_device
@requires_tensors
def cur_query_weights(
    C: torch.Tensor,
    u: torch.Tensor,
    *,
    gram: torch.Tensor | None = None,
    ridge: float = 0.0,
    rcond: float | None = None,
) -> torch.Tensor:
    r"""Per-query CUR weights from the heavy scores of each query's own anchor items.

    With the anchor-query relevance :math:`A \in \mathbb{R}^{n_a \times N}`, a
    query's anchor items :math:`I` (:math:`m` of them) and its heavy scores
    :math:`u = f(q, I)`, the CUR approximation of the query's scores of all items is
    :math:`\hat s = u^\top A_{:,I}^{+} A = w^\top A` with
    :math:`w = A_{:,I} (A_{:,I}^\top A_{:,I})^{+} u`, computed batched from the
    :math:`m \times m` Gram matrix :math:`G = A_{:,I}^\top A_{:,I}` by a symmetric
    eigendecomposition (eigenvalues below ``rcond**2`` times the largest, by default
    ``max(m, n_a) * eps`` times, are dropped), or with ``ridge > 0`` from
    :math:`(G + \lambda I)^{-1}`.

    Parameters
    ----------
    C : Tensor of shape (b, m, n_a)
        :math:`A_{:,I}^\top` for each of ``b`` queries (rows: anchor items).
    u : Tensor of shape (b, m)
        Heavy scores of each query against its anchor items.
    gram : Tensor of shape (b, m, m), optional
        ``C @ C.mT`` if already known (e.g. updated incrementally).
    ridge : float, default=0.0
        Ridge penalty :math:`\lambda \ge 0` added to the eigenvalues of :math:`G`
        that the cutoff keeps (0: the pseudo-inverse).
    rcond : float in [0, 1) or None, default=None
        Relative singular-value cutoff of :math:`A_{:,I}`; ``None`` uses
        ``sqrt(max(m, n_a) * eps)``.

    Returns
    -------
    Tensor of shape (b, n_a)
        ``w``; the approximate scores of all items are ``w @ A``.

    Notes
    -----
    Working on :math:`G` squares the condition number of :math:`A_{:,I}`: the
    weights carry a relative error of about ``eps * cond(A_I)**2`` (in float64, about
    ``1e-11`` at a condition number of ``1e3`` but ``3e-4`` to ``2e-3`` at ``1e7``, just
    inside the default cutoff), where ``torch.linalg.pinv`` of :math:`A_{:,I}` would
    give about ``eps * cond(A_I)``. It is the price of the ADACUR search's incremental
    Gram updates; pass a larger ``rcond`` (e.g. ``1e-5``) to drop the directions that
    cannot be resolved.

    References
    ----------
    .. [1] Yadav, Monath, Zaheer, McCallum, "Efficient k-NN Search with Cross-Encoders
       using Adaptive Multi-Round CUR Decomposition", Findings of EMNLP 2023,
       arXiv:2305.02996.

    Examples
    --------
    A query whose scores lie in the row space of :math:`A` is recovered exactly from
    its scores at 4 anchor items:

    >>> import torch
    >>> from mlpapers.retrieval.rbe import cur_query_weights
    >>> g = torch.Generator().manual_seed(0)
    >>> A = torch.randn(3, 8, generator=g, dtype=torch.float64)  # 3 anchor queries
    >>> s = torch.randn(3, generator=g, dtype=torch.float64) @ A  # the query's scores
    >>> I = torch.tensor([0, 2, 5, 7])  # its anchor items
    >>> w = cur_query_weights(A[:, I].T[None], s[I][None])
    >>> w.shape
    torch.Size([1, 3])
    >>> torch.allclose(w @ A, s)
    True
    """
    if not isinstance(C, torch.Tensor) or C.ndim != 3:
        raise ValueError(f"C must be a 3-D tensor (b, m, n_a), got {_shape(C)}.")
    b, m, n_a = C.shape
    if not isinstance(u, torch.Tensor) or tuple(u.shape) != (b, m):
        raise ValueError(f"u must be a tensor of shape {(b, m)} (b, m) to match C, got "
                         f"{_shape(u)}.")
    if gram is not None and (not isinstance(gram, torch.Tensor)
                             or tuple(gram.shape) != (b, m, m)):
        raise ValueError(f"gram must be a tensor of shape {(b, m, m)} (C @ C.mT), got "
                         f"{_shape(gram)}.")
    # (a NaN in C failed in torch's eigh, one in u gave NaN weights without an error)
    check_finite(C, "C")
    check_finite(u, "u")
    if gram is not None:
        check_finite(gram, "gram")
    # one dtype of at least float32 (eigh has no integer or float16 kernels)
    dtype = common_float_dtype(C, u, *(() if gram is None else (gram,)), min_bits=32)
    C, u = C.to(dtype), u.to(dtype)
    if gram is not None:
        gram = gram.to(dtype)
    check_positive(ridge, "ridge", strict=False)
    check_rcond(rcond)
    # in power-of-two units (exact): the Gram matrix of C near 1e-160 underflowed (NaN
    # weights) and near 1e160 overflowed (eigh failed). With C / c and u / v the weights
    # are w c / v, for the ridge / c^2 and the Gram matrix / c^2
    c_unit, u_unit = power_of_two_unit(abs_max(C), 60), power_of_two_unit(abs_max(u), 60)
    # no unit so small that the ridge in it, ridge / unit**2, overflows the dtype (a
    # tiny C's ridge became inf and every weight 0): at most a quarter of its range
    ratio = float(ridge) / (torch.finfo(C.dtype).max / 4)
    if ratio > 0.0:
        c_unit = max(c_unit, 2.0 ** math.ceil(0.5 * math.log2(ratio)))
    if c_unit == u_unit == 1.0:
        return _cur_query_weights(C, u, gram, ridge, rcond)
    w = _cur_query_weights(C / c_unit, u / u_unit,
                           None if gram is None else gram / c_unit / c_unit,
                           float(ridge) / c_unit / c_unit, rcond)
    return w * (u_unit / c_unit)


def _cur_query_weights(C: torch.Tensor, u: torch.Tensor, gram: torch.Tensor | None,
                       ridge: float, rcond: float | None) -> torch.Tensor:
    """:func:`cur_query_weights` on checked inputs of one floating dtype: the ADACUR
    search calls it per chunk of queries and round, on the fitted anchors' relevance
    and on heavy scores already checked (no pass over them again)."""
    m, n_a = C.shape[1], C.shape[2]
    G = C @ C.mT if gram is None else gram
    lam, V = torch.linalg.eigh(G)
    top = lam[..., -1:].clamp_min(torch.finfo(lam.dtype).tiny)
    tol = rcond**2 if rcond is not None else max(m, n_a) * torch.finfo(lam.dtype).eps
    keep = lam > tol * top
    inv = torch.where(keep, 1.0 / torch.where(keep, lam + ridge, 1.0), 0.0)
    coef = V @ (inv * (V.mT @ u[..., None])[..., 0])[..., None]  # G^+ u, (b, m, 1)
    return (C.mT @ coef)[..., 0]


#: Most scores held by one chunk of :func:`topk_scores` (32 MiB in float64): the
#: queries per chunk are also capped by ``CHUNK_SCORES // n_items``. (Smaller chunks
#: were also faster: 1024 queries x 10**5 items scored and selected in 2.5 s by chunks
#: of 2**22 scores, 4.1 s by 2**24 and 4.9 s in one chunk of 1024 queries.)
CHUNK_SCORES = BLOCK_ELEMENTS


def stable_topk(S: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` of a stable descending sort of each row of ``S`` (b, N).

    Equal to ``order = argsort(S, dim=1, descending=True, stable=True)[:, :k]`` and
    ``S.gather(1, order)`` (ties by the lower index, NaN first), computed by
    ``topk``: a full sort of every row cost ``O(N log N)`` per query (27 s for 1024
    queries over 10**5 items, against 0.3 s). Only rows whose top-``k`` set is not
    unique (a tie straddling the ``k``-th place) or that hold a NaN among their
    top-``k + 1`` values are sorted in full.

    Returns
    -------
    values : Tensor of shape (b, k)
    indices : Tensor of shape (b, k), int64
    """
    N = S.shape[1]
    k = min(int(k), N)
    extra = int(k < N)  # one more place tells whether a tie straddles the k-th
    v, i = S.topk(k + extra, dim=1, largest=True, sorted=True)
    # (the NaN check on the kept values only: topk ranks NaN above every number)
    redo = v.isnan().any(dim=1)
    if extra:
        redo |= v[:, k - 1] == v[:, k]
        v, i = v[:, :k], i[:, :k]
    # within the unique top-k set: by index, then stably by value (ties: lower index)
    by_index = i.argsort(dim=1)
    v, i = v.gather(1, by_index), i.gather(1, by_index)
    by_value = v.argsort(dim=1, descending=True, stable=True)
    v, i = v.gather(1, by_value), i.gather(1, by_value)
    if bool(redo.any()):
        rows = redo.nonzero()[:, 0]
        order = torch.argsort(S[rows], dim=1, descending=True, stable=True)[:, :k]
        v[rows], i[rows] = S[rows].gather(1, order), order
    return v, i


def topk_scores(
    score_fn: Callable[[int, int], torch.Tensor],
    n_queries: int,
    k: int,
    *,
    batch_size: int = 1024,
    n_items: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of a score matrix computed in query chunks (bounded memory).

    Parameters
    ----------
    score_fn : callable
        ``score_fn(start, stop) -> Tensor (stop - start, n_items)``.
    n_queries, k : int
    batch_size : int, default=1024
        Most queries per chunk.
    n_items : int
        Columns of the score matrix: a chunk also holds at most :data:`CHUNK_SCORES`
        (``2**22``) scores, so the working set does not grow with ``n_items``
        (``batch_size`` rows of 10**5 items took 2.4 GB).

    Returns
    -------
    scores, indices : Tensors of shape (n_queries, k)
        Descending scores; ties broken by the lower item index (:func:`stable_topk`).
    """
    rows = block_rows_for(n_items, CHUNK_SCORES, cap=int(batch_size))
    # written into one preallocated output: a list of small results kept alive between
    # the large transient score chunks made the resident memory grow by a chunk per
    # chunk (see mlpapers._utils._blocks)
    return collect_row_blocks(lambda r: stable_topk(score_fn(r.start, r.stop), k),
                              n_queries, rows)


@on_inputs_device
def hit_rate(true_scores: ArrayLike, pred_indices: ArrayLike, k: int | None = None) -> float:
    """HitRate@k: overlap of the predicted and the true top-``k`` item sets.

    ``|pred[:, :k] ∩ top_k(true)| / k``, averaged over queries (a predicted item
    repeated in a row counts once); the true top-``k`` uses a stable sort (ties broken
    by the lower item index).

    Parameters
    ----------
    true_scores : array-like of shape (n_queries, n_items)
        Heavy-ranker relevance.
    pred_indices : array-like of shape (n_queries, m)
        Ranked predicted item indices.
    k : int or None
        Cut-off; ``None`` uses ``m``. Must satisfy ``k <= m``.

    Returns
    -------
    float
        In [0, 1].

    Examples
    --------
    >>> from mlpapers.retrieval.rbe import hit_rate
    >>> hit_rate([[0.1, 0.9, 0.5]], [[1, 0]])
    0.5
    """
    hits, k = hit_counts(true_scores, pred_indices, k)
    return int(hits.sum()) / (len(hits) * k)  # one division: chunked sums agree exactly


def hit_counts(true_scores: Any, pred_indices: Any, k: int | None = None, *,
               name: str = "true_scores") -> tuple[torch.Tensor, int]:
    """Per-query hit counts of :func:`hit_rate` and the cut-off ``k`` it used; errors
    about ``true_scores`` name it ``name`` (the caller's parameter).

    Returns
    -------
    hits : LongTensor of shape (n_queries,)
        ``|pred[q, :k] ∩ top_k(true[q])|``.
    k : int
    """
    T = check_matrix(true_scores, name)
    P = torch.as_tensor(torch_compatible_array(to_numpy(pred_indices)))
    if P.dtype == torch.bool or P.is_complex() or (
            P.is_floating_point() and not bool((P == P.round()).all())):
        raise TypeError(f"pred_indices must hold integer item indices, got {P.dtype} values.")
    P = P.long()
    if P.ndim != 2 or P.shape[0] != T.shape[0]:
        raise ValueError(f"pred_indices must have shape ({T.shape[0]}, m), got {tuple(P.shape)}.")
    # (int(k) truncated 2.5 to 2 and read True as 1)
    k = P.shape[1] if k is None else int(check_positive(k, "k", integer=True))
    if not 1 <= k <= min(P.shape[1], T.shape[1]):
        raise ValueError(f"k must be in [1, {min(P.shape[1], T.shape[1])}], got {k}.")
    if bool(((P[:, :k] < 0) | (P[:, :k] >= T.shape[1])).any()):
        raise ValueError(f"pred_indices holds item indices outside [0, {T.shape[1]}).")
    true_top = stable_topk(T, k)[1]  # (topk: no full sort of each row)
    mask = torch.zeros_like(T, dtype=torch.bool)
    mask.scatter_(1, true_top, True)
    pred = torch.zeros_like(mask).scatter_(1, P[:, :k], True)  # a repeated item counts once
    return (mask & pred).sum(dim=1), k


@on_inputs_device
@requires_tensors
def softmax_signed_loss(
    logits: torch.Tensor, targets: torch.Tensor, top_quantile: float = 0.99
) -> torch.Tensor:
    r"""The "softmax_signed" loss of neural RBE over sampled items.

    Per query, items whose true relevance is at least the ``top_quantile``
    quantile of the sampled items are positives; with :math:`p = \mathrm{softmax}`
    of the logits over the sampled items,
    :math:`L = -\operatorname{mean}_{q,i}(\pm p_{qi})` (``+`` for positives, ``-``
    for negatives), i.e. it pushes the softmax mass onto the positives.

    Parameters
    ----------
    logits : Tensor of shape (n_queries, n_sampled)
        Predicted scores of the sampled items for each query (e.g. a
        :class:`NeuralRBEHead`'s output); the loss is differentiable in them.
    targets : Tensor of shape (n_queries, n_sampled)
        Heavy-ranker relevance of the same pairs.
    top_quantile : float, default=0.99
        Quantile of each row of ``targets`` (linear interpolation, as
        :func:`torch.quantile`) at or above which an item is a positive; in
        ``[0, 1]``. At least the row's largest target is always a positive.

    Returns
    -------
    Tensor
        Scalar loss, in ``[-1 / n_sampled, 1 / n_sampled]``.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).

    Examples
    --------
    Uniform logits cost :math:`(1 - 2/4) / 4`; putting the mass on the positive (the
    best target) lowers the loss:

    >>> import torch
    >>> from mlpapers.retrieval.rbe import softmax_signed_loss
    >>> targets = torch.tensor([[0.1, 0.9, 0.3, 0.2]])
    >>> float(softmax_signed_loss(torch.zeros(1, 4), targets))
    0.125
    >>> float(softmax_signed_loss(torch.tensor([[0.0, 9.0, 0.0, 0.0]]), targets)) < 0
    True
    """
    # (a mismatch broadcast silently, e.g. (2, m) logits against (1, m) targets; a
    # quantile outside [0, 1] failed with a size error deep in the indexing)
    if (logits.ndim != 2 or tuple(logits.shape) != tuple(targets.shape)
            or min(targets.shape) < 1):
        raise ValueError("logits and targets must be 2-D tensors of the same shape "
                         "(n_queries, n_sampled), both at least 1, got shapes "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}.")
    if (isinstance(top_quantile, bool) or not isinstance(top_quantile, numbers.Real)
            or not 0.0 <= top_quantile <= 1.0):
        raise ValueError(f"top_quantile must be a number in [0, 1], got {top_quantile!r}.")
    # (a NaN target was silently a negative; NaN logits propagate: a diverging run sees them)
    check_finite(targets, "targets")
    return _softmax_signed_loss(logits, targets, top_quantile)


def _softmax_signed_loss(logits: torch.Tensor, targets: torch.Tensor,
                         top_quantile: float) -> torch.Tensor:
    """:func:`softmax_signed_loss` on checked inputs: the neural head's training calls it
    every step on the fitted (checked) relevance (no pass over the targets again)."""
    # torch.quantile (linear interpolation) computed from one sort: faster on CPU.
    v = torch.sort(targets, dim=1).values
    pos = top_quantile * (targets.shape[1] - 1)
    lo = int(pos)
    hi = min(lo + 1, targets.shape[1] - 1)
    thr = v[:, lo:lo + 1] + (pos - lo) * (v[:, hi:hi + 1] - v[:, lo:lo + 1])
    logits = logits.to(common_float_dtype(logits))  # (softmax refuses integer logits)
    sign = torch.where(targets >= thr, 1.0, -1.0).to(logits.dtype)
    p = torch.softmax(logits, dim=1)
    return -(sign * p).mean()
