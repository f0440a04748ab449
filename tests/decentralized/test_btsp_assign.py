"""MSR step and BottleneckNodeAssigner (BTSP-MSR and baselines)."""

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.decentralized import BottleneckNodeAssigner
from mlpapers.decentralized.btsp import (
    TOPOLOGIES,
    best_multiplier,
    bottleneck_delay,
    circulant_schedule,
    make_delay_matrix,
    multiplier_relabel,
)

METHODS = ["btsp_msr", "btsp", "identity", "random", "greedy", "annealing", "exact"]


def euclid(n, seed):
    pts = np.random.default_rng(seed).random((n, 2))
    return np.linalg.norm(pts[:, None] - pts[None], axis=-1)


def brute_opt(D, topology, directed=False):
    """Minimum BCD over all (n-1)! assignments with pi(0) = 0, vectorised over them."""
    n = len(D)
    E = D if directed else np.maximum(D, D.T)
    P = np.array([(0, *rest) for rest in itertools.permutations(range(1, n))])
    total = np.zeros(len(P))
    for skips in circulant_schedule(n, topology):
        worst = np.zeros(len(P))
        for i in range(n):
            for s in skips:
                worst = np.maximum(worst, E[P[:, i], P[:, (i + s) % n]])
        total += worst
    return total.min() / len(circulant_schedule(n, topology))


# -------------------------------------------------------------------- MSR ----
@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), seed=st.integers(0, 10_000),
       topology=st.sampled_from(TOPOLOGIES), directed=st.booleans())
def test_best_multiplier_never_worse(n, seed, topology, directed):
    rng = np.random.default_rng(seed)
    D = rng.random((n, n))
    perm = rng.permutation(n)
    before = bottleneck_delay(D, perm, topology, directed=directed)
    c, new, bcd = best_multiplier(D, perm, topology, directed=directed)
    assert math.gcd(c, n) == 1 and 1 <= c < max(n, 2)
    np.testing.assert_array_equal(new, multiplier_relabel(perm, c))
    assert bcd == pytest.approx(bottleneck_delay(D, new, topology, directed=directed))
    assert bcd <= before + 1e-12
    # it is the best multiplier: no unit does better
    for u in range(1, n):
        if math.gcd(u, n) == 1:
            other = bottleneck_delay(D, multiplier_relabel(perm, u), topology, directed=directed)
            assert bcd <= other + 1e-12


def test_multiplier_relabel_errors():
    with pytest.raises(ValueError, match="coprime"):
        multiplier_relabel(np.arange(8), 2)
    with pytest.raises(TypeError, match="integer"):
        multiplier_relabel(np.arange(8), 1.5)
    with pytest.raises(ValueError, match="1D"):
        multiplier_relabel(np.zeros((2, 2), int), 1)
    np.testing.assert_array_equal(multiplier_relabel([3, 1, 0, 2], 3), [3, 2, 0, 1])


# ------------------------------------------------------------- assigner ------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_assigner_methods_consistent(method, topology):
    D = euclid(8, 1)
    est = BottleneckNodeAssigner(topology=topology, method=method, random_state=0).fit(D)
    n = 8
    assert sorted(est.assignment_.tolist()) == list(range(n))
    tau = len(circulant_schedule(n, topology))
    assert est.bcd_ == pytest.approx(bottleneck_delay(D, est.assignment_, topology))
    assert est.bcd_total_ == pytest.approx(est.bcd_ * tau)
    assert est.bcd_per_round_.shape == (tau,)
    assert est.lower_bound_ <= est.bcd_ + 1e-12
    assert est.theta_ <= bottleneck_delay(D, est.assignment_, "ring") + 1e-12
    assert est.edges_.shape == (n * sum(len(r) for r in est.schedule_), 3)
    np.testing.assert_array_equal(
        est.assignment_, multiplier_relabel(est.base_assignment_, est.multiplier_))
    assert est.bcd(D) == pytest.approx(est.bcd_)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_exact_is_optimum_and_bounds(seed, topology):
    """theta* <= OPT <= BTSP-MSR <= BTSP for n <= 8 (brute force over permutations)."""
    n = 6 + seed
    D = euclid(n, seed)
    opt = brute_opt(D, topology)
    ex = BottleneckNodeAssigner(topology=topology, method="exact").fit(D)
    assert ex.bcd_ == pytest.approx(opt)
    fits = {m: BottleneckNodeAssigner(topology=topology, method=m, random_state=seed).fit(D)
            for m in ("btsp", "btsp_msr", "random", "greedy", "annealing")}
    for est in fits.values():
        assert est.bcd_ >= opt - 1e-12
    assert fits["btsp_msr"].bcd_ <= fits["btsp"].bcd_ + 1e-12
    assert ex.lower_bound_ <= opt + 1e-12
    if topology == "ring":
        assert fits["btsp"].theta_ <= opt <= fits["btsp"].bcd_ <= 2 * opt + 1e-12


