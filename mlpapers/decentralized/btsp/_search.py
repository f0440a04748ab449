"""Assignment searches on a fixed schedule: MSR multipliers and the baselines.

All functions take the link-delay matrix ``E`` (``E[u, v]`` for a message
``u -> v``; already symmetrised in undirected mode) and a validated schedule.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mlpapers.decentralized.btsp._bottleneck import _argmin_total, _exact_sum, _round_maxima
from mlpapers.decentralized.btsp._hamilton import EXACT_MAX_N, _exact_minimax

#: Largest ``n`` of the brute-force exact solver for schedules other than a ring.
BRUTE_FORCE_MAX_N = 10


def coprime_multipliers(n: int) -> np.ndarray:
    """Multipliers ``c`` in ``1..n-1`` with ``gcd(c, n) = 1`` (``[1]`` for ``n = 2``)."""
    c = np.arange(1, max(n, 2))
    return c[np.gcd(c, n) == 1]


def relabel(perm: np.ndarray, c: int) -> np.ndarray:
    """``pi'(i) = pi(c * i mod n)``."""
    n = perm.shape[0]
    return perm[(int(c) * np.arange(n)) % n]


def msr(E: np.ndarray, perm: np.ndarray, schedule) -> tuple[int, np.ndarray, np.ndarray]:
    """Best multiplier: returns ``(c, relabelled perm, per-round maxima)``.

    Every unit ``c`` of ``Z_n`` is scored in one batched evaluation; ``c = 1`` comes
    first and ties keep the smallest ``c``, so the result is never worse than ``perm``.
    Near-ties of the per-period sums are resolved exactly (:func:`_argmin_total`).
    """
    n = perm.shape[0]
    cs = coprime_multipliers(n)
    batch = perm[(cs[:, None] * np.arange(n)[None, :]) % n]  # (phi(n), n)
    rounds = _round_maxima(E, batch, schedule)
    k = _argmin_total(rounds)
    return int(cs[k]), batch[k].copy(), rounds[k]


def greedy(E: np.ndarray, schedule, rng: np.random.Generator) -> np.ndarray:
    """Greedy construction of the official code, vectorised over candidates.

    A random node takes position 0; position ``k`` then gets the unplaced node that
    minimises the partial BCD, counting only links whose two ends are placed.
    Ties are broken uniformly at random (the official code keeps the lowest node
    id; with that rule and the same first node the two agree exactly).
    ``O(n^2 sum |S_l|)`` work in ``O(n tau)`` vectorised steps.
    """
    n = E.shape[0]
    perm = np.full(n, -1, dtype=np.int64)
    free = np.ones(n, dtype=bool)
    first = int(rng.integers(n))
    perm[0], free[first] = first, False
    cur = np.zeros(len(schedule))
    skips = [np.asarray(s) for s in schedule]
    for k in range(1, n):
        cand = np.flatnonzero(free)
        new = np.tile(cur[:, None], (1, cand.size))  # (tau, m)
        for l, s in enumerate(skips):
            back = (k - s) % n
            back = back[back < k]  # placed senders to k
            fwd = (k + s) % n
            fwd = fwd[fwd < k]  # placed receivers from k
            if back.size:
                new[l] = np.maximum(new[l], E[perm[back]][:, cand].max(axis=0))
            if fwd.size:
                new[l] = np.maximum(new[l], E[cand][:, perm[fwd]].max(axis=1))
        score = new.sum(axis=0)
        best = np.flatnonzero(score == score.min())
        j = int(best[rng.integers(best.size)])
        perm[k], free[cand[j]] = cand[j], False
        cur = new[:, j]
    return perm


