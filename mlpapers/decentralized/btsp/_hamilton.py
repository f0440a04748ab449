"""Hamiltonian cycles in threshold graphs: Posa search, the 2-approximation, exact DP."""

from __future__ import annotations

import numpy as np

#: Largest ``n`` of the exact minimax Held--Karp solver (``2**(n-1) * (n-1)`` states).
EXACT_MAX_N = 16


def _nz(mask: np.ndarray) -> np.ndarray:
    return mask.nonzero()[0]


def _sym_values(S: np.ndarray) -> np.ndarray:
    """The sorted distinct delays of a symmetric ``S`` off the diagonal: the candidate
    thresholds of the searches over threshold graphs."""
    return np.unique(S[np.triu_indices(S.shape[0], 1)])


def _posa_cycle(A: np.ndarray, rng: np.random.Generator, max_steps: int) -> np.ndarray | None:
    """Posa rotation--extension search for a Hamiltonian cycle in boolean ``A``.

    Extensions follow Warnsdorff's rule (fewest unvisited neighbours, random ties);
    a stuck endpoint rotates the path through a random neighbour on it, and a
    Hamiltonian path is closed by a rotation whose new endpoint sees the start.
    Returns the cycle as an order of the ``n`` nodes, or None after ``max_steps``.
    Every node must have at least 2 neighbours and none itself (:func:`_find_cycle`).
    """
    n = A.shape[0]
    start = int(rng.integers(n))
    path = np.empty(n, dtype=np.int64)
    pos = np.full(n, -1, dtype=np.int64)
    unvisited = np.ones(n, dtype=bool)
    free_deg = A.sum(axis=1).astype(np.int64)  # neighbours not on the path
    path[0], pos[start], L = start, 0, 1
    unvisited[start] = False
    free_deg -= A[:, start]
    for _ in range(max_steps):
        end = path[L - 1]
        if L == n:
            if A[end, path[0]]:
                return path.copy()
            nb = _nz(A[end])
            j = pos[nb]
            j = j[j < n - 2]
            good = j[A[path[j + 1], path[0]]]
            if good.size:
                k = int(good[rng.integers(good.size)])
                path[k + 1:] = path[k + 1:][::-1]
                return path.copy()
            if rng.random() < 0.5:  # rotate at the other end too
                path[:] = path[::-1]
                pos[path] = np.arange(n)
                continue
        else:
            cand = _nz(A[end] & unvisited)
            if cand.size:
                deg = free_deg[cand]
                best = cand[deg == deg.min()]
                w = int(best[rng.integers(best.size)])
                path[L], pos[w] = w, L
                unvisited[w] = False
                free_deg -= A[:, w]
                L += 1
                continue
            if rng.random() < 0.1:
                path[:L] = path[:L][::-1]
                pos[path[:L]] = np.arange(L)
                continue
        # rotation through a random on-path neighbour w = path[j], j < L - 2: one exists, as
        # all of end's (>= 2) neighbours are on the path here and path[L - 2] is only one
        nb = _nz(A[end] & ~unvisited)
        j = pos[nb]
        j = j[j < L - 2]
        k = int(j[rng.integers(j.size)])
        path[k + 1:L] = path[k + 1:L][::-1]
        pos[path[k + 1:L]] = np.arange(k + 1, L)
    return None


def _find_cycle(A: np.ndarray, rng: np.random.Generator, restarts: int) -> np.ndarray | None:
    """A Hamiltonian cycle of the graph ``A`` (``n >= 3`` nodes; the diagonal is
    ignored) by ``restarts`` Posa searches, or None when none finds one."""
    A = A.copy()
    np.fill_diagonal(A, False)
    # a node with fewer than 2 neighbours lies on no cycle; the Posa search relies on it
    if (A.sum(axis=1) < 2).any():
        return None
    n = A.shape[0]
    for _ in range(restarts):
        cyc = _posa_cycle(A, rng, max_steps=8 * n + 200)
        if cyc is not None:
            return cyc
    return None


