"""Properties that must hold for every valid input, on inputs hypothesis generates
(mlpapers.decentralized.btsp).

Delay matrices are generated over the documented domain: symmetric or not, metric or
not, with ties, zeros between distinct nodes, integer values and several scales; graphs
and schedules likewise (explicit skip sets, with skips sharing factors with ``n``).
The relations are exact: brute force on tiny instances (bounds are bounds, optima are
optima), relabelling and monotone-transform invariances, feasibility of the returned
tours, schedules and edge lists, and the algebra of the mixing matrices.
``PROP_EXAMPLES`` raises the number of examples for exploration
(``HYPOTHESIS_PROFILE=explore PROP_EXAMPLES=500``).
"""

import itertools
import math
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from mlpapers.decentralized.btsp import (
    TOPOLOGIES,
    BottleneckNodeAssigner,
    best_multiplier,
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    delays_from_graph,
    is_biconnected,
    metric_closure,
    mixing_matrices,
    multiplier_relabel,
)
from mlpapers.decentralized.btsp._dsgd import mix

from .test_btsp import brute_biconnected

N = int(os.environ.get("PROP_EXAMPLES", 0))


def _ex(default: int) -> int:
    return N or default


# ------------------------------------------------------------- strategies ------
@st.composite
def delay_matrices(draw, min_n=2, max_n=7, symmetric=None):
    """Non-negative (n, n) delays: continuous, tied (a few levels), integer or with zero
    delays between distinct nodes; symmetric or not; at scales 1e-6 .. 1e6."""
    n = draw(st.integers(min_n, max_n))
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["uniform", "ties", "integer", "zeros", "euclid"]))
    sym = draw(st.booleans()) if symmetric is None else symmetric
    scale = 10.0 ** draw(st.sampled_from([-6, 0, 3, 6]))
    rng = np.random.default_rng(seed)
    if kind == "euclid":
        pts = rng.random((n, 2))
        D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    elif kind == "ties":
        D = rng.integers(1, 4, size=(n, n)) / 3.0
    elif kind == "integer":
        D = rng.integers(0, 10, size=(n, n)).astype(float)
    elif kind == "zeros":
        D = rng.random((n, n)) * (rng.random((n, n)) < 0.6)
    else:
        D = rng.random((n, n))
    if sym:
        D = np.maximum(D, D.T)
    D = D * scale
    np.fill_diagonal(D, 0.0)
    return D


@st.composite
def schedules(draw, n):
    """A named topology or explicit skip sets (any skips not 0 mod n, some sharing a
    factor with n, duplicates and skips above n included)."""
    if draw(st.booleans()):
        return draw(st.sampled_from(TOPOLOGIES))
    rounds = draw(st.lists(st.lists(st.integers(1, 3 * n), min_size=1, max_size=3),
                           min_size=1, max_size=3))
    return [[s if s % n else s + 1 for s in r] for r in rounds]


def _perm_matrix(D, sigma):
    """Physical relabelling: node u becomes sigma[u]."""
    D2 = np.empty_like(D)
    D2[np.ix_(sigma, sigma)] = D
    return D2


def _brute_bcd_all(D, schedule, directed):
    """BCD (per-round mean) of every assignment with pi(0) = 0: the optimum, brute force."""
    n = len(D)
    E = D if directed else np.maximum(D, D.T)
    P = np.array([(0, *rest) for rest in itertools.permutations(range(1, n))])
    total = np.zeros(len(P))
    for skips in schedule:
        worst = np.zeros(len(P))
        for i in range(n):
            for s in skips:
                worst = np.maximum(worst, E[P[:, i], P[:, (i + s) % n]])
        total += worst
    return total / len(schedule)


def _cycle_bottleneck(E, tour):
    return float(E[tour, np.roll(tour, -1)].max())


