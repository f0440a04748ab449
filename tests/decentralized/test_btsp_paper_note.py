"""Paper-note checks of BTSP-MSR not covered elsewhere.

* Note section 3, upper bound: on a metric delay matrix with ring bottleneck ``B`` a
  skip-``s`` link of the multiplier-relabelled tour spans ``h(c * s)`` ring hops, so
  round ``l`` of ``BCD(pi o c; S)`` is at most ``B * max_{s in S_l} h(c * s)``, and the
  MSR step's BCD is at most the smallest of these bounds.
* Note section 4, the Dirichlet non-IID split of ``DecentralizedSGD``
  (``partition="dirichlet"``): label skew falls as ``alpha`` grows, as for the
  largest coordinate of a ``Dirichlet(alpha)`` vector, and every class is cut at
  the cumulative shares of its own seeded draw.
"""

import math

import numpy as np
import pytest

from mlpapers._utils import make_generators
from mlpapers.decentralized.btsp import (
    TOPOLOGIES,
    DecentralizedSGD,
    best_multiplier,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    make_delay_matrix,
    multiplier_relabel,
)

_RTOL = 1e-12  # the bound adds up to n / 2 float delays along the ring


def _hops(s: int, n: int) -> int:
    """Ring hops spanned by skip ``s``: ``min(s mod n, n - s mod n)``."""
    r = s % n
    return min(r, n - r)


@pytest.mark.parametrize("kind", ["geometric", "backbone", "clustered"])
@pytest.mark.parametrize("n", [17, 31, 48, 60])
def test_multiplier_bcd_below_ring_bottleneck_times_hops(kind, n):
    """Note section 3: per round, BCD(tour o c) <= B * max_s h(c s) for every unit c, and
    best_multiplier's per-round mean BCD is at most the smallest bound / tau."""
    D = make_delay_matrix(n, kind, random_state=n)
    tour, B, _ = bottleneck_tsp(D, random_state=0)
    # B is the tour's ring bottleneck (the bound's hop unit)
    assert bottleneck_delay(D, tour, "ring", reduce="sum") == B
    units = [c for c in range(1, n) if math.gcd(c, n) == 1]
    for topology in TOPOLOGIES:
        schedule = circulant_schedule(n, topology)
        totals = []
        for c in units:
            h = np.array([max(_hops(c * s, n) for s in skips) for skips in schedule])
            rounds = bottleneck_delay(D, multiplier_relabel(tour, c), topology, reduce="none")
            assert rounds.shape == (len(schedule),)
            assert np.all(rounds <= B * h * (1 + _RTOL)), (topology, c)
            totals.append(B * h.sum())
        _, _, bcd = best_multiplier(D, tour, topology)  # per-round mean, not the sum
        assert bcd <= min(totals) / len(schedule) * (1 + _RTOL), topology


def _dirichlet_split(alpha, seed, n_nodes=8, n_classes=10, per_class=200):
    """Labels (shuffled, already 0..n_classes-1) and the fitted node of each sample."""
    rng = np.random.default_rng(1000 + seed)
    y = rng.permutation(np.repeat(np.arange(n_classes), per_class))
    X = rng.normal(size=(len(y), 3))
    clf = DecentralizedSGD(n_nodes=n_nodes, n_rounds=1, partition="dirichlet", alpha=alpha,
                           random_state=seed).fit(X, y)
    return y, clf.node_of_


def _class_node_counts(y, node_of, n_classes=10, n_nodes=8):
    M = np.zeros((n_classes, n_nodes), dtype=np.int64)
    np.add.at(M, (y, node_of), 1)
    return M


def test_dirichlet_label_skew_falls_with_alpha():
    """The mean largest share of a class on one node decreases in alpha and matches
    E[max of Dirichlet(alpha 1_8)] (numpy Monte Carlo) within sampling error."""
    alphas = [0.1, 1.0, 10.0, 100.0]
    seeds = range(5)
    ref_rng = np.random.default_rng(12345)
    observed = []
    for alpha in alphas:
        shares = []
        for seed in seeds:
            y, node_of = _dirichlet_split(alpha, seed)
            M = _class_node_counts(y, node_of)
            shares.append(M.max(1) / M.sum(1))
        shares = np.concatenate(shares)  # 50 classes
        ref = ref_rng.dirichlet(np.full(8, alpha), size=20000).max(1)
        # 5 standard errors of the mean of 50 maxima, plus the floor of the cuts (1/200)
        tol = 5 * ref.std() / math.sqrt(len(shares)) + 1 / 200
        assert abs(shares.mean() - ref.mean()) <= tol, (alpha, shares.mean(), ref.mean())
        observed.append(shares.mean())
    assert all(a > b for a, b in zip(observed, observed[1:])), observed
    assert observed[0] > 0.5 and observed[-1] < 0.2


@pytest.mark.parametrize("alpha", [0.1, 2.0])
def test_dirichlet_split_cuts_each_class_at_its_seeded_shares(alpha):
    """Every sample lands on exactly one node, and class c's per-node counts are the
    gaps of floor(cumsum(share) * |class c|), share ~ Dirichlet(alpha) drawn from fit's
    numpy stream after the class's permutation, classes in label order."""
    n_nodes, seed = 8, 3
    y, node_of = _dirichlet_split(alpha, seed)
    assert node_of.shape == y.shape and node_of.dtype.kind in "iu"
    assert node_of.min() >= 0 and node_of.max() < n_nodes
    M = _class_node_counts(y, node_of)
    np.testing.assert_array_equal(M.sum(1), np.bincount(y))
    rng = make_generators(seed)[1]  # the stream fit draws the split from
    for c in range(10):
        members = np.flatnonzero(y == c)
        order = rng.permutation(members)
        share = rng.dirichlet(np.full(n_nodes, alpha))
        cuts = (np.cumsum(share)[:-1] * len(members)).astype(np.int64)
        want = np.diff(np.concatenate([[0], cuts, [len(members)]]))
        np.testing.assert_array_equal(M[c], want, err_msg=f"class {c}")
        # the samples themselves: consecutive runs of the class's permutation
        for node, part in enumerate(np.split(order, cuts)):
            assert (node_of[part] == node).all()
