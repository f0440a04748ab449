"""SCENT under the caller's ambient torch state: grad/inference mode, default dtype,
deterministic algorithms, anomaly detection; global state, user inputs and threads.

Every public entry point (the four estimators' fit/partial_fit/predict*/score/objective,
warm starts through pickle and save/load, :class:`EntropicRiskLoss` and the public
kernels) must give the bitwise same result inside each context of ``AMBIENT`` as
outside it, and leave the process state as it found it.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    asgd_update,
    log_mean_exp,
    objective,
    softplus_dual_ratio,
    sox_update,
    spmd_gamma,
    spmd_update,
    umax_update,
)
from tests._ambient import (
    AMBIENT,
    check_ambient,
    check_one_numpy_seed,
    check_state_untouched,
    check_thread_safe,
)

_rng = np.random.default_rng(0)
X = _rng.normal(size=(48, 4)).astype(np.float32)
Y_CLASS = _rng.integers(0, 5, 48)
Y_REG = X @ np.array([1.0, -2.0, 0.5, 0.0]) + _rng.normal(size=48)
Y_BIN = (X[:, 0] + 0.3 * _rng.normal(size=48) > 0).astype(int)
X_SPARSE = sp.csr_matrix(np.where(np.abs(X) > 0.7, X, 0.0))

#: estimator factory and targets of each estimator (tiny: the file stays fast)
ESTIMATORS = {
    "SCENTClassifier": (lambda: SCENTClassifier(n_negatives=3, epochs=2, batch_size=16,
                                                momentum=0.5, alpha=0.01, fit_intercept=True,
                                                random_state=0), Y_CLASS),
    "KLDRORegressor": (lambda: KLDRORegressor(epochs=2, random_state=0), Y_REG),
    "KLDROClassifier": (lambda: KLDROClassifier(epochs=2, random_state=0), Y_CLASS),
    "PartialAUCClassifier": (lambda: PartialAUCClassifier(epochs=2, random_state=0), Y_BIN),
}


def _outputs(est, X, y) -> list:
    """Everything a fitted estimator computes or holds, for a bitwise comparison."""
    out = [est.coef_, est.intercept_, est.predict(X), est.score(X, y), est.objective(X, y),
           np.asarray(est.loss_curve_), est.nu_]
    for method in ("predict_proba", "predict_log_proba", "decision_function"):
        if hasattr(est, method):
            out.append(getattr(est, method)(X))
    return out


def _fit(name: str, **params) -> list:
    make, y = ESTIMATORS[name]
    est = make().set_params(**params)
    return _outputs(est.fit(X, y), X, y)


def _scent_variant() -> list:
    est = SCENTClassifier(loss="negatives", negatives="in_batch", method="asgd",
                          batch_size=16, epochs=2, random_state=0)
    return _outputs(est.fit(X, Y_CLASS), X, Y_CLASS)


def _scent_sparse() -> list:
    est = SCENTClassifier(n_negatives=3, epochs=2, batch_size=16, random_state=0)
    return _outputs(est.fit(X_SPARSE, Y_CLASS), X_SPARSE, Y_CLASS)


def _scent_warm_starts() -> list:
    """partial_fit from scratch, a growing dual table, then a pickled and a saved copy
    continuing (the warm starts rebuild the live training tensors)."""
    est = SCENTClassifier(n_negatives=3, batch_size=16, momentum=0.5, random_state=0)
    est.partial_fit(X, Y_CLASS, classes=np.arange(5))
    est.partial_fit(X[:16], Y_CLASS[:16], sample_index=np.arange(48, 64))
    pickled = pickle.loads(pickle.dumps(est)).partial_fit(X, Y_CLASS)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scent.pt")
        est.save(path)
        loaded = SCENTClassifier.load(path).partial_fit(X, Y_CLASS)
    est.partial_fit(X, Y_CLASS)
    return [_outputs(e, X, Y_CLASS) for e in (est, pickled, loaded)]


def _save_load(name: str):
    make, y = ESTIMATORS[name]
    fitted = make().fit(X, y)

    def call() -> list:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.pt")
            fitted.save(path)
            return _outputs(type(fitted).load(path), X, y)

    return call


def _loss_calls() -> list:
    """Every dual rule of EntropicRiskLoss on float32 and float64 scores, two steps."""
    # the inputs and the module are made on the CPU (under a caller's default device a
    # module is built there, as torch.nn modules are); the calls run in the context
    with torch.device("cpu"):
        gen = torch.Generator().manual_seed(0)
        scores = torch.randn(2, 4, 6, generator=gen, dtype=torch.float32)
        mask = torch.rand(4, 6, generator=gen, dtype=torch.float32) > 0.3
        mask[:, 0] = True
        indices = [torch.tensor([0, 3, 5, 7]), torch.tensor([3, 5, 8, 9])]
    out = []
    for method in ("scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"):
        for dtype in (torch.float32, torch.float64):
            with torch.device("cpu"):
                loss_fn = EntropicRiskLoss(10, method=method, log_alpha=-0.5, temperature=0.7)
            for step, idx in enumerate(indices):
                out.append(loss_fn(scores[step].to(dtype), idx, mask if step else None))
            out += [loss_fn.nu, loss_fn.initialized]
    return out


def _kernel_calls() -> list:
    out = []
    for dtype in (torch.float32, torch.float64):
        with torch.device("cpu"):  # CPU inputs, whatever the context's default device
            nu = torch.tensor([0.1, 0.5, -1.0], dtype=dtype)
            lme = torch.tensor([1.0, 0.2, 30.0], dtype=dtype)
            s = torch.tensor([[0.1, 2.0], [3.0, -1.0], [0.0, 0.5]], dtype=dtype)
            log_alpha = torch.tensor(-2.0)
        out += [spmd_update(nu, lme, 0.5), spmd_update(nu, lme, log_alpha),
                spmd_gamma(nu, 0.2), sox_update(nu, lme, 0.3), asgd_update(nu, lme, 0.1),
                umax_update(nu, lme, 0.1, 1.0), softplus_dual_ratio(s, nu, 1e-3),
                softplus_dual_ratio(s, nu, 1e-3, mask=s > 0), log_mean_exp(s),
                log_mean_exp(s, mask=s > 0), objective(s), objective(s, s > 0, 1e-3),
                objective(s, temperature=1e6)]
    return out


CALLS = {
    **{f"{name}.fit": (lambda name=name: _fit(name)) for name in ESTIMATORS},
    "SCENTClassifier.fit[negatives,in_batch,asgd]": _scent_variant,
    "SCENTClassifier.fit[sparse]": _scent_sparse,
    "SCENTClassifier.partial_fit[warm starts]": _scent_warm_starts,
    "KLDRORegressor.fit[log_alpha=auto,sox]": lambda: _fit("KLDRORegressor", method="sox",
                                                           log_alpha="auto"),
    "KLDROClassifier.fit[init=zeros,umax]": lambda: _fit("KLDROClassifier", method="umax",
                                                         init="zeros"),
    "EntropicRiskLoss": _loss_calls,
    "kernels": _kernel_calls,
}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(CALLS))
def test_entry_points_do_not_depend_on_ambient_state(name, context):
    # fit/partial_fit inside no_grad / inference_mode failed with "element 0 of tensors
    # does not require grad" before they switched autograd on for themselves
    check_ambient(CALLS[name], context)


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_save_load_does_not_depend_on_ambient_state(name, context):
    check_ambient(_save_load(name), context)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_fit_with_random_state_none_does_not_reseed(name):
    """``None`` draws one seed from numpy's global RandomState (scikit-learn's rule)
    and touches no other generator: it advances numpy's stream, never reseeds it."""
    make, y = ESTIMATORS[name]
    check_one_numpy_seed(lambda: make().set_params(random_state=None).fit(X, y))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_fit_and_predict_are_thread_safe(name):
    check_thread_safe(lambda: _fit(name))


