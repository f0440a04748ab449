"""BTSP at user scale: annealing updates the links a swap changes, not all of them.

``method="annealing"`` runs ``20 n`` swap moves; each move re-read all ``n sum |S_l|``
link delays from the ``(n, n)`` matrix (n = 2000: 65 s, 15 times n = 1000). The cached
links give the same search (the same maxima and the same first maxima) with
``O(sum |S_l|)`` reads per move.
"""

import numpy as np
import pytest

from mlpapers.decentralized.btsp import circulant_schedule
from mlpapers.decentralized.btsp._search import _eval_one, _Links, anneal

TOPOLOGIES = ["ring", "exponential", "one_peer_exponential", "sparse_exponential",
              [[1], [2, 5]], [[3, 4], [1, 7, 11]]]


def _reference_anneal(E, schedule, rng, n_iter, init=None, t0_frac=0.1):
    """The search written from its definition: every move evaluated from scratch."""
    n = E.shape[0]
    perm = rng.permutation(n) if init is None else init.copy()
    idxs = [(np.arange(n)[:, None] + np.asarray(s)[None, :]) % n for s in schedule]
    off = E[~np.eye(n, dtype=bool)]
    t0 = t0_frac * float(off.max() - off.min()) or 1.0
    cool = 1e-3 ** (1.0 / max(n_iter, 1))
    maxima, where = _eval_one(E, perm, idxs)
    cost = float(maxima.sum())
    best, best_cost, T = perm.copy(), cost, t0
    for _ in range(n_iter):
        if rng.random() < 0.5:
            a = where[int(rng.integers(len(where)))][int(rng.integers(2))]
        else:
            a = int(rng.integers(n))
        b = int(rng.integers(n - 1))
        b += b >= a
        perm[a], perm[b] = perm[b], perm[a]
        new_max, new_where = _eval_one(E, perm, idxs)
        d = float(new_max.sum()) - cost
        if d <= 0 or rng.random() < np.exp(-d / T):
            cost, where = float(new_max.sum()), new_where
            if cost < best_cost:
                best, best_cost = perm.copy(), cost
        else:
            perm[a], perm[b] = perm[b], perm[a]
        T *= cool
    return best


class _CountingDelays(np.ndarray):
    """A delay matrix that counts the entries read by indexing."""

    reads = 0

    def __getitem__(self, key):
        out = np.asarray(super().__getitem__(key))
        _CountingDelays.reads += out.size
        return out


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
def test_cached_links_give_the_maxima_of_a_full_evaluation(topology):
    rng = np.random.default_rng(0)
    n = 31
    E = np.round(rng.random((n, n)) * 4) / 4  # many ties: the first maximum matters
    schedule = circulant_schedule(n, topology)
    idxs = [(np.arange(n)[:, None] + np.asarray(s)[None, :]) % n for s in schedule]
    perm = rng.permutation(n)
    links = _Links(E, perm, schedule)
    pos = np.empty(2, dtype=np.int64)
    for _ in range(60):
        pos[:] = rng.choice(n, 2, replace=False)
        perm[pos] = perm[pos[::-1]]
        links.update(pos)
        maxima, where = links.maxima()
        ref_max, ref_where = _eval_one(E, perm, idxs)
        np.testing.assert_array_equal(maxima, ref_max)
        assert where == ref_where


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
def test_anneal_equals_the_search_evaluated_from_scratch(topology):
    rng = np.random.default_rng(1)
    n = 23
    E = rng.random((n, n))
    E = np.round(np.maximum(E, E.T) * 8) / 8
    schedule = circulant_schedule(n, topology)
    for seed in range(2):
        got = anneal(E, schedule, np.random.default_rng(seed), 300)
        ref = _reference_anneal(E, schedule, np.random.default_rng(seed), 300)
        np.testing.assert_array_equal(got, ref)
    init = rng.permutation(n)
    got = anneal(E, schedule, np.random.default_rng(5), 200, init=init, t0_frac=1e-2)
    ref = _reference_anneal(E, schedule, np.random.default_rng(5), 200, init=init, t0_frac=1e-2)
    np.testing.assert_array_equal(got, ref)


def test_anneal_reads_a_bounded_number_of_links_per_move():
    n, n_iter = 200, 400
    rng = np.random.default_rng(2)
    E = rng.random((n, n)).view(_CountingDelays)
    schedule = circulant_schedule(n, "exponential")
    K = sum(len(s) for s in schedule)
    _CountingDelays.reads = 0
    anneal(E, schedule, np.random.default_rng(0), n_iter)
    # the range of the delays (n^2), the initial links (n K), then per move at most two
    # updates (a swap and its undo) of 2 K links out of and 2 K into the two positions;
    # a full evaluation per move reads n K (here 25 times more)
    assert _CountingDelays.reads <= n * n + n * K + n_iter * 8 * K

