"""Numerical robustness of BTSP-MSR and the DSGD simulator: scale, ties, precision.

References are exact: networkx biconnectivity scans over the distinct delays, and
rational (``fractions``) recomputations of BCDs and simulated times from their
definitions.
"""

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    delays_from_graph,
    metric_closure,
    scale_schedule,
)
from mlpapers.decentralized.btsp._dsgd import consensus_distance, mix
from mlpapers.decentralized.btsp._search import coprime_multipliers
from mlpapers.decentralized.btsp._topology import mixing_matrices

U = 2.0 ** -52  # one ulp of 1.0


def _sym(M):
    M = np.maximum(M, M.T)
    np.fill_diagonal(M, 0)
    return M


def _connected(A):
    return connected_components(csr_matrix(A), directed=False)[0] == 1


def _biconnected(A):
    """From the definition: connected, and still connected without any one vertex."""
    n = A.shape[0]
    keep = [np.delete(np.arange(n), v) for v in range(n)]
    return _connected(A) and all(_connected(A[np.ix_(k, k)]) for k in keep)


def _brute_theta(S):
    """Smallest distinct delay whose threshold graph is biconnected (a scan)."""
    n = S.shape[0]
    for v in np.unique(S[np.triu_indices(n, 1)]):
        A = (S <= v) & ~np.eye(n, dtype=bool)
        if n == 2 or _biconnected(A):
            return v
    raise AssertionError("the complete graph is biconnected")


def _exact_rounds(D, perm, schedule):
    """Per-round bottlenecks as fractions, from the definition (undirected links)."""
    n = len(perm)
    return [max(Fraction(float(max(D[perm[i], perm[(i + s) % n]], D[perm[(i + s) % n], perm[i]])))
                for i in range(n) for s in r) for r in schedule]


def _delay_cases():
    rng = np.random.default_rng(0)
    n = 9
    A = _sym(rng.random((n, n)))
    return {
        "tiny": A * 1e-300,
        "huge": A * 1e300,
        "subnormal": A * 1e-320,
        "range_1e-12_1e12": _sym(np.where(rng.random((n, n)) < 0.5, 1e-12, 1e12)),
        "last_ulp": _sym(1.0 + U * rng.integers(0, 4, (n, n))),
        "int": _sym(rng.integers(0, 5, (n, n))),
        "float16": (A * 100).astype(np.float16),
        "float32": A.astype(np.float32),
        "all_equal": _sym(np.ones((n, n))),
        "zero_one": _sym(rng.integers(0, 2, (n, n))),
        "all_zero": np.zeros((n, n)),
    }


