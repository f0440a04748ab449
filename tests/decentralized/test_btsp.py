"""Schedules, BCD, biconnectivity and the bottleneck TSP of mlpapers.decentralized.btsp."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import connected_components

from mlpapers.decentralized.btsp import (
    TOPOLOGIES,
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    delays_from_graph,
    is_biconnected,
    make_delay_matrix,
    metric_closure,
    mixing_matrices,
    multiplier_relabel,
    scale_schedule,
)


def euclid(n, seed, dim=2):
    pts = np.random.default_rng(seed).random((n, dim))
    return np.linalg.norm(pts[:, None] - pts[None], axis=-1)


def random_delays(n, seed, symmetric=True):
    D = np.random.default_rng(seed).random((n, n))
    if symmetric:
        D = np.maximum(D, D.T)
    np.fill_diagonal(D, 0)
    return D


def brute_bcd(D, perm, schedule, directed=False):
    n = len(perm)
    total = []
    for skips in schedule:
        worst = 0.0
        for i in range(n):
            for s in skips:
                u, v = perm[i], perm[(i + s) % n]
                d = D[u, v] if directed else max(D[u, v], D[v, u])
                worst = max(worst, d)
        total.append(worst)
    return np.array(total)


def brute_biconnected(A):
    """By the definition: connected, and still connected after removing any one node
    (undirected: ``A`` is symmetrised; fewer than two nodes are not biconnected)."""
    n = len(A)
    A = (A | A.T) & ~np.eye(n, dtype=bool)
    if n < 2:
        return False
    if n == 2:
        return bool(A[0, 1])
    if connected_components(A, directed=False)[0] != 1:
        return False
    for v in range(n):
        keep = np.arange(n) != v
        if connected_components(A[np.ix_(keep, keep)], directed=False)[0] != 1:
            return False
    return True


def brute_btsp(E):
    n = len(E)
    best = np.inf
    for rest in itertools.permutations(range(1, n)):
        t = (0, *rest)
        best = min(best, max(E[t[i], t[(i + 1) % n]] for i in range(n)))
    return best


# ------------------------------------------------------------ schedules ------
@pytest.mark.parametrize("n", list(range(2, 40)) + [64, 100, 1023, 1024, 1025])
def test_exponential_schedules(n):
    expo = circulant_schedule(n, "exponential")
    assert len(expo) == 1 and len(expo[0]) == math.ceil(math.log2(n))
    assert all(0 < s < n for s in expo[0])
    one = circulant_schedule(n, "one_peer_exponential")
    assert [r[0] for r in one] == expo[0] and all(len(r) == 1 for r in one)
    assert circulant_schedule(n, "ring") == [[1]]
    sparse = circulant_schedule(n, "sparse_exponential")
    assert len(sparse) == 1 and sparse[0][0] == 1 and len(sparse[0]) <= 2
    assert all(0 < s < n for s in sparse[0])


def test_schedule_examples_and_explicit():
    assert circulant_schedule(8, "exponential") == [[1, 2, 4]]
    assert circulant_schedule(9, "exponential") == [[1, 2, 4, 8]]
    assert circulant_schedule(9, "sparse_exp") == [[1, 4]]
    assert circulant_schedule(10, [3, 13, 1]) == [[1, 3]]
    assert circulant_schedule(10, [[1], [2, 12]]) == [[1], [2]]
    assert circulant_schedule(10, [[-1]]) == [[9]]
    assert scale_schedule([[1, 2], [4]], 3, 10) == [[3, 6], [2]]
    with pytest.raises(ValueError, match="0 modulo"):
        circulant_schedule(10, [[1, 10]])
    with pytest.raises(ValueError, match="topology must be one of"):
        circulant_schedule(10, "hypercube")
    with pytest.raises(ValueError, match="n must be >= 2"):
        circulant_schedule(1, "ring")
    with pytest.raises(TypeError, match="n must be an integer"):
        circulant_schedule(4.0, "ring")
    with pytest.raises(ValueError, match="non-empty"):
        circulant_schedule(4, [[]])
    with pytest.raises(ValueError, match="coprime"):
        scale_schedule([[1]], 2, 10)


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 31])
def test_mixing_doubly_stochastic(topology, n):
    W = mixing_matrices(n, topology)
    assert W.shape == (len(circulant_schedule(n, topology)), n, n)
    assert (W >= 0).all()
    np.testing.assert_allclose(W.sum(axis=1), 1.0)
    np.testing.assert_allclose(W.sum(axis=2), 1.0)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_one_peer_exact_averaging_power_of_two(n):
    W = mixing_matrices(n, "one_peer_exponential")
    P = np.eye(n)
    for Wl in W:
        P = Wl @ P
    np.testing.assert_allclose(P, np.full((n, n), 1.0 / n), atol=1e-12)


def test_one_peer_not_exact_otherwise():
    W = mixing_matrices(6, "one_peer_exponential")
    P = W[2] @ W[1] @ W[0]
    assert not np.allclose(P, 1 / 6)


# ------------------------------------------------------------------ BCD ------
@pytest.mark.parametrize("topology", [*TOPOLOGIES, [[1, 3], [2]]])
@pytest.mark.parametrize("n", [2, 3, 7, 10])
@pytest.mark.parametrize("directed", [False, True])
def test_bcd_matches_brute_force(topology, n, directed):
    if not isinstance(topology, str) and n < 7:
        pytest.skip("explicit skips 1, 2, 3 need n > 3")
    rng = np.random.default_rng(n)
    D = random_delays(n, n, symmetric=False)
    perm = rng.permutation(n)
    sched = circulant_schedule(n, topology)
    rounds = brute_bcd(D, perm, sched, directed)
    got = bottleneck_delay(D, perm, topology, reduce="none", directed=directed)
    np.testing.assert_allclose(got, rounds)
    assert bottleneck_delay(D, perm, topology, reduce="sum", directed=directed) == \
        pytest.approx(rounds.sum())
    assert bottleneck_delay(D, perm, topology, directed=directed) == pytest.approx(rounds.mean())


def test_bcd_doctest_values_and_tensor_input():
    import torch

    D = np.abs(np.subtract.outer(np.arange(4.0), np.arange(4.0)))
    assert bottleneck_delay(D, [0, 1, 3, 2], "ring") == 2.0
    assert bottleneck_delay(torch.tensor(D), torch.tensor([0, 1, 2, 3]), "ring") == 3.0


def test_ring_bcd_is_tour_bottleneck():
    D = euclid(12, 0)
    tour, b, _ = bottleneck_tsp(D, random_state=0)
    assert bottleneck_delay(D, tour, "ring") == pytest.approx(b)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 24), seed=st.integers(0, 10_000), k=st.integers(0, 50),
       topology=st.sampled_from(TOPOLOGIES), directed=st.booleans())
def test_multiplier_identity(n, seed, k, topology, directed):
    """BCD(pi o c; S) == BCD(pi; c S) for every c coprime with n."""
    rng = np.random.default_rng(seed)
    D = random_delays(n, seed, symmetric=False)
    perm = rng.permutation(n)
    units = [c for c in range(1, max(n, 2)) if math.gcd(c, n) == 1]
    c = units[k % len(units)]
    S = circulant_schedule(n, topology)
    lhs = bottleneck_delay(D, multiplier_relabel(perm, c), S, reduce="none", directed=directed)
    rhs = bottleneck_delay(D, perm, scale_schedule(S, c, n), reduce="none", directed=directed)
    np.testing.assert_allclose(lhs, rhs)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 20), seed=st.integers(0, 10_000), r=st.integers(0, 100),
       topology=st.sampled_from(TOPOLOGIES), scale=st.floats(0.01, 100.0))
def test_bcd_invariances(n, seed, r, topology, scale):
    rng = np.random.default_rng(seed)
    D = random_delays(n, seed, symmetric=False)
    perm = rng.permutation(n)
    ref = bottleneck_delay(D, perm, topology, directed=True)
    # rotation (any D, directed)
    assert bottleneck_delay(D, np.roll(perm, r), topology, directed=True) == pytest.approx(ref)
    # physical relabelling: D'[sigma(u), sigma(v)] = D[u, v], pi' = sigma o pi
    sigma = rng.permutation(n)
    D2 = np.empty_like(D)
    D2[np.ix_(sigma, sigma)] = D
    assert bottleneck_delay(D2, sigma[perm], topology, directed=True) == pytest.approx(ref)
    # scaling
    assert bottleneck_delay(scale * D, perm, topology, directed=True) == pytest.approx(scale * ref)
    # reflection pi(-i) for symmetric D
    Ds = np.maximum(D, D.T)
    refl = perm[(-np.arange(n)) % n]
    want = bottleneck_delay(Ds, perm, topology)
    assert bottleneck_delay(Ds, refl, topology) == pytest.approx(want)


def test_bcd_bad_input():
    D = random_delays(5, 0)
    with pytest.raises(ValueError, match="square"):
        bottleneck_delay(D[:, :4], np.arange(5), "ring")
    with pytest.raises(ValueError, match="non-negative"):
        bottleneck_delay(D - 1, np.arange(5), "ring")
    bad = D.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        bottleneck_delay(bad, np.arange(5), "ring")
    with pytest.raises(ValueError, match="permutation"):
        bottleneck_delay(D, [0, 1, 2, 3, 3], "ring")
    with pytest.raises(ValueError, match="length n=5"):
        bottleneck_delay(D, [0, 1, 2, 3], "ring")
    with pytest.raises(ValueError, match="reduce"):
        bottleneck_delay(D, np.arange(5), "ring", reduce="max")
    with pytest.raises(ValueError, match="topology"):
        bottleneck_delay(D, np.arange(5), "torus")
    with pytest.raises(ValueError, match="2D"):
        bottleneck_delay(np.zeros(5), np.arange(5), "ring")
    with pytest.raises(ValueError, match="minimum of 2"):
        bottleneck_delay(np.zeros((1, 1)), [0], "ring")


# ------------------------------------------------------- biconnectivity ------
def test_is_biconnected_matches_definition():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(2, 11))
        A = np.triu(rng.random((n, n)) < rng.random(), 1)
        A = A | A.T
        assert is_biconnected(A) == brute_biconnected(A)


def test_is_biconnected_known_graphs():
    n = 9
    cycle = np.zeros((n, n), bool)
    cycle[np.arange(n), (np.arange(n) + 1) % n] = True
    assert is_biconnected(cycle)
    path = cycle.copy()
    path[n - 1, 0] = path[0, n - 1] = False
    assert not is_biconnected(path | path.T)
    bowtie = np.zeros((5, 5), bool)  # two triangles sharing node 0
    for a, b in [(0, 1), (1, 2), (2, 0), (0, 3), (3, 4), (4, 0)]:
        bowtie[a, b] = bowtie[b, a] = True
    assert not is_biconnected(bowtie)
    assert is_biconnected(np.ones((2, 2)))
    assert not is_biconnected(np.ones((1, 1)))


def test_is_biconnected_networkx():
    nx = pytest.importorskip("networkx")
    for seed in range(20):
        G = nx.gnp_random_graph(40, 0.08, seed=seed)
        A = nx.to_numpy_array(G) > 0
        assert is_biconnected(A) == nx.is_biconnected(G)


@pytest.mark.parametrize("seed", range(6))
def test_theta_star_is_brute_force_threshold(seed):
    n = 4 + seed
    D = random_delays(n, seed)
    vals = np.unique(D[np.triu_indices(n, 1)])
    want = next(t for t in vals if brute_biconnected(D <= t))
    assert biconnected_threshold(D) == want
    # ties: rounded delays
    Dt = np.round(D * 3) / 3
    vals = np.unique(Dt[np.triu_indices(n, 1)])
    assert biconnected_threshold(Dt) == next(t for t in vals if brute_biconnected(Dt <= t))


# ------------------------------------------------------------- BTSP ----------
@pytest.mark.parametrize("seed", range(8))
def test_btsp_small_vs_brute_force(seed):
    n = 4 + seed % 5  # 4..8
    D = euclid(n, seed)
    opt = brute_btsp(D)
    tour_e, b_e, theta = bottleneck_tsp(D, method="exact")
    assert b_e == pytest.approx(opt)
    assert sorted(tour_e) == list(range(n))
    assert bottleneck_delay(D, tour_e, "ring") == pytest.approx(opt)
    tour, b, theta2 = bottleneck_tsp(D, random_state=seed)
    assert theta == theta2
    assert theta <= opt + 1e-12 <= b + 2e-12
    assert b <= 2 * opt + 1e-12 and b <= 2 * theta + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_btsp_exact_directed_vs_brute_force(seed):
    n = 5 + seed
    D = random_delays(n, seed, symmetric=False)
    tour, b, theta = bottleneck_tsp(D, method="exact", directed=True)
    assert b == pytest.approx(brute_btsp(D))
    assert bottleneck_delay(D, tour, "ring", directed=True) == pytest.approx(b)
    assert theta <= b
    # the 2-approximation is feasible and never better than the optimum
    tour2, b2, _ = bottleneck_tsp(D, directed=True, random_state=0)
    assert sorted(tour2) == list(range(n)) and b2 >= b - 1e-12


@pytest.mark.parametrize("n,kind,seed", [(10, "geometric", 0), (37, "clustered", 1),
                                         (64, "backbone", 2), (120, "geometric", 3),
                                         (200, "backbone", 4), (200, "clustered", 5)])
def test_btsp_two_approx_bound_on_metric(n, kind, seed):
    D = make_delay_matrix(n, kind, random_state=seed)
    tour, b, theta = bottleneck_tsp(D, random_state=seed)
    assert sorted(tour) == list(range(n))
    assert bottleneck_delay(D, tour, "ring") == pytest.approx(b)
    assert theta <= b <= 2 * theta + 1e-9


def test_btsp_euclidean_random_instances():
    for seed in range(5):
        D = euclid(30 + 20 * seed, seed, dim=3)
        _, b, theta = bottleneck_tsp(D, random_state=seed)
        assert theta <= b <= 2 * theta


def test_btsp_edge_cases():
    for n in (2, 3):
        D = random_delays(n, n)
        for method in ("2approx", "exact"):
            tour, b, theta = bottleneck_tsp(D, method=method)
            assert sorted(tour) == list(range(n))
            assert b == pytest.approx(D[np.triu_indices(n, 1)].max())
            assert theta == b
    const = np.ones((13, 13))  # ties everywhere, prime n
    tour, b, theta = bottleneck_tsp(const, random_state=0)
    assert b == theta == 1.0 and sorted(tour) == list(range(13))


def test_btsp_non_metric_closure():
    D = random_delays(30, 0) ** 4  # far from metric
    closed = metric_closure(D)
    assert (closed <= D + 1e-15).all()
    n = len(D)
    via = (closed[:, :, None] + closed[None, :, :]).min(axis=1)
    assert (closed <= via + 1e-12).all()
    tour, b, theta = bottleneck_tsp(D, metric_closure=True, random_state=0)
    assert theta <= b <= 2 * theta + 1e-12
    assert sorted(tour) == list(range(n))


def test_btsp_bad_input():
    with pytest.raises(ValueError, match="method"):
        bottleneck_tsp(random_delays(4, 0), method="lkh")
    with pytest.raises(ValueError, match="n <= 16"):
        bottleneck_tsp(random_delays(17, 0), method="exact")


# ------------------------------------------------------------ graphs ---------
def test_delays_from_graph():
    nx = pytest.importorskip("networkx")
    G = nx.path_graph(["a", "b", "c", "d"])
    for (u, v), l in zip(G.edges, [100.0, 200.0, 50.0]):
        G.edges[u, v]["distance"] = l
    D = delays_from_graph(G)
    link = 0.0085 * np.array([100.0, 200.0, 50.0]) + 4.0
    assert D[0, 1] == pytest.approx(link[0])
    assert D[0, 3] == pytest.approx(link.sum())
    assert np.allclose(D, D.T) and (np.diag(D) == 0).all()
    L = delays_from_graph(G, shortest_paths=False)
    assert np.isinf(L[0, 3]) and L[1, 2] == pytest.approx(link[1])
    D2 = delays_from_graph(G, nodelist=["d", "c", "b", "a"], per_unit=1.0, overhead=0.0)
    assert D2[0, 3] == pytest.approx(350.0)
    G.add_node("e")
    with pytest.raises(ValueError, match="not .*connected"):
        delays_from_graph(G)
    H = nx.Graph()
    H.add_edge(0, 1)
    with pytest.raises(ValueError, match="no 'distance'.*length_attr=None"):
        delays_from_graph(H)


@pytest.mark.parametrize("kind", ["geometric", "clustered", "backbone"])
def test_make_delay_matrix(kind):
    D, pos, links = make_delay_matrix(40, kind, random_state=0, return_positions=True)
    assert D.shape == (40, 40) and pos.shape == (40, 2) and links.shape[1] == 2
    assert np.allclose(D, D.T) and (np.diag(D) == 0).all()
    assert (D[~np.eye(40, dtype=bool)] > 0).all()
    via = (D[:, :, None] + D[None, :, :]).min(axis=1)
    assert (D <= via + 1e-9).all()
    np.testing.assert_array_equal(D, make_delay_matrix(40, kind, random_state=0))
    with pytest.raises(ValueError, match="kind"):
        make_delay_matrix(5, "mesh")


def _graph_metric(edges, n):
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    r, c = np.array(edges).T
    A = csr_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
    return shortest_path(A, directed=False, unweighted=True)


@pytest.mark.parametrize("name", ["k23", "k25", "petersen"])
def test_btsp_non_hamiltonian_threshold_graph(name):
    """G(theta*) biconnected but not Hamiltonian: the answer needs 2-hop links (= 2 theta*)."""
    if name.startswith("k2"):
        m = int(name[2])
        edges = [(a, 2 + b) for a in range(2) for b in range(m)]
        n = 2 + m
    else:
        outer = [(i, (i + 1) % 5) for i in range(5)]
        spokes = [(i, i + 5) for i in range(5)]
        inner = [(5 + i, 5 + (i + 2) % 5) for i in range(5)]
        edges, n = outer + spokes + inner, 10
    D = _graph_metric(edges, n)
    tour, b, theta = bottleneck_tsp(D, random_state=0)
    assert theta == 1.0 and b == 2.0 and sorted(tour) == list(range(n))
    assert bottleneck_tsp(D, method="exact")[1] == 2.0


def test_delays_from_graph_without_networkx(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "networkx", None)
    with pytest.raises(ImportError, match=r"mlpapers\[graph\]"):
        delays_from_graph(object())


def test_switches_read_later_are_checked_there_too():
    """``bottleneck_tsp(metric=...)`` is None, True or False; ``bcd`` reads
    ``directed``/``metric_closure`` again, so a value set after fit is checked there."""
    from mlpapers.decentralized import BottleneckNodeAssigner

    D = random_delays(6, 0)
    with pytest.raises(TypeError, match="metric must be a bool"):
        bottleneck_tsp(D, metric="no")
    assert bottleneck_tsp(D, metric=np.True_)[1] == bottleneck_tsp(D, metric=True)[1]
    est = BottleneckNodeAssigner(random_state=0).fit(D)
    for name in ("directed", "metric_closure"):
        est.set_params(**{name: "no"})
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            est.bcd(D)
        est.set_params(**{name: False})
    assert est.bcd(D) == pytest.approx(est.bcd_)
