"""Paths of the btsp package that the rest of the suite did not reach (branch coverage,
session 19): input checks of the public functions, the simulated clock's overflow and
the cycle search's precondition. Each test asserts the documented behaviour or a
property from the definition."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    biconnected_threshold,
    bottleneck_tsp,
    circulant_schedule,
    is_biconnected,
    make_delay_matrix,
)
from mlpapers.decentralized.btsp._dsgd import _SimClock
from mlpapers.decentralized.btsp._hamilton import _find_cycle
from mlpapers.decentralized.btsp._topology import check_assignment


def _blobs(n=40, seed=0):
    g = np.random.default_rng(seed)
    y = np.arange(n) % 2
    return g.normal(size=(n, 3)) + 2.0 * y[:, None], y


# ----------------------------------------------------------- input checks ---------
def test_is_biconnected_refuses_a_non_square_matrix():
    with pytest.raises(ValueError, match="adjacency must be a square matrix"):
        is_biconnected(np.ones((3, 4), dtype=bool))


def test_is_biconnected_refuses_strings():
    # astype(bool) read every non-empty string, "0" too, as an edge
    with pytest.raises(TypeError, match="^adjacency must hold booleans or numbers"):
        is_biconnected(np.array([["0", "0", "0"]] * 3))


def test_random_bcd_is_correctly_rounded_as_bcd_is():
    # every assignment of 3 nodes on a ring has the same BCD; a float mean of the random
    # assignments' BCDs sat 1 ulp below bcd_
    rng = np.random.default_rng(0)
    rng.random((2, 2))
    est = BottleneckNodeAssigner(topology="ring", random_state=0).fit(rng.random((3, 3)))
    assert est.random_bcd_ == est.bcd_


def test_make_delay_matrix_needs_two_nodes():
    with pytest.raises(ValueError, match="n must be >= 2, got 1"):
        make_delay_matrix(1)


def test_explicit_schedule_as_numpy_arrays():
    """A schedule given as arrays (all rounds, or one round) reads as the same lists."""
    assert circulant_schedule(8, np.array([[1, 2], [3, 5]])) == [[1, 2], [3, 5]]
    assert circulant_schedule(8, [np.array([9, 2]), [3]]) == [[1, 2], [3]]
    with pytest.raises(ValueError, match="non-empty sequence of skip sets"):
        circulant_schedule(8, [])


def test_check_assignment_dtypes():
    """Integral floats are positions; fractional floats and non-numbers are refused."""
    assert check_assignment(np.array([2.0, 0.0, 1.0]), 3).tolist() == [2, 0, 1]
    with pytest.raises(TypeError, match="must contain integers"):
        check_assignment(np.array([0.5, 1.0, 2.0]), 3)
    with pytest.raises(TypeError, match="must contain integers, got dtype"):
        check_assignment(np.array(["0", "1", "2"]), 3)


def test_dsgd_parameter_errors():
    X, y = _blobs()
    with pytest.raises(ValueError, match="n_nodes must be >= 2, got 1"):
        DecentralizedSGD(n_nodes=1, n_rounds=1).fit(X, y)
    with pytest.raises(ValueError, match="eval_set must be a pair"):
        DecentralizedSGD(n_nodes=2, n_rounds=1).fit(X, y, eval_set=(X,))
    shards = [np.arange(20) + 0.0, np.arange(20, 40) + 0.0]  # float indices
    with pytest.raises(ValueError, match="integer sample indices"):
        DecentralizedSGD(n_nodes=2, n_rounds=1).fit(X, y, nodes=shards)


def test_exact_on_a_ring_is_limited_to_16_nodes():
    D = make_delay_matrix(17, random_state=0)
    with pytest.raises(ValueError, match="n <= 16"):
        BottleneckNodeAssigner(topology="ring", method="exact").fit(D)
    # the function's own error names the option that asked for the exact solver
    with pytest.raises(ValueError, match=r"method='exact' .*limited to n <= 16, got n=17"):
        bottleneck_tsp(D, method="exact")


def test_theta_is_the_biconnected_threshold_of_the_symmetrised_delays():
    """bottleneck_tsp's and the assigner's theta (from the max(D, D^T) they hold when
    undirected) is, by definition, the smallest delay v at which the links with
    max(D, D^T) <= v (directed: min(D, D^T) <= v) form a biconnected graph (networkx
    as the reference); theta <= the tour's bottleneck (it lower-bounds every cycle)."""
    nx = pytest.importorskip("networkx")
    g = np.random.default_rng(3)
    for n, directed in ((9, False), (9, True), (12, False)):
        D = g.random((n, n))
        np.fill_diagonal(D, 0.0)
        S = np.minimum(D, D.T) if directed else np.maximum(D, D.T)
        ref = min(v for v in np.unique(S[np.triu_indices(n, 1)]) if nx.is_biconnected(
            nx.from_numpy_array(((S <= v) & ~np.eye(n, dtype=bool)).astype(int))))
        tour, b, theta = bottleneck_tsp(D, directed=directed, random_state=0)
        assert theta == ref == biconnected_threshold(D, directed=directed)
        assert theta <= b
        est = BottleneckNodeAssigner(topology="ring", directed=directed,
                                     random_state=0).fit(D)
        assert est.theta_ == theta