@pytest.mark.parametrize("case", sorted(_delay_cases()))
def test_theta_and_bcd_are_exact_at_any_scale_and_with_ties(case):
    D = _delay_cases()[case]
    D64 = np.asarray(D, dtype=np.float64)
    S = np.maximum(D64, D64.T)
    theta = biconnected_threshold(D)
    assert theta == _brute_theta(S)
    for topology in ("ring", "one_peer_exponential"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no overflow/underflow anywhere
            est = BottleneckNodeAssigner(topology=topology, random_state=0).fit(D)
        assert est.theta_ == theta
        rounds = _exact_rounds(D64, est.assignment_, est.schedule_)
        assert est.bcd_per_round_.tolist() == [float(r) for r in rounds]
        assert est.bcd_total_ == float(sum(rounds))
        assert est.bcd_ == float(sum(rounds) / len(rounds))
        # MSR never increases the (exact) BCD of the ring tour it starts from
        assert sum(rounds) <= sum(_exact_rounds(D64, est.base_assignment_, est.schedule_))
        assert est.lower_bound_ <= est.bcd_


def test_bcd_sums_are_correctly_rounded():
    # rounds (1, 2**-53, 2**-53): a float running sum loses both halves of an ulp
    n = 7
    hop = np.minimum(np.arange(n), n - np.arange(n))
    D = np.where(hop[np.subtract.outer(np.arange(n), np.arange(n)) % n] == 1, 1.0, 2.0 ** -53)
    np.fill_diagonal(D, 0)
    schedule = [[1], [2], [3]]
    want = [Fraction(1), Fraction(2.0 ** -53), Fraction(2.0 ** -53)]
    assert bottleneck_delay(D, np.arange(n), schedule, reduce="sum") == float(sum(want)) == 1 + U
    assert bottleneck_delay(D, np.arange(n), schedule) == float(sum(want) / 3)
    est = BottleneckNodeAssigner(topology=schedule, method="identity").fit(D)
    assert est.bcd_total_ == 1 + U and est.bcd_ == float(sum(want) / 3)


def _pentagon_ulp_delays():
    """n=5: ring links (i, i+-1) cost 1 + ulp, skip-2 links cost 1."""
    n = 5
    d = np.subtract.outer(np.arange(n), np.arange(n)) % n
    D = np.where((d == 1) | (d == n - 1), 1.0 + U, 1.0)
    np.fill_diagonal(D, 0)
    return D


def test_msr_picks_the_exact_best_multiplier_under_last_ulp_ties():
    # c=1 gives rounds (1+u, 1, 1+u), c=2 gives (1, 1+u, 1): both float running sums
    # round to 3, so a float comparison keeps c=1 although c=2 is strictly better
    D = _pentagon_ulp_delays()
    perm = np.arange(5)
    sched = circulant_schedule(5, "one_peer_exponential")
    exact = {int(c): sum(_exact_rounds(D, perm, scale_schedule(sched, int(c), 5)))
             for c in coprime_multipliers(5)}
    best = min(c for c in exact if exact[c] == min(exact.values()))
    c, new, bcd = best_multiplier(D, perm, "one_peer_exponential")
    assert c == best == 2
    assert bcd == float(exact[best] / 3)
    est = BottleneckNodeAssigner(topology="one_peer_exponential", method="identity",
                                 msr=True).fit(D)
    assert est.multiplier_ == 2 and est.bcd_total_ == float(exact[2])


def test_exact_method_is_exact_under_last_ulp_ties():
    import itertools

    D = _pentagon_ulp_delays()
    sched = circulant_schedule(5, "one_peer_exponential")
    opt = min(sum(_exact_rounds(D, (0,) + p, sched))
              for p in itertools.permutations(range(1, 5)))
    est = BottleneckNodeAssigner(topology="one_peer_exponential", method="exact").fit(D)
    assert sum(_exact_rounds(D, est.assignment_, sched)) == opt
    assert est.bcd_total_ == float(opt)


@pytest.mark.parametrize("k", [-1000, -600, 600, 990])
def test_power_of_two_rescaling_changes_nothing(k):
    # scaling by 2**k is exact: the whole fit must scale, including the warning that
    # BTSP-MSR lost to random assignments (its spread estimate squared the BCDs and
    # overflowed above ~1e154, dropping the warning with a numpy RuntimeWarning)
    nx = pytest.importorskip("networkx")
    G = nx.connected_watts_strogatz_graph(40, 4, 0.2, seed=0)
    rng = np.random.default_rng(0)
    for u, v in G.edges:
        G[u][v]["weight"] = float(rng.uniform(1, 20))
    D = delays_from_graph(G, length_attr="weight", per_unit=1.0, overhead=0.0)

    def fit(M):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            est = BottleneckNodeAssigner(random_state=0).fit(M)
        return est, [(w.category, str(w.message).split(" (")[0]) for w in rec]

    ref, ref_warn = fit(D)
    est, est_warn = fit(np.ldexp(D, k))
    assert [c for c, _ in ref_warn] == [UserWarning]
    assert est_warn == ref_warn
    np.testing.assert_array_equal(est.assignment_, ref.assignment_)
    assert est.bcd_ == math.ldexp(ref.bcd_, k) and est.theta_ == math.ldexp(ref.theta_, k)
    assert est.random_bcd_ == math.ldexp(ref.random_bcd_, k)


def _k23():
    """K_{2,3} links of delay 1, all other pairs 10: biconnected at theta* = 1, not
    Hamiltonian, and far from metric (10 > 1 + 1)."""
    D = np.full((5, 5), 10.0)
    for a in (0, 1):
        for b in (2, 3, 4):
            D[a, b] = D[b, a] = 1.0
    np.fill_diagonal(D, 0)
    return D


@pytest.mark.parametrize("scale", [1.0, 1e-10, 1e-300, 1e10])
def test_metric_check_of_the_2approx_warning_is_unit_free(scale):
    # the triangle-inequality check had an absolute tolerance of 1e-9: delays in a small
    # unit all looked metric, and the (legitimately) exceeded 2 theta* bound of this
    # non-metric instance raised a false "although the delays are metric" warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tour, b, theta = bottleneck_tsp(_k23() * scale, random_state=0)
    assert b == 10 * scale and theta == scale


def test_infinite_delays_error_names_the_fix_and_metric_closure_fills_links():
    nx = pytest.importorskip("networkx")
    G = nx.cycle_graph(6)
    G.add_edge(0, 3)
    for u, v in G.edges:
        G[u][v]["distance"] = float(u + v + 1)
    link = delays_from_graph(G, shortest_paths=False)  # inf between non-adjacent nodes
    with pytest.raises(ValueError, match=r"infinity \(first at \[0, 2\]\).*metric_closure"):
        BottleneckNodeAssigner().fit(link)
    with pytest.raises(ValueError, match="infinity"):
        DecentralizedSGD(delays=link)._check_params()
    closed = metric_closure(link)
    np.testing.assert_allclose(closed, delays_from_graph(G), rtol=1e-15)
    a = BottleneckNodeAssigner(metric_closure=True, random_state=0).fit(link)
    b = BottleneckNodeAssigner(random_state=0).fit(closed)
    np.testing.assert_array_equal(a.assignment_, b.assignment_)
    assert a.bcd_ == b.bcd_ and a.bcd(link) == a.bcd_
    assert bottleneck_tsp(link, metric_closure=True, random_state=0)[2] == b.theta_
    G.remove_edges_from([(0, 1), (2, 3), (0, 3)])  # two components
    with pytest.raises(ValueError, match="disconnected"):
        metric_closure(delays_from_graph(G, shortest_paths=False))


def test_diagonal_is_ignored_whatever_it_holds():
    rng = np.random.default_rng(1)
    D = _sym(rng.random((6, 6)))
    ref = BottleneckNodeAssigner(random_state=0).fit(D)
    for diag in (np.nan, np.inf, 5.0):
        M = D.copy()
        np.fill_diagonal(M, diag)
        est = BottleneckNodeAssigner(random_state=0).fit(M)
        np.testing.assert_array_equal(est.assignment_, ref.assignment_)
        assert est.bcd_ == ref.bcd_
    M = D.copy()
    M[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN \(first at \[1, 2\]\)"):
        bottleneck_delay(M, np.arange(6), "ring")


def test_delays_too_large_to_sum_are_rejected_and_1e300_works():
    # three rounds of ~1e308 overflowed bcd_total_/bcd_ to inf (numpy warned only)
    D = _sym(np.random.default_rng(2).random((9, 9)) + 0.5)
    with pytest.raises(ValueError, match="at most 1e.300.*rescale"):
        BottleneckNodeAssigner(topology="one_peer_exponential").fit(D * 1e308)
    est = BottleneckNodeAssigner(topology="one_peer_exponential", random_state=0).fit(
        D / D.max() * 1e300)
    assert np.isfinite(est.bcd_total_) and est.bcd_total_ >= est.bcd_ >= est.theta_ > 0


def test_integer_and_low_precision_delays_match_their_float64_values():
    # documented: delays are float64; integers above 2**53 round (here two values tie)
    rng = np.random.default_rng(3)
    for D in (_sym(rng.integers(0, 1000, (8, 8))),
              _sym(rng.random((8, 8))).astype(np.float16),
              _sym(rng.random((8, 8))).astype(np.float32),
              _sym(2 ** 53 + rng.integers(0, 2, (8, 8)))):
        a = BottleneckNodeAssigner(random_state=0).fit(D)
        b = BottleneckNodeAssigner(random_state=0).fit(np.asarray(D, dtype=np.float64))
        np.testing.assert_array_equal(a.assignment_, b.assignment_)
        assert a.bcd_ == b.bcd_ and a.theta_ == b.theta_
    big = np.array([[0, 2 ** 53 + 1], [2 ** 53 + 1, 0]], dtype=np.int64)
    assert biconnected_threshold(big) == float(2 ** 53)


# ----------------------------------------------------------------- DSGD ---------
def test_consensus_distance_is_exactly_zero_for_equal_nodes_and_never_overflows():
    g = torch.Generator().manual_seed(0)
    for n in range(2, 40):
        x = torch.randn(1, 13, generator=g).expand(n, 13).contiguous()
        assert consensus_distance({"w": x}) == 0.0
        # mixing keeps equal rows equal, for every schedule
        for topo in ("exponential", "one_peer_exponential"):
            W = torch.as_tensor(mixing_matrices(n, topo), dtype=torch.float32)
            p = {"w": x}
            for l in range(W.shape[0]):
                p = mix(p, W[l])
            assert consensus_distance(p) == 0.0
    big = torch.tensor([[1e30], [-1e30]])  # float32 squares of 1e30 overflow
    assert consensus_distance({"w": big}) == pytest.approx(1e60)


def test_dsgd_equal_nodes_on_identical_data_keep_exact_consensus():
    # every node holds copies of the same sample (one class: a zero cross-entropy
    # gradient) and weight decay moves every model alike: the nodes stay equal
    X = np.tile([[0.5, -1.0, 2.0]], (16, 1))
    y = np.zeros(16, dtype=int)
    clf = DecentralizedSGD(n_nodes=7, n_rounds=20, lr=0.5, weight_decay=0.3, eval_every=5,
                           random_state=0).fit(X, y)
    for v in clf.node_params_.values():
        assert torch.equal(v, v[:1].expand_as(v))
    assert [h["consensus"] for h in clf.history_] == [0.0] * 4


def test_dsgd_simulated_time_is_correctly_rounded_over_long_runs():
    # a float running sum of 0.1 + 0.1 per round drifted to 199.9999999999972 after 1000
    X, y = np.random.default_rng(0).normal(size=(40, 3)), np.arange(40) % 2
    D = np.full((8, 8), 0.1)
    clf = DecentralizedSGD(n_nodes=8, n_rounds=1000, delays=D, compute_time=0.1,
                           eval_every=250, random_state=0).fit(X, y)
    assert clf.sim_time_ == float(1000 * (Fraction(0.1) + Fraction(0.1)))
    rng = np.random.default_rng(1)
    D = _sym(rng.random((8, 8))) + _sym(rng.integers(0, 2, (8, 8))) * 1e6
    clf = DecentralizedSGD(n_nodes=8, n_rounds=700, delays=D, compute_time=0.3,
                           topology="one_peer_exponential", eval_every=233,
                           random_state=0).fit(X, y)
    rd = [Fraction(float(d)) for d in clf.round_delays_]
    for h in clf.history_:
        q, r = divmod(h["round"], len(rd))
        assert h["sim_time"] == float(h["round"] * Fraction(0.3) + q * sum(rd) + sum(rd[:r]))
    assert clf.history_[-1]["sim_time"] == clf.sim_time_
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["consensus"])
               for h in clf.history_)
    Di = _sym(rng.integers(0, 10 ** 6, (8, 8)))  # integer delays: exact integer times
    clf = DecentralizedSGD(n_nodes=8, n_rounds=99, delays=Di, compute_time=7,
                           topology="one_peer_exponential", eval_every=99,
                           random_state=0).fit(X, y)
    rd = clf.round_delays_.astype(np.int64)
    assert clf.sim_time_ == 99 * 7 + 33 * int(rd.sum())


