"""``scale_schedule`` validates the schedule it scales, as ``circulant_schedule`` does.

It scaled any iterable it was given: a skip ``0 mod n`` (a node sending to itself)
or a fractional skip came back as an invalid schedule without an error, and a topology
name failed with a string-formatting TypeError.
"""

import numpy as np
import pytest

from mlpapers.decentralized.btsp import (
    bottleneck_delay,
    circulant_schedule,
    multiplier_relabel,
    scale_schedule,
)


@pytest.mark.parametrize("schedule", [[[0, 8]], [[1], [16]]])
def test_scale_schedule_rejects_self_loops(schedule):
    with pytest.raises(ValueError, match="0 modulo n=8"):
        scale_schedule(schedule, 3, 8)


def test_scale_schedule_rejects_fractional_skips():
    with pytest.raises(TypeError, match="skips must be integers"):
        scale_schedule([[1.5]], 3, 8)


@pytest.mark.parametrize("name", ["ring", "exponential", "one_peer_exponential",
                                  "sparse_exponential"])
def test_scale_schedule_accepts_what_circulant_schedule_accepts(name):
    n, c = 11, 4
    expected = [sorted({(c * s) % n for s in r}) for r in circulant_schedule(n, name)]
    assert scale_schedule(name, c, n) == expected
    assert scale_schedule(circulant_schedule(n, name), c, n) == expected
    # a flat list of skips is one round, skips reduced modulo n first
    assert scale_schedule([1, 12], c, n) == [[4]]


@pytest.mark.parametrize("n", [7, 8, 12])
def test_scale_schedule_is_the_multiplier_relabelling(n):
    # BCD(pi o c; S) == BCD(pi; c S) for every c coprime with n (the MSR identity)
    rng = np.random.default_rng(n)
    D = rng.random((n, n))
    pi = rng.permutation(n)
    S = circulant_schedule(n, "one_peer_exponential")
    for c in range(1, n):
        if np.gcd(c, n) != 1:
            with pytest.raises(ValueError, match="coprime"):
                scale_schedule(S, c, n)
            continue
        for directed in (False, True):
            a = bottleneck_delay(D, multiplier_relabel(pi, c), S, reduce="none",
                                 directed=directed)
            b = bottleneck_delay(D, pi, scale_schedule(S, c, n), reduce="none",
                                 directed=directed)
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("G", ["graph", np.ones((3, 3)), [[0, 1], [1, 0]]])
def test_delays_from_graph_rejects_non_graphs(G):
    # a matrix or a string failed with AttributeError: 'X' object has no attribute 'nodes'
    from mlpapers.decentralized.btsp import delays_from_graph

    with pytest.raises(TypeError, match="G must be a networkx graph"):
        delays_from_graph(G)


def test_delays_from_graph_path_is_hop_count_times_overhead():
    nx = pytest.importorskip("networkx")
    from mlpapers.decentralized.btsp import delays_from_graph

    D = delays_from_graph(nx.path_graph(5), length_attr=None, overhead=2.5)
    hops = np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    np.testing.assert_array_equal(D, 2.5 * hops)
