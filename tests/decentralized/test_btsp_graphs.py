"""delays_from_graph on networkx graphs as users build them (session-7 audit)."""

import numpy as np
import pytest

from mlpapers.decentralized.btsp import delays_from_graph

nx = pytest.importorskip("networkx")


def _dijkstra(G, weight):
    """Reference: networkx's all-pairs Dijkstra in list(G.nodes) order."""
    nodes = list(G.nodes)
    L = dict(nx.all_pairs_dijkstra_path_length(G, weight=weight))
    return np.array([[L[u][v] for v in nodes] for u in nodes])


def test_unweighted_graph_hop_count():
    # an unweighted graph (no edge attribute) used to be rejected with no way out
    G = nx.petersen_graph()
    D = delays_from_graph(G, length_attr=None, overhead=4.0)
    hops = np.array(nx.floyd_warshall_numpy(G))
    np.testing.assert_allclose(D, 4.0 * hops)


def test_multigraph_parallel_links_take_the_shortest():
    # parallel links of different lengths (Topology Zoo GML files are multigraphs) used to
    # raise; shortest paths use the fastest link, as networkx's own Dijkstra does
    M = nx.MultiGraph()
    M.add_edge("a", "b", distance=1000.0)
    M.add_edge("a", "b", distance=200.0)
    M.add_edge("b", "c", distance=100.0)
    M.add_edge("c", "a", distance=900.0)
    for *_, data in M.edges(keys=True, data=True):
        data["w"] = 0.0085 * data["distance"] + 4.0
    np.testing.assert_allclose(delays_from_graph(M), _dijkstra(M, "w"))
    L = delays_from_graph(M, shortest_paths=False)
    assert L[0, 1] == pytest.approx(0.0085 * 200.0 + 4.0)
    MD = nx.MultiDiGraph(M)  # both directions, parallel links kept
    np.testing.assert_allclose(delays_from_graph(MD), _dijkstra(M, "w"))


def test_digraph_and_string_labels_match_networkx():
    rng = np.random.default_rng(0)
    G = nx.gnp_random_graph(30, 0.2, seed=3, directed=True)
    G = nx.relabel_nodes(G, {i: f"node-{i}" for i in G}, copy=True)
    G.add_edges_from((f"node-{i}", f"node-{(i + 1) % 30}") for i in range(30))  # strongly conn.
    for _, _, data in G.edges(data=True):
        data["distance"] = float(rng.uniform(10, 1000))
        data["w"] = 0.0085 * data["distance"] + 4.0
    D = delays_from_graph(G)
    np.testing.assert_allclose(D, _dijkstra(G, "w"))
    assert not np.allclose(D, D.T)


def test_missing_length_attribute_error_names_the_edge_attributes():
    # networkx graphs usually carry "weight"; the error used to suggest only
    # length_attr=None (hop counts), not the attribute the user actually has
    G = nx.path_graph(4)
    nx.set_edge_attributes(G, 2.5, "weight")
    nx.set_edge_attributes(G, "10 Gbps", "LinkLabel")  # as in Topology Zoo files
    with pytest.raises(ValueError,
                       match=r"numeric attributes are \['weight'\]: pass length_attr="):
        delays_from_graph(G)
    with pytest.raises(ValueError, match="non-numeric 'LinkLabel' attribute"):
        delays_from_graph(G, length_attr="LinkLabel")
    D = delays_from_graph(G, length_attr="weight", per_unit=1.0, overhead=0.0)
    np.testing.assert_allclose(D, np.array(nx.floyd_warshall_numpy(G, weight="weight")))


def test_btsp_msr_warns_when_clearly_worse_than_random():
    # random link weights on a small-world graph: no spatial structure, and the default
    # static exponential graph. BTSP-MSR's BCD is 9 % above the random mean there; the
    # user is told (and refine_iter, which starts annealing from it, fixes it)
    import warnings

    from mlpapers.decentralized.btsp import BottleneckNodeAssigner

    G = nx.connected_watts_strogatz_graph(40, 4, 0.2, seed=0)
    rng = np.random.default_rng(0)
    for u, v in G.edges:
        G[u][v]["weight"] = float(rng.uniform(1, 20))
    D = delays_from_graph(G, length_attr="weight", per_unit=1.0, overhead=0.0)
    with pytest.warns(UserWarning, match="larger BCD .* than the mean of 5 random"):
        est = BottleneckNodeAssigner(random_state=0).fit(D)
    assert est.bcd_ > 1.05 * est.random_bcd_
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = BottleneckNodeAssigner(random_state=0, refine_iter=800).fit(D)
        BottleneckNodeAssigner(topology="ring", random_state=0).fit(D)
    assert ref.bcd_ < est.random_bcd_


def test_no_warning_from_a_noisy_random_baseline():
    # with one random draw (or two) the baseline is too noisy to call a loss: metric
    # delays of random points, where BTSP-MSR beats the true random mean
    import warnings

    from mlpapers.decentralized.btsp import BottleneckNodeAssigner

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in range(20):
            P = np.random.default_rng(s).random((8, 2))
            D = np.linalg.norm(P[:, None] - P[None], axis=-1)
            for n_random in (1, 2):
                BottleneckNodeAssigner(topology="one_peer_exponential", n_random=n_random,
                                       random_state=s).fit(D)
