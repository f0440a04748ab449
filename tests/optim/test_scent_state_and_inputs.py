"""SCENTClassifier's state across failing calls and skipped batches, and the kernels'
inputs (session 34: found by black-box probing)."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import EntropicRiskLoss, SCENTClassifier, objective, spmd_update


def _xy(n=40, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)), rng.integers(0, classes, n)


def test_objective_reads_a_column_of_labels_as_one_label_per_row():
    # with as many rows as classes, an (n, 1) y broadcast against the classes inside
    # the exact objective and gave another value without a word
    X = np.random.default_rng(0).normal(size=(6, 3))
    y = np.arange(6)
    clf = SCENTClassifier(n_negatives=5, epochs=5, random_state=0).fit(X, y)
    flat = clf.objective(X, y)
    assert clf.objective(X, y.reshape(-1, 1)) == flat
    assert clf.objective(X, torch.as_tensor(y).reshape(-1, 1)) == flat
    assert clf.objective(X[:5], y[:5].reshape(-1, 1)) == clf.objective(X[:5], y[:5])
    with pytest.raises(ValueError, match="y should be a 1d array"):
        clf.objective(X[:1], y[0])
    with pytest.raises(ValueError, match="y should be a 1d array"):
        clf.objective(X, np.stack([y, y], 1))


def test_gamma_curve_counts_only_the_batches_that_took_a_step():
    # a batch of one row has no in-batch negative and is skipped; the epoch's mean
    # counted the previous batch's statistics a second time
    X = np.random.default_rng(0).normal(size=(9, 3))
    y = np.tile([0, 1, 2], 3)
    stats, forward = [], EntropicRiskLoss.forward

    def recording(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        stats.append(dict(self.last_stats))
        return out

    EntropicRiskLoss.forward = recording
    try:
        clf = SCENTClassifier(negatives="in_batch", loss="negatives", batch_size=4, epochs=3,
                              lr=0.1, random_state=0).fit(X, y)
    finally:
        EntropicRiskLoss.forward = forward
    # batches of 4, 4 and 1 rows: two loss calls per epoch
    assert len(stats) == 6
    assert np.isnan(clf.gamma_curve_[0])  # first visits only
    for epoch in (1, 2):
        calls = stats[2 * epoch: 2 * epoch + 2]
        count = sum(s["gamma_count"] for s in calls)
        mean = sum(s["gamma_mean"] * s["gamma_count"] for s in calls) / count
        assert clf.gamma_curve_[epoch] == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_a_later_partial_fit_that_fails_leaves_the_model_as_it_was(momentum):
    # the failed call had written nu = inf into the live dual table (absorbing under
    # ASGD) and stepped the live weights: every later call failed again, however small
    # lr was set, while a pickled copy (rebuilt from coef_ and nu_) trained on
    X, y = _xy()
    clf = SCENTClassifier(n_negatives=2, method="asgd", batch_size=8, momentum=momentum,
                          random_state=0).partial_fit(X, y, classes=[0, 1, 2])
    before = pickle.loads(pickle.dumps(clf))
    clf.set_params(lr=1e4, dual_lr=5.0)
    with pytest.raises(FloatingPointError, match="diverged"):
        clf.partial_fit(X, y)
    np.testing.assert_array_equal(clf.coef_, before.coef_)
    np.testing.assert_array_equal(clf.nu_, before.nu_)
    assert clf.loss_curve_ == before.loss_curve_
    for model in (clf, before):
        model.set_params(lr=1e-3, dual_lr=1e-3).partial_fit(X, y)
    # the rolled-back model continues exactly as the copy taken before the failure
    np.testing.assert_array_equal(clf.coef_, before.coef_)
    np.testing.assert_array_equal(clf.nu_, before.nu_)
    assert np.isfinite(clf.nu_).all()


def test_a_partial_fit_interrupted_after_its_epoch_keeps_no_curve_entry(monkeypatch):
    # regression: the rollback restored the attributes but not the lists, appended in
    # place: loss_curve_ and gamma_curve_ kept the failed call's epoch
    X, y = _xy()
    clf = SCENTClassifier(n_negatives=2, batch_size=8, random_state=0).partial_fit(
        X, y, classes=[0, 1, 2])
    before = pickle.loads(pickle.dumps(clf))

    def interrupt(self, *args):
        raise KeyboardInterrupt
    monkeypatch.setattr(SCENTClassifier, "_warn_if_worse_than_zero", interrupt)
    with pytest.raises(KeyboardInterrupt):
        clf.partial_fit(X, y)
    assert clf.loss_curve_ == before.loss_curve_ and len(clf.loss_curve_) == 1
    np.testing.assert_array_equal(clf.gamma_curve_, before.gamma_curve_)
    assert clf.n_iter_ == before.n_iter_


@pytest.mark.parametrize("big", [np.array([1e20]), np.array([2**63 + 5], dtype=np.uint64),
                                 np.array([1e12]), np.array([2**31])])
def test_huge_sample_indices_are_refused_by_name(big):
    # regression: 1e20 and a uint64 above 2**63 wrapped to negative int64 rows of the
    # dual table; 1e12 asked for a table of 1e12 entries
    X, y = _xy()
    index = np.concatenate([np.arange(len(X) - 1), big]).astype(big.dtype)
    clf = SCENTClassifier(n_negatives=2, batch_size=8, random_state=0)
    with pytest.raises(ValueError, match=r"sample_index values must be below 2\*\*31"):
        clf.partial_fit(X, y, classes=[0, 1, 2], sample_index=index)
    assert not hasattr(clf, "coef_")


def test_objective_refuses_scores_without_anchors():
    with pytest.raises(ValueError, match="at least one anchor"):
        objective(torch.zeros(0, 3))  # the mean over no anchors was NaN
    with pytest.raises(ValueError, match="0-d tensor"):
        objective(torch.tensor(1.0))  # was an IndexError
    # anchors without items stay -inf (documented), one row is one anchor
    assert float(objective(torch.zeros(2, 0))) == -np.inf
    assert float(objective(torch.tensor([0.0, np.log(3.0)]))) == pytest.approx(np.log(2.0))


@pytest.mark.parametrize("bad", [None, "1.0", [0.0, 1.0]])
def test_step_parameters_that_are_not_numbers_raise_a_type_error_naming_them(bad):
    with pytest.raises(TypeError, match="log_alpha must be a real number or a torch.Tensor"):
        spmd_update(torch.zeros(2), torch.ones(2), bad)


def test_step_parameters_accept_numpy_scalars_and_0d_arrays():
    nu, lme = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    ref = spmd_update(nu, lme, 1.0)
    for value in (np.float32(1.0), np.array(1.0), torch.tensor(1.0, dtype=torch.float64)):
        assert torch.allclose(spmd_update(nu, lme, value), ref, rtol=1e-7)