def test_entropic_risk_loss_is_thread_safe_per_instance():
    check_thread_safe(_loss_calls)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_tensor_inputs_that_require_grad_or_are_inference_tensors(name):
    make, y = ESTIMATORS[name]
    expected = _outputs(make().fit(X, y), X, y)
    Xg = torch.tensor(X, requires_grad=True)
    est = check_state_untouched(lambda: make().fit(Xg, y))
    for a, b in zip(_outputs(est, Xg, y), expected):
        np.testing.assert_array_equal(a, b)
    assert Xg.grad is None
    for key, value in vars(est).items():       # no graph leaks into the fitted state
        if isinstance(value, torch.Tensor):
            assert value.grad_fn is None, key
    with torch.inference_mode():               # made there, used by a normal fit
        Xi, yi = torch.tensor(X), torch.tensor(y)
    est = make().fit(Xi, yi)
    for a, b in zip(_outputs(est, Xi, yi), expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_score_takes_target_and_weight_tensors_that_require_grad(name):
    # scikit-learn's score read them through numpy: "Can't call numpy() on Tensor that
    # requires grad"
    make, y = ESTIMATORS[name]
    est = make().fit(X, y)
    yg = torch.tensor(y, dtype=torch.float64, requires_grad=True)
    weight = torch.linspace(0.5, 1.5, len(y), dtype=torch.float64)
    assert est.score(X, yg) == est.score(X, y.astype(np.float64))
    assert est.score(X, y, sample_weight=weight.requires_grad_(True)) == est.score(
        X, y, sample_weight=weight.detach().numpy())


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_read_only_inputs_are_accepted_silently_and_not_mutated(name):
    make, y = ESTIMATORS[name]
    Xr, yr = X.copy(), y.copy()
    Xr.flags.writeable = yr.flags.writeable = False
    Xt = torch.tensor(X, dtype=torch.float64)        # the dtype fit uses: no copy made
    Xt_copy = Xt.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = make().fit(Xr, yr)
        _outputs(est, Xr, yr)
        _outputs(make().fit(Xt, y), Xt, y)
    assert np.array_equal(Xr, X) and np.array_equal(yr, y) and torch.equal(Xt, Xt_copy)


def test_entropic_risk_loss_respects_the_callers_grad_mode():
    """A differentiable function the user calls: no graph under no_grad (the dual update
    still runs, identically), a graph otherwise."""
    w = torch.ones(3, requires_grad=True)
    feats = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(0))
    index = torch.tensor([0, 3, 5, 7])
    plain, quiet = EntropicRiskLoss(10), EntropicRiskLoss(10)
    loss = plain(feats @ w, index)
    with torch.no_grad():
        silent = quiet(feats @ w, index)
    assert loss.requires_grad and not silent.requires_grad and silent.grad_fn is None
    assert torch.equal(loss.detach(), silent) and torch.equal(plain.nu, quiet.nu)
    loss.backward()
    assert w.grad is not None and not plain.nu.requires_grad


