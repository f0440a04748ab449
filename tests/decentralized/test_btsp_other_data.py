"""BTSP-MSR on delay matrices not made by ``mlpapers.datasets`` / ``make_delay_matrix``.

Euclidean distances between scikit-learn's bundled data points and blobs, integer
milliseconds, heavy-tailed (Pareto, non-metric) and asymmetric delays, offsets and
rescalings: quality against the trivial random baseline, the exact optimum (brute force
over all assignments) and the bounds of the method; invariance of the answer under the
transformations that cannot change an ordering of delays.
"""

import itertools

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.datasets import load_digits, load_wine, make_blobs

from mlpapers.decentralized.btsp import BottleneckNodeAssigner, bottleneck_delay


def _int_ms(n=64, seed=0):
    """Integer millisecond delays: 0.8 ms per unit of distance plus 4 ms per link."""
    pts = np.random.default_rng(seed).random((n, 2)) * 100
    D = np.rint(cdist(pts, pts) * 0.8 + 4).astype(np.int64)
    np.fill_diagonal(D, 0)
    return D


@pytest.mark.parametrize("source", ["blobs", "wine", "digits"])
def test_ring_reaches_the_biconnectivity_bound_on_real_distances(source):
    """A ring's BCD is at least theta* (every Hamiltonian cycle is biconnected); on these
    Euclidean instances BTSP-MSR's ring reaches it exactly, so it is optimal, and it is far
    below the random baseline. Measured: blobs 788.6 vs random 1465 (5 clusters spread over
    +-1000, n = 80), wine (unscaled features, n = 178) 165 vs 1139, digits (n = 200) 35.9 vs
    71.4."""
    if source == "blobs":
        X, _ = make_blobs(80, centers=5, center_box=(-1000, 1000), random_state=0)
    elif source == "wine":
        X = load_wine().data
    else:
        X = load_digits().data[:200]
    D = cdist(X, X)
    est = BottleneckNodeAssigner(topology="ring", random_state=0).fit(D)
    assert est.bcd_ == est.theta_
    assert est.bcd_ == bottleneck_delay(D, est.assignment_, "ring")
    assert est.bcd_ < 0.7 * est.random_bcd_


def test_one_peer_beats_random_on_digits_and_wine():
    """One-peer exponential graph on Euclidean distances of bundled data: BTSP-MSR below
    0.95 of the random mean (measured 0.86 on digits, 0.55 on unscaled wine) and above its
    own lower bound."""
    for X in (load_digits().data[:200], load_wine().data):
        D = cdist(X, X)
        est = BottleneckNodeAssigner(topology="one_peer_exponential", random_state=0).fit(D)
        assert est.lower_bound_ <= est.bcd_ < 0.95 * est.random_bcd_


@pytest.mark.parametrize("topology", ["ring", "one_peer_exponential", "sparse_exponential"])
@pytest.mark.parametrize("method", ["btsp_msr", "greedy", "annealing"])
def test_same_assignment_under_order_preserving_changes(topology, method):
    """Integer ms delays, their exact rescaling by 1e6, +1e4 ms on every link, float32 and
    Fortran order give the same assignment: the methods only compare delays (annealing's
    temperature is relative to the delays' range)."""
    D = _int_ms()
    off = np.where(np.eye(64, dtype=bool), 0, D + 10_000)
    ref = BottleneckNodeAssigner(topology=topology, method=method, random_state=0).fit(D)
    for D2 in (D * 1e6, off, D.astype(np.float32), np.asfortranarray(D.astype(float))):
        est = BottleneckNodeAssigner(topology=topology, method=method, random_state=0).fit(D2)
        np.testing.assert_array_equal(est.assignment_, ref.assignment_)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_against_brute_force_on_offset_nearly_collinear_points(n):
    """Points near a line at offset 1e4 (distances of order 1 from coordinates of order
    1e4): the exact solver equals brute force over all (n-1)! assignments, BTSP-MSR is never
    below it, the ring is within twice the optimum and lower_bound_ is a lower bound."""
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 2)) * [1.0, 1e-3] + 1e4
    D = cdist(X, X)
    for topology in ("ring", "exponential", "one_peer_exponential"):
        best = min(bottleneck_delay(D, (0,) + p, topology)
                   for p in itertools.permutations(range(1, n)))
        est = BottleneckNodeAssigner(topology=topology, random_state=0).fit(D)
        ex = BottleneckNodeAssigner(topology=topology, method="exact", random_state=0).fit(D)
        assert ex.bcd_ == pytest.approx(best, rel=1e-12)
        assert est.bcd_ >= best * (1 - 1e-12)
        assert est.lower_bound_ <= best * (1 + 1e-12)
        if topology == "ring":
            assert est.bcd_ <= 2 * best


def test_asymmetric_delays_directed():
    """Asymmetric delays (Euclidean times a random factor in [1, 2) per direction, n = 40):
    with directed=True the reported BCD is the directed BCD of the assignment, and BTSP-MSR
    is below 0.9 of the random mean (measured 0.76 one-peer, 0.29 ring)."""
    rng = np.random.default_rng(0)
    A = rng.random((40, 2))
    D = cdist(A, A) * (1 + rng.random((40, 40)))
    np.fill_diagonal(D, 0)
    for topology in ("ring", "one_peer_exponential"):
        est = BottleneckNodeAssigner(topology=topology, directed=True, random_state=0).fit(D)
        assert est.bcd_ == bottleneck_delay(D, est.assignment_, topology, directed=True)
        assert est.bcd_ < 0.9 * est.random_bcd_


def test_heavy_tailed_non_metric_delays():
    """Symmetrised Pareto(1.5) delays (n = 50, heavy-tailed, no triangle inequality): the
    BTSP ring still reaches theta* (measured 0.22 against 41 for random), but for the
    one-peer graph the multiplier step finds little structure to exploit (the documented
    limit: BTSP-MSR 0.48 of random, annealing 0.11, median of 10 instances);
    ``refine_iter`` repairs it (never worse, and below half of BTSP-MSR here: measured
    2.6 against 16.1, random 23.8)."""
    rng = np.random.default_rng(3)
    P = rng.pareto(1.5, (50, 50))
    D = (P + P.T) / 2
    np.fill_diagonal(D, 0)
    ring = BottleneckNodeAssigner(topology="ring", random_state=0).fit(D)
    assert ring.bcd_ == ring.theta_ < 0.1 * ring.random_bcd_
    plain = BottleneckNodeAssigner(topology="one_peer_exponential", random_state=0).fit(D)
    refined = BottleneckNodeAssigner(topology="one_peer_exponential", refine_iter=1000,
                                     random_state=0).fit(D)
    assert plain.bcd_ < plain.random_bcd_
    assert refined.bcd_ < 0.5 * plain.bcd_
