"""Acceptance tests written from the text of issue #10 (decentralized.btsp) and its note.

Each test quotes the issue sentence it checks. Properties already covered elsewhere
(brute force, 2-approximation, multiplier identity, invariances, mixing matrices, bad
input) are not repeated.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mlpapers.decentralized as decentralized
import mlpapers.decentralized.btsp as btsp
from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    bottleneck_delay,
    circulant_schedule,
    make_delay_matrix,
    mixing_matrices,
    multiplier_relabel,
)

NAMES = ("circulant_schedule", "bottleneck_delay", "delays_from_graph", "bottleneck_tsp",
         "best_multiplier", "BottleneckNodeAssigner", "DecentralizedSGD", "is_biconnected")


def test_public_names_are_importable_from_both_paths():
    # "Public API (`mlpapers.decentralized.btsp`, re-exported from `mlpapers.decentralized`)"
    # (incl. "is_biconnected" of the BTSP step)
    for name in NAMES:
        assert getattr(btsp, name) is getattr(decentralized, name)


@pytest.mark.parametrize("spelling, name", [
    ("one-peer exponential", "one_peer_exponential"),
    ("One-Peer-Exponential", "one_peer_exponential"),
    ("sparse exponential", "sparse_exponential"),
    (" Ring ", "ring"),
    ("one_peer_exp", "one_peer_exponential"),
])
def test_topologies_accept_the_issue_spelling(spelling, name):
    # "a circulant schedule (ring, exponential, one-peer exponential, sparse exponential,
    # or explicit skip sets)": the prose names used to raise "topology must be one of"
    for n in (2, 7, 16):
        assert circulant_schedule(n, spelling) == circulant_schedule(n, name)
    np.testing.assert_array_equal(mixing_matrices(9, spelling), mixing_matrices(9, name))
    D = make_delay_matrix(12, random_state=0)
    est = BottleneckNodeAssigner(topology=spelling, random_state=0).fit(D)
    assert est.bcd_ == bottleneck_delay(D, est.assignment_, name)


def test_unknown_topology_still_raises():
    # "bad input (..., unknown topology) raises clear errors"
    for bad in ("torus", "one peer", "exponential graph"):
        with pytest.raises(ValueError, match="topology must be one of"):
            circulant_schedule(8, bad)


def test_decentralized_sgd_takes_the_issue_arguments_by_name():
    # "DecentralizedSGD(model, topology, assignment, delays, compute_time, ...)": the issue's
    # names, keyword-only as CONVENTIONS.md requires of every estimator.
    params = inspect.signature(DecentralizedSGD).parameters
    for name in ("model", "topology", "assignment", "delays", "compute_time"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((80, 5)), rng.integers(0, 3, 80)
    D = make_delay_matrix(6, random_state=1)
    pi = rng.permutation(6)
    est = DecentralizedSGD(model="logistic", topology="ring", assignment=pi, delays=D,
                           compute_time=2.5, n_rounds=6, random_state=0).fit(X, y)
    # "simulated wall-clock time = compute + the round's bottleneck delay"
    ring_delay = bottleneck_delay(D, pi, "ring")
    assert est.sim_time_ == pytest.approx(6 * (2.5 + ring_delay), rel=1e-12)


@pytest.mark.parametrize("method", ["btsp_msr", "btsp", "random", "greedy", "annealing",
                                    "exact"])
def test_every_method_sets_the_issue_attributes(method):
    # "BottleneckNodeAssigner(topology="exponential", method="btsp_msr"|"btsp"|"random"|
    # "greedy"|"annealing"|"exact", ...) with fit(delays) -> assignment_, bcd_, bcd_total_,
    # bcd_per_round_, multiplier_, theta_, random_bcd_"
    n, topology = 8, "one_peer_exponential"
    D = make_delay_matrix(n, "backbone", random_state=2)
    est = BottleneckNodeAssigner(topology=topology, method=method, random_state=0).fit(D)
    pi = est.assignment_
    assert sorted(pi.tolist()) == list(range(n))
    per_round = bottleneck_delay(D, pi, topology, reduce="none")
    np.testing.assert_array_equal(est.bcd_per_round_, per_round)
    assert est.bcd_total_ == pytest.approx(per_round.sum(), rel=1e-15)
    assert est.bcd_ == pytest.approx(per_round.mean(), rel=1e-15)
    assert est.theta_ == btsp.biconnected_threshold(D)
    assert est.random_bcd_ > 0
    assert np.gcd(int(est.multiplier_), n) == 1
    # note: "ring_tour_" (the BTSP tour); "MSR step: ... relabel i -> c*i mod n"
    if method.startswith("btsp"):
        tour = est.ring_tour_
        assert sorted(tour.tolist()) == list(range(n))
        ring = bottleneck_delay(D, tour, "ring")
        assert est.theta_ <= ring <= 2 * est.theta_
        np.testing.assert_array_equal(est.assignment_, multiplier_relabel(tour, est.multiplier_))
    else:
        assert est.ring_tour_ is None