def _exact_minimax(E: np.ndarray) -> tuple[np.ndarray, float]:
    """Exact bottleneck Hamiltonian cycle by minimax Held--Karp dynamic programming.

    ``best[mask, v]`` is the smallest possible largest link delay of a path that
    starts at node 0, visits exactly the nodes of ``mask`` (over nodes ``1..n-1``)
    and ends at ``v``. Layers of equal popcount are processed with vectorised
    numpy operations. ``O(2^n n^2)`` time, ``O(2^n n)`` memory; ``E`` may be
    asymmetric (``E[u, v]`` for ``u -> v``).
    """
    n = E.shape[0]
    if n > EXACT_MAX_N:  # reached from bottleneck_tsp(method="exact"); the others check first
        raise ValueError(f"method='exact' (minimax Held--Karp, 2**(n-1) * (n-1) states) is "
                         f"limited to n <= {EXACT_MAX_N}, got n={n}.")
    if n == 2:
        return np.array([0, 1]), float(max(E[0, 1], E[1, 0]))
    m = n - 1
    full = 1 << m
    best = np.full((full, m), np.inf)
    for v in range(m):
        best[1 << v, v] = E[0, v + 1]
    masks = np.arange(full)
    pop = np.zeros(full, dtype=np.int64)
    for b in range(m):
        pop += (masks >> b) & 1
    into = E[1:, 1:]  # into[u, v] = E[u+1, v+1]
    for k in range(2, m + 1):
        layer = masks[pop == k]
        for v in range(m):
            Mv = layer[((layer >> v) & 1) == 1]
            prev = Mv ^ (1 << v)
            best[Mv, v] = np.maximum(best[prev], into[:, v][None, :]).min(axis=1)
    final = np.maximum(best[full - 1], E[1:, 0])
    v = int(final.argmin())
    value = float(final[v])
    tour = [v]
    mask = full - 1
    while True:
        prev = mask ^ (1 << v)
        if prev == 0:
            break
        cost = np.maximum(best[prev], into[:, v])
        u = int(_nz(cost <= best[mask, v])[0])
        tour.append(u)
        mask, v = prev, u
    order = np.array([0] + [t + 1 for t in reversed(tour)], dtype=np.int64)
    return order, value


def _two_approx_tour(S: np.ndarray, theta: float, rng, restarts: int) -> np.ndarray:
    """The 2-approximation's cycle on symmetric delays ``S`` (see :func:`bottleneck_tsp`).

    Binary search, over the distinct delays in ``[theta, tau_H]`` (``tau_H`` the largest
    delay on a link of ``G(theta)^2``), for the smallest threshold at which the Posa
    search (:func:`_find_cycle`) finds a Hamiltonian cycle. ``G(tau_H)`` contains
    ``G(theta)^2``, the square of a biconnected graph, which is Hamiltonian for any
    delays (Fleischner's theorem; metric delays only add ``tau_H <= 2 theta``). The
    Posa search is a heuristic that can still miss that cycle: then ``n <= 16`` falls
    back to the exact solver and larger ``n`` doubles the search interval.
    """
    n = S.shape[0]
    if n <= 3:
        return np.arange(n)
    G = S <= theta
    np.fill_diagonal(G, False)
    Gf = G.astype(np.float32)
    H = ((Gf @ Gf) > 0) | G
    np.fill_diagonal(H, False)
    tau_h = float(S[H].max())
    vals = _sym_values(S)
    lo = int(np.searchsorted(vals, theta))
    hi = int(np.searchsorted(vals, tau_h))
    found = _find_cycle(S <= vals[hi], rng, restarts)
    if found is None:
        if n <= EXACT_MAX_N:
            return _exact_minimax(S)[0]
        while found is None and hi < len(vals) - 1:
            hi = min(len(vals) - 1, 2 * hi - lo + 1)
            found = _find_cycle(S <= vals[hi], rng, restarts)
        if found is None:  # the complete graph: any order is a cycle
            found = np.arange(n)
    best = found
    if lo < hi:  # theta* itself often suffices: try it first
        cyc = _find_cycle(S <= vals[lo], rng, restarts)
        if cyc is not None:
            return cyc
        lo += 1
    while lo < hi:  # smallest threshold with a cycle found; keep the best cycle seen
        mid = (lo + hi) // 2
        cyc = _find_cycle(S <= vals[mid], rng, restarts)
        if cyc is None:
            lo = mid + 1
        else:
            best, hi = cyc, mid
    return best