# -------------------------------------------------------------- schedules ------
@settings(max_examples=_ex(40), deadline=None)
@given(n=st.integers(2, 40), data=st.data())
def test_schedule_is_canonical_and_mixing_matrices_are_doubly_stochastic_circulants(n, data):
    topo = data.draw(schedules(n))
    S = circulant_schedule(n, topo)
    if not isinstance(topo, str):  # explicit skips are reduced mod n, sorted and deduplicated
        assert S == [sorted({s % n for s in r}) for r in topo]
    for r in S:
        assert r == sorted(set(r)) and all(1 <= s < n for s in r)
    W = mixing_matrices(n, topo)
    assert W.shape == (len(S), n, n) and W.dtype == np.float64
    assert np.all(W >= 0)
    np.testing.assert_allclose(W.sum(axis=2), 1.0, atol=1e-12)  # rows
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)  # columns
    for l, skips in enumerate(S):
        # circulant: shifting every node by one leaves W unchanged
        np.testing.assert_array_equal(np.roll(W[l], (1, 1), axis=(0, 1)), W[l])
        # node j hears exactly itself and j - s for s in S_l, with equal weights
        support = {0} | {(-s) % n for s in skips}
        assert set(np.flatnonzero(W[l, 0]).tolist()) == support
        np.testing.assert_allclose(W[l, 0, sorted(support)], 1.0 / (len(skips) + 1))
        # symmetric exactly when the skip set is closed under negation mod n
        closed = {(-s) % n for s in skips} == set(skips)
        assert np.array_equal(W[l], W[l].T) == closed


@settings(max_examples=_ex(30), deadline=None)
@given(n=st.integers(2, 12), data=st.data(), dims=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def test_gossip_preserves_the_average_and_never_increases_the_spread(n, data, dims, seed):
    topo = data.draw(schedules(n))
    W = torch.as_tensor(mixing_matrices(n, topo))
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(n, dims, 2, generator=g, dtype=torch.float64),
              "b": torch.randn(n, generator=g, dtype=torch.float64)}
    for Wl in W:
        out = mix(params, Wl)
        for k in params:
            assert out[k].shape == params[k].shape
            np.testing.assert_allclose(out[k].mean(0).numpy(), params[k].mean(0).numpy(),
                                       atol=1e-12)
            # a doubly stochastic average is a contraction of the max deviation
            dev0 = (params[k] - params[k].mean(0)).abs().max()
            dev1 = (out[k] - out[k].mean(0)).abs().max()
            assert float(dev1) <= float(dev0) + 1e-12
        params = out