def test_dsgd_divergence_raises_instead_of_predicting_from_nan():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    with pytest.raises(FloatingPointError, match="diverged by round 10.*lower lr"):
        DecentralizedSGD(model="mlp", n_nodes=8, n_rounds=30, lr=1e3,
                         random_state=0).fit(X, y)
    # a huge but finite run stays usable, with a finite consensus distance
    clf = DecentralizedSGD(n_nodes=8, n_rounds=30, lr=1e30, random_state=0).fit(X, y)
    assert all(math.isfinite(h["consensus"]) for h in clf.history_)


def test_metric_closure_whose_path_sums_exceed_the_bound_names_the_closure():
    # every link is accepted (1e300), but a 3-hop path sums to 3e300: the error must
    # come from the closure, not from a later check of delays the user never passed
    from mlpapers.decentralized.btsp import BottleneckNodeAssigner, metric_closure

    D = np.full((4, 4), np.inf)
    for i in range(3):
        D[i, i + 1] = D[i + 1, i] = 1e300
    with pytest.raises(ValueError, match="shortest-path delays reach 3e\\+300"):
        metric_closure(D)
    with pytest.raises(ValueError, match="shortest-path delays reach"):
        BottleneckNodeAssigner(metric_closure=True).fit(D)
    np.testing.assert_array_equal(metric_closure(D / 1e10)[0], [0, 1e290, 2e290, 3e290])
