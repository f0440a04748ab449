"""Support-item selection for relevance-based embeddings (pure torch / sklearn).

Every selector takes the training relevance matrix ``R`` of shape
``(n_queries, n_items)`` and returns the indices of ``k`` distinct items. The
item features are the columns of ``R`` (each item's relevance over the training
queries), centred per item when ``center=True``, matching the affine linear head
used with ``standardize=True``.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
import warnings
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias, get_args, overload

import numpy as np
import torch

from mlpapers._utils import (
    ArrayLike,
    RandomStateLike,
    check_bool,
    check_finite,
    check_in_options,
    check_positive,
    common_float_dtype,
    make_generators,
    on_inputs_device,
    power_of_two_unit,
    requires_tensors,
    to_numpy,
    user_stacklevel,
)
from mlpapers._utils._blocks import block_rows_for
from mlpapers._utils._random import _check_seed_type
from mlpapers.retrieval.rbe._kernels import abs_max, check_matrix

__all__ = ["SUPPORT_METHODS", "check_support_indices", "greedy_selection", "quiet_early_stop",
           "select_support"]

#: ``select_support(method=...)``, ``RelevanceBasedRetriever(support=...)`` (when not
#: explicit indices) and ``AdaCURRetriever(init=...)``; ``SUPPORT_METHODS`` lists them.
SupportMethod: TypeAlias = Literal["greedy", "random", "popular", "kmeans", "farthest"]
SUPPORT_METHODS: tuple[str, ...] = get_args(SupportMethod)
#: Explicit support items, ``RelevanceBasedRetriever(support=...)``: distinct item indices.
SupportIndices: TypeAlias = Sequence[int | np.integer] | np.ndarray | torch.Tensor
#: ``greedy_selection(method=...)``; ``GREEDY_METHODS`` lists its values.
GreedyMethod: TypeAlias = Literal["lowrank", "gram"]
GREEDY_METHODS: tuple[str, ...] = get_args(GreedyMethod)
#: ``select_support(greedy_method=...)``: a :data:`GreedyMethod` or ``"auto"`` (``"lowrank"``).
SelectGreedyMethod: TypeAlias = Literal["auto", GreedyMethod]
SELECT_GREEDY_METHODS: tuple[str, ...] = get_args(SelectGreedyMethod)

# Per-thread switch of the early-stop warning of greedy selection. Not a
# ``warnings.catch_warnings`` block: that swaps the process-wide filter list and restores
# it on exit, so two blocks overlapping in two threads could leave "ignore every warning"
# installed for good (seen with simultaneous ADACUR fits)
_QUIET = threading.local()


@contextlib.contextmanager
def quiet_early_stop():
    """In this thread, :func:`greedy_selection` does not warn when it stops early
    (for callers that fill the missing items themselves)."""
    previous = getattr(_QUIET, "early_stop", False)
    _QUIET.early_stop = True
    try:
        yield
    finally:
        _QUIET.early_stop = previous


def _item_features(R: torch.Tensor, center: bool) -> torch.Tensor:
    """``(n_queries, n_items) -> (n_items, n_queries)`` item relevance vectors.

    With ``center``, an item whose relevance is exactly constant over the queries gets
    an exactly zero vector: centring leaves rounding noise (the computed mean need not
    equal the constant), whose *direction* greedy selection would otherwise take for
    information once the real items are exhausted (the official greedy excludes such
    items by an absolute norm threshold). Items that vary at all, however little
    relative to their offset, are kept.
    """
    X = R.T
    if not center:
        return X
    Xc = X - X.mean(dim=1, keepdim=True)
    const = X.amax(dim=1) == X.amin(dim=1)
    if bool(const.any()):
        Xc[const] = 0.0
    return Xc


@on_inputs_device
@requires_tensors
def greedy_selection(
    X: torch.Tensor,
    k: int,
    *,
    tol: float = 0.0,
    method: GreedyMethod = "lowrank",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Greedy column-subset selection minimising the projection residual.

    With item vectors :math:`x_j` (rows of ``X``) and the residual Gram matrix
    :math:`G = X_{res} X_{res}^\top`, each step picks

    .. math::  j^\star = \arg\max_j \|G_{:, j}\|^2 / G_{jj},

    which is exactly the decrease of :math:`\|X - X P_S\|_F^2` (:math:`P_S` the
    orthogonal projector onto the span of the chosen vectors) when adding
    :math:`j`, then deflates :math:`G \leftarrow G - g g^\top / G_{j^\star j^\star}`
    with :math:`g = G_{:, j^\star}`. The updates cancel at the scale of the
    residual they start from, so once the residual energy of the items still in play
    has fallen by :math:`10^5` (or no item's updated residual is above
    :math:`10^{-10}` of its starting one), the residual is recomputed explicitly
    (projection off the span of the picks, twice) and the updates restart from it:
    relevance with a large common component (an offset of :math:`10^6`, whose
    residuals after the first pick are :math:`10^{-12}` of the item norms) is
    selected as exactly as centred relevance. Items whose residual is within the
    rounding they keep inside the span of the picks (:math:`\eta_i + \sum_s |c_{si}|
    \eta_s`, with :math:`\eta = 4 \epsilon \|x\|` each item's rounding and
    :math:`c_{\cdot i}` its coefficients on the picks), or whose squared residual is at
    most ``tol`` times their squared norm, lie in that span and are never picked
    (duplicates, chosen items, the rounding of an offset); selection stops early,
    with a warning, when no item is left.

    Parameters
    ----------
    X : Tensor of shape (n_items, n_queries)
        Item feature vectors (float64 recommended).
    k : int
        Number of items to pick, ``>= 0``.
    tol : float, default=0.0
        Relative residual tolerance, ``>= 0``: items whose squared residual is at most
        ``tol`` times their squared norm are treated as in the span of the picks. The
        default leaves out only those within rounding of it.
    method : {"lowrank", "gram"}, default="lowrank"
        ``"gram"`` keeps the explicit ``(n_items, n_items)`` Gram matrix
        (:math:`O(N^2)` memory); ``"lowrank"`` never forms it: it keeps the
        column norms :math:`a_j = \|G_{:, j}\|^2`, the diagonal :math:`d_j` and the
        deflation factors, and updates them in :math:`O(N (n_q + t))` per step. Both
        give the same sequence up to rounding (the update of :math:`a_j` cancels at the
        scale of :math:`|X|^4` of the residual a pass starts from, which the explicit
        recomputations above keep within :math:`10^{5}` of the current one). The
        recorded gains are computed from the picked column in both
        (:math:`\|g\|^2 / g_j`). On exact ties (integer relevance, duplicated items, a
        rank-1 residual where every gain is equal) each method's rounding decides, as
        ``np.argmax`` in the official greedy does, so the two can pick different items
        of equal gain.

    Returns
    -------
    indices : LongTensor of shape (k',)
        Picked items (rows of ``X``) in the order picked, ``k' <= k``.
    gains : Tensor of shape (k',)
        The decrease of the squared Frobenius residual at each pick (no autograd
        graph: ``X`` is read detached); they sum to
        :math:`\|X\|_F^2` once the picks span the rows of ``X``.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).

    Examples
    --------
    Six item vectors in a plane: two picks explain all of :math:`\|X\|_F^2`.

    >>> import torch
    >>> from mlpapers.retrieval.rbe import greedy_selection
    >>> g = torch.Generator().manual_seed(0)
    >>> X = (torch.randn(6, 2, generator=g, dtype=torch.float64)
    ...      @ torch.randn(2, 5, generator=g, dtype=torch.float64))
    >>> idx, gains = greedy_selection(X, 2)
    >>> idx.shape
    torch.Size([2])
    >>> bool(torch.isclose(gains.sum(), (X ** 2).sum()))
    True
    """
    check_in_options(method, "method", GREEDY_METHODS)
    # (a negative or fractional k failed deep in torch, a NaN tol picked nothing)
    if X.ndim != 2:
        raise ValueError("X must be a 2-D tensor of item vectors (n_items, n_queries), got "
                         f"shape {tuple(X.shape)}.")
    check_positive(k, "k", strict=False, integer=True)
    check_positive(tol, "tol", strict=False)
    check_finite(X, "X")  # (NaN gains picked arbitrary items silently)
    X = X.to(common_float_dtype(X, min_bits=32))  # (integer X failed in torch.finfo)
    return _greedy(X, k, tol=tol, method=method)