# -------------------------------------------------------------------- BCD ------
@settings(max_examples=_ex(40), deadline=None)
@given(D=delay_matrices(max_n=10), data=st.data(), directed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_bcd_reductions_symmetrisation_and_monotonicity(D, data, directed, seed):
    n = len(D)
    topo = data.draw(schedules(n))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    rounds = bottleneck_delay(D, perm, topo, reduce="none", directed=directed)
    S = circulant_schedule(n, topo)
    assert rounds.shape == (len(S),)
    # the sum is correctly rounded (math.fsum), which numpy's sum need not be (1 ulp off
    # for some sums of three rounds)
    assert (bottleneck_delay(D, perm, topo, reduce="sum", directed=directed)
            == math.fsum(rounds.tolist()))
    assert bottleneck_delay(D, perm, topo, directed=directed) == pytest.approx(rounds.mean())
    # each round's bottleneck is one of the delays of a link it uses
    E = D if directed else np.maximum(D, D.T)
    for l, skips in enumerate(S):
        used = {E[perm[i], perm[(i + s) % n]] for i in range(n) for s in skips}
        assert rounds[l] in used and rounds[l] == max(used)
    # undirected mode is directed mode on max(D, D^T)
    np.testing.assert_array_equal(
        bottleneck_delay(D, perm, topo, reduce="none"),
        bottleneck_delay(np.maximum(D, D.T), perm, topo, reduce="none", directed=True))
    # larger delays cannot lower a bottleneck; more skips in a round cannot either
    bigger = D + rng.random((n, n)) * D.max()
    assert np.all(bottleneck_delay(bigger, perm, topo, reduce="none", directed=directed)
                  >= rounds)
    extra = [sorted(set(r) | {int(rng.integers(1, n))}) if n > 1 else r for r in S]
    assert np.all(bottleneck_delay(D, perm, extra, reduce="none", directed=directed) >= rounds)


@settings(max_examples=_ex(30), deadline=None)
@given(D=delay_matrices(max_n=12), data=st.data(), directed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_best_multiplier_is_the_minimum_over_all_units(D, data, directed, seed):
    n = len(D)
    topo = data.draw(schedules(n))
    perm = np.random.default_rng(seed).permutation(n)
    c, new, bcd = best_multiplier(D, perm, topo, directed=directed)
    units = [u for u in range(1, max(n, 2)) if math.gcd(u, n) == 1]
    scores = [bottleneck_delay(D, multiplier_relabel(perm, u), topo, directed=directed)
              for u in units]
    assert bcd == min(scores)
    assert c == units[int(np.argmin(scores))]  # the smallest among ties
    np.testing.assert_array_equal(new, multiplier_relabel(perm, c))
    assert sorted(new.tolist()) == list(range(n))


# ---------------------------------------------------------- biconnectivity -----
@settings(max_examples=_ex(60), deadline=None)
@given(n=st.integers(1, 9), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_is_biconnected_matches_the_definition_and_ignores_labels(n, density, seed):
    rng = np.random.default_rng(seed)
    A = np.triu(rng.random((n, n)) < density, 1)
    A = A | A.T
    want = brute_biconnected(A)
    assert is_biconnected(A) == want
    sigma = rng.permutation(n)
    assert is_biconnected(A[np.ix_(sigma, sigma)]) == want
    assert is_biconnected(A.astype(int)) == want  # 0/1 input
    if want and n > 2:  # adding an edge keeps a biconnected graph biconnected
        i, j = rng.choice(n, 2, replace=False)
        B = A.copy()
        B[i, j] = B[j, i] = True
        assert is_biconnected(B)


@settings(max_examples=_ex(40), deadline=None)
@given(D=delay_matrices(max_n=8), directed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_threshold_is_the_smallest_biconnected_value_and_is_label_and_order_free(
        D, directed, seed):
    n = len(D)
    S = np.minimum(D, D.T) if directed else np.maximum(D, D.T)
    theta = biconnected_threshold(D, directed=directed)
    vals = np.unique(S[np.triu_indices(n, 1)])
    want = next(t for t in vals if brute_biconnected(S <= t)) if n > 2 else S[0, 1]
    assert theta == want
    sigma = np.random.default_rng(seed).permutation(n)
    assert biconnected_threshold(_perm_matrix(D, sigma), directed=directed) == theta
    # only the order of the delays matters: theta(f(D)) = f(theta(D)) for increasing f
    # (x * x + x on both sides: the same float operations, so the same rounding)
    assert biconnected_threshold(D * D + D, directed=directed) == theta * theta + theta


# ------------------------------------------------------------------- BTSP ------
@settings(max_examples=_ex(40), deadline=None)
@given(D=delay_matrices(max_n=7), directed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_bottleneck_tsp_bounds_against_brute_force(D, directed, seed):
    n = len(D)
    E = D if directed else np.maximum(D, D.T)
    opt = _brute_bcd_all(D, [[1]], directed).min()  # the optimal ring = optimal tour
    tour_e, b_e, theta = bottleneck_tsp(D, method="exact", directed=directed)
    assert sorted(tour_e.tolist()) == list(range(n))
    assert b_e == opt == _cycle_bottleneck(E, tour_e)
    assert theta <= opt  # theta* is a lower bound (every Hamiltonian cycle is 2-connected)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # non-metric inputs may warn
        tour, b, theta2 = bottleneck_tsp(D, directed=directed, random_state=seed)
    assert theta2 == theta
    assert sorted(tour.tolist()) == list(range(n))
    assert b == _cycle_bottleneck(E, tour) >= opt
    assert bottleneck_delay(D, tour, "ring", directed=directed) == b
    # relabelling the physical nodes does not change the optimum
    sigma = np.random.default_rng(seed).permutation(n)
    assert bottleneck_tsp(_perm_matrix(D, sigma), method="exact", directed=directed)[1] == opt


@settings(max_examples=_ex(25), deadline=None)
@given(D=delay_matrices(min_n=3, max_n=40, symmetric=True), seed=st.integers(0, 2**31 - 1))
def test_two_approximation_on_metric_delays_is_within_twice_theta(D, seed):
    # the shortest-path closure is metric: Parker-Rardin's bound theta <= b <= 2 theta
    # holds, and no warning is raised
    M = metric_closure(D)
    n = len(M)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tour, b, theta = bottleneck_tsp(M, random_state=seed)
        tour2, b2, theta2 = bottleneck_tsp(D, metric_closure=True, random_state=seed)
    assert sorted(tour.tolist()) == list(range(n))
    assert theta <= b <= 2 * theta * (1 + 1e-12)
    np.testing.assert_array_equal(tour2, tour)
    assert (b2, theta2) == (b, theta)


@settings(max_examples=_ex(25), deadline=None)
@given(D=delay_matrices(min_n=2, max_n=30, symmetric=True), seed=st.integers(0, 2**31 - 1),
       f=st.sampled_from(["square", "sqrt", "affine"]))
def test_two_approximation_depends_only_on_the_order_of_the_delays(D, seed, f):
    # every step (thresholds, biconnectivity, the cycle search) compares delays only:
    # a strictly increasing map of the delays gives the same tour for the same seed
    g = {"square": lambda x: x * x, "sqrt": np.sqrt, "affine": lambda x: 3 * x + 1}[f]
    G = g(D)
    np.fill_diagonal(G, 0.0)
    # (an increasing map may merge close values by rounding: then the order changed)
    iu = np.triu_indices(len(D), 1)
    assume(np.unique(G[iu]).size == np.unique(D[iu]).size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t1, b1, th1 = bottleneck_tsp(D, random_state=seed)
        t2, b2, th2 = bottleneck_tsp(G, random_state=seed)
    np.testing.assert_array_equal(t1, t2)
    assert b2 == g(np.float64(b1)) and th2 == g(np.float64(th1))
    # metric or not, the tour is a Hamiltonian cycle whose bottleneck is reported
    assert sorted(t1.tolist()) == list(range(len(D)))
    assert th1 <= b1 == _cycle_bottleneck(D, t1)


@settings(max_examples=_ex(30), deadline=None)
@given(D=delay_matrices(max_n=12), seed=st.integers(0, 2**31 - 1))
def test_metric_closure_is_the_largest_metric_below_the_delays(D, seed):
    M = metric_closure(D)
    n = len(D)
    assert np.all(M <= D) and np.all(np.diag(M) == 0)
    # triangle inequality (to rounding of the sums)
    via = (M[:, :, None] + M[None, :, :]).min(axis=1)
    assert np.all(M <= via * (1 + 1e-12))
    # idempotent, to the rounding of sums of up to n - 1 delays in another order
    np.testing.assert_allclose(metric_closure(M), M, rtol=n * np.finfo(float).eps, atol=0)
    sigma = np.random.default_rng(seed).permutation(n)
    np.testing.assert_allclose(metric_closure(_perm_matrix(D, sigma)), _perm_matrix(M, sigma),
                               rtol=1e-12)


# --------------------------------------------------------------- assigner ------
@settings(max_examples=_ex(30), deadline=None)
@given(D=delay_matrices(max_n=7), data=st.data(), directed=st.booleans(),
       method=st.sampled_from(["btsp_msr", "btsp", "identity", "random", "greedy",
                               "annealing", "exact"]),
       seed=st.integers(0, 2**31 - 1))
def test_assigner_outputs_are_feasible_consistent_and_bounded(D, data, directed, method, seed):
    n = len(D)
    topo = data.draw(schedules(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-metric inputs / worse-than-random warnings
        est = BottleneckNodeAssigner(topology=topo, method=method, directed=directed,
                                     n_iter=50, random_state=seed).fit(D)
    S = circulant_schedule(n, topo)
    E = D if directed else np.maximum(D, D.T)
    a = est.assignment_
    assert sorted(a.tolist()) == list(range(n))
    assert est.schedule_ == S
    rounds = bottleneck_delay(D, a, S, reduce="none", directed=directed)
    np.testing.assert_array_equal(est.bcd_per_round_, rounds)
    assert est.bcd_total_ == pytest.approx(rounds.sum()) and est.bcd_ == pytest.approx(
        rounds.mean())
    # the multiplier step: a unit of Z_n applied to the base assignment
    assert math.gcd(est.multiplier_, n) == 1
    np.testing.assert_array_equal(a, multiplier_relabel(est.base_assignment_, est.multiplier_))
    # edges: in round l every node sends and receives once per skip, along used links
    edges = est.edges_
    assert edges.shape == (n * sum(len(r) for r in S), 3)
    for l, skips in enumerate(S):
        e = edges[edges[:, 0] == l]
        assert len(e) == n * len(skips) and np.all(e[:, 1] != e[:, 2])
        assert np.all(np.bincount(e[:, 1], minlength=n) == len(skips))
        assert np.all(np.bincount(e[:, 2], minlength=n) == len(skips))
        assert E[e[:, 1], e[:, 2]].max() == rounds[l]
    # bounds against the brute-force optimum
    opt = _brute_bcd_all(D, S, directed).min()
    tol = 1e-12 * max(float(D.max()), 1e-300)
    assert est.lower_bound_ <= opt + tol <= est.bcd_ + 2 * tol
    assert est.random_bcd_ >= opt - tol
    if method == "exact":
        assert est.bcd_ == pytest.approx(opt, rel=1e-12, abs=tol)


@settings(max_examples=_ex(20), deadline=None)
@given(D=delay_matrices(min_n=8, max_n=40), data=st.data(), directed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_lower_bound_is_below_every_method_beyond_brute_force_sizes(D, data, directed, seed):
    # too large for brute force: the documented lower bound must still lie below what
    # every method finds (and below the random baseline, a mean of feasible BCDs)
    n = len(D)
    topo = data.draw(schedules(n))
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in ("btsp_msr", "greedy", "annealing", "random"):
            est = BottleneckNodeAssigner(topology=topo, method=method, directed=directed,
                                         n_iter=30, n_random=2, random_state=seed).fit(D)
            found.append(est.bcd_)
            lb = est.lower_bound_
            assert lb <= est.random_bcd_
            assert sorted(est.assignment_.tolist()) == list(range(n))
    assert lb <= min(found)


@settings(max_examples=_ex(20), deadline=None)
@given(D=delay_matrices(max_n=9), data=st.data(), directed=st.booleans(),
       method=st.sampled_from(["btsp_msr", "btsp", "greedy", "annealing", "exact"]),
       k=st.integers(-20, 20), seed=st.integers(0, 2**31 - 1))
def test_assigner_is_invariant_to_a_power_of_two_change_of_units(D, data, directed, method, k,
                                                                 seed):
    # multiplying every delay by 2^k is exact in floating point and keeps every
    # comparison (and annealing's exp(-d / T), T being proportional to the delays):
    # the same seed gives the same assignment, and BCDs scale by 2^k
    n = len(D)
    if method == "exact" and n > 8:
        return
    topo = data.draw(schedules(n))
    kw = dict(topology=topo, method=method, directed=directed, n_iter=60, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = BottleneckNodeAssigner(**kw).fit(D)
        b = BottleneckNodeAssigner(**kw).fit(D * 2.0**k)
    np.testing.assert_array_equal(a.assignment_, b.assignment_)
    assert b.bcd_ == a.bcd_ * 2.0**k and b.theta_ == a.theta_ * 2.0**k
    assert b.lower_bound_ == a.lower_bound_ * 2.0**k


@settings(max_examples=_ex(20), deadline=None)
@given(D=delay_matrices(max_n=7), data=st.data(), directed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_exact_assignment_relabels_with_the_physical_nodes(D, data, directed, seed):
    n = len(D)
    topo = data.draw(schedules(n))
    sigma = np.random.default_rng(seed).permutation(n)
    a = BottleneckNodeAssigner(topology=topo, method="exact", directed=directed).fit(D)
    b = BottleneckNodeAssigner(topology=topo, method="exact", directed=directed).fit(
        _perm_matrix(D, sigma))
    assert b.bcd_ == a.bcd_ and b.theta_ == a.theta_ and b.lower_bound_ == a.lower_bound_
    # the relabelled optimal assignment is optimal for the relabelled network
    assert bottleneck_delay(_perm_matrix(D, sigma), sigma[a.assignment_], topo,
                            directed=directed) == a.bcd_


# ------------------------------------------------------------------ graphs -----
@settings(max_examples=_ex(25), deadline=None)
@example(n=4, p=1.0, seed=3, directed=False, per_unit=0.1, overhead=0.0)  # 31.4 vs 31.4 + ulp
@given(n=st.integers(2, 12), p=st.floats(0.1, 1.0), seed=st.integers(0, 2**31 - 1),
       directed=st.booleans(), per_unit=st.floats(0.0, 1.0), overhead=st.floats(0.0, 10.0))
def test_delays_from_graph_are_shortest_paths_and_follow_the_node_order(
        n, p, seed, directed, per_unit, overhead):
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(seed)
    G = nx.gnp_random_graph(n, p, seed=int(seed % 2**32), directed=directed)
    # connect it: a (bidirectional) path through all nodes in a random order
    order = rng.permutation(n).tolist()
    for u, v in zip(order, order[1:], strict=False):
        G.add_edge(u, v)
        if directed:
            G.add_edge(v, u)
    for u, v in G.edges:
        G.edges[u, v]["distance"] = float(rng.integers(0, 1000))
    D = delays_from_graph(G, per_unit=per_unit, overhead=overhead, nodelist=range(n))
    ref = dict(nx.shortest_path_length(G, weight=lambda u, v, e: per_unit * e["distance"]
                                       + overhead))
    want = np.array([[ref[u][v] for v in range(n)] for u in range(n)])
    np.testing.assert_allclose(D, want, rtol=1e-12, atol=1e-12)
    if not directed:  # documented: a symmetric matrix (exactly, not to rounding)
        np.testing.assert_array_equal(D, D.T)
    # another node order permutes rows and columns alike
    perm = rng.permutation(n)
    np.testing.assert_array_equal(delays_from_graph(G, per_unit=per_unit, overhead=overhead,
                                                    nodelist=perm.tolist()),
                                  D[np.ix_(perm, perm)])


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
