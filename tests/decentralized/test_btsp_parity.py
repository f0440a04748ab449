"""Parity of BTSP-MSR code paths that claim to agree (each test names its two paths)."""

import copy

import numpy as np
import pytest
import torch

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    delays_from_graph,
    metric_closure,
    mixing_matrices,
)
from mlpapers.decentralized.btsp._node_models import _build_module, _init_params

nx = pytest.importorskip("networkx")

METHODS = ["btsp_msr", "btsp", "random", "greedy", "annealing", "identity", "exact"]
TOPOLOGIES = ["ring", "exponential", "one_peer_exponential", "sparse_exponential"]


def euclidean(n, seed):
    P = np.random.default_rng(seed).random((n, 2))
    return np.linalg.norm(P[:, None] - P[None], axis=-1)


def asymmetric(n, seed):
    A = np.random.default_rng(seed).random((n, n))
    np.fill_diagonal(A, 0.0)
    return A


@pytest.mark.parametrize("n", [2, 3, 7])
def test_delays_from_graph_equals_metric_closure_of_its_links(n):
    """delays_from_graph(G) (Dijkstra) vs metric_closure (Floyd-Warshall) of the link
    delays, for a Graph, a DiGraph, and links in a tiny unit (1e-250) or of zero delay.

    Regression: zero-delay links were shifted to 1e-300 and every path below 1e-200
    set to 0, so all delays of a network in a tiny unit came back 0.
    """
    rng = np.random.default_rng(n)
    W = rng.random((n, n)) * 100
    for directed in (False, True):
        G = nx.DiGraph() if directed else nx.Graph()
        L = np.full((n, n), np.inf)
        np.fill_diagonal(L, 0.0)
        for i in range(n):
            for j in range(n):
                if i != j and (directed or i < j) and (j - i) % n in (1, 2):
                    G.add_edge(i, j, distance=W[i, j])
                    L[i, j] = 0.0085 * W[i, j] + 4.0
                    if not directed:
                        L[j, i] = L[i, j]
        if directed:  # strongly connected: close the cycle backwards
            for i in range(n):
                if not G.has_edge(i, (i - 1) % n) and i != (i - 1) % n:
                    G.add_edge(i, (i - 1) % n, distance=W[i, (i - 1) % n])
                    L[i, (i - 1) % n] = 0.0085 * W[i, (i - 1) % n] + 4.0
        np.testing.assert_allclose(delays_from_graph(G), metric_closure(L), rtol=1e-14, atol=0)
        np.testing.assert_array_equal(delays_from_graph(G, shortest_paths=False), L)
    # a path in a tiny unit, one link of zero delay
    G, L = nx.Graph(), np.full((n, n), np.inf)
    np.fill_diagonal(L, 0.0)
    for i in range(n - 1):
        G.add_edge(i, i + 1, distance=0.0 if i == 0 else 1e-250 * (i + 1))
        L[i, i + 1] = L[i + 1, i] = 0.0 if i == 0 else 1e-250 * (i + 1)
    np.testing.assert_allclose(delays_from_graph(G, per_unit=1.0, overhead=0.0),
                               metric_closure(L), rtol=1e-14, atol=0)


@pytest.mark.filterwarnings("ignore:BTSP.*larger BCD")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_bcd_method_equals_fitted_attributes_on_each_reduce(method, topology):
    """bcd(D, reduce=...) vs bcd_ / bcd_total_ / bcd_per_round_, and
    bottleneck_delay vs bcd_, for symmetric and asymmetric D, directed or not,
    with and without metric_closure."""
    for D in (euclidean(7, 0), asymmetric(7, 1)):
        for directed in (False, True):
            for closure in (False, True):
                est = BottleneckNodeAssigner(topology=topology, method=method,
                                             directed=directed, metric_closure=closure,
                                             n_iter=30, random_state=0).fit(D)
                assert est.bcd(D) == est.bcd_
                assert est.bcd(D, reduce="sum") == est.bcd_total_
                np.testing.assert_array_equal(est.bcd(D, reduce="none"), est.bcd_per_round_)
                Dm = metric_closure(D) if closure else D
                assert bottleneck_delay(Dm, est.assignment_, topology,
                                        directed=directed) == est.bcd_
                assert est.lower_bound_ <= est.bcd_


