"""Synthetic delay matrices of physical networks (no downloads)."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, get_args, overload

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import minimum_spanning_tree, shortest_path

from mlpapers._utils import check_bool, check_in_options, check_positive, check_random_state

__all__ = ["make_delay_matrix"]

#: ``make_delay_matrix(kind=...)``; ``KINDS`` lists its values.
DelayKind: TypeAlias = Literal["geometric", "clustered", "backbone"]
KINDS: tuple[str, ...] = get_args(DelayKind)


@overload
def make_delay_matrix(
    n: int, kind: DelayKind = ..., *, extent: float = ..., per_unit: float = ...,
    overhead: float = ..., n_clusters: int = ..., n_neighbors: int = ...,
    return_positions: Literal[False] = ..., random_state: Any = ...,
) -> np.ndarray: ...
@overload
def make_delay_matrix(
    n: int, kind: DelayKind = ..., *, extent: float = ..., per_unit: float = ...,
    overhead: float = ..., n_clusters: int = ..., n_neighbors: int = ...,
    return_positions: Literal[True], random_state: Any = ...,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def make_delay_matrix(
    n: int, kind: DelayKind = ..., *, extent: float = ..., per_unit: float = ...,
    overhead: float = ..., n_clusters: int = ..., n_neighbors: int = ...,
    return_positions: bool = ..., random_state: Any = ...,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def make_delay_matrix(
    n: int,
    kind: DelayKind = "geometric",
    *,
    extent: float = 3000.0,
    per_unit: float = 0.0085,
    overhead: float = 4.0,
    n_clusters: int = 6,
    n_neighbors: int = 3,
    return_positions: bool = False,
    random_state: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Delays between ``n`` nodes of a synthetic physical network (a symmetric metric).

    Nodes are points in an ``extent x extent`` square (miles). Link delays follow
    the official code's ``.gml`` convention ``per_unit * length + overhead`` (ms):

    * ``"geometric"``: uniform points, a direct link between every pair;
    * ``"clustered"``: points in ``n_clusters`` Gaussian metro areas (std
      ``extent / 40``) around uniform centres, direct links;
    * ``"backbone"``: uniform points joined by a sparse backbone (each node to its
      ``n_neighbors`` nearest, plus a Euclidean minimum spanning tree for
      connectivity); delays are shortest paths, so multi-hop pairs pay the
      per-hop overhead several times, as in ISP backbone graphs.

    Parameters
    ----------
    n : int
        Number of nodes (``>= 2``).
    kind : {"geometric", "clustered", "backbone"}, default="geometric"
    extent : float, default=3000.0
        Side of the square, in length units.
    per_unit, overhead : float, default=0.0085, 4.0
        Delay per length unit and per hop.
    n_clusters : int, default=6
        Metro areas of ``"clustered"``.
    n_neighbors : int, default=3
        Nearest-neighbour links per node of ``"backbone"``.
    return_positions : bool, default=False
        Also return the node coordinates and (for ``"backbone"``) the link list.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the node positions (and of the cluster centres and memberships);
        ``None`` draws from numpy's global RNG, as in scikit-learn, and a
        ``Generator`` seeds the draws from one of its numbers.

    Returns
    -------
    delays : ndarray of shape (n, n), float64
        Symmetric, zero diagonal, satisfies the triangle inequality.
    positions : ndarray of shape (n, 2)
        Only with ``return_positions``.
    links : ndarray of shape (m, 2)
        Physical links (all pairs for the complete kinds); only with
        ``return_positions``.

    Examples
    --------
    >>> from mlpapers.decentralized.btsp import make_delay_matrix
    >>> D = make_delay_matrix(8, "backbone", random_state=0)
    >>> D.shape, bool((D == D.T).all())
    ((8, 8), True)
    """
    check_bool(return_positions, "return_positions")
    check_positive(n, "n", integer=True)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}.")
    check_in_options(kind, "kind", KINDS)
    check_positive(extent, "extent")
    check_positive(per_unit, "per_unit", strict=False)
    check_positive(overhead, "overhead", strict=False)
    check_positive(n_clusters, "n_clusters", integer=True)
    check_positive(n_neighbors, "n_neighbors", integer=True)
    rng = check_random_state(random_state)
    if kind == "clustered":
        centres = rng.uniform(0, extent, size=(n_clusters, 2))
        labels = rng.randint(n_clusters, size=n)
        pos = centres[labels] + rng.normal(scale=extent / 40, size=(n, 2))
    else:
        pos = rng.uniform(0, extent, size=(n, 2))
    dist = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=-1)
    if kind != "backbone":
        D = per_unit * dist + overhead
        np.fill_diagonal(D, 0.0)
        iu = np.triu_indices(n, 1)
        links = np.stack(iu, 1)
    else:
        k = min(n_neighbors, n - 1)
        near = np.argsort(dist + np.diag(np.full(n, np.inf)), axis=1)[:, :k]
        adj = np.zeros((n, n), dtype=bool)
        adj[np.repeat(np.arange(n), k), near.ravel()] = True
        mst = minimum_spanning_tree(csr_matrix(np.triu(dist, 1))).toarray() > 0
        adj |= mst
        adj |= adj.T
        np.fill_diagonal(adj, False)
        rows, cols = np.nonzero(adj)
        w = per_unit * dist[rows, cols] + overhead
        # a zero-delay link is a stored zero, which csgraph reads as an edge of weight 0
        D = shortest_path(csr_matrix((w, (rows, cols)), shape=(n, n)), method="D",
                          directed=False)
        links = np.stack(np.nonzero(np.triu(adj, 1)), 1)
    D = 0.5 * (D + D.T)
    if return_positions:
        return D, pos, links
    return D
