"""Regression tests from the ecosystem / scale / lifecycle audit of the SCENT estimators."""

import copy

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim.scent import EntropicRiskLoss, SCENTClassifier


@pytest.mark.parametrize("cast", [lambda m: m.float(), lambda m: m.half(),
                                  lambda m: m.to(torch.bfloat16),
                                  lambda m: torch.nn.Sequential(m).to(torch.float32)[0]])
@pytest.mark.parametrize("method", ["scent", "sox", "asgd", "umax", "asgd_softplus"])
def test_entropic_risk_loss_survives_dtype_casts(cast, method):
    # ``loss.float()`` / ``model.half()`` cast the float64 dual table: the next forward
    # raised "Index put requires the source and destination dtypes match"
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 6, generator=g)
    ref = EntropicRiskLoss(10, method=method, log_alpha=0.5)
    ref(scores, torch.tensor([0, 3, 5, 9]))
    moved = cast(copy.deepcopy(ref))
    assert moved.nu.dtype == torch.float64
    torch.testing.assert_close(moved.nu, ref.nu, rtol=0, atol=0)  # cast losslessly
    batch = torch.tensor([0, 1, 2, 3])
    out = moved(scores, batch)
    expected = ref(scores, batch)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(moved.nu, ref.nu)
    half = cast(copy.deepcopy(ref))(scores.half(), batch)  # low-precision scores run too
    assert half.dtype == torch.float32 and torch.isfinite(half)  # computed in float32


def test_predict_blocks_are_bounded_by_elements_not_rows(monkeypatch):
    # predict / objective took blocks of 4096 rows whatever the number of classes: 655 MB
    # of float64 logits per block at 20k classes (1.7 GB peak scoring 20k rows)
    import mlpapers.optim.scent._xc_predict as mod

    X, y = make_extreme_classification(4200, 1100, 2, noise=1.0, min_samples_per_class=1,
                                       random_state=0)
    clf = SCENTClassifier(n_negatives=4, epochs=1, random_state=0).fit(X, y)
    sizes = []
    original = SCENTClassifier._logit_block

    def recording(self, X):
        logits = original(self, X)

        def block(rows):
            z = logits(rows)
            sizes.append(z.numel())
            return z
        return block

    monkeypatch.setattr(SCENTClassifier, "_logit_block", recording)
    clf.predict(X)
    clf.objective(X, y)
    assert len(sizes) > 2 and max(sizes) <= getattr(mod, "_CHUNK_ELEMENTS", 1 << 22)


@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.5, alpha=1e-3, fit_intercept=True),
                                dict(loss="negatives", negatives="in_batch", lr=0.3)])
def test_sparse_csr_input_trains_like_dense(kw):
    # extreme-classification features are sparse: CSR input raised "Sparse data was
    # passed for X, but dense data is required"; it now trains on sparse batches
    sp = pytest.importorskip("scipy.sparse")
    X, y = make_extreme_classification(400, 15, 10, noise=0.3, random_state=0)
    X[np.abs(X) < 0.8] = 0.0
    S = sp.csr_matrix(X)
    dense = SCENTClassifier(n_negatives=4, epochs=3, random_state=0, **kw).fit(X, y)
    sparse = SCENTClassifier(n_negatives=4, epochs=3, random_state=0, **kw).fit(S, y)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, atol=1e-5)
    np.testing.assert_allclose(sparse.nu_, dense.nu_, atol=1e-5)
    np.testing.assert_allclose(sparse.predict_proba(sp.csc_matrix(X)),
                               sparse.predict_proba(X), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(sparse.predict(S), sparse.predict(X))
    assert sparse.objective(S, y) == pytest.approx(sparse.objective(X, y), rel=1e-12)
    before = sparse.coef_.copy()
    sparse.partial_fit(S, y)
    dense.partial_fit(X, y)
    assert not np.array_equal(sparse.coef_, before)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, atol=1e-5)


