"""Fits that end far worse than where they started warn (session 17, data made elsewhere).

A too large ``lr`` (or raw features in large units) made the KL-DRO models end above
their starting objective and ``SCENTClassifier`` far above the all-zero model, with
finite losses and no word. Each test also checks that the healthy fit on the same
data stays quiet.
"""

import math
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler

from mlpapers.optim import KLDROClassifier, KLDRORegressor, SCENTClassifier


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    return X, (y - y.mean()) / y.std()


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:600], y[:600]


def _quiet(fit):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return fit()


# -- KL-DRO ------------------------------------------------------------------------------
def test_kldro_regressor_warns_when_it_ends_above_its_start(diabetes):
    # lr=0.03 on diabetes: 0.840 at the least-squares start, 1.30 after 10 epochs (and
    # 6e8 to 3e9 after the default 100), every loss finite
    X, y = diabetes
    with pytest.warns(ConvergenceWarning, match="above its starting objective.*lower lr") as rec:
        reg = KLDRORegressor(lam=1.0, lr=0.03, epochs=10, random_state=0).fit(X, y)
    assert reg.loss_curve_[-1] > reg.init_objective_
    assert rec[0].filename == __file__   # points at the user's call
    # the objective it reports is the exact one: the warning compares like with like
    assert reg.objective(X, y) == pytest.approx(reg.loss_curve_[-1], rel=1e-9)
    healthy = _quiet(lambda: KLDRORegressor(lam=1.0, epochs=5, random_state=0).fit(X, y))
    assert healthy.loss_curve_[-1] < healthy.init_objective_


def test_kldro_classifier_warns_when_it_ends_above_its_start():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    with pytest.warns(ConvergenceWarning, match="above its starting objective"):
        clf = KLDROClassifier(lam=1.0, lr=0.3, epochs=5, random_state=0).fit(X, y)
    assert clf.loss_curve_[-1] > clf.init_objective_
    _quiet(lambda: KLDROClassifier(lam=1.0, epochs=3, random_state=0).fit(X, y))


# -- SCENTClassifier ---------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["softmax", "negatives"])
def test_scent_zero_model_value_is_the_reference_of_the_warning(digits, loss):
    """At lr ~ 0 the model stays at zero: the epoch's mean surrogate is then exactly the
    value the warning compares with (tau log C for "softmax", 0 for "negatives")."""
    X, y = digits
    X = StandardScaler().fit_transform(X)
    tau = 2.0
    clf = SCENTClassifier(loss=loss, n_negatives=9, temperature=tau, lr=1e-30, epochs=1,
                          random_state=0).fit(X, y)
    expected = tau * math.log(10) if loss == "softmax" else 0.0
    assert clf.loss_curve_[0] == pytest.approx(expected, abs=1e-5)


def test_scent_classifier_warns_far_above_the_zero_model(digits):
    # digits + 1e4: the default lr=1 sent the last epoch's loss to ~1e9 (chance accuracy)
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="far above.*Standardise X") as rec:
        clf = SCENTClassifier(n_negatives=9, epochs=3, random_state=0).fit(X + 1e4, y)
    assert clf.loss_curve_[-1] > 1e3 * math.log(10)
    assert rec[0].filename == __file__
    # partial_fit's epochs are checked too
    with pytest.warns(ConvergenceWarning, match="far above"):
        SCENTClassifier(n_negatives=9, random_state=0).partial_fit(
            X + 1e4, y, classes=np.arange(10))
    healthy = _quiet(lambda: SCENTClassifier(n_negatives=9, epochs=3, random_state=0).fit(
        StandardScaler().fit_transform(X), y))
    assert healthy.loss_curve_[-1] < math.log(10)


def test_scent_classifier_negatives_loss_warns_when_it_diverges(digits):
    # loss="negatives" at the default lr=1 on standardised digits (batches of 64): the
    # gamma of well-classified samples collapses and the risk, 0 at the zero model,
    # climbed to 1e19 (0.16 training accuracy); batches of 256 reach 0.98, quietly
    X, y = digits
    X = StandardScaler().fit_transform(X)
    kw = dict(loss="negatives", n_negatives=9, epochs=8, random_state=0)
    with pytest.warns(ConvergenceWarning, match="far above the 0 of"):
        clf = SCENTClassifier(batch_size=64, **kw).fit(X, y)
    assert clf.loss_curve_[-1] > 1e6
    healthy = _quiet(lambda: SCENTClassifier(**kw).fit(X, y))
    assert healthy.loss_curve_[-1] < 0


def test_scent_classifier_stale_duals_do_not_raise_a_false_alarm():
    """The last epoch's surrogate only bounds the loss from above: at a large ``lr``
    ``asgd_softplus``'s duals jumped to nu ~ 93 in a spike and stayed high (the dual
    step shrinks with the schedule), so ``loss_curve_[-1]`` read 5.6 while the exact
    objective was 0.11 at 0.994 training accuracy, and the fit warned. The exact
    objective now decides."""
    X, y = load_wine(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = SCENTClassifier(n_negatives=2, method="asgd_softplus", lr=2.0, epochs=20,
                              batch_size=8, random_state=0).fit(X, y)
    zero = float(clf.temperature) * np.log(3)
    assert clf.loss_curve_[-1] > zero + float(clf.temperature) * np.log(3)  # surrogate high
    assert clf.objective(X, y) < 0.5 * zero and clf.score(X, y) > 0.95


def test_divergence_warning_on_sparse_and_dataframe_input():
    """The exact objective that decides the warning was computed through ``objective()``,
    which re-validated the training rows: sparse input (the loop's sparse row batches)
    raised ``ValueError: setting an array element with a sequence`` instead of warning,
    and a DataFrame warned about missing feature names."""
    sp = pytest.importorskip("scipy.sparse")
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] + 1e4, y[:600]
    with pytest.warns(ConvergenceWarning, match="far above"):
        SCENTClassifier(n_negatives=9, epochs=1, random_state=0).fit(sp.csr_matrix(X), y)
    with pytest.warns(ConvergenceWarning, match="far above"):
        SCENTClassifier(n_negatives=9, epochs=1, random_state=0).partial_fit(
            sp.csr_matrix(X), y, classes=np.arange(10))
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        SCENTClassifier(n_negatives=9, epochs=1, random_state=0).fit(frame, y)
    msgs = [str(w.message) for w in rec]
    assert any("far above" in m for m in msgs)
    assert not [m for m in msgs if "feature names" in m], msgs