@pytest.mark.filterwarnings("ignore:BTSP.*larger BCD")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_directed_equals_undirected_and_name_equals_explicit_schedule(method, topology):
    """On symmetric D: directed=True vs directed=False; topology by name vs the
    explicit skip lists of circulant_schedule; numpy vs torch delays."""
    n = 8
    D = euclidean(n, 2)
    kw = dict(method=method, n_iter=30, random_state=0)
    ref = BottleneckNodeAssigner(topology=topology, **kw).fit(D)
    for other in (BottleneckNodeAssigner(topology=topology, directed=True, **kw).fit(D),
                  BottleneckNodeAssigner(topology=circulant_schedule(n, topology),
                                         **kw).fit(D),
                  BottleneckNodeAssigner(topology=topology, **kw).fit(torch.as_tensor(D))):
        np.testing.assert_array_equal(other.assignment_, ref.assignment_)
        for attr in ("bcd_", "bcd_total_", "theta_", "lower_bound_", "random_bcd_",
                     "multiplier_"):
            assert getattr(other, attr) == getattr(ref, attr), attr
        np.testing.assert_array_equal(other.edges_, ref.edges_)


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_exact_ring_assigner_equals_exact_bottleneck_tsp(n):
    """BottleneckNodeAssigner(ring, method="exact").bcd_ vs bottleneck_tsp(method="exact"),
    undirected and directed; the 2-approximation's tour: its ring BCD vs its bottleneck;
    every method on the ring agrees where every cyclic order is the same cycle
    (undirected n <= 3, directed n = 2: n = 3 has two orientations)."""
    for D, directed in ((euclidean(n, n), False), (asymmetric(n, n), True)):
        ex = BottleneckNodeAssigner(topology="ring", method="exact", directed=directed).fit(D)
        tour, b, theta = bottleneck_tsp(D, method="exact", directed=directed)
        assert ex.bcd_ == b == bottleneck_delay(D, tour, "ring", directed=directed)
        tour2, b2, theta2 = bottleneck_tsp(D, directed=directed, random_state=0)
        assert bottleneck_delay(D, tour2, "ring", directed=directed) == b2 >= b
        assert theta2 == theta <= b
        if n <= (2 if directed else 3):
            for method in METHODS:
                est = BottleneckNodeAssigner(topology="ring", method=method,
                                             directed=directed, random_state=0).fit(D)
                assert est.bcd_ == ex.bcd_, method


def test_dsgd_round_delays_equal_the_assigner_bcd_per_round():
    """DecentralizedSGD.round_delays_ vs BottleneckNodeAssigner.bcd_per_round_ for the
    assigner's assignment (directed and undirected, schedule by name or by list)."""
    D = asymmetric(6, 3)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((24, 3)), np.arange(24) % 2
    for directed in (False, True):
        est = BottleneckNodeAssigner(topology="one_peer_exponential", directed=directed,
                                     random_state=0).fit(D)
        for top in ("one_peer_exponential", est.schedule_):
            sgd = DecentralizedSGD(topology=top, assignment=est.assignment_, delays=D,
                                   directed=directed, n_rounds=3, random_state=0).fit(X, y)
            np.testing.assert_array_equal(sgd.round_delays_, est.bcd_per_round_)
    np.testing.assert_array_equal(mixing_matrices(6, "exponential"),
                                  mixing_matrices(6, circulant_schedule(6, "exponential")))


@pytest.mark.parametrize("model", ["logistic", "mlp"])
@pytest.mark.parametrize("topology", ["exponential", "one_peer_exponential"])
def test_builtin_model_equals_the_same_module_through_vmap(model, topology):
    """model="logistic"/"mlp" (batched matmuls) vs an nn.Module with the same initial
    weights (torch.func.vmap), with momentum, weight decay, an assignment and nodes
    without data. Every node holds at most one sample, so the minibatches do not
    depend on the random stream (the built-in initialisation draws from it first;
    see the ``model`` parameter): the runs agree bit for bit."""
    n, n_samples = 8, 6
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n_samples, 4)).astype(np.float32)
    y = np.arange(n_samples) % 3
    kw = dict(n_nodes=n, n_rounds=5, eval_every=2, hidden=5, random_state=3, lr=0.3,
              momentum=0.5, weight_decay=0.01, topology=topology, batch_size=3,
              assignment=rng.permutation(n))
    nodes = np.arange(n_samples)  # nodes 6 and 7 hold no sample
    builtin = DecentralizedSGD(model=model, **kw).fit(X, y, nodes=nodes)
    seeded = DecentralizedSGD(random_state=3)
    seeded._init_fit()  # the generator fit initialises the built-in model from
    module = _build_module(model, 4, 3, 5)
    _init_params(module, seeded._torch_gen)
    user = DecentralizedSGD(model=copy.deepcopy(module), **kw).fit(X, y, nodes=nodes)
    for k, v in builtin.node_params_.items():
        assert torch.equal(v, user.node_params_[k]), k
    assert [h["loss"] for h in builtin.history_] == [h["loss"] for h in user.history_]
    np.testing.assert_array_equal(builtin.predict_proba(X), user.predict_proba(X))


def test_backbone_delays_with_zero_cost_links_are_zero():
    """make_delay_matrix("backbone") vs delays_from_graph on zero-cost links: both keep a
    zero-delay link as an edge of weight 0 (the generator shifted it to 1e-300)."""
    from mlpapers.decentralized.btsp import make_delay_matrix

    D = make_delay_matrix(12, "backbone", per_unit=0.0, overhead=0.0, random_state=0)
    assert (D == 0).all()