# The rounding of an item's given values, at most half an epsilon of their norm (more
# after centring), as a multiple of epsilon times that norm: noise that no pick
# explains. (Relevance offset by 1e6 and centred keeps residuals of ~1e-16 of the
# offset, which greedy picked as if they were information: 30 supports where 5
# reproduce the relevance.)
_INPUT_ROUNDING = 4


def _greedy(X: torch.Tensor, k: int, *, tol: float, method: str,
            raw_norms: torch.Tensor | None = None,
            raw_eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`greedy_selection` on validated floating ``X``. ``raw_norms`` are the norms
    of the items as given before centring (default: those of ``X``, in ``X``'s units)
    and ``raw_eps`` the relative rounding of the given values (default: ``X``'s
    epsilon)."""
    # a discrete selection, not differentiable: no graph (an X that requires grad made
    # torch warn when its scale was read as a Python float)
    X = X.detach()
    # The scores a_j / d_j grow as |X|**2 from a_j ~ |X|**4, which underflows float64 for
    # |X| < 1e-77 (every gain 0: R = [[4e-144]] scored 0) and overflows for |X| > 1e77.
    # Picks do not depend on the scale: work in units of a power of two (exact) when
    # the data are far from 1, and scale the gains back.
    unit = power_of_two_unit(abs_max(X), 60)
    if unit != 1.0:
        X = X / unit
    d0 = torch.einsum("ij,ij->i", X, X)  # no (N, n_q) temporary
    raw_norms = d0.sqrt() if raw_norms is None else raw_norms.to(X) / unit
    tiny = torch.finfo(X.dtype).tiny
    floor = (tol * d0).clamp_min(tiny)
    alive = d0 > tiny
    picks: list[int] = []
    gains: list[torch.Tensor] = []
    deflation = _GramDeflation if method == "gram" else _LowRankDeflation
    residual, basis = X, X.new_zeros((X.shape[1], 0))
    # the rounding of each item's values (as given, then as computed here), as a norm;
    # an item whose residual is no larger than the rounding it keeps inside the span
    # of the picks lies in that span and is not picked
    eta = _INPUT_ROUNDING * max(raw_eps or 0.0, torch.finfo(X.dtype).eps) * raw_norms
    noise = eta
    while len(picks) < k:
        made = _greedy_pass(deflation(residual, k - len(picks)), k, alive,
                            torch.maximum(floor, noise ** 2), picks, gains)
        if not made or len(picks) == k:
            break
        # The deflation updates cancel at the scale of the residual the pass started
        # from: go on from the residual recomputed explicitly. Items with a large
        # common component (relevance offset by 1e6) keep a residual 1e-12 of their
        # norm after the first pick, which the updates drowned (every later pick was
        # noise, or none was made)
        residual, basis = _explicit_residual(residual, basis, picks[-made:])
        noise = _span_noise(X, picks, eta)
    if len(picks) < k and not getattr(_QUIET, "early_stop", False):
        warnings.warn(
            f"greedy support selection stopped after {len(picks)} of {k} items: the "
            "remaining items lie (up to tol) in the span of the chosen ones, so the "
            "training relevance is already reproduced exactly.",
            UserWarning, stacklevel=user_stacklevel(),
        )
    idx = torch.tensor(picks, dtype=torch.long, device=X.device)
    gain = torch.stack(gains) if gains else X.new_zeros(0)
    return idx, gain * unit * unit if unit != 1.0 else gain


# A pass of deflation updates ends once the residual energy of the items still in play
# has fallen by this factor since the pass began (the updates cancel at the pass's
# starting scale, ~1e-16 of it for the diagonal and of its square for the column norms),
# or when no item is left whose updated residual is above _PASS_RTOL of its starting one
_REFRESH_DROP = 1e-5
_PASS_RTOL = 1e-10


def _explicit_residual(residual: torch.Tensor, basis: torch.Tensor,
                       new: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``residual`` projected off the span of its rows ``new`` and off
    ``basis`` (the orthonormal directions of earlier picks), and the extended basis."""
    W = residual[new].T
    W = W / torch.linalg.vector_norm(W, dim=0)
    for _ in range(2):  # twice is enough (Kahan): orthogonal to the basis to rounding
        W = W - basis @ (basis.T @ W)
    Q = torch.linalg.qr(W).Q
    basis = torch.cat([basis, Q], dim=1)
    out = residual - (residual @ Q) @ Q.T
    return out - (out @ basis) @ basis.T, basis


def _span_noise(X: torch.Tensor, picks: list[int], eta: torch.Tensor) -> torch.Tensor:
    r"""The residual an item inside the span of the picks keeps from rounding:
    :math:`\eta_i + \sum_s |c_{si}| \eta_s`, with :math:`\eta` each item's rounding and
    :math:`c_{\cdot i}` its least-squares coefficients on the picked items (large when
    the picks are nearly collinear, which amplifies their rounding)."""
    Q, T = torch.linalg.qr(X[picks].T)
    C = torch.linalg.solve_triangular(T, (X @ Q).T, upper=True)  # (t, N)
    return eta + C.abs().T @ eta[picks]


class _GramDeflation:
    """The explicit ``(N, N)`` residual Gram matrix, deflated in place."""

    def __init__(self, residual: torch.Tensor, k: int) -> None:
        self.G = residual @ residual.T

    def norms_and_diagonal(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.G * self.G).sum(dim=0), torch.diagonal(self.G)

    def deflate(self, j: int) -> torch.Tensor:
        g = self.G[:, j].clone()
        self.G -= torch.outer(g, g) / g[j]
        return (g @ g) / g[j]


class _LowRankDeflation:
    r"""``G = X X^T - L L^T`` without forming it: the column norms
    :math:`a_j = \|G_{:, j}\|^2`, the diagonal and the deflation factors ``L``."""

    def __init__(self, residual: torch.Tensor, k: int) -> None:
        X = self.X = residual
        N = X.shape[0]
        self.d = torch.einsum("ij,ij->i", X, X)
        # a_j = x_j^T (X^T X) x_j, computed once in the cheaper space. In row chunks of
        # about 2**24 values: no (N, n_q) temporary besides X itself.
        small = N <= X.shape[1]
        M = X @ X.T if small else X.T @ X  # (N, N) or (n_q, n_q)
        rows = block_rows_for(M.shape[1], 2**24)
        # (filled in place: a torch.cat of the chunks failed on zero items)
        self.a = X.new_empty(N)
        for s in range(0, N, rows):
            self.a[s:s + rows] = ((M[s:s + rows] ** 2).sum(dim=1) if small
                                  else ((X[s:s + rows] @ M) * X[s:s + rows]).sum(dim=1))
        # allocated once (grown by torch.cat, it was copied at every pick: quadratic in
        # k, 30% of the selection of 200 items among 2 * 10**4)
        self.L_all = X.new_zeros((N, min(k, N)))
        self.t = 0

    def norms_and_diagonal(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a, self.d

    def deflate(self, j: int) -> torch.Tensor:
        X, L = self.X, self.L_all[:, :self.t]
        g = X @ X[j] - L @ L[j]  # G[:, j]
        h = X @ (X.T @ g) - L @ (L.T @ g)  # G g
        gj = g[j]
        coef = g / gj
        self.a = (self.a - 2.0 * coef * h + coef * coef * (g @ g)).clamp_min(0.0)
        self.d = self.d - g * coef
        self.L_all[:, self.t] = g / torch.sqrt(gj)
        self.t += 1
        # the gain from the column itself, ||G_j||^2 / G_jj (as the "gram" method): the
        # updated a_j cancels at the scale of |X|**4
        return (g @ g) / gj


def _greedy_pass(state: _GramDeflation | _LowRankDeflation, k: int, alive: torch.Tensor,
                 floor: torch.Tensor, picks: list[int], gains: list[torch.Tensor]) -> int:
    """Greedy picks from one residual until ``k`` in all, no candidate, or the
    residual has shrunk too far for the updates (see ``_REFRESH_DROP``); returns the
    number of picks made."""
    start = len(picks)
    d_start = state.norms_and_diagonal()[1].clone()
    top = float(d_start[alive].max()) if bool(alive.any()) else 0.0
    while len(picks) < k:
        a, d = state.norms_and_diagonal()
        ok = alive & (d > floor) & (d > _PASS_RTOL * d_start)
        if not bool(ok.any()):
            break
        score = torch.where(ok, a / torch.where(ok, d, 1.0), -math.inf)
        j = int(torch.argmax(score))
        picks.append(j)
        # never again, whatever the deflation leaves: for an item of norm 1e-114 next
        # to items of norm 1e-3, g_j**2 underflows and G_jj was not deflated (picked
        # twice)
        alive[j] = False
        gains.append(state.deflate(j))
        d = state.norms_and_diagonal()[1]
        if not bool(alive.any()) or float(d[alive].max()) < _REFRESH_DROP * top:
            break
    return len(picks) - start


def _farthest(X: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (about the mean item: with |x|^2 - 2 x.y + |y|^2, a relevance offset by 1e6
    # changed the picks from the 14th on; one matrix-vector product per pick)
    about = _AboutMean(X)

    def dist2(y: torch.Tensor) -> torch.Tensor:
        return about.sq_distances(y[None])[0]

    d_mean = dist2(X.mean(dim=0))
    first = int(torch.argmax(d_mean))
    picks, scores = [first], [torch.sqrt(d_mean[first])]
    # chosen items sit at -1 (distances are >= 0): never picked twice, even when the
    # remaining items all coincide with chosen ones (distance 0)
    dmin = dist2(X[first])
    dmin[first] = -1.0
    for _ in range(k - 1):
        j = int(torch.argmax(dmin))
        picks.append(j)
        scores.append(torch.sqrt(dmin[j]))
        dmin = torch.minimum(dmin, dist2(X[j]))
        dmin[j] = -1.0
    return torch.tensor(picks, device=X.device), torch.stack(scores)


class _AboutMean:
    """Squared distances from the rows of ``X`` (N, d) to points ``Y`` (k, d), as
    ``|x - m|^2 - 2 (x - m).(y - m) + |y - m|^2`` about the mean row ``m``: a matrix
    product and no (k, N, d) or (N, d) temporary, with the centred norms of ``X``
    summed from the differences, once. ``|x|^2 - 2 x.y + |y|^2`` (and cdist's matrix
    form) cancelled at eps |offset|^2 for items with a large common offset; about m
    the rounding is eps |offset| |y - m|."""

    def __init__(self, X: torch.Tensor) -> None:
        self.X, self.m = X, X.mean(dim=0)
        self.centred_sq = _centred_sq_norms(X, self.m)

    def sq_distances(self, Y: torch.Tensor) -> torch.Tensor:
        """(k, N) squared distances, clamped at 0."""
        Z = Y - self.m
        return (self.centred_sq[None, :] - 2.0 * (Z @ self.X.mT - (Z @ self.m)[:, None])
                + torch.einsum("ij,ij->i", Z, Z)[:, None]).clamp_min(0.0)


def _centred_sq_norms(X: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``|X[i] - m|^2`` per row from the differences, in blocks along the axis ``X`` is
    laid out on (the item vectors are often a transposed view of the relevance)."""
    if X.mT.is_contiguous():
        out = X.new_zeros(X.shape[0])
        cols = block_rows_for(X.shape[0], 2**22)
        for s in range(0, X.shape[1], cols):
            D = X.mT[s:s + cols] - m[s:s + cols, None]
            out += torch.einsum("ji,ji->i", D, D)
        return out
    rows = block_rows_for(X.shape[1], 2**22)
    return torch.cat([torch.einsum("ij,ij->i", D, D) for D in
                      (X[s:s + rows] - m for s in range(0, X.shape[0], rows))])


def _kmeans(X: torch.Tensor, k: int, seed: int, n_init: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans

    Xn = to_numpy(X)
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed)
    if len(np.unique(Xn + 0.0, axis=0)) >= k:  # (+ 0.0: -0.0 and 0.0 are one point)
        # no catch_warnings here: it swaps the process-wide warning filters, so blocks
        # overlapping in two threads could leave "ignore every warning" installed for good
        km.fit(Xn)
    else:
        # fewer distinct item vectors than clusters: scikit-learn warns that it found
        # fewer distinct clusters (handled below). Silenced the only way it can be, with
        # process-wide filters (a documented limit: not thread-safe in this degenerate case)
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Number of distinct clusters",
                                    category=ConvergenceWarning)
            km.fit(Xn)
    centres = torch.as_tensor(km.cluster_centers_, dtype=X.dtype, device=X.device)
    labels = torch.as_tensor(km.labels_, device=X.device)
    # (about the mean item: cdist's matrix form took members farther from their
    # centroid than others for items offset by 1e7)
    dist = _AboutMean(X).sq_distances(centres)  # (k, N)
    sizes = torch.bincount(labels, minlength=k)
    member = labels[None, :] == torch.arange(k, device=X.device)[:, None]
    dist_in = torch.where(member, dist, math.inf)
    picks: list[int] = []
    taken = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
    # Non-empty clusters come first and each takes one of its own members, so a cluster's
    # members are still free at its turn; an empty one (duplicate item vectors) takes the
    # free item nearest its centre (k <= N leaves one). The distances are finite: the
    # caller passes item vectors in units near 1
    for c in torch.argsort(sizes, descending=True, stable=True).tolist():
        row = dist_in[c] if sizes[c] > 0 else dist[c]
        j = int(torch.argmin(torch.where(taken, math.inf, row)))
        picks.append(j)
        taken[j] = True
    order = np.asarray(picks)
    size_of = to_numpy(sizes[torch.argsort(sizes, descending=True, stable=True)])
    return order, size_of.astype(np.float64)


@overload
def select_support(
    R: ArrayLike, k: int, method: SupportMethod = ..., *, center: bool = ..., tol: float = ...,
    random_state: RandomStateLike = ..., n_init: int = ...,
    greedy_method: SelectGreedyMethod = ...,
    device: str | torch.device | None = ..., return_scores: Literal[False] = ...,
) -> np.ndarray: ...
@overload
def select_support(
    R: ArrayLike, k: int, method: SupportMethod = ..., *, center: bool = ..., tol: float = ...,
    random_state: RandomStateLike = ..., n_init: int = ...,
    greedy_method: SelectGreedyMethod = ...,
    device: str | torch.device | None = ..., return_scores: Literal[True],
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def select_support(
    R: ArrayLike, k: int, method: SupportMethod = ..., *, center: bool = ..., tol: float = ...,
    random_state: RandomStateLike = ..., n_init: int = ...,
    greedy_method: SelectGreedyMethod = ...,
    device: str | torch.device | None = ..., return_scores: bool = ...,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
@on_inputs_device
def select_support(
    R: ArrayLike,
    k: int,
    method: SupportMethod = "greedy",
    *,
    center: bool = True,
    tol: float = 0.0,
    random_state: RandomStateLike = None,
    n_init: int = 3,
    greedy_method: SelectGreedyMethod = "auto",
    device: str | torch.device | None = None,
    return_scores: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    r"""Choose ``k`` support items from a training relevance matrix.

    Parameters
    ----------
    R : array-like or Tensor of shape (n_queries, n_items)
        Heavy-ranker relevance of training queries (rows) to items (columns).
    k : int
        Number of support items, ``1 <= k <= n_items``.
    method : {"greedy", "random", "popular", "kmeans", "farthest"}, default="greedy"
        * ``"greedy"``: greedy reconstruction-error selection (see
          :func:`greedy_selection`); the score of each pick is the exact decrease
          of the training mean squared error of the (affine, if ``center``) least-squares
          reconstruction of ``R`` from the chosen columns.
        * ``"random"``: uniform without replacement (AnnCUR's anchors).
        * ``"popular"``: the ``k`` items of highest mean relevance (descending).
        * ``"kmeans"``: k-means on the item vectors; per cluster the real item
          nearest its centroid (largest clusters first, no duplicates).
        * ``"farthest"``: farthest-point traversal starting from the item farthest
          from the mean item vector.
    center : bool, default=True
        Centre each item vector over the queries first (matches the affine head of
        ``standardize=True``); an item constant over the queries becomes an exact zero
        vector (greedy never picks it). Ignored by ``"random"`` and ``"popular"``.
    tol : float, default=0.0
        Relative residual tolerance of ``"greedy"`` (see :func:`greedy_selection`); it
        may return fewer than ``k`` items (with a warning) when the rest are already
        reconstructed exactly (to rounding, or to ``tol``).
    random_state : int, RandomState, Generator or None
        Seed of ``"random"`` and ``"kmeans"``.
    n_init : int, default=3
        Restarts of ``"kmeans"`` (scikit-learn's ``KMeans(n_init=...)``).
    greedy_method : {"auto", "gram", "lowrank"}, default="auto"
        ``"auto"`` is ``"lowrank"`` (never forms the item Gram matrix); ``"gram"`` is the
        literal deflation of the explicit ``(n_items, n_items)`` Gram matrix.
    device : str or torch.device, optional
        Where the torch computation runs.
    return_scores : bool, default=False
        Also return a per-pick score: the training-MSE decrease (greedy), the mean
        relevance (popular), the cluster size (kmeans), the distance to the previously
        chosen set (farthest; for the first pick, the distance to the mean item vector)
        or NaN (random).

    Returns
    -------
    indices : ndarray of shape (k,), int64
        Distinct item indices (columns of ``R``) in the order chosen; fewer than
        ``k`` only when ``"greedy"`` stops early (with a warning).
    scores : ndarray of shape (k,), float64
        Only when ``return_scores``.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.rbe import select_support
    >>> R = np.random.default_rng(0).standard_normal((30, 3)) @ np.ones((3, 12))
    >>> select_support(R, 2, "popular").shape
    (2,)
    """
    check_bool(center, "center")
    check_bool(return_scores, "return_scores")
    check_in_options(method, "method", SUPPORT_METHODS)
    check_in_options(greedy_method, "greedy_method", SELECT_GREEDY_METHODS)
    Rt = check_matrix(R, "R", device)
    n_q, N = Rt.shape
    check_positive(k, "k", integer=True)
    # (checked for every method, as scikit-learn checks its parameters: only "greedy"
    # read tol and "kmeans" n_init, so a bad value passed with the others)
    check_positive(tol, "tol", strict=False)
    check_positive(n_init, "n_init", integer=True)
    if k > N:
        raise ValueError(f"k={k} support items requested but R has only {N} items (columns).")
    # a caller's Generator (the estimators pass their own) is drawn from directly; made
    # only for the random methods: random_state=None draws a seed from numpy's global
    # RNG, which the deterministic methods advanced for nothing
    _check_seed_type(random_state)  # (still a TypeError for a bad seed, whatever the method)
    if isinstance(random_state, numbers.Integral) and random_state < 0:
        raise ValueError(f"random_state must be a non-negative integer, got {random_state}.")
    rng = None
    if method in ("random", "kmeans"):
        rng = (random_state if isinstance(random_state, np.random.Generator)
               else make_generators(random_state)[1])
    if method == "random":
        assert rng is not None  # (made above for the random methods)
        idx = rng.choice(N, size=k, replace=False).astype(np.int64)
        scores = np.full(k, np.nan)
        return (idx, scores) if return_scores else idx
    # The relevance in units of a power of two first (scores scaled back): the column
    # means and the centring of relevance near the float64 maximum overflowed
    # (R * 3.78e307 made k-means and farthest-point fail with an OverflowError, greedy
    # likewise, and every mean of "popular" was inf). Scaled down only as far as the
    # sums of a column and the centred differences need (to at most
    # finfo.max / (4 n_queries)): a division to unit scale would flush entries far
    # below the largest (1e-30 next to 1e300) to subnormals or zero and change the
    # picks. Tiny relevance (max |R| < 2**-60) is scaled up, which is exact.
    # Ordinary relevance is left as is
    amax = abs_max(Rt)
    unit = power_of_two_unit(amax, 60) if amax < 1.0 else 1.0
    bound = math.floor(math.log2(torch.finfo(Rt.dtype).max / (4 * max(n_q, 1))))
    if amax > 2.0 ** bound:
        unit = 2.0 ** (math.floor(math.log2(amax)) + 1 - bound)
    if unit != 1.0:
        Rt = Rt / unit
    if method == "popular":
        mean = Rt.mean(dim=0)
        order = torch.argsort(mean, descending=True, stable=True)[:k]
        idx, scores = to_numpy(order), to_numpy(mean[order]) * unit
    elif method in ("kmeans", "farthest"):
        # and the item vectors in units of a power of two too: centring can leave them
        # far below the relevance (items that vary by ~1e-200 next to a constant item
        # of ~1), whose squared distances underflowed (k-means found one cluster, every
        # farthest-point distance was 0)
        X = _item_features(Rt, center)
        x_unit = power_of_two_unit(abs_max(X), 60)
        X = X if x_unit == 1.0 else X / x_unit
        if method == "kmeans":
            assert rng is not None  # (made above for the random methods)
            seed = int(rng.integers(2**31 - 1))
            idx, scores = _kmeans(X, k, seed, n_init)  # cluster sizes: no unit
        else:
            i, s = _farthest(X, k)
            with np.errstate(over="ignore"):  # (distances beyond float64: inf)
                idx, scores = to_numpy(i), to_numpy(s) * x_unit * unit
    else:
        gm = greedy_method
        if gm == "auto":
            gm = "lowrank"
        # (the rounding of the given relevance, which centring does not remove; the
        # norms in units where the squares of relevance near 1e300 do not overflow)
        norm_unit = power_of_two_unit(amax / unit, 60)
        raw_norms = (torch.linalg.vector_norm(Rt, dim=0) if norm_unit == 1.0 else
                     torch.linalg.vector_norm(Rt / norm_unit, dim=0) * norm_unit)
        i, s = _greedy(_item_features(Rt, center), k, tol=tol, method=gm,
                       raw_norms=raw_norms, raw_eps=_relative_rounding(R))
        # (MSE decreases: squares of the relevance, inf beyond the float64 range)
        with np.errstate(over="ignore"):
            idx, scores = to_numpy(i), to_numpy(s) / (n_q * N) * unit * unit
    idx = np.asarray(idx, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    return (idx, scores) if return_scores else idx


def _relative_rounding(R: Any) -> float:
    """The epsilon of ``R``'s floating dtype (numpy or torch), else float64's."""
    dtype = getattr(R, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    return float(np.finfo(np.float64).eps)


def check_support_indices(support: Any, n_items: int) -> np.ndarray:
    """Explicit support item indices: distinct integers in ``[0, n_items)`` -> int64."""
    S = np.asarray(support)
    if S.ndim != 1 or S.size == 0 or S.dtype.kind not in "iu":
        raise ValueError("support must be a method name or a non-empty 1D array of "
                         f"item indices, got {support!r}.")
    if S.min() < 0 or S.max() >= n_items or len(np.unique(S)) != S.size:
        raise ValueError(f"support indices must be distinct and in [0, {n_items}).")
    return S.astype(np.int64)