def test_entropic_risk_loss_built_in_inference_mode_trains_outside_it():
    # its dual table was an inference tensor: "Inplace update to inference tensor outside
    # InferenceMode is not allowed" at the first normal step
    w = torch.ones(3, requires_grad=True)
    feats = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(0))
    index = torch.tensor([0, 3, 5, 7])
    with torch.inference_mode():
        made_inside = EntropicRiskLoss(10)
    reference = EntropicRiskLoss(10)
    loss = made_inside(feats @ w, index)
    loss.backward()
    assert torch.equal(loss.detach(), reference(feats @ w, index).detach())
    assert torch.equal(made_inside.nu, reference.nu)
    assert not made_inside.nu.is_inference()


def test_kernels_convert_python_numbers_as_torch_does():
    """Documented limit: tensors keep their dtype whatever the default; Python lists and
    integer tensors become floating as ``torch.as_tensor`` makes them, in the default
    dtype (as every torch function does)."""
    for dtype in (torch.float64, torch.float32):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            assert spmd_update([0.1, 0.2], [1, 2], 0.0).dtype == dtype
            assert spmd_update(torch.tensor([0.1], dtype=torch.float32), torch.tensor(
                [1.0], dtype=torch.float32), 0.0).dtype == torch.float32
        finally:
            torch.set_default_dtype(previous)
