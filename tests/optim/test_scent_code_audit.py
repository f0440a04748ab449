"""Code-reading audit (session 19): paths found untested or drifting from their comments."""

import math

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import log_mean_exp, objective
from mlpapers.optim.scent._kernels import tempered_log_mean_exp


def test_log_mean_exp_of_no_items_is_minus_inf_as_an_all_masked_slice():
    # k = 0 without a mask failed with "math domain error" (log 0); the documented value
    # of a slice without any valid item is -inf, and a mask of all False gives it
    s = torch.zeros(3, 0, dtype=torch.float64)
    none = torch.zeros(3, 0, dtype=torch.bool)
    out = log_mean_exp(s)
    assert out.shape == (3,) and bool(torch.all(out == -math.inf))
    assert torch.equal(out, log_mean_exp(s, mask=none))
    for mask in (None, none):
        t = tempered_log_mean_exp(s, 0.5, mask=mask)
        assert t.shape == (3,) and bool(torch.all(t == -math.inf))
    assert float(objective(torch.zeros(2, 0))) == -math.inf
    # one item or more: unchanged (log of the mean of exp, from the definition)
    v = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    assert float(log_mean_exp(v)) == pytest.approx(math.log(2.0), abs=1e-15)


# -- error paths that no test reached (branch coverage, session 19) ----------------------
def _xy(n=64, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, (X[:, 0] > 0).astype(int)


def test_partial_fit_refuses_other_classes_than_the_first_call():
    from mlpapers.optim import SCENTClassifier

    X, y = _xy()
    clf = SCENTClassifier(n_negatives=1, random_state=0).partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="classes differ from the fitted classes_"):
        clf.partial_fit(X, y, classes=[0, 1, 2])
    clf.partial_fit(X, y, classes=[1, 0])  # the same set in another order is accepted


@pytest.mark.parametrize("name, value, match", [
    ("momentum", 1.0, r"momentum must be in \[0, 1\)"),
    ("gamma", 1.5, r"gamma must be in \(0, 1\]"),
])
def test_estimators_refuse_momentum_and_gamma_out_of_range(name, value, match):
    from mlpapers.optim import KLDRORegressor, PartialAUCClassifier, SCENTClassifier

    X, y = _xy()
    for est in (SCENTClassifier(n_negatives=1), KLDRORegressor(), PartialAUCClassifier()):
        with pytest.raises(ValueError, match=match):
            est.set_params(epochs=1, **{name: value}).fit(X, y)


def test_dual_steps_refuse_inputs_that_hold_no_real_numbers():
    from mlpapers.optim.scent import sox_update, spmd_update

    for bad in ([True, False], torch.tensor([1 + 2j])):
        with pytest.raises(TypeError, match="nu must hold real numbers"):
            spmd_update(bad, torch.zeros(2), 0.0)
        with pytest.raises(TypeError, match="log_mean_exp must hold real numbers"):
            sox_update(torch.zeros(2), bad, 0.5)


def test_entropic_risk_loss_names_its_bad_inputs():
    from mlpapers.optim.scent import EntropicRiskLoss

    with pytest.raises(ValueError, match="nu_init must be a finite float"):
        EntropicRiskLoss(4, nu_init=float("inf"))
    loss_fn = EntropicRiskLoss(4)
    idx = torch.tensor([0, 1])
    with pytest.raises(TypeError, match="floating point torch.Tensor"):
        loss_fn(np.zeros((2, 3)), idx)
    with pytest.raises(ValueError, match=r"B, k >= 1"):
        loss_fn(torch.zeros(2, 0), idx)
    with pytest.raises(ValueError, match="mask must have the shape of scores"):
        loss_fn(torch.zeros(2, 3), idx, mask=torch.ones(2, 2, dtype=torch.bool))
    assert not bool(loss_fn.initialized.any())  # nothing refused touched the table


def test_a_tensor_log_alpha_gives_the_dual_steps_of_the_same_float():
    # the tensor branch casts log_alpha to the table's float64 and device: same steps
    from mlpapers.optim.scent import EntropicRiskLoss, spmd_update

    g = torch.Generator().manual_seed(0)
    scores = [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3)]
    idx = torch.tensor([0, 2, 3])
    a = EntropicRiskLoss(4, log_alpha=-0.7)
    b = EntropicRiskLoss(4, log_alpha=torch.tensor(-0.7, dtype=torch.float64))
    c = EntropicRiskLoss(4, log_alpha=torch.full((3,), -0.7, dtype=torch.float32))
    nu = None
    for s in scores:
        va, vb, vc = a(s, idx), b(s, idx), c(s, idx)
        L = torch.logsumexp(s, 1) - math.log(5)
        nu = L if nu is None else spmd_update(nu, L, -0.7)
        torch.testing.assert_close(a.nu[idx], nu, rtol=0, atol=1e-14)
        assert torch.equal(a.nu, b.nu) and float(va) == float(vb)
        assert bool(torch.isfinite(vc))
    # a (B,) float32 tensor: -0.7 rounded to float32 (~1e-8 off) for every anchor
    torch.testing.assert_close(c.nu, a.nu, rtol=0, atol=1e-6)