def test_sparse_dataframe_records_feature_names():
    pd = pytest.importorskip("pandas")
    sp = pytest.importorskip("scipy.sparse")
    X, y = make_extreme_classification(200, 6, 4, noise=0.3, random_state=0)
    X[np.abs(X) < 0.5] = 0.0
    df = pd.DataFrame.sparse.from_spmatrix(sp.csr_matrix(X), columns=list("abcd"))
    clf = SCENTClassifier(n_negatives=3, epochs=2, random_state=0).fit(df, y)
    assert list(clf.feature_names_in_) == list("abcd")
    ref = SCENTClassifier(n_negatives=3, epochs=2, random_state=0).fit(X, y)
    np.testing.assert_allclose(clf.coef_, ref.coef_, atol=1e-5)
    with pytest.raises(ValueError, match="feature names"):
        clf.predict(df.rename(columns={"a": "z"}))


def test_partial_auc_exact_objective_works_in_blocks(monkeypatch):
    # the per-epoch loss_curve_ and objective() built all n_pos x n_neg pair losses in
    # float64 (2.7 GB peak fitting 20k samples, 20 GB at 50k x 50k); they now reduce
    # blocks of positives, with the same value
    import mlpapers.optim.scent._pauc as mod
    from mlpapers.optim.scent import PartialAUCClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4200, 3))
    y = (X[:, 0] + rng.logistic(size=4200) > 0).astype(int)
    sizes = []
    original = mod.tempered_log_mean_exp

    def recording(x, *args, **kwargs):
        sizes.append(x.numel())
        return original(x, *args, **kwargs)

    monkeypatch.setattr(mod, "tempered_log_mean_exp", recording)
    clf = PartialAUCClassifier(epochs=1, random_state=0).fit(X, y)
    value = clf.objective(X, y)
    assert max(sizes) <= 1 << 22
    # brute force, all pairs at once in numpy
    s = X @ clf.coef_ + clf.intercept_
    h = 1 / (1 + np.exp(-s))
    ell = np.maximum(clf.margin - (h[y == 1][:, None] - h[y == 0][None, :]), 0) ** 2
    z = ell / clf.lam
    m = z.max(1, keepdims=True)
    lme = (m[:, 0] + np.log(np.exp(z - m).mean(1)))
    assert value == pytest.approx(clf.lam * lme.mean(), rel=1e-10)


def test_torch_sparse_tensor_input_is_accepted():
    # a torch sparse COO tensor failed with "Could not run 'aten::ne.Scalar' with
    # arguments from the 'SparseCPU' backend"
    X, y = make_extreme_classification(300, 10, 6, noise=0.3, random_state=0)
    ref = SCENTClassifier(n_negatives=3, epochs=1, random_state=0).fit(X, y)
    Xs = torch.tensor(X).to_sparse()
    est = SCENTClassifier(n_negatives=3, epochs=1, random_state=0).fit(Xs, torch.tensor(y))
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_array_equal(est.predict(Xs), ref.predict(X))


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_fit_under_float64_default_dtype(float64_default):
    # torch.set_default_dtype(torch.float64) in user code made the float32 weights of
    # SCENTClassifier and PartialAUCClassifier float64 against float32 data: a crash
    from mlpapers.optim import PartialAUCClassifier

    X, y = make_extreme_classification(200, 10, 6, random_state=0)
    clf = SCENTClassifier(n_negatives=4, epochs=2, random_state=0).fit(X, y)
    assert clf.coef_.dtype == np.float32 and clf.predict(X).shape == (200,)
    yb = (y < 5).astype(int)
    pauc = PartialAUCClassifier(epochs=2, random_state=0).fit(X, yb)
    assert np.isfinite(pauc.coef_).all()


