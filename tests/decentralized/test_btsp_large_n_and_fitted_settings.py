"""Regression tests: exponential schedules of n = 2**k >= 2**49 nodes, ``bcd`` after
``set_params``, and the ``inf`` advice of callers without ``metric_closure``."""

import pickle

import numpy as np
import pytest

from mlpapers._base import TorchEstimatorMixin
from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    scale_schedule,
)
from mlpapers.decentralized.btsp._topology import check_delays


# -- powers of two from integer arithmetic -------------------------------------------
@pytest.mark.parametrize("k", [49, 50, 53, 63, 64, 100])
def test_exponential_schedules_of_huge_powers_of_two_stay_below_n(k):
    # float log2(2**k - 1) rounds up to k from k = 49 on: the skip n (0 mod n, a node
    # sending to itself) entered the schedule
    n = 2 ** k
    one_peer = circulant_schedule(n, "one_peer_exponential")
    assert len(one_peer) == k
    assert one_peer == [[1 << j] for j in range(k)]
    assert all(1 <= s <= n - 1 for r in one_peer for s in r)
    assert circulant_schedule(n, "exponential") == [[1 << j for j in range(k)]]
    assert circulant_schedule(n, "sparse_exponential") == [[1, 1 << (k - 2)]]
    scaled = scale_schedule("one_peer_exponential", 3, n)
    assert len(scaled) == k
    assert all(1 <= s <= n - 1 for r in scaled for s in r)
    # one more node: 2**k is below n and joins the schedule
    assert circulant_schedule(n + 1, "one_peer_exponential")[-1] == [n]


def test_powers_of_two_below_n_match_a_brute_count():
    for n in range(2, 300):
        powers = [p for p in (1 << j for j in range(10)) if p < n]
        assert circulant_schedule(n, "one_peer_exponential") == [[p] for p in powers]


# -- bcd treats the delays as fit did ----------------------------------------------
def _delays(n=9, seed=0):
    D = np.random.default_rng(seed).random((n, n)) * 10
    np.fill_diagonal(D, 0)
    return D


def _link():
    """Delays of a 6-cycle with a chord: inf between non-adjacent nodes."""
    n = 6
    L = np.full((n, n), np.inf)
    for u in range(n):
        L[u, (u + 1) % n] = L[(u + 1) % n, u] = 1.0 + u
    L[0, 3] = L[3, 0] = 2.5
    np.fill_diagonal(L, 0)
    return L


def test_bcd_uses_the_fitted_directed_after_set_params():
    D = _delays()
    est = BottleneckNodeAssigner(random_state=0).fit(D)
    est.set_params(directed=True)
    assert est.bcd(D) == est.bcd_
    assert est.bcd(D, reduce="sum") == est.bcd_total_
    np.testing.assert_array_equal(est.bcd(D, reduce="none"), est.bcd_per_round_)
    est = BottleneckNodeAssigner(directed=True, random_state=0).fit(D)
    est.set_params(directed=False)
    assert est.bcd(D) == est.bcd_


def test_bcd_uses_the_fitted_metric_closure_after_set_params():
    D = _delays() ** 3  # far from metric: the closure changes the BCD
    est = BottleneckNodeAssigner(random_state=0).fit(D)
    est.set_params(metric_closure=True)
    assert est.bcd(D) == est.bcd_
    link = _link()
    est = BottleneckNodeAssigner(metric_closure=True, random_state=0).fit(link)
    est.set_params(metric_closure=False)
    assert est.bcd(link) == est.bcd_  # inf is still a missing link, closed as in fit


def test_fitted_settings_survive_save_load_and_pickle(tmp_path):
    D = _delays()
    est = BottleneckNodeAssigner(random_state=0).fit(D)
    est.set_params(directed=True)
    est.save(tmp_path / "est.pt")
    loaded = BottleneckNodeAssigner.load(tmp_path / "est.pt")
    assert loaded.directed is True  # the parameter as saved
    assert loaded.bcd(D) == est.bcd_  # the delays as fitted
    assert pickle.loads(pickle.dumps(est)).bcd(D) == est.bcd_