def test_exact_directed_ring_matches_brute_force():
    D = np.random.default_rng(0).random((7, 7))
    ex = BottleneckNodeAssigner(topology="ring", method="exact", directed=True).fit(D)
    assert ex.bcd_ == pytest.approx(brute_opt(D, "ring", directed=True))
    # a single coprime skip is a relabelled ring
    ex3 = BottleneckNodeAssigner(topology=[[3]], method="exact", directed=True).fit(D)
    assert ex3.bcd_ == pytest.approx(ex.bcd_)


# Upper bounds on bcd_ / random_bcd_ (n_random=10). Measured over 70 instances
# (make_delay_matrix and BottleneckNodeAssigner seeded alike, seeds 0-19 and 100-149),
# the largest ratios were: geometric 0.39 (ring), 0.79 (one-peer), 0.72 (sparse);
# clustered 0.73, 0.95, 0.98. On clustered networks (metro areas) the long skips of the
# one-peer and sparse graphs cross clusters whatever the assignment, so the gain is
# smaller there (mean ratio 0.85 and 0.80) and only "better than random" holds for
# every instance. (A single 0.8 bound passed with seed 0 only by luck: it failed for
# 70% and 55% of the clustered instances.)
_CLAIM_BOUND = {
    ("geometric", "ring"): 0.5,
    ("geometric", "one_peer_exponential"): 0.85,
    ("geometric", "sparse_exponential"): 0.8,
    ("clustered", "ring"): 0.85,
    ("clustered", "one_peer_exponential"): 1.0,
    ("clustered", "sparse_exponential"): 1.0,
}


@pytest.mark.parametrize("kind", ["geometric", "clustered"])
@pytest.mark.parametrize("topology,n", [("ring", 64), ("one_peer_exponential", 64),
                                        ("sparse_exponential", 100)])
def test_paper_claim_btsp_msr_beats_random(kind, topology, n):
    """Small-scale claim: BTSP-MSR lowers the BCD of random assignments, by a clear margin
    on geometric networks (bounds measured over 70 instances, see ``_CLAIM_BOUND``).

    (For n = 2^k the sparse exponential skip n/4 always spans n/4 tour hops, whatever
    the multiplier, hence n = 100 there; the static exponential graph only gains a few
    percent, see the next test and the user guide.)
    """
    D = make_delay_matrix(n, kind, random_state=0)
    est = BottleneckNodeAssigner(topology=topology, random_state=0, n_random=10).fit(D)
    assert est.bcd_ < _CLAIM_BOUND[kind, topology] * est.random_bcd_
    assert est.bcd_ >= est.lower_bound_ - 1e-12


def test_btsp_msr_close_to_random_on_the_static_exponential_graph():
    """The static exponential graph's one round uses every skip up to n/2, so its
    bottleneck stays near the network diameter whatever the assignment (user guide).
    Over 50 clustered instances (seeds 0-19 and 100-129) bcd_ / random_bcd_ had mean 0.99
    and max 1.02, and exceeded 1 for 28% of them: ``bcd_ <= random_bcd_`` held for seed 0
    only by luck."""
    D = make_delay_matrix(64, "clustered", random_state=0)
    est = BottleneckNodeAssigner(topology="exponential", random_state=0, n_random=10).fit(D)
    assert est.lower_bound_ - 1e-12 <= est.bcd_ <= 1.05 * est.random_bcd_