def test_partial_fit_continues_a_model_pickled_with_an_int_fit_intercept():
    """A model pickled before the switches were checked, holding ``fit_intercept=1``,
    unpickles with ``True`` and keeps training instead of failing its next call. A new
    estimator refuses the int."""
    import pickle

    X, y = make_extreme_classification(200, 6, 4, noise=0.3, random_state=0)
    classes = np.unique(y)
    model = SCENTClassifier(n_negatives=2, epochs=1, random_state=0).partial_fit(
        X, y, classes=classes)
    state = model.__getstate__()
    state["fit_intercept"] = 1
    old = pickle.loads(pickle.dumps(model))
    old.__setstate__(state)
    assert old.fit_intercept is True
    before = old.coef_.copy()
    old.partial_fit(X, y)
    assert not np.array_equal(old.coef_, before)
    with pytest.raises(TypeError, match="fit_intercept must be a bool"):
        SCENTClassifier(n_negatives=2, fit_intercept=1).partial_fit(X, y, classes=classes)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_fit_whose_last_step_overflows_the_weights_raises():
    # the scores are checked before each step: an overflow in the last one returned
    # infinite coef_ (predict_proba NaN) without an error or a warning
    import pickle

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(100, 4)), rng.integers(0, 3, 100)
    kw = dict(n_negatives=2, alpha=1.0, lr=100.0, lr_schedule="constant", random_state=0)
    with pytest.raises(FloatingPointError, match="diverged at epoch 20: the weights"):
        SCENTClassifier(epochs=20, **kw).fit(X, y)
    # a partial_fit stream: the failed call rolls back to the last finite model
    clf = SCENTClassifier(n_negatives=2, alpha=1.0, lr=5.0, random_state=0)
    Xs = X * 1e-3
    with pytest.raises(FloatingPointError):
        for _ in range(200):
            before = pickle.dumps(clf)
            clf.partial_fit(Xs, y, classes=[0, 1, 2])
    assert np.isfinite(clf.coef_).all()
    np.testing.assert_array_equal(clf.coef_, pickle.loads(before).coef_)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_penalty_in_the_loss_curve_does_not_overflow_before_the_weights():
    # 0.5 alpha |W|^2 was summed in float32: inf in loss_curve_ from |W| ~ 1e19 on
    clf = SCENTClassifier(n_negatives=2, alpha=1.0, lr=1e-30, epochs=1, random_state=0)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 4)), rng.integers(0, 3, 20)
    clf.partial_fit(X, y, classes=[0, 1, 2])
    clf._W.data.fill_(3e19)
    clf.partial_fit(X * 0, y)  # scores = intercepts: finite
    want = 0.5 * float(np.sum(np.full(clf.coef_.shape, 3e19, np.float64) ** 2))
    assert np.isfinite(clf.loss_curve_[-1]) and clf.loss_curve_[-1] >= 0.99 * want


def test_momentum_switched_off_and_on_continues_alike_live_and_reloaded(tmp_path):
    # a reloaded model dropped the saved heavy-ball buffers when resumed at momentum 0;
    # the live optimizer kept them and used them again at momentum 0.9
    import pickle

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 6)), rng.integers(0, 5, 200)
    a = SCENTClassifier(n_negatives=2, random_state=0, batch_size=64, momentum=0.9)
    a.partial_fit(X, y, classes=np.arange(5))
    a.save(tmp_path / "a.pt")
    copies = [pickle.loads(pickle.dumps(a)), SCENTClassifier.load(tmp_path / "a.pt")]
    for m in (a, *copies):
        m.set_params(momentum=0.0).partial_fit(X, y)
        m.set_params(momentum=0.9).partial_fit(X, y)
    for m in copies:
        np.testing.assert_array_equal(m.coef_, a.coef_)


def test_in_batch_partial_fit_on_one_class_warns_that_nothing_trained():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    clf = SCENTClassifier(negatives="in_batch", random_state=0)
    with pytest.warns(UserWarning, match="trained nothing"):
        clf.partial_fit(X[:1], [0], classes=[0, 1, 2])
    assert not clf.coef_.any()
    with pytest.warns(UserWarning, match="trained nothing"):
        clf.partial_fit(X, [1] * 6)
    clf.partial_fit(X, [0, 1, 2, 0, 1, 2])  # two classes in the batch: trains, no warning
    assert clf.coef_.any()
