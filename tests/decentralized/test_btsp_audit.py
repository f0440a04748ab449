"""Regression tests from the adversarial audit of the BTSP-MSR public API."""

import numpy as np
import pytest
import torch

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    scale_schedule,
)

from .test_btsp import brute_bcd


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.array([3, 7, 100])[np.digitize(X[:, 0], [-0.4, 0.4])]
    return X, y


def _dsgd(**kw):
    return DecentralizedSGD(**{**dict(n_nodes=4, n_rounds=4, lr=0.5, eval_every=2,
                                      random_state=0), **kw})


def test_dsgd_eval_set_is_validated(data):
    X, y = data
    # unknown labels were silently mapped to other classes by searchsorted
    with pytest.raises(ValueError, match="not seen"):
        _dsgd().fit(X, y, eval_set=(X, np.where(y == 3, 55, y)))
    # a length mismatch surfaced as a torch cross_entropy error
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        _dsgd().fit(X, y, eval_set=(X, y[:-1]))
    ok = _dsgd().fit(X, y, eval_set=(X[:20], y[:20]))
    assert 0.0 <= ok.history_[-1]["accuracy"] <= 1.0


def test_dsgd_user_module_with_wrong_output_size_is_named(data):
    X, y = data
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="n_classes"):
        _dsgd(model=torch.nn.Linear(3, 2)).fit(X, y)  # was an IndexError deep in torch
    with pytest.raises(ValueError, match="model must accept"):
        _dsgd(model=torch.nn.Linear(5, 3)).fit(X, y)
    bn = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    before = bn[1].running_mean.clone()
    _dsgd(model=bn, n_rounds=2).fit(X, y)  # the shape probe has no side effect
    torch.testing.assert_close(bn[1].running_mean, before)


def test_assigner_bcd_and_scale_schedule_errors():
    rng = np.random.default_rng(1)
    D = rng.random((7, 7))
    est = BottleneckNodeAssigner(random_state=0).fit(D)
    assert est.bcd(D) == pytest.approx(est.bcd_)
    with pytest.raises(ValueError, match="delays has 5 nodes"):
        est.bcd(D[:5, :5])
    with pytest.raises(TypeError, match="c must be an integer"):
        scale_schedule([[1]], 2.5, 7)  # silently truncated to 2 before


def test_bottleneck_delay_matches_a_hand_written_loop_with_ties():
    rng = np.random.default_rng(2)
    for n in (2, 3, 5, 8, 11):
        D = np.round(rng.random((n, n)), 1)  # ties and zeros off the diagonal
        perm = rng.permutation(n)
        topos = ["ring", "exponential", "one_peer_exponential"] + ([[[1, 3], [2]]] if n >= 5
                                                                   else [])
        for topo in topos:
            sched = circulant_schedule(n, topo)
            for directed in (False, True):
                ref = brute_bcd(D, perm, sched, directed=directed)
                got = bottleneck_delay(D, perm, topo, reduce="none", directed=directed)
                np.testing.assert_allclose(got, ref)


def test_bottleneck_tsp_rejects_restarts_that_search_nothing():
    rng = np.random.default_rng(5)
    D = rng.random((40, 40))
    D = (D + D.T) / 2
    # restarts=0 (or negative) skipped the cycle search and returned the identity tour
    for bad in (0, -1):
        with pytest.raises(ValueError, match="restarts"):
            bottleneck_tsp(D, restarts=bad)
    with pytest.raises(TypeError, match="restarts"):
        bottleneck_tsp(D, restarts=2.5)
    tour, b, theta = bottleneck_tsp(D, restarts=1, random_state=0)
    assert sorted(tour.tolist()) == list(range(40))
    assert theta <= b <= 2 * theta


def test_assigner_bcd_applies_the_fitted_metric_closure():
    # bcd() evaluated raw delays although bcd_ (with metric_closure=True) is on the
    # closed ones, so est.bcd(D) != est.bcd_ on the very matrix it was fitted on
    rng = np.random.default_rng(2)
    D = rng.random((12, 12)) ** 3  # far from metric
    for directed in (False, True):
        est = BottleneckNodeAssigner(metric_closure=True, directed=directed,
                                     random_state=0).fit(D)
        assert est.bcd(D) == pytest.approx(est.bcd_)
        np.testing.assert_allclose(est.bcd(D, reduce="none"), est.bcd_per_round_)