def _eval_one(E, perm, idxs):
    """Per-round bottleneck of one assignment and where it is: ``(maxima (tau,), [(i, j)])``
    with ``(i, j)`` the virtual positions of the first maximal link of each round in
    row-major order of the round's ``(n, |S_l|)`` links. Kept as the reference of
    :class:`_Links`, which gives the same values after ``O(sum |S_l|)`` link updates per
    swap (and one maximum over all the links)."""
    maxima = np.empty(len(idxs))
    where = []
    for l, idx in enumerate(idxs):
        vals = E[perm[:, None], perm[idx]]  # (n, k)
        a = int(vals.argmax())
        maxima[l] = vals.flat[a]
        i, j = divmod(a, idx.shape[1])
        where.append((i, int(idx[i, j])))
    return maxima, where


class _Links:
    """Delays of all the links of every round under an assignment, updated per swap.

    Annealing evaluated every move by gathering all ``n sum |S_l|`` link delays from the
    ``(n, n)`` matrix (random reads: at ``n = 2000`` a run of the default ``20 n``
    moves took 14 s on one core). A swap of two positions changes only the links at
    those positions (``4 sum |S_l|`` of them, out and in), so they are rewritten in a
    cached ``(tau, n, w)`` array, each round's ``(n, |S_l|)`` links padded to the widest
    round ``w`` with the lowest value of the delays' dtype (never a first maximum before
    a real link), and each round's maximum is one ``argmax`` over a contiguous row. A
    rejected move restores the saved values (:meth:`undo`) instead of rewriting them.
    The maxima and their positions are :func:`_eval_one`'s exactly (same values, same
    first-maximum order), so the search is unchanged.
    """

    def __init__(self, E: np.ndarray, perm: np.ndarray, schedule):
        n = perm.shape[0]
        skips = [np.asarray(s, dtype=np.int64).reshape(-1) for s in schedule]
        widths = [len(s) for s in skips]
        tau, w = len(skips), max(widths)
        self.E, self.perm, self.n = E, perm, n
        self.col_start = np.cumsum([0, *widths])[:-1]
        sk = np.concatenate(skips)  # (K,): column c links i -> i + sk[c]
        round_of = np.repeat(np.arange(tau), widths)
        slot_of = np.arange(sk.size) - self.col_start[round_of]
        i = np.arange(n)
        self.idx = (i[:, None] + sk[None, :]) % n  # (n, K)
        # (3, n, 2K): for each position, the origin, target and cache slot of its K links
        # out and its K links in, so that a swap's links are one gather of this table
        into = (i[:, None] - sk[None, :]) % n  # idx[into[p, c], c] = p
        at = np.broadcast_to(i[:, None], (n, sk.size))
        cell = round_of * (n * w) + slot_of
        self.table = np.stack([np.concatenate([at, into], axis=1),
                               np.concatenate([self.idx, at], axis=1),
                               np.concatenate([cell + at * w, cell + into * w], axis=1)])
        low = (np.finfo(E.dtype).min if E.dtype.kind == "f" else np.iinfo(E.dtype).min)
        self.vals = np.full((tau, n, w), low, dtype=E.dtype)
        self.vals_flat = self.vals.reshape(-1)
        self.rows = self.vals.reshape(tau, n * w)
        self.vals_flat[cell + at * w] = E[perm[:, None], perm[self.idx]]
        self.rounds, self.w = np.arange(tau), w
        self._slots = self._saved = None

    def update(self, pos: np.ndarray) -> None:
        """Rewrite the links at positions ``pos`` after ``perm`` changed there."""
        links = self.table[:, pos]
        slots = links[2].reshape(-1)
        self._slots, self._saved = slots, self.vals_flat[slots]
        origin, target = self.perm[links[:2]]
        self.vals_flat[slots] = self.E[origin, target].reshape(-1)

    def undo(self) -> None:
        """Restore the links the last :meth:`update` rewrote (``perm`` swapped back)."""
        self.vals_flat[self._slots] = self._saved

    def maxima(self) -> tuple[np.ndarray, list]:
        """As :func:`_eval_one`."""
        arg = self.rows.argmax(axis=1)
        maxima = self.rows[self.rounds, arg].astype(np.float64)
        i = arg // self.w
        targets = self.idx[i, self.col_start + (arg - i * self.w)]
        return maxima, list(zip(i.tolist(), targets.tolist()))