def test_files_and_pickles_of_older_versions_read_the_saved_parameters(tmp_path,
                                                                      monkeypatch):
    D = _delays()
    est = BottleneckNodeAssigner(directed=True, random_state=0).fit(D)
    with monkeypatch.context() as m:  # written as before the fitted settings were saved
        m.setattr(BottleneckNodeAssigner, "_get_state", TorchEstimatorMixin._get_state)
        est.save(tmp_path / "old.pt")
    loaded = BottleneckNodeAssigner.load(tmp_path / "old.pt")
    loaded.set_params(directed=False)
    assert loaded.bcd(D) == est.bcd_
    old = pickle.loads(pickle.dumps(est))
    del old._fitted_settings
    old = pickle.loads(pickle.dumps(old))
    assert old.bcd(D) == est.bcd_


def test_a_malformed_fitted_settings_record_is_refused(tmp_path, monkeypatch):
    est = BottleneckNodeAssigner(random_state=0).fit(_delays())
    monkeypatch.setattr(est, "_fitted_settings", {"directed": "no"})
    est.save(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="_fitted_settings"):
        BottleneckNodeAssigner.load(tmp_path / "bad.pt")


# -- the inf advice names only what the caller offers -------------------------------
def test_dsgd_inf_advice_names_no_metric_closure_parameter():
    X = np.random.default_rng(0).normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match=r"infinity.*metric_closure\(delays\)") as exc:
        DecentralizedSGD(delays=_link(), n_rounds=2).fit(X, y)
    assert "metric_closure=True" not in str(exc.value)


@pytest.mark.parametrize("call", [
    lambda L: check_delays(L),
    lambda L: bottleneck_delay(L, np.arange(6), "ring"),
    lambda L: best_multiplier(L, np.arange(6), "ring"),
    lambda L: biconnected_threshold(L),
    lambda L: BottleneckNodeAssigner(random_state=0).fit(np.ones((6, 6))).bcd(L),
], ids=["check_delays", "bottleneck_delay", "best_multiplier", "biconnected_threshold",
        "bcd"])
def test_callers_without_the_parameter_suggest_the_function_only(call):
    with pytest.raises(ValueError, match=r"metric_closure\(delays\)\.$") as exc:
        call(_link())
    assert "metric_closure=True" not in str(exc.value)


@pytest.mark.parametrize("call", [
    lambda L: check_delays(L, closure_param=True),
    lambda L: bottleneck_tsp(L),
    lambda L: BottleneckNodeAssigner().fit(L),
], ids=["check_delays", "bottleneck_tsp", "fit"])
def test_callers_with_the_parameter_suggest_it_too(call):
    with pytest.raises(ValueError, match=r"metric_closure\(delays\) or metric_closure=True"):
        call(_link())


# -- DecentralizedSGD predicts with the model it fitted --------------------------------
@pytest.mark.parametrize("fitted, other", [("logistic", "mlp"), ("mlp", "logistic")])
def test_dsgd_predicts_with_the_fitted_model_after_set_params(tmp_path, fitted, other):
    # params_ hold the fitted architecture's weights: predict built the new model and
    # ran it with its missing weights uninitialised (NaN or constant probabilities,
    # or an AttributeError), and save wrote a file that loaded into another model
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    est = DecentralizedSGD(model=fitted, n_nodes=4, n_rounds=10, hidden=8, lr=0.5,
                           random_state=0).fit(X, y)
    before = est.predict_proba(X)
    est.set_params(model=other, hidden=16)
    np.testing.assert_array_equal(est.predict_proba(X), before)
    with pytest.raises(ValueError, match="model="):
        est.save(tmp_path / "m.pt")
    est.set_params(model=fitted)
    est.save(tmp_path / "m.pt")
    np.testing.assert_array_equal(DecentralizedSGD.load(tmp_path / "m.pt").predict_proba(X),
                                  before)
