"""Bottleneck communication delay, biconnectivity and the bottleneck TSP.

* :func:`bottleneck_delay` -- BCD of an assignment on a circulant schedule.
* :func:`is_biconnected` -- iterative Tarjan (articulation points), rows vectorised.
* :func:`biconnected_threshold` -- the smallest ``theta`` with a biconnected
  threshold graph, a lower bound on the optimal bottleneck Hamiltonian cycle.
* :func:`bottleneck_tsp` -- the 2-approximation (Parker--Rardin / Fleischner) and
  an exact minimax Held--Karp solver for small ``n``.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import Any, Literal, TypeAlias, get_args, overload

import numpy as np

from mlpapers._utils import (
    ArrayLike,
    check_bool,
    check_in_options,
    check_positive,
    check_random_state,
    check_seed,
    to_numpy,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for
from mlpapers.decentralized.btsp._hamilton import (
    EXACT_MAX_N,
    _exact_minimax,
    _sym_values,
    _two_approx_tour,
)
from mlpapers.decentralized.btsp._topology import (
    TopologyLike,
    check_assignment,
    check_delays,
    circulant_schedule,
)
from mlpapers.decentralized.btsp._topology import (
    metric_closure as _closure,
)

__all__ = [
    "EXACT_MAX_N",
    "biconnected_threshold",
    "bottleneck_delay",
    "bottleneck_tsp",
    "is_biconnected",
]

_CHUNK = BLOCK_ELEMENTS  # gathered delay entries per batch in batched BCD evaluations


# ---------------------------------------------------------------- BCD ---------
def _edge_matrix(D: np.ndarray, directed: bool) -> np.ndarray:
    """Delay used for a link: exact in directed mode, ``max(D, D^T)`` otherwise."""
    return D if directed else np.maximum(D, D.T)


def _round_maxima(E: np.ndarray, perms: np.ndarray, schedule) -> np.ndarray:
    """Per-round bottleneck of a batch of assignments.

    Parameters
    ----------
    E : ndarray (n, n)
        Link delays ``E[u, v]`` of physical link ``u -> v``.
    perms : ndarray (b, n) of int
        Assignments, ``perms[k, i]`` the physical node at virtual position ``i``.
    schedule : list of list of int
        Skip sets.

    Returns
    -------
    ndarray (b, tau)
        ``out[k, l] = max_{i, s in S_l} E[perms[k, i], perms[k, (i + s) mod n]]``.
    """
    b, n = perms.shape
    out = np.empty((b, len(schedule)))
    base = np.arange(n)
    for l, skips in enumerate(schedule):
        idx = (base[:, None] + np.asarray(skips)[None, :]) % n  # (n, k)
        step = block_rows_for(n * len(skips), _CHUNK)
        for a in range(0, b, step):
            p = perms[a:a + step]
            vals = E[p[:, :, None], p[:, idx]]  # (chunk, n, k)
            out[a:a + step, l] = vals.reshape(len(p), -1).max(axis=1)
    return out


def _exact_total(rounds: np.ndarray) -> float:
    """Correctly rounded sum of the round bottlenecks (``math.fsum``)."""
    return math.fsum(rounds.tolist())


def _exact_sum(values: np.ndarray) -> Fraction:
    """The exact sum of float64 values, as a fraction (no rounding at all)."""
    return sum(map(Fraction, values.tolist()), Fraction(0))


def _exact_mean(rounds: np.ndarray) -> float:
    """Correctly rounded mean of the round bottlenecks (exact rational arithmetic)."""
    return float(_exact_sum(rounds) / len(rounds))


def _argmin_total(rounds: np.ndarray) -> int:
    """Row of ``rounds`` ``(b, tau)`` (non-negative) with the smallest exact sum; the
    first row among exact ties.

    Float sums of different rows round differently, so with delays that differ in
    their last bits the smallest float sum need not be the smallest sum: the rows
    within the rounding error of the smallest float sum are compared exactly (as
    fractions, each distinct multiset of values once). Usually one row is left and
    this costs one vectorised sum.
    """
    s = rounds.sum(axis=1)
    k = int(s.argmin())
    tau = rounds.shape[1]
    if tau == 1 or not np.isfinite(s[k]):
        return k
    # each of the tau - 1 additions of non-negative terms errs by at most eps/2 relative
    slack = tau * np.finfo(np.float64).eps
    cand = np.flatnonzero(s * (1 - slack) <= s[k] * (1 + slack))
    if cand.size == 1:
        return k
    keys, first = np.unique(np.sort(rounds[cand], axis=1), axis=0, return_index=True)
    totals = [_exact_sum(row) for row in keys]
    best = min(totals)
    return int(cand[min(f for f, t in zip(first, totals) if t == best)])


#: ``bottleneck_delay(reduce=...)`` and ``BottleneckNodeAssigner.bcd(reduce=...)``: a
#: :data:`ScalarReduce` returns a float, ``"none"`` an array; ``REDUCES`` lists them.
ScalarReduce: TypeAlias = Literal["mean", "sum"]
Reduce: TypeAlias = Literal[ScalarReduce, "none"]
REDUCES: tuple[str, ...] = get_args(Reduce)
#: ``bottleneck_tsp(method=...)``; ``TSP_METHODS`` lists its values.
TSPMethod: TypeAlias = Literal["2approx", "exact"]
TSP_METHODS: tuple[str, ...] = get_args(TSPMethod)


@overload
def bottleneck_delay(
    delays: ArrayLike, assignment: ArrayLike, topology: TopologyLike = ...,
    *, reduce: ScalarReduce = ..., directed: bool = ...,
) -> float: ...
@overload
def bottleneck_delay(
    delays: ArrayLike, assignment: ArrayLike, topology: TopologyLike = ...,
    *, reduce: Literal["none"], directed: bool = ...,
) -> np.ndarray: ...
@overload
def bottleneck_delay(
    delays: ArrayLike, assignment: ArrayLike, topology: TopologyLike = ...,
    *, reduce: Reduce = ..., directed: bool = ...,
) -> float | np.ndarray: ...
def bottleneck_delay(
    delays: ArrayLike,
    assignment: ArrayLike,
    topology: TopologyLike = "exponential",
    *,
    reduce: Reduce = "mean",
    directed: bool = False,
) -> float | np.ndarray:
    r"""Bottleneck communication delay (BCD) of an assignment on a circulant topology.

    .. math::

        \mathrm{BCD}(\pi; S) = \sum_{l=1}^{\tau} \max_{i,\; s \in S_l}
        D[\pi(i), \pi((i + s) \bmod n)]

    Each synchronous round waits for its slowest used link; the per-period sum adds
    the rounds of one period, the mean divides by ``tau`` (what the paper reports).

    Parameters
    ----------
    delays : array-like of shape (n, n)
        Non-negative delays, ``delays[u, v]`` from physical node ``u`` to ``v``.
    assignment : array-like of shape (n,)
        Permutation: ``assignment[i]`` is the physical node at virtual position ``i``.
    topology : str, sequence or ndarray, default="exponential"
        See :func:`~mlpapers.decentralized.btsp.circulant_schedule`.
    reduce : {"mean", "sum", "none"}, default="mean"
        Per-round mean, per-period sum, or the per-round array of length ``tau``.
    directed : bool, default=False
        If True use ``delays[u, v]`` for a message ``u -> v`` exactly; otherwise
        links are treated as bidirectional with delay ``max(D[u, v], D[v, u])``
        (identical for symmetric ``delays``).

    Returns
    -------
    float or ndarray of shape (tau,)
        The per-round mean or per-period sum of the round bottlenecks (correctly
        rounded), or the bottleneck of each round with ``reduce="none"``.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import bottleneck_delay
    >>> D = np.abs(np.subtract.outer(np.arange(4.0), np.arange(4.0)))  # nodes on a line
    >>> bottleneck_delay(D, [0, 1, 3, 2], "ring")
    2.0
    >>> bottleneck_delay(D, [0, 1, 2, 3], "one_peer_exponential", reduce="none")
    array([3., 2.])
    """
    check_bool(directed, "directed")
    check_in_options(reduce, "reduce", REDUCES)
    D = check_delays(delays)
    n = D.shape[0]
    perm = check_assignment(assignment, n)
    schedule = circulant_schedule(n, topology)
    rounds = _round_maxima(_edge_matrix(D, bool(directed)), perm[None], schedule)[0]
    if reduce == "none":
        return rounds
    return _exact_total(rounds) if reduce == "sum" else _exact_mean(rounds)


# ------------------------------------------------------- biconnectivity -------
def is_biconnected(adjacency: ArrayLike) -> bool:
    """Whether an undirected graph given by a boolean adjacency matrix is biconnected.

    Iterative depth-first search (Tarjan--Hopcroft articulation points): the search
    itself needs ``O(n)`` Python steps, each an ``O(n)`` vectorised row scan; the
    low-points are a masked minimum over the adjacency matrix followed by one pass
    in reverse discovery order. As in networkx, the single edge ``K_2`` counts as
    biconnected and graphs with fewer than two nodes do not.

    Parameters
    ----------
    adjacency : array-like of shape (n, n)
        Boolean (or 0/1) adjacency matrix; the diagonal is ignored and an
        asymmetric matrix is read as undirected (``A | A.T``).

    Returns
    -------
    bool
        True when the graph is connected and has no articulation point (removing
        any single node leaves it connected).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import is_biconnected
    >>> cycle = np.roll(np.eye(5, dtype=bool), 1, axis=1)  # edges i -> i + 1 mod 5
    >>> is_biconnected(cycle)
    True
    >>> is_biconnected(cycle[:4, :4])  # a path: its inner nodes are cut vertices
    False
    """
    A = to_numpy(adjacency)  # (np.asarray refuses grad/bfloat16/CUDA tensors)
    if A.dtype.kind not in "biuf":  # (astype(bool) read every non-empty string as an edge)
        raise TypeError(f"adjacency must hold booleans or numbers, got dtype {A.dtype}.")
    if A.dtype.kind == "f" and not np.isfinite(A).all():  # (NaN was read as an edge)
        raise ValueError("adjacency contains NaN or infinity.")
    A = A.astype(bool)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"adjacency must be a square matrix, got shape {A.shape}.")
    A = A | A.T
    n = A.shape[0]
    if n < 2:
        return False
    A = A.copy()
    np.fill_diagonal(A, False)
    if n == 2:
        return bool(A[0, 1])
    disc = np.full(n, -1, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    unvisited = np.ones(n, dtype=bool)
    order = np.empty(n, dtype=np.int64)
    disc[0] = 0
    order[0] = 0
    unvisited[0] = False
    stack = [0]
    t = 1
    while stack:
        v = stack[-1]
        row = A[v] & unvisited
        w = int(row.argmax())
        if row[w]:
            disc[w] = t
            order[t] = w
            parent[w] = v
            unvisited[w] = False
            t += 1
            stack.append(w)
        else:
            stack.pop()
    if t < n:  # not connected
        return False
    # low0[v] = min(disc[v], disc[w] for non-tree neighbours w); excluding the tree edge
    # to the parent. Descendant neighbours have larger disc, so including them is harmless.
    big = np.iinfo(np.int64).max
    M = np.where(A, disc[None, :], big)
    kids = np.arange(1, n)
    M[order[kids], parent[order[kids]]] = big
    low = np.minimum(disc, M.min(axis=1))
    for w in order[:0:-1]:  # reverse discovery order, children before parents
        p = parent[w]
        if low[w] < low[p]:
            low[p] = low[w]
    children_of_root = int((parent == 0).sum())
    if children_of_root >= 2:
        return False
    non_root = order[1:]
    par = parent[non_root]
    mask = par != 0  # a non-root parent u is an articulation point if low[child] >= disc[u]
    return not bool(np.any(low[non_root[mask]] >= disc[par[mask]]))


def biconnected_threshold(delays: ArrayLike, *, directed: bool = False) -> float:
    """Smallest ``theta`` for which ``{(u, v): D[u, v] <= theta}`` is biconnected.

    Every Hamiltonian cycle is biconnected, so ``theta`` is a lower bound on the
    bottleneck of any Hamiltonian cycle (the ring's BCD). Binary search over the
    sorted distinct delays, starting above the trivial bounds (every node needs
    two incident links).

    Parameters
    ----------
    delays : array-like of shape (n, n)
        Delays; an asymmetric matrix is symmetrised with ``max(D, D^T)`` (links used
        both ways), or with ``min(D, D^T)`` when ``directed=True`` (a valid lower
        bound for directed cycles).
    directed : bool, default=False
        See above.

    Returns
    -------
    theta : float
        One of the (symmetrised) delays.

    Examples
    --------
    Five nodes on a circle: links of one hop already form a biconnected cycle.

    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import biconnected_threshold
    >>> d = np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    >>> biconnected_threshold(np.minimum(d, 5 - d))
    1.0
    """
    check_bool(directed, "directed")
    return _theta_bound(check_delays(delays), bool(directed))


def _theta_bound(D: np.ndarray, directed: bool, S: np.ndarray | None = None) -> float:
    """:math:`\\theta^*` of validated delays, symmetrised as a lower bound on every cycle:
    ``max(D, D^T)`` (links used both ways), ``min(D, D^T)`` for directed cycles (one
    direction of each link). ``S``: ``max(D, D^T)`` where the caller holds it already
    (used only when undirected; saves an ``n x n`` pass)."""
    if directed:
        return _theta_star(np.minimum(D, D.T))
    return _theta_star(np.maximum(D, D.T) if S is None else S)


def _theta_star(S: np.ndarray) -> float:
    n = S.shape[0]
    if n == 2:
        return float(S[0, 1])
    vals = _sym_values(S)
    off = S + np.diag(np.full(n, np.inf))
    second = np.sort(off, axis=1)[:, 1].max()  # every node needs degree >= 2
    lo = int(np.searchsorted(vals, second))
    hi = len(vals) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if is_biconnected(S <= vals[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(vals[lo])


def _cycle_bottleneck(E: np.ndarray, tour: np.ndarray) -> float:
    return float(E[tour, np.roll(tour, -1)].max())


def bottleneck_tsp(
    delays: ArrayLike,
    *,
    method: TSPMethod = "2approx",
    directed: bool = False,
    metric: bool | None = None,
    metric_closure: bool = False,
    restarts: int = 4,
    random_state: Any = None,
) -> tuple[np.ndarray, float, float]:
    r"""Bottleneck travelling salesman tour: a cycle minimising its largest link delay.

    ``method="2approx"`` (Parker--Rardin) finds :math:`\theta^*`, the smallest
    threshold whose graph :math:`G(\theta^*)` is biconnected (a lower bound on the
    optimum). By Fleischner's theorem the square :math:`G(\theta^*)^2` is
    Hamiltonian and, under the triangle inequality, its links are at most
    :math:`2\theta^*`; hence the threshold graph :math:`G(\tau_H)`, with
    :math:`\tau_H` the largest delay on a link of :math:`G(\theta^*)^2`, is
    Hamiltonian too. We binary-search the smallest :math:`\tau \in [\theta^*,
    \tau_H]` at which a Pósa rotation--extension search finds a Hamiltonian cycle
    in :math:`G(\tau)` (so the result is often well below :math:`2\theta^*`), and
    verify the bottleneck. Fleischner's constructive proof is not implemented: if
    the search fails at :math:`\tau_H` (never seen on metric inputs), small
    instances fall back to the exact solver and larger ones to larger thresholds,
    with a warning when the guarantee is lost.

    ``method="exact"`` solves the problem by minimax Held--Karp dynamic
    programming (``n <= 16``).

    Parameters
    ----------
    delays : array-like of shape (n, n)
        Non-negative delays.
    method : {"2approx", "exact"}, default="2approx"
    directed : bool, default=False
        If False the cycle is undirected with link delays ``max(D, D^T)``. If True
        ``delays[u, v]`` is the delay of ``u -> v``; the 2-approximation works on
        ``max(D, D^T)`` and keeps the better traversal direction, the exact solver
        is exact for directed cycles.
    metric : bool or None, default=None
        Whether to check the ``2 theta*`` bound and warn when it fails; ``None``
        checks it when the (symmetrised) delays satisfy the triangle inequality.
    metric_closure : bool, default=False
        Replace the delays by their shortest-path closure first (``inf`` in
        ``delays`` then marks a missing link).
    restarts : int, default=4
        Random restarts of the cycle search per threshold.
    random_state : int, Generator, RandomState or None
        Seed of the randomised cycle search; ``None`` draws one seed from numpy's
        global ``RandomState`` (as scikit-learn does, so ``np.random.seed`` makes the
        call reproducible).

    Returns
    -------
    tour : ndarray of shape (n,)
        Node order of the cycle (it closes from ``tour[-1]`` back to ``tour[0]``).
    bottleneck : float
        Largest link delay on the cycle.
    theta : float
        The lower bound :math:`\theta^*` (``max(D, D^T)``; ``min(D, D^T)`` when
        ``directed``).

    References
    ----------
    .. [1] R. G. Parker and R. L. Rardin, "Guaranteed performance heuristics for the
       bottleneck traveling salesman problem", Operations Research Letters, 1984.
    .. [2] "Bottleneck Communication Delay Minimization for Communication-Efficient
       Decentralized Learning", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import bottleneck_tsp
    >>> pts = np.random.default_rng(0).random((30, 2))
    >>> D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    >>> tour, b, theta = bottleneck_tsp(D, random_state=0)
    >>> bool(theta <= b <= 2 * theta)
    True
    """
    check_bool(directed, "directed")
    check_bool(metric_closure, "metric_closure")
    if metric is not None:
        check_bool(metric, "metric")
    check_seed(random_state)  # (numpy's SeedSequence errors do not name it)
    check_in_options(method, "method", TSP_METHODS)
    check_positive(restarts, "restarts", integer=True)  # 0 searched nothing: identity tour
    D = check_delays(delays, allow_inf=bool(metric_closure), closure_param=True)
    if metric_closure:
        D = _closure(D)
    S = np.maximum(D, D.T)
    E = D if directed else S
    theta = _theta_bound(D, bool(directed), S)
    if method == "exact":
        tour, b = _exact_minimax(E)
        return tour, b, theta
    if random_state is None or isinstance(random_state, np.random.RandomState):
        # scikit-learn's None: one seed from numpy's global RandomState, so that
        # np.random.seed makes the call reproducible (default_rng(None) read OS entropy)
        random_state = int(check_random_state(random_state).randint(0, 2**31 - 1))
    rng = np.random.default_rng(random_state)
    theta_s = theta if not directed else _theta_star(S)
    tour = _two_approx_tour(S, theta_s, rng, restarts)
    if directed:
        rev = tour[::-1].copy()
        if _cycle_bottleneck(E, rev) < _cycle_bottleneck(E, tour):
            tour = rev
    b = _cycle_bottleneck(E, tour)
    # relative tolerance only: an absolute one would hide (or invent) a violation when
    # the delays' unit makes them tiny
    exceeded = _cycle_bottleneck(S, tour) > 2 * theta_s * (1 + 1e-9)
    if exceeded and (_is_metric(S) if metric is None else bool(metric)):
        warnings.warn(f"bottleneck {b:.6g} exceeds 2 * theta* = {2 * theta_s:.6g} although "
                      "the delays are metric: the cycle search failed.", RuntimeWarning,
                      stacklevel=2)
    return tour, b, theta


def _is_metric(S: np.ndarray, tol: float = 1e-9) -> bool:
    """Triangle inequality up to a relative ``tol`` (scale-free: the same answer in
    any unit of the delays)."""
    n = S.shape[0]
    step = block_rows_for(n * n)
    for a in range(0, n, step):
        via = (S[:, a:a + step, None] + S[None, a:a + step, :]).min(axis=1)
        if (S > via * (1 + tol)).any():
            return False
    return True