def test_sparse_input_refuses_a_3d_torch_sparse_tensor():
    from mlpapers.optim import SCENTClassifier

    X = torch.zeros(4, 2, 3).to_sparse()
    with pytest.raises(ValueError, match="Expected 2D array, got a 3D sparse tensor"):
        SCENTClassifier(n_negatives=1).fit(X, [0, 1, 0, 1])


def test_objective_refuses_y_of_another_length():
    from mlpapers.optim import SCENTClassifier

    X, y = _xy()
    clf = SCENTClassifier(n_negatives=1, epochs=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples: 64 != 63"):
        clf.objective(X, y[:-1])


def test_divergence_errors_of_the_training_loops():
    # non-finite scores (SCENTClassifier) and non-finite loss / lam (KL-DRO) stop the fit
    # with a FloatingPointError naming the epoch, not NaN weights
    import warnings

    from mlpapers.optim import KLDRORegressor, SCENTClassifier

    X, y = _xy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (the weights overflow in epoch 1: caught at its end, before epoch 2's scores)
        with pytest.raises(FloatingPointError, match="diverged at epoch 1: the weights"):
            SCENTClassifier(n_negatives=1, lr=1e38, epochs=3, random_state=0).fit(1e3 * X, y)
        # finite weights, overflowing scores: stopped at the next batch
        with pytest.raises(FloatingPointError, match="diverged at epoch 1: non-finite scores"):
            SCENTClassifier(n_negatives=1, lr=1.0, batch_size=16, epochs=3,
                            random_state=0).fit(1e20 * X, y)
        with pytest.raises(FloatingPointError, match="diverged at epoch 2; lower lr"):
            KLDRORegressor(lr=1e30, epochs=3, momentum=0, random_state=0).fit(
                X, X[:, 0] + np.random.default_rng(1).normal(size=len(X)))


def test_momentum_survives_two_pickle_round_trips():
    # an unpickled model has no optimizer until its next partial_fit: pickling it again
    # must keep the heavy-ball buffers it was loaded with (else the next step restarts
    # the momentum from zero)
    import pickle

    from mlpapers.optim import SCENTClassifier

    X, y = _xy()
    clf = SCENTClassifier(n_negatives=1, momentum=0.9, epochs=2, random_state=0).fit(X, y)
    twice = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(clf))))
    assert not hasattr(twice, "_opt")
    clf.partial_fit(X, y)
    twice.partial_fit(X, y)
    np.testing.assert_array_equal(twice.coef_, clf.coef_)
    np.testing.assert_array_equal(twice.nu_, clf.nu_)


def test_entropic_risk_loss_repr_names_its_table_size_and_method():
    from mlpapers.optim.scent import EntropicRiskLoss

    assert repr(EntropicRiskLoss(7, method="sox")) == "EntropicRiskLoss(n_anchors=7, method='sox')"


def test_lr_beyond_float32_is_refused_before_training():
    # the float32 SGD step failed with torch's "value cannot be converted to type float
    # without overflow" (no parameter named); the largest float32 itself is accepted
    from mlpapers.optim import KLDRORegressor, PartialAUCClassifier, SCENTClassifier

    X, y = _xy()
    for est in (SCENTClassifier(n_negatives=1), SCENTClassifier(n_negatives=1, momentum=0.5),
                KLDRORegressor(), PartialAUCClassifier()):
        with pytest.raises(ValueError, match=r"lr must be at most 3.4\d*e\+38"):
            est.set_params(lr=1e39, epochs=1).fit(X, y)
    big = float(torch.finfo(torch.float32).max)
    SCENTClassifier(n_negatives=1, lr=1e-3).set_params(lr=big)._check_params(2)


def test_first_partial_fit_needs_two_classes_and_stays_unfitted():
    from mlpapers.optim import SCENTClassifier

    X, y = _xy()
    clf = SCENTClassifier(n_negatives=1)
    with pytest.raises(ValueError, match="classes must hold at least 2 classes"):
        clf.partial_fit(X, np.zeros(len(X), dtype=int), classes=[0])
    assert not hasattr(clf, "classes_")


def test_pauc_asgd_dual_overflow_stops_the_fit_with_its_cause():
    # ASGD's exp(L - nu) overflows when loss / lam is near the float32 bound the fit
    # accepts (SCENT, SOX, U-max and BSGD run there: test_scent_numerics)
    from mlpapers.optim import PartialAUCClassifier

    X, y = _xy(60)
    lam = 4 / (float(torch.finfo(torch.float32).max) / 64) * 1.01
    with pytest.raises(FloatingPointError, match="diverged at epoch 2: the dual update"):
        PartialAUCClassifier(lam=lam, method="asgd", epochs=2, batch_size=32,
                             random_state=0).fit(X, y)
