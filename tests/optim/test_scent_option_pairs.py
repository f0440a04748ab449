"""Option interactions of the SCENT estimators: pairwise covering arrays.

Every pair of values of the code-path options (loss, sampler, dual rule, log_alpha,
intercept, momentum/penalty, input kind, label kind, batch size, ...) appears in at
least one configuration. Each configuration must fit and keep the promises each option
makes alone: numpy outputs of the documented shapes, finite coefficients, probabilities
summing to 1, the same model after a clone + refit, a pickle and a save/load round trip,
sparse ``X`` training as its dense copy, and a pickled ``partial_fit`` continuing as
the live one.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.base import clone

from mlpapers.optim.scent import (
    METHODS,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
)
from tests._pairwise import covering_array, uncovered_pairs


def _ids(configs):
    return ["-".join(str(v) for v in c.values()) for c in configs]


_RNG = np.random.RandomState(0)
_N, _D, _C = 40, 5, 5
_X = _RNG.randn(_N, _D)
_X[_RNG.rand(_N, _D) < 0.4] = 0.0                      # sparse-ish, for the CSR copies
_Y = np.argmax(_X @ _RNG.randn(_D, _C) + 0.3 * _RNG.randn(_N, _C), axis=1)
_YREG = _X @ _RNG.randn(_D) + 0.3 * _RNG.randn(_N)
_YBIN = (_X[:, 0] + 0.5 * _RNG.randn(_N) > 0.3).astype(int)


def _inputs(kind):
    return {"f64": _X, "f32": _X.astype(np.float32), "torch": torch.as_tensor(_X),
            "csr": sp.csr_matrix(_X), "list": _X.tolist()}[kind]


def _labels(kind, y):
    return {"int": y, "str": np.array([f"c{v}" for v in y]), "gap": 7 * y - 3,
            "torch": torch.as_tensor(y)}[kind]


def _state(est, X):
    out = {"pred": est.predict(X), "coef": np.asarray(est.coef_),
           "intercept": np.asarray(est.intercept_), "curve": np.asarray(est.loss_curve_),
           "nu": np.asarray(est.nu_, dtype=float)}
    if hasattr(est, "decision_function"):
        out["df"] = est.decision_function(X)
    if hasattr(est, "predict_proba"):
        out["proba"] = est.predict_proba(X)
    return out


def _assert_same(a, b):
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _check_invariants(est, X, y, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # divergence warnings are other tests'
        try:
            est.fit(X, y)
        except FloatingPointError as exc:
            # the ASGD baselines' dual step can overflow far from the optimum (the
            # paper's finding); that must be a clear error naming the cure, no NaN model
            assert est.method in ("asgd", "asgd_softplus") and "dual_lr" in str(exc)
            return None
        state = _state(est, X)
        n_rows = X.shape[0] if hasattr(X, "shape") else len(X)
        assert isinstance(state["pred"], np.ndarray) and len(state["pred"]) == n_rows
        for key in ("coef", "intercept", "curve"):
            assert np.isfinite(state[key]).all(), key
        if "proba" in state:
            np.testing.assert_allclose(state["proba"].sum(1), 1.0, atol=1e-6)
        assert np.isfinite(est.objective(X, y))
        _assert_same(state, _state(clone(est).fit(X, y), X))
        _assert_same(state, _state(pickle.loads(pickle.dumps(est)), X))
        est.save(tmp_path / "m.pt")
        _assert_same(state, _state(type(est).load(tmp_path / "m.pt"), X))
    return state


_CLF_OPTIONS = {"loss": ["softmax", "negatives"], "negatives": ["uniform", "in_batch"],
                "method": list(METHODS), "log_alpha": [None, -2.0],
                "fit_intercept": [False, True], "momentum_alpha": [(0.0, 0.0), (0.5, 0.01)],
                "n_negatives": [1, _C - 1], "input": ["f64", "f32", "torch", "csr", "list"],
                "labels": ["int", "str", "gap", "torch"], "batch_size": [7, 1000]}
_CLF_CONFIGS = covering_array(_CLF_OPTIONS)


def test_covering_arrays_cover_every_pair():
    for options, configs in ((_CLF_OPTIONS, _CLF_CONFIGS), (_DRO_OPTIONS, _DRO_CONFIGS),
                             (_PAUC_OPTIONS, _PAUC_CONFIGS)):
        assert uncovered_pairs(options, configs) == []


@pytest.mark.parametrize("cfg", _CLF_CONFIGS, ids=_ids(_CLF_CONFIGS))
def test_classifier_option_pairs(cfg, tmp_path):
    momentum, alpha = cfg["momentum_alpha"]
    est = SCENTClassifier(loss=cfg["loss"], negatives=cfg["negatives"], method=cfg["method"],
                          log_alpha=cfg["log_alpha"], fit_intercept=cfg["fit_intercept"],
                          momentum=momentum, alpha=alpha, n_negatives=cfg["n_negatives"],
                          batch_size=cfg["batch_size"], epochs=2, lr=0.1, random_state=0)
    X, y = _inputs(cfg["input"]), _labels(cfg["labels"], _Y)
    state = _check_invariants(est, X, y, tmp_path)
    assert state["coef"].shape == (_C, _D) and state["proba"].shape == (_N, _C)
    if not cfg["fit_intercept"]:
        assert not state["intercept"].any()
    if cfg["method"] == "bsgd":
        assert np.isnan(state["nu"]).all()          # no dual table
    if cfg["input"] == "csr":                        # sparse trains as its dense copy
        dense = clone(est).fit(_X, y)
        np.testing.assert_allclose(state["coef"], dense.coef_, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state["nu"], dense.nu_, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", _CLF_CONFIGS[::3], ids=_ids(_CLF_CONFIGS[::3]))
def test_partial_fit_resumes_after_pickle_in_every_combination(cfg):
    momentum, alpha = cfg["momentum_alpha"]
    est = SCENTClassifier(loss=cfg["loss"], negatives=cfg["negatives"], method=cfg["method"],
                          log_alpha=cfg["log_alpha"], fit_intercept=cfg["fit_intercept"],
                          momentum=momentum, alpha=alpha, n_negatives=cfg["n_negatives"],
                          batch_size=cfg["batch_size"], lr=0.1, random_state=0)
    X, y = _inputs(cfg["input"]), _labels(cfg["labels"], _Y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.partial_fit(X, y, classes=np.unique(np.asarray(y)))
        copy = pickle.loads(pickle.dumps(est))
        est.partial_fit(X, y)
        copy.partial_fit(X, y)
    _assert_same(_state(est, X), _state(copy, X))


_DRO_OPTIONS = {"method": list(METHODS), "log_alpha": [None, "auto", -1.0],
                "lr_schedule": ["cosine", "constant"], "momentum": [0.0, 0.9],
                "batch_size": [1, 7, 1000], "fit_intercept": [True, False],
                "alpha": [0.0, 0.1], "init": ["erm", "zeros"],
                "input": ["f64", "f32", "torch"]}     # lists: in the classifier's array
_DRO_CONFIGS = covering_array(_DRO_OPTIONS)
_N_DRO = 20                                           # 7 < 20 < 1000: three batch regimes


@pytest.mark.parametrize("cfg", _DRO_CONFIGS, ids=_ids(_DRO_CONFIGS))
def test_kldro_option_pairs(cfg, tmp_path):
    params = {k: v for k, v in cfg.items() if k != "input"}
    # half the rows: batch_size=1 runs a step per row, twice per estimator (fit, clone)
    X = _inputs(cfg["input"])[:_N_DRO]
    reg = KLDRORegressor(**params, lam=1.0, lr=1e-3, epochs=2, random_state=0)
    state = _check_invariants(reg, X, _YREG[:_N_DRO], tmp_path)
    if state is not None:
        assert state["coef"].shape == (_D,)
        # one dual variable, NaN for the stateless BSGD only (documented)
        assert np.isnan(state["nu"]) == (cfg["method"] == "bsgd")
    clf = KLDROClassifier(**params, lam=1.0, lr=1e-3, epochs=2, random_state=0)
    state = _check_invariants(clf, X, _YBIN[:_N_DRO], tmp_path)
    if state is not None:
        assert state["proba"].shape == (_N_DRO, 2)
        if not cfg["fit_intercept"]:
            assert not state["intercept"].any()


_PAUC_OPTIONS = {"method": list(METHODS), "log_alpha": [None, -2.0],
                 "batch_size": [1, 1000], "n_negatives": [1, 1000],
                 "max_fpr": [0.3, 1.0], "labels": ["int", "str", "pm1"]}
_PAUC_CONFIGS = covering_array(_PAUC_OPTIONS)


@pytest.mark.parametrize("cfg", _PAUC_CONFIGS, ids=_ids(_PAUC_CONFIGS))
def test_partial_auc_option_pairs(cfg, tmp_path):
    y = {"int": _YBIN, "str": np.where(_YBIN, "pos", "neg"), "pm1": 2 * _YBIN - 1}[cfg["labels"]]
    params = {k: v for k, v in cfg.items() if k != "labels"}
    est = PartialAUCClassifier(**params, lr=0.01, epochs=2, random_state=0)
    state = _check_invariants(est, _X, y, tmp_path)
    assert state["df"].shape == (_N,)
    assert 0.0 <= est.score(_X, y) <= 1.0


# which parameters each dual rule reads (documented: the others' are ignored, so one set
# of keyword arguments serves a comparison of methods)
_OWN = {"scent": {"log_alpha"}, "sox": {"gamma"}, "bsgd": set(), "asgd": {"dual_lr"},
        "umax": {"dual_lr", "delta"}, "asgd_softplus": {"dual_lr", "rho"}}
_OTHER_VALUES = {"log_alpha": -1.5, "gamma": 0.3, "dual_lr": 0.05, "delta": 0.0, "rho": 0.1}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls, y", [(SCENTClassifier, _Y), (KLDRORegressor, _YREG)],
                         ids=["classifier", "kldro"])
def test_each_method_ignores_the_other_methods_parameters(cls, y, method):
    kw = dict(method=method, epochs=2, lr=1e-2, random_state=0)
    if cls is SCENTClassifier:
        kw["n_negatives"] = 2
    base = cls(**kw).fit(_X, y)
    others = {k: v for k, v in _OTHER_VALUES.items() if k not in _OWN[method]}
    np.testing.assert_array_equal(cls(**kw, **others).fit(_X, y).coef_, base.coef_)
    # its own ones do change the fit (the dual first); U-max's delta only where a dual
    # lags its estimate by more than delta, which these short fits need not reach
    for name in sorted(_OWN[method] - {"delta"}):
        changed = cls(**kw, **{name: _OTHER_VALUES[name]}).fit(_X, y)
        assert not np.array_equal(changed.nu_, base.nu_, equal_nan=True), name


@pytest.mark.parametrize("loss", ["softmax", "negatives"])
@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("sparse", [False, True])
def test_all_negatives_make_the_estimate_exact_in_every_combination(loss, fit_intercept,
                                                                    temperature, sparse):
    # documented: n_negatives = n_classes - 1 with "uniform" uses every class, so BSGD's
    # full-batch estimate (loss_curve_) is the exact objective at the weights it starts from
    X = sp.csr_matrix(_X) if sparse else _X
    clf = SCENTClassifier(method="bsgd", loss=loss, n_negatives=_C - 1, batch_size=_N,
                          lr=0.5, fit_intercept=fit_intercept, temperature=temperature,
                          random_state=0)
    clf.partial_fit(X, _Y, classes=np.arange(_C))
    exact = clf.objective(X, _Y)
    clf.partial_fit(X, _Y)
    assert clf.loss_curve_[-1] == pytest.approx(exact, rel=1e-6, abs=1e-6)
