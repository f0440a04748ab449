"""Documented promises and memory bounds of SCENT checked directly (sixth audit)."""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim.scent import (
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    log_mean_exp,
)


def test_log_mean_exp_of_an_empty_masked_slice_is_minus_inf():
    # the docstring promises -inf for a slice without valid items; it gave NaN
    # (logsumexp = -inf minus log(count = 0) = -inf)
    scores = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.5, -1.0]], requires_grad=True)
    mask = torch.tensor([[True, False], [False, False], [True, True]])
    out = log_mean_exp(scores, mask=mask)
    assert out[1].item() == float("-inf")
    assert out[0].item() == 1.0
    expected = torch.logsumexp(scores[2], 0) - torch.log(torch.tensor(2.0))
    torch.testing.assert_close(out[2], expected)
    out[[0, 2]].sum().backward()  # the empty slice does not poison the other gradients
    assert torch.isfinite(scores.grad).all() and scores.grad[1].eq(0).all()
    # along dim=0 as well: a column without a valid item gives -inf
    cols = log_mean_exp(scores.detach(), dim=0, mask=torch.tensor([[True, False]] * 3))
    assert cols[1].item() == float("-inf") and torch.isfinite(cols[0])


@pytest.mark.parametrize("loss", ["softmax", "negatives"])
def test_predict_and_objective_work_in_row_blocks(monkeypatch, loss):
    # predict / score / objective built all n x n_classes float64 logits at once (8 GB for
    # 100k rows of 10k classes); they now reduce blocks of rows
    import mlpapers.optim.scent._xc_predict as mod

    X, y = make_extreme_classification(300, 12, 5, noise=1.0, min_samples_per_class=1,
                                       random_state=0)
    clf = SCENTClassifier(n_negatives=4, loss=loss, alpha=0.1, temperature=0.7, epochs=2,
                          random_state=0).fit(X, y)
    pred, obj, acc = clf.predict(X), clf.objective(X, y), clf.score(X, y)

    def whole(self, X):
        raise AssertionError("all logits at once")

    monkeypatch.setattr(mod, "_CHUNK_ELEMENTS", 7 * 12 + 5)  # 300 = 42 * 7 + 6: ragged
    monkeypatch.setattr(SCENTClassifier, "_logits", whole)
    np.testing.assert_array_equal(clf.predict(X), pred)
    assert clf.score(X, y) == acc
    assert clf.objective(X, y) == pytest.approx(obj, rel=1e-12)


@pytest.mark.parametrize("init,change", [
    ({}, dict(log_alpha=5.0)), ({}, dict(momentum=0.5)), ({}, dict(method="umax", delta=0.1)),
    ({}, dict(fit_intercept=True)), (dict(fit_intercept=True), dict(fit_intercept=False))])
def test_set_params_between_partial_fits_acts_like_a_reloaded_model(init, change):
    # lr / gamma / dual_lr / temperature took effect at the next partial_fit, but the
    # live model kept its old log_alpha, momentum and dual rule while a pickled or
    # loaded copy used the new ones (coef_ off by up to 0.2 after one epoch)
    import pickle

    X, y = make_extreme_classification(200, 8, 4, noise=0.5, min_samples_per_class=2,
                                       random_state=1)
    live = SCENTClassifier(n_negatives=3, batch_size=50, momentum=0.2, random_state=0, **init)
    live.partial_fit(X, y, classes=np.unique(y))
    copy = pickle.loads(pickle.dumps(live))
    before = live.coef_.copy()
    for est in (live, copy):
        est.set_params(**change).partial_fit(X, y)
    np.testing.assert_array_equal(live.coef_, copy.coef_)
    np.testing.assert_array_equal(live.intercept_, copy.intercept_)
    np.testing.assert_array_equal(live.nu_, copy.nu_)
    unchanged = SCENTClassifier(n_negatives=3, batch_size=50, momentum=0.2, random_state=0,
                                **init)
    unchanged.partial_fit(X, y, classes=np.unique(y)).partial_fit(X, y)
    assert not np.array_equal(live.coef_, unchanged.coef_) and not np.array_equal(
        live.coef_, before)


def _badly_scaled_logistic_data(seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((300, 5))
    y = (Z @ np.array([1.0, -2.0, 0.5, 1.5, -1.0]) + rng.standard_normal(300) > 0).astype(int)
    scales = np.array([1e-3, 1.0, 1e3, 10.0, 1e-2])
    offsets = np.array([5.0, -100.0, 1e4, 0.0, 3.0])
    return Z, Z * scales + offsets, y


def test_erm_logistic_warm_start_is_independent_of_feature_units_and_offsets():
    # L-BFGS in the original units stopped far from the optimum on features whose scales
    # differ by orders of magnitude: the same unpenalised problem must reach the same loss
    import torch.nn.functional as F

    from mlpapers.optim.scent._dro_init import erm_logistic

    Z, X, y = _badly_scaled_logistic_data()
    yt = torch.as_tensor(y)

    def loss(A):
        W, b = erm_logistic(torch.as_tensor(A), yt, 2, alpha=0.0, fit_intercept=True)
        return float(F.cross_entropy(torch.as_tensor(A) @ W.T + b, yt))

    assert loss(X) == pytest.approx(loss(Z), abs=1e-7)


def test_pauc_fit_is_independent_of_feature_units_and_offsets():
    # the sigmoid saw uncentred scores: raw features with large means put every score in
    # its flat tail and the fit never left its start (objective 1.0 on raw breast cancer)
    Z, X, y = _badly_scaled_logistic_data(1)
    Z = (Z - Z.mean(0)) / Z.std(0)
    fits = [PartialAUCClassifier(lam=0.5, epochs=5, random_state=0).fit(A, y) for A in (Z, X)]
    assert fits[1].objective(X, y) == pytest.approx(fits[0].objective(Z, y), rel=1e-4)
    assert fits[1].score(X, y) == pytest.approx(fits[0].score(Z, y), abs=1e-6)
    assert fits[1].objective(X, y) < 0.9  # the start (all sigmoids at 1/2) scores 1.0


@pytest.mark.parametrize("make", [lambda: SCENTClassifier(n_negatives=1, epochs=1),
                                  lambda: KLDRORegressor(epochs=1),
                                  lambda: KLDROClassifier(epochs=1),
                                  lambda: PartialAUCClassifier(epochs=1)],
                         ids=["SCENTClassifier", "KLDRORegressor", "KLDROClassifier",
                              "PartialAUCClassifier"])
def test_objective_checks_the_fitted_number_of_features(make):
    # objective validates X against the fit (as predict does) and leaves the fit as it was
    est = make()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    y = X @ np.arange(5.0) if isinstance(est, KLDRORegressor) else (X[:, 0] > 0).astype(int)
    est.fit(X, y)
    with pytest.raises(ValueError, match="X has 4 features, but .* is expecting 5"):
        est.objective(X[:, :4], y)
    assert est.n_features_in_ == 5
