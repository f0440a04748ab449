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