def test_msr_option_and_ties():
    D = np.ones((9, 9))  # every assignment is optimal
    for method in METHODS:
        est = BottleneckNodeAssigner(method=method, msr=True, random_state=0).fit(D)
        assert est.bcd_ == 1.0
    est = BottleneckNodeAssigner(method="btsp_msr", msr=False, random_state=0).fit(D)
    assert est.multiplier_ == 1


@pytest.mark.parametrize("n", [2, 3, 5, 13])
def test_small_and_prime_n(n):
    D = euclid(n, n)
    for method in ("btsp_msr", "greedy", "annealing", "exact")[: 4 if n <= 10 else 3]:
        est = BottleneckNodeAssigner(topology="exponential", method=method, random_state=0)
        est.fit(D)
        assert sorted(est.assignment_.tolist()) == list(range(n))


def test_directed_asymmetric_delays():
    rng = np.random.default_rng(0)
    D = make_delay_matrix(40, "geometric", random_state=0) * (1 + rng.random((40, 40)))
    est = BottleneckNodeAssigner(topology="one_peer_exponential", directed=True,
                                 random_state=0).fit(D)
    assert est.bcd_ == pytest.approx(
        bottleneck_delay(D, est.assignment_, "one_peer_exponential", directed=True))
    und = BottleneckNodeAssigner(topology="one_peer_exponential", random_state=0).fit(D)
    assert est.bcd_ <= und.bcd_ + 1e-12  # directed links are never slower than max(D, D^T)


def test_metric_closure_option():
    D = euclid(20, 0) ** 3
    est = BottleneckNodeAssigner(topology="ring", metric_closure=True, random_state=0).fit(D)
    assert est.theta_ <= est.bcd_ <= 2 * est.theta_ + 1e-12


def test_determinism_and_persistence(tmp_path):
    D = make_delay_matrix(30, "clustered", random_state=1)
    for method in ("btsp_msr", "random", "greedy", "annealing"):
        a = BottleneckNodeAssigner(method=method, random_state=3).fit(D)
        b = BottleneckNodeAssigner(method=method, random_state=3).fit(D)
        np.testing.assert_array_equal(a.assignment_, b.assignment_)
        assert a.random_bcd_ == b.random_bcd_
    a.save(tmp_path / "est.pt")
    c = BottleneckNodeAssigner.load(tmp_path / "est.pt")
    np.testing.assert_array_equal(a.assignment_, c.assignment_)
    assert c.bcd_ == a.bcd_ and c.schedule_ == a.schedule_ and c.get_params() == a.get_params()
    d = pickle.loads(pickle.dumps(a))
    assert d.bcd_ == a.bcd_


def test_assigner_bad_input():
    D = euclid(6, 0)
    with pytest.raises(ValueError, match="method"):
        BottleneckNodeAssigner(method="milp").fit(D)
    with pytest.raises(ValueError, match="topology"):
        BottleneckNodeAssigner(topology="star").fit(D)
    with pytest.raises(ValueError, match="square"):
        BottleneckNodeAssigner().fit(D[:5])
    with pytest.raises(ValueError, match="non-negative"):
        BottleneckNodeAssigner().fit(-D)
    with pytest.raises(ValueError, match="infinity|NaN"):
        BottleneckNodeAssigner().fit(np.full((4, 4), np.inf))
    with pytest.raises(ValueError, match="n_random"):
        BottleneckNodeAssigner(n_random=0).fit(D)
    with pytest.raises(TypeError, match="msr"):
        BottleneckNodeAssigner(msr="yes").fit(D)
    with pytest.raises(ValueError, match="n <= 10"):
        BottleneckNodeAssigner(method="exact").fit(euclid(11, 0))
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        BottleneckNodeAssigner().bcd(D)


def test_refine_never_worse():
    D = make_delay_matrix(48, "backbone", random_state=2)
    for topology in ("exponential", "one_peer_exponential"):
        base = BottleneckNodeAssigner(topology=topology, random_state=0).fit(D)
        ref = BottleneckNodeAssigner(topology=topology, refine_iter=500, random_state=0).fit(D)
        assert ref.bcd_ <= base.bcd_ + 1e-12
        assert ref.bcd_ == pytest.approx(bottleneck_delay(D, ref.assignment_, topology))
    with pytest.raises(ValueError, match="refine_iter"):
        BottleneckNodeAssigner(refine_iter=-1).fit(D)