# ------------------------------------------------------------ graphs ---------------
def test_delays_from_graph_checks():
    nx = pytest.importorskip("networkx")
    from mlpapers.decentralized.btsp import delays_from_graph

    G = nx.Graph()
    G.add_edge("a", "b", distance=100.0)
    G.add_edge("b", "c", distance=200.0)
    with pytest.raises(ValueError, match="every node of G exactly once"):
        delays_from_graph(G, nodelist=["a", "b"])
    H = nx.Graph()
    H.add_node("a")
    with pytest.raises(ValueError, match="at least 2 nodes, got 1"):
        delays_from_graph(H)
    with pytest.raises(ValueError, match="per_unit must be >= 0"):
        delays_from_graph(G, per_unit=-1.0)
    for length in (-1000.0, -300.0, float("nan")):  # (-300 passed: 4 ms overhead made it +)
        N = nx.Graph()
        N.add_edge("a", "b", distance=length)
        with pytest.raises(ValueError, match=r"^edge \('a', 'b'\) has 'distance' = .*: link "
                                             r"lengths must be finite and >= 0"):
            delays_from_graph(N)
    P = nx.path_graph(3)  # connected: its sums overflowed, reported as "not connected"
    for u, v in P.edges:
        P[u][v]["distance"] = 1e308
    with pytest.raises(ValueError, match=r"^edge \(0, 1\) has a delay per_unit \* length \+ "
                                         r"overhead = 1e\+308 above 1e\+300"):
        delays_from_graph(P, per_unit=1.0, overhead=0.0)
    B = nx.Graph()
    B.add_edge("a", "b", distance=True)  # a bool is no length
    with pytest.raises(ValueError, match="non-numeric 'distance'"):
        delays_from_graph(B)
    # a self-loop carries no message between nodes: the delays are those without it
    L = G.copy()
    L.add_edge("b", "b", distance=1.0)
    np.testing.assert_array_equal(delays_from_graph(L), delays_from_graph(G))


# ----------------------------------------------------------- simulated clock -------
def test_sim_clock_is_the_exact_sum_and_overflows_to_inf():
    delays = np.array([0.1, 0.2, 0.7])
    clock = _SimClock(0.3, delays)
    for t in (0, 1, 2, 3, 7, 1000):
        exact = sum((Fraction(0.3) + Fraction(float(delays[r % 3])) for r in range(t)),
                    Fraction(0))
        assert clock(t) == float(exact)
    # beyond float64 the time is inf, as a float sum would be (no OverflowError)
    assert _SimClock(1e308, np.zeros(1))(2) == float("inf")


def test_dsgd_sim_time_overflow_is_inf():
    X, y = _blobs()
    clf = DecentralizedSGD(n_nodes=2, n_rounds=2, compute_time=1e308, eval_every=1,
                           random_state=0).fit(X, y)
    assert clf.sim_time_ == float("inf")
    assert clf.history_[0]["sim_time"] == 1e308


# ----------------------------------------------------------- cycle search ----------
def test_find_cycle_precondition_and_small_graphs():
    """A node with one neighbour lies on no cycle (None without a search); a triangle
    is its own cycle; any cycle found visits every node once along edges."""
    rng = np.random.default_rng(0)
    path = np.zeros((5, 5), dtype=bool)
    for i in range(4):
        path[i, i + 1] = path[i + 1, i] = True
    assert _find_cycle(path, rng, 4) is None
    tri = ~np.eye(3, dtype=bool)
    assert sorted(_find_cycle(tri, rng, 1).tolist()) == [0, 1, 2]
    ring = np.roll(np.eye(9, dtype=bool), 1, axis=1)
    c = _find_cycle(ring | ring.T, rng, 4)
    assert sorted(c.tolist()) == list(range(9))
    assert (ring | ring.T)[c, np.roll(c, -1)].all()


def test_demo_rounds_within_a_budget():
    """The demo's round count for a simulated budget, from the definition: the largest
    t whose t rounds (compute plus the round's delay, cycling over the schedule) fit."""
    from mlpapers.decentralized.btsp._demo import rounds_within

    g = np.random.default_rng(0)
    for _ in range(20):
        delays = g.uniform(0.0, 5.0, size=int(g.integers(1, 5)))
        compute = float(g.uniform(0.5, 3.0))
        budget = float(g.uniform(0.0, 60.0))
        t, used = 0, 0.0
        while used + (compute + delays[t % len(delays)]) <= budget:
            used += compute + delays[t % len(delays)]
            t += 1
        assert rounds_within(budget, compute, delays) == t
    assert rounds_within(10.0, 1.0, np.array([1.0, 3.0])) == 3  # 2 + 4 + 2 = 8 <= 10


@pytest.mark.parametrize("flat", [[1, 2.5], [2.0], [1, "a"]])
def test_a_flat_skip_list_with_a_non_integer_raises_the_skips_type_error(flat):
    # [1, 2.5] was read as a list of rounds and the valid skip 1 named as a bad round
    from mlpapers.decentralized.btsp import circulant_schedule, scale_schedule

    with pytest.raises(TypeError, match="skips must be integers"):
        circulant_schedule(8, flat)
    with pytest.raises(TypeError, match="skips must be integers"):
        scale_schedule(flat, 3, 8)
    assert scale_schedule([1, 2], 3, 8) == [[3, 6]]
