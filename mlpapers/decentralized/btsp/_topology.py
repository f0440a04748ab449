"""Circulant communication schedules, their mixing matrices, and delay-matrix helpers.

Convention: in round ``l`` of a schedule ``[S_1, ..., S_tau]`` every virtual node ``i``
*sends* to virtual node ``(i + s) mod n`` for every skip ``s`` in ``S_l`` (equivalently,
node ``j`` receives from ``j - s``). One period is ``tau`` rounds.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from mlpapers._utils import ArrayLike, check_bool, check_positive, check_tensor, to_numpy

__all__ = [
    "MAX_DELAY",
    "TOPOLOGIES",
    "check_assignment",
    "check_delays",
    "circulant_schedule",
    "delays_from_graph",
    "metric_closure",
    "mixing_matrices",
    "scale_schedule",
]

#: Names accepted by :func:`circulant_schedule` (aliases of the official code included).
TOPOLOGIES = (
    "ring",
    "exponential",
    "one_peer_exponential",
    "sparse_exponential",
)
_ALIASES = {
    "exp": "exponential",
    "one_peer_exp": "one_peer_exponential",
    "sparse_exp": "sparse_exponential",
}

Schedule = list[list[int]]

#: What the estimators take as ``topology``: a name (see :func:`circulant_schedule`), or
#: explicit skips: one flat round of integers, or rounds of them (sequences or arrays).
TopologyLike: TypeAlias = (str | Sequence[int] | Sequence[Sequence[int] | np.ndarray]
                           | np.ndarray)


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an integer, got {n!r} of type {type(n).__name__}.")
    if n < 2:
        raise ValueError(f"n must be >= 2 (a topology needs two nodes), got {n}.")
    return int(n)


def circulant_schedule(n: int, topology: TopologyLike = "exponential") -> Schedule:
    """Skip sets of a circulant (time-varying) topology on ``n`` virtual nodes.

    With ``k_max = floor(log2(n - 1))`` there are ``ceil(log2 n)`` powers of two
    ``1, 2, ..., 2**k_max`` below ``n``:

    * ``"ring"``: ``[[1]]``;
    * ``"exponential"`` (static exponential graph of Ying et al.): one round with all
      powers of two, ``[[1, 2, 4, ..., 2**k_max]]``;
    * ``"one_peer_exponential"``: one power of two per round,
      ``[[1], [2], ..., [2**k_max]]`` (``tau = ceil(log2 n)`` rounds);
    * ``"sparse_exponential"``: ``[[1, 2**(k_max - 1)]]`` (duplicates removed).

    Parameters
    ----------
    n : int
        Number of nodes (``>= 2``).
    topology : str, sequence or ndarray
        One of ``TOPOLOGIES`` (or the aliases ``"exp"``, ``"one_peer_exp"``,
        ``"sparse_exp"`` of the official code; case, spaces and hyphens are ignored,
        so ``"one-peer exponential"`` works), or explicit skips: a sequence (or
        array) of rounds, each a sequence (or array) of integer skips. A flat
        sequence of integers is one round. Skips are reduced modulo ``n``; a skip
        ``0 mod n`` is an error.

    Returns
    -------
    schedule : list of list of int
        ``schedule[l]`` are the sorted, distinct skips of round ``l``, each in
        ``1..n-1``.

    Examples
    --------
    >>> from mlpapers.decentralized.btsp import circulant_schedule
    >>> circulant_schedule(9, "exponential")
    [[1, 2, 4, 8]]
    >>> circulant_schedule(8, "one_peer_exponential")
    [[1], [2], [4]]
    """
    n = _check_n(n)
    if isinstance(topology, str):
        # the and paper's prose spellings ("one-peer exponential") name the same
        # topologies: case, spaces and hyphens are not significant
        key = "_".join(topology.strip().lower().replace("-", " ").split())
        name = _ALIASES.get(key, key)
        if name not in TOPOLOGIES:
            raise ValueError(
                f"topology must be one of {list(TOPOLOGIES)} or a sequence of skip sets, "
                f"got {topology!r}."
            )
        # in integers: float log2(2**k - 1) rounds up to k for k >= 49, and the skip
        # 2**k = n (0 mod n, a node sending to itself) entered the schedule
        k_max = (n - 1).bit_length() - 1
        powers = [1 << k for k in range(k_max + 1)]
        if name == "ring":
            rounds: list[list[int]] = [[1]]
        elif name == "exponential":
            rounds = [powers]
        elif name == "one_peer_exponential":
            rounds = [[p] for p in powers]
        else:
            rounds = [[1, 1 << max(k_max - 1, 0)]]
        return [sorted(set(r)) for r in rounds]
    return _explicit_schedule(n, topology)


def _explicit_schedule(n: int, topology: Any) -> Schedule:
    if isinstance(topology, np.ndarray):
        topology = topology.tolist()
    if not isinstance(topology, Sequence) or len(topology) == 0:
        raise ValueError(
            "topology must be a topology name or a non-empty sequence of skip sets, "
            f"got {topology!r}."
        )
    # a flat list of scalars is one round (its non-integers then raise the skips'
    # TypeError: [1, 2.5] was read as rounds and the valid skip 1 named as a bad round)
    if not any(isinstance(s, Sequence | np.ndarray) and not isinstance(s, str)
               for s in topology):
        topology = [topology]
    rounds = []
    for l, skips in enumerate(topology):
        if isinstance(skips, np.ndarray):
            skips = skips.tolist()
        if not isinstance(skips, Sequence) or len(skips) == 0:
            raise ValueError(f"topology round {l} must be a non-empty sequence of skips, "
                             f"got {skips!r}.")
        red = set()
        for s in skips:
            if isinstance(s, bool) or not isinstance(s, numbers.Integral):
                raise TypeError(f"topology skips must be integers, got {s!r} in round {l} "
                                "(each round lists its skips: a circulant schedule, "
                                "not a mixing matrix).")
            if int(s) % n == 0:
                raise ValueError(f"skip {s} in round {l} is 0 modulo n={n}: a node cannot "
                                 "send to itself.")
            red.add(int(s) % n)
        rounds.append(sorted(red))
    return rounds


def scale_schedule(schedule: TopologyLike, c: int, n: int) -> Schedule:
    """Multiply every skip by ``c`` modulo ``n`` (the schedule ``c * S`` of the MSR step).

    ``bottleneck_delay(D, multiplier_relabel(pi, c), S) == bottleneck_delay(D, pi, c * S)``
    for every ``c`` coprime with ``n``.

    Parameters
    ----------
    schedule : str, sequence or ndarray
        Skip sets, one per round, as returned by :func:`circulant_schedule`; anything
        that function accepts as ``topology`` (a topology name, a flat list of
        skips) is read the same way, and skips are reduced modulo ``n``.
    c : int
        Multiplier, coprime with ``n``.
    n : int
        Number of nodes (the modulus).

    Returns
    -------
    list of list of int
        The skip sets ``{c * s mod n : s in S_l}`` of each round, sorted.

    Raises
    ------
    ValueError
        If ``c`` is not coprime with ``n`` (a skip could become 0, and the schedule
        would no longer be the relabelling of the original), or a skip is ``0 mod n``.
    TypeError
        If ``c``, ``n`` or a skip is not an integer.

    Examples
    --------
    >>> from mlpapers.decentralized.btsp import circulant_schedule, scale_schedule
    >>> scale_schedule(circulant_schedule(8, "one_peer_exponential"), 3, 8)
    [[3], [6], [4]]
    """
    for name, v in (("c", c), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an integer, got {v!r}.")
    if math.gcd(int(c), int(n)) != 1:
        raise ValueError(f"c={c} is not coprime with n={n}.")
    # validated as circulant_schedule's topology: a skip 0 mod n (a node sending to
    # itself) or a fractional skip was scaled into an invalid schedule without an error
    schedule = circulant_schedule(int(n), schedule)
    return [sorted({(int(c) * s) % int(n) for s in r}) for r in schedule]


def mixing_matrices(n: int, topology: TopologyLike = "exponential") -> np.ndarray:
    """Doubly stochastic gossip matrices of a circulant schedule, in virtual indices.

    Round ``l`` uses ``W_l = (I + sum_{s in S_l} P^s) / (|S_l| + 1)`` where
    ``(P^s x)_j = x_{j - s}``: node ``j`` averages its own value with those received
    from ``j - s``. Each ``W_l`` is circulant, hence doubly stochastic. For the
    one-peer exponential graph with ``n = 2**k`` the product over one period is
    exactly ``11^T / n`` (finite-time consensus).

    Parameters
    ----------
    n : int
        Number of nodes.
    topology : str, sequence or ndarray
        As in :func:`circulant_schedule`.

    Returns
    -------
    W : ndarray of shape (tau, n, n), float64
        ``W[l]`` is the mixing matrix of round ``l``; ``x <- W[l] @ x`` mixes rows.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import mixing_matrices
    >>> W = mixing_matrices(8, "one_peer_exponential")
    >>> W.shape
    (3, 8, 8)
    >>> bool(np.allclose(W[2] @ W[1] @ W[0], np.full((8, 8), 1 / 8)))  # exact consensus
    True
    """
    schedule = circulant_schedule(n, topology)
    W = np.zeros((len(schedule), n, n))
    for l, skips in enumerate(schedule):
        W[l] = round_mixing_matrix(n, skips)
    return W


def round_mixing_matrix(n: int, skips: Any) -> np.ndarray:
    """The ``(n, n)`` float64 mixing matrix of one round of skips (virtual indices), as
    in :func:`mixing_matrices`; one round at a time keeps a large network's memory at
    one ``n x n`` matrix."""
    W = np.zeros((n, n))
    rows = np.arange(n)
    w = 1.0 / (len(skips) + 1)
    W[rows, rows] += w
    for s in skips:
        W[rows, (rows - s) % n] += w
    return W


#: Largest accepted delay: per-period sums of round bottlenecks, simulated times and
#: shortest-path sums of larger finite values could overflow float64.
MAX_DELAY = 1e300


def check_delays(delays: Any, name: str = "delays", *, allow_inf: bool = False,
                 closure_param: bool = False) -> np.ndarray:
    """Validate a delay matrix: square, at least 2x2, finite and non-negative.

    Returns a float64 numpy copy. The diagonal is ignored by every routine (a node
    never sends to itself) and is set to 0, whatever it held (NaN and inf included).

    Parameters
    ----------
    delays : array-like of shape (n, n)
    name : str, default="delays"
        The argument's name, used in error messages.
    allow_inf : bool, default=False
        Accept ``inf`` off the diagonal (no direct link), as the input of
        :func:`metric_closure` does.
    closure_param : bool, default=False
        The caller takes ``metric_closure=True``: the error for ``inf`` suggests it
        besides :func:`metric_closure`.

    Notes
    -----
    Delays are compared and summed in float64: integer delays above ``2**53`` are
    rounded (distinct values may then tie), and delays above ``1e300`` are rejected
    (sums of round bottlenecks would overflow); every result is proportional to the
    delays' unit, so rescale such inputs.
    """
    t = check_tensor(delays, name=name, ndim=2, dtype="float64", min_samples=2,
                     min_features=2, allow_nan=True)
    D = to_numpy(t).astype(np.float64, copy=True)
    if D.shape[0] != D.shape[1]:
        raise ValueError(f"{name} must be a square (n, n) matrix, got shape {D.shape}.")
    np.fill_diagonal(D, 0.0)
    if np.isnan(D).any():
        i, j = np.argwhere(np.isnan(D))[0]
        raise ValueError(f"{name} contains NaN (first at [{i}, {j}]).")
    if (D < 0).any():
        raise ValueError(f"{name} must be non-negative, found min {D.min():.4g}.")
    inf = np.isinf(D)
    if inf.any() and not allow_inf:
        i, j = np.argwhere(inf)[0]
        # (metric_closure=True was suggested to callers that have no such parameter)
        fix = "metric_closure(delays) or metric_closure=True" if closure_param else (
            "metric_closure(delays)")
        raise ValueError(
            f"{name} contains infinity (first at [{i}, {j}]): every ordered pair of nodes "
            "needs a finite delay. For link delays with inf between non-adjacent "
            f"nodes, take the shortest-path delays first: {fix}.")
    if (D[~inf] > MAX_DELAY).any():
        raise ValueError(f"{name} must be at most {MAX_DELAY:g}, found {D[~inf].max():.4g}: "
                         "sums of such delays overflow float64; rescale them (every result "
                         "is proportional to the delays' unit).")
    return D


def check_assignment(assignment: Any, n: int, name: str = "assignment") -> np.ndarray:
    """Validate a permutation of ``0..n-1`` (virtual position -> physical node)."""
    a = np.asarray(to_numpy(assignment) if not isinstance(assignment, np.ndarray)
                   else assignment)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"{name} must be a 1D array of length n={n}, got shape {a.shape}.")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise TypeError(f"{name} must contain integers.")
    elif a.dtype.kind not in "iu":
        raise TypeError(f"{name} must contain integers, got dtype {a.dtype}.")
    a = a.astype(np.int64)
    if not np.array_equal(np.sort(a), np.arange(n)):
        raise ValueError(f"{name} must be a permutation of 0..{n - 1}.")
    return a


def metric_closure(delays: ArrayLike) -> np.ndarray:
    """Shortest-path (Floyd--Warshall) closure of a delay matrix.

    The result satisfies the triangle inequality, which the ``2 theta*`` guarantee
    of :func:`~mlpapers.decentralized.btsp.bottleneck_tsp` needs. ``inf`` marks a
    missing link (e.g. ``delays_from_graph(G, shortest_paths=False)``); every pair
    must be joined by a path. Vectorised over the ``(n, n)`` matrix, ``O(n^3)``
    time, ``O(n^2)`` memory.

    Parameters
    ----------
    delays : array-like of shape (n, n), n >= 2
        Non-negative link delays, ``delays[u, v]`` from ``u`` to ``v``; ``inf`` (or
        any delay larger than a path through other nodes) is replaced by the
        shortest path. The diagonal is ignored.

    Returns
    -------
    ndarray of shape (n, n), float64
        Shortest-path delays: ``D[u, v] <= D[u, w] + D[w, v]`` for all nodes, zero
        diagonal, symmetric when ``delays`` is.

    Raises
    ------
    ValueError
        If some node cannot reach another (the graph of finite delays is not
        strongly connected).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import metric_closure
    >>> metric_closure([[0, 1, np.inf], [1, 0, 2], [np.inf, 2, 0]])
    array([[0., 1., 3.],
           [1., 0., 2.],
           [3., 2., 0.]])
    """
    D = check_delays(delays, allow_inf=True)
    for k in range(D.shape[0]):
        np.minimum(D, D[:, k, None] + D[None, k, :], out=D)
    if not np.isfinite(D).all():
        i, j = np.argwhere(~np.isfinite(D))[0]
        raise ValueError(f"delays has no path of finite delays from node {i} to node {j}: "
                         "the physical network is disconnected.")
    if (D > MAX_DELAY).any():  # path sums of delays below the bound can exceed it
        raise ValueError(f"shortest-path delays reach {D.max():.4g}, above {MAX_DELAY:g}: "
                         "rescale the delays (every result is proportional to their unit).")
    return D


def _as_length(value) -> float | None:
    """``float(value)`` for a link length (numbers and numeric strings), else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def delays_from_graph(
    G: Any,
    *,
    length_attr: str | None = "distance",
    per_unit: float = 0.0085,
    overhead: float = 4.0,
    shortest_paths: bool = True,
    nodelist: Sequence | None = None,
) -> np.ndarray:
    """Delay matrix of a physical network given as a :mod:`networkx` graph.

    Each link gets the delay ``per_unit * length + overhead`` (the official code's
    defaults: ``0.0085`` ms per mile of fibre plus a 4 ms per-hop overhead); node
    pairs then get the shortest-path (Dijkstra) delay, so the matrix is a symmetric
    metric for an undirected graph. Between parallel edges of a multigraph the
    shortest counts (as for networkx's shortest paths).

    Parameters
    ----------
    G : networkx.Graph
        Physical network (``Graph``, ``DiGraph``, ``MultiGraph`` or
        ``MultiDiGraph``; any hashable node labels). Directed graphs give directed
        (asymmetric) delays.
    length_attr : str or None, default="distance"
        Edge attribute with the link length. Every edge must have it. ``None``
        for an unweighted graph: every link has length 0, so a delay is
        ``overhead`` times the hop count.
    per_unit : float, default=0.0085
        Delay per unit of length.
    overhead : float, default=4.0
        Fixed delay per hop.
    shortest_paths : bool, default=True
        If False, return the direct link delays with ``inf`` between non-adjacent
        nodes (for plotting; the assignment routines need finite delays).
    nodelist : sequence, optional
        Node order of the rows; default ``list(G.nodes)`` (for a graph read by
        :func:`networkx.read_gml`, the order of the file). The official code sorts
        the labels instead: ``nodelist=sorted(G.nodes)`` reproduces its matrix (and
        hence its ``no_opt`` identity baseline) exactly.

    Returns
    -------
    delays : ndarray of shape (n, n), float64
        ``delays[i, j]`` between ``nodelist[i]`` and ``nodelist[j]``: the
        shortest-path delay, or the direct link delay (``inf`` without a link) with
        ``shortest_paths=False``; zero diagonal.

    Raises
    ------
    ImportError
        If networkx is not installed.
    ValueError
        If an edge lacks ``length_attr`` or the graph is not connected (with
        ``shortest_paths=True``).

    Examples
    --------
    >>> import networkx as nx
    >>> from mlpapers.decentralized.btsp import delays_from_graph
    >>> G = nx.Graph()
    >>> G.add_edge("a", "b", distance=100.0)  # miles
    >>> G.add_edge("b", "c", distance=200.0)
    >>> delays_from_graph(G).round(2)  # 0.0085 ms per mile + 4 ms per hop
    array([[ 0.  ,  4.85, 10.55],
           [ 4.85,  0.  ,  5.7 ],
           [10.55,  5.7 ,  0.  ]])
    """
    check_bool(shortest_paths, "shortest_paths")
    try:
        import networkx as nx  # noqa: F401  (only to give a clear error)
    except ImportError as exc:  # pragma: no cover - networkx ships with torch
        raise ImportError(
            "delays_from_graph needs networkx: pip install 'mlpapers[graph]' "
            "(or pip install networkx)."
        ) from exc
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    # (a bad one was reported as "edge ... has an invalid delay", naming no parameter)
    check_positive(per_unit, "per_unit", strict=False)
    check_positive(overhead, "overhead", strict=False)

    # (anything else, e.g. a numpy matrix, failed with an AttributeError on G.nodes)
    if not all(hasattr(G, a) for a in ("nodes", "edges", "is_directed")):
        hint = (": a delay matrix is used as it is (or metric_closure(delays)); an "
                "adjacency matrix converts with networkx.from_numpy_array"
                if isinstance(G, np.ndarray) or hasattr(G, "__array__") else "")
        raise TypeError(f"G must be a networkx graph, got {type(G).__name__}{hint}.")
    nodes = list(G.nodes) if nodelist is None else list(nodelist)
    index = {u: i for i, u in enumerate(nodes)}
    if len(index) != len(nodes) or set(index) != set(G.nodes):
        raise ValueError("nodelist must list every node of G exactly once.")
    n = len(nodes)
    if n < 2:
        raise ValueError(f"G must have at least 2 nodes, got {n}.")
    link = np.full((n, n), np.inf)
    directed = G.is_directed()
    for u, v, data in G.edges(data=True):
        if u == v:
            continue
        if length_attr is not None and length_attr not in data:
            have = sorted(str(k) for k, val in data.items() if _as_length(val) is not None)
            hint = (f"; its numeric attributes are {have}: pass length_attr=<one of them>"
                    if have else "")
            raise ValueError(f"edge ({u!r}, {v!r}) has no {length_attr!r} attribute{hint}. "
                             "Pass length_attr=None for an unweighted graph (hop-count "
                             "delays); for a graph with node coordinates only, store each "
                             "link's length as an edge attribute first (see the user guide).")
        length = 0.0 if length_attr is None else _as_length(data[length_attr])
        if length is None:
            raise ValueError(f"edge ({u!r}, {v!r}) has a non-numeric {length_attr!r} "
                             f"attribute ({data[length_attr]!r}); length_attr must name a "
                             "numeric link length.")
        if not (math.isfinite(length) and length >= 0):
            # (a negative length passed when the overhead made its delay positive)
            raise ValueError(f"edge ({u!r}, {v!r}) has {length_attr!r} = {length!r}: link "
                             "lengths must be finite and >= 0.")
        d = per_unit * length + overhead
        if not d <= MAX_DELAY:
            # (their shortest-path sums overflowed to inf, reported as "not connected")
            raise ValueError(f"edge ({u!r}, {v!r}) has a delay per_unit * length + overhead "
                             f"= {d:.4g} above {MAX_DELAY:g}: sums of such delays overflow "
                             "float64; rescale the lengths or per_unit (every result is "
                             "proportional to the delays' unit).")
        i, j = index[u], index[v]
        for a, b in ((i, j),) if directed else ((i, j), (j, i)):
            link[a, b] = min(link[a, b], d)  # parallel edges: the shortest link
    np.fill_diagonal(link, 0.0)
    if not shortest_paths:
        return link
    finite = np.isfinite(link) & ~np.eye(n, dtype=bool)
    # a zero-delay link is an explicitly stored zero, which scipy.sparse.csgraph reads
    # as an edge of weight 0 (only absent entries are non-edges): no shift to a tiny
    # positive delay is needed (one zeroed every delay of a network in a tiny unit)
    rows, cols = np.nonzero(finite)
    graph = csr_matrix((link[rows, cols], (rows, cols)), shape=(n, n))
    D = shortest_path(graph, method="D", directed=True)
    if not np.all(np.isfinite(D)):
        raise ValueError("G is not (strongly) connected: some node pairs have no path.")
    if not directed:
        # Dijkstra from u and from v add the same links in opposite orders: the two sums
        # can differ in the last bit; the matrix of an undirected graph is symmetric
        np.minimum(D, D.T, out=D)
    return D