def anneal(E: np.ndarray, schedule, rng: np.random.Generator, n_iter: int,
           init: np.ndarray | None = None, t0_frac: float = 0.1) -> np.ndarray:
    """Simulated annealing over assignments with swap moves.

    A fairer version of the official baseline (100 iterations there): geometric
    cooling from ``T0 = t0_frac * (max - min)`` of the link delays to ``1e-3 T0`` over
    ``n_iter`` iterations, and half of the moves swap an end of a bottleneck link of
    a random round with a random position (the other half swap two random
    positions). The best assignment seen is returned. A move costs ``O(sum |S_l|)``
    link updates and one maximum over the ``n sum |S_l|`` cached link delays.
    """
    n = E.shape[0]
    perm = rng.permutation(n) if init is None else init.copy()
    off = E[~np.eye(n, dtype=bool)]
    t0 = t0_frac * float(off.max() - off.min()) or 1.0
    cool = 1e-3 ** (1.0 / max(n_iter, 1))
    links = _Links(E, perm, schedule)  # views perm: updated after each change of perm
    maxima, where = links.maxima()
    cost = float(maxima.sum())
    best, best_cost = perm.copy(), cost
    T = t0
    pos = np.empty(2, dtype=np.int64)
    for _ in range(int(n_iter)):
        if rng.random() < 0.5:
            a = where[int(rng.integers(len(where)))][int(rng.integers(2))]
        else:
            a = int(rng.integers(n))
        b = int(rng.integers(n - 1))
        b += b >= a
        pos[0], pos[1] = a, b
        perm[a], perm[b] = perm[b], perm[a]
        links.update(pos)
        new_max, new_where = links.maxima()
        new_cost = float(new_max.sum())
        d = new_cost - cost
        if d <= 0 or rng.random() < math.exp(-d / T):
            cost, where = new_cost, new_where
            if cost < best_cost:
                best, best_cost = perm.copy(), cost
        else:
            perm[a], perm[b] = perm[b], perm[a]
            links.undo()
        T *= cool
    return best


def exact(E: np.ndarray, schedule) -> np.ndarray:
    """An optimal assignment.

    A single round with a single skip ``s`` coprime with ``n`` is a bottleneck TSP
    (solved exactly by minimax Held--Karp, ``n <= 16``; the tour is relabelled by
    ``s^{-1}``); any other schedule is brute-forced over the ``(n - 1)!``
    assignments with ``pi(0) = 0`` (BCD is rotation invariant), ``n <= 10``.
    """
    n = E.shape[0]
    if len(schedule) == 1 and len(schedule[0]) == 1 and math.gcd(schedule[0][0], n) == 1:
        if n > EXACT_MAX_N:
            raise ValueError(f"method='exact' on a ring is limited to n <= {EXACT_MAX_N}, "
                             f"got n={n}.")
        tour, _ = _exact_minimax(E)
        s = schedule[0][0]
        perm = np.empty(n, dtype=np.int64)
        perm[(s * np.arange(n)) % n] = tour
        return perm
    if n > BRUTE_FORCE_MAX_N:
        raise ValueError(f"method='exact' is limited to n <= {BRUTE_FORCE_MAX_N} for this "
                         f"topology (brute force), got n={n}.")
    best, best_cost = None, None
    it = itertools.permutations(range(1, n))
    chunk = 40320
    while True:
        rows = list(itertools.islice(it, chunk))
        if not rows:
            break
        perms = np.zeros((len(rows), n), dtype=np.int64)
        perms[:, 1:] = rows
        rounds = _round_maxima(E, perms, schedule)
        k = _argmin_total(rounds)  # exact comparisons: float sums of ties may misorder
        cost = _exact_sum(rounds[k])
        if best_cost is None or cost < best_cost:
            best, best_cost = perms[k].copy(), cost
    assert best is not None  # permutations() yields at least one (maybe empty) tuple
    return best
