"""SCENTClassifier(loss="negatives") and in-batch negatives: unbiasedness by enumeration,
exactness with all negatives, the exact objective, errors, exact resumption."""

import itertools
import math
import pickle

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim import SCENTClassifier
from mlpapers.optim.scent._common import minimize_lbfgs
from mlpapers.optim.scent._kernels import log_mean_exp
from mlpapers.optim.scent._sampled import in_batch_negatives, other_class_negatives
from mlpapers.optim.scent._xc import batch_scores, exact_objective


def inner_estimate(loss, negatives, z, y, draw, tau):
    """exp of the masked log-mean-exp of the scores a step would use, and the kept rows."""
    B = len(y)
    z_pos = z[torch.arange(B), y]
    z_neg = z[:, draw.cand]
    if draw.cols is not None:
        z_neg = z_neg.gather(1, draw.cols)
    scores, mask, keep = batch_scores(loss, negatives, z_pos, z_neg, draw.valid, z.shape[1], tau)
    keep = torch.ones(B, dtype=torch.bool) if keep is None else keep
    return torch.exp(log_mean_exp(scores, mask=mask)), keep


def exact_inner(loss, z, y, tau):
    s = (z - z[torch.arange(len(y)), y][:, None]) / tau
    if loss == "softmax":
        return torch.exp(s).mean(1)
    e = torch.exp(s)
    e[torch.arange(len(y)), y] = 0.0
    return e.sum(1) / (z.shape[1] - 1)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_other_class_draws_are_exactly_unbiased(k, tau):
    """Averaging over every tuple of k shared draws gives the mean over the other classes."""
    gen = torch.Generator().manual_seed(0)
    C, B = 6, 7
    z = torch.randn(B, C, generator=gen, dtype=torch.float64) * 2
    y = torch.tensor([0, 5, 2, 2, 3, 1, 4])
    est = []
    for u in itertools.product(range(C - 1), repeat=k):
        draw = other_class_negatives(C, k, y, gen, draws=torch.tensor(u))
        assert draw.valid is None and draw.cand.shape == (2 * k,)
        used = draw.cand[draw.cols]
        assert bool((used != y[:, None]).all())  # never the anchor's own class
        est.append(inner_estimate("negatives", "uniform", z, y, draw, tau)[0])
    torch.testing.assert_close(torch.stack(est).mean(0), exact_inner("negatives", z, y, tau))


@pytest.mark.parametrize("loss", ["negatives", "softmax"])
def test_in_batch_negatives_unbiased_for_balanced_classes(loss):
    """Enumerate every batch of 3 holding anchor 0 (the other two points uniformly from the
    rest): given at least one other class in the batch, the in-batch estimate is unbiased
    when the classes are balanced, and biased towards frequent classes otherwise."""
    gen = torch.Generator().manual_seed(1)
    n, C = 9, 3
    zfull = torch.randn(n, C, generator=gen, dtype=torch.float64) * 2

    def average(labels):
        y = torch.tensor(labels)
        ests = []
        for others in itertools.combinations(range(1, n), 2):
            rows = torch.tensor((0,) + others)
            draw = in_batch_negatives(y[rows])
            est, keep = inner_estimate(loss, "in_batch", zfull[rows], y[rows], draw, 1.0)
            if bool(keep[0]):
                ests.append(est[int(keep[: 1].sum()) - 1])
        return torch.stack(ests).mean(), exact_inner(loss, zfull[:1], y[:1], 1.0)[0]

    mean, exact = average([0, 0, 0, 1, 1, 1, 2, 2, 2])
    torch.testing.assert_close(mean, exact)
    mean, exact = average([0, 1, 1, 1, 1, 1, 1, 1, 2])  # class 2 is rare
    assert abs(float(mean - exact)) > 1e-3


def test_in_batch_drops_anchors_without_other_class():
    y = torch.tensor([4, 4, 7])
    draw = in_batch_negatives(y)
    assert draw.cand.tolist() == [4, 7]
    z = torch.zeros(3, 8, dtype=torch.float64)
    _, keep = inner_estimate("negatives", "in_batch", z, y, draw, 1.0)
    assert keep.all()
    single = in_batch_negatives(torch.tensor([4, 4]))
    _, keep = inner_estimate("negatives", "in_batch", z[:2], torch.tensor([4, 4]), single, 1.0)
    assert not keep.any()
    # an estimator whose batches hold a single class takes no step
    X = np.random.default_rng(0).normal(size=(20, 3))
    clf = SCENTClassifier(loss="negatives", negatives="in_batch", random_state=0)
    with pytest.warns(UserWarning, match="trained nothing"):
        clf.partial_fit(X, np.zeros(20, dtype=int), classes=[0, 1, 2])
    assert not clf.coef_.any() and np.isnan(clf.nu_).all()


@pytest.fixture(scope="module")
def problem():
    return make_extreme_classification(300, 12, 5, noise=1.0, zipf_exponent=0.5,
                                       random_state=0)


@pytest.mark.parametrize("method", ["bsgd", "scent"])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_all_negatives_follow_exact_gradient(problem, method, fit_intercept):
    """With every other class as negative the inner mean is exact; BSGD, and SCENT with a
    huge alpha (nu <- L), then take full-batch gradient steps on the exact objective."""
    X, y = problem
    C, lr, tau, steps = len(np.unique(y)), 0.7, 0.8, 3
    clf = SCENTClassifier(n_negatives=C - 1, loss="negatives", method=method, log_alpha=50.0,
                          temperature=tau, lr=lr, lr_schedule="constant", epochs=steps,
                          batch_size=len(X), fit_intercept=fit_intercept,
                          random_state=0).fit(X, y)
    Xt = torch.tensor(X, dtype=torch.float64)
    yt = torch.tensor(np.searchsorted(clf.classes_, y))
    W = torch.zeros(C, X.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(C, dtype=torch.float64, requires_grad=fit_intercept)
    for _ in range(steps):
        f = exact_objective(Xt @ W.T + b, yt, "negatives", tau)
        grads = torch.autograd.grad(f, [W, b] if fit_intercept else [W])
        with torch.no_grad():
            W -= lr * grads[0]
            if fit_intercept:
                b -= lr * grads[1]
    np.testing.assert_allclose(clf.coef_, W.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(clf.intercept_, b.detach().numpy(), atol=1e-5)
    with torch.no_grad():
        ref = float(exact_objective(Xt @ W.T + b, yt, "negatives", tau))
    assert clf.objective(X, y) == pytest.approx(ref, abs=1e-5)


def test_objective_matches_brute_force(problem):
    X, y = problem
    clf = SCENTClassifier(loss="negatives", n_negatives=3, epochs=2, temperature=0.7,
                          fit_intercept=True, alpha=0.1, random_state=0).fit(X, y)
    z = X.astype(np.float64) @ clf.coef_.T.astype(np.float64) + clf.intercept_
    yi = np.searchsorted(clf.classes_, y)
    C = z.shape[1]
    vals = [math.log(sum(math.exp((z[i, k] - z[i, yi[i]]) / 0.7) for k in range(C)
                         if k != yi[i]) / (C - 1)) for i in range(len(y))]
    ref = 0.7 * np.mean(vals) + 0.05 * float((clf.coef_.astype(np.float64) ** 2).sum())
    assert clf.objective(X, y) == pytest.approx(ref, rel=1e-9)
    # the softmax objective of the same estimator is the cross-entropy
    soft = clf.set_params(loss="softmax").objective(X, y)
    ce = -np.mean(np.log(clf.predict_proba(X)[np.arange(len(y)), yi])) * 0.7
    assert soft == pytest.approx(ce + 0.05 * float((clf.coef_.astype(np.float64) ** 2).sum()),
                                 rel=1e-9)


@pytest.mark.parametrize("negatives", ["uniform", "in_batch"])
def test_negatives_loss_converges_to_lbfgs_optimum(problem, negatives):
    """SCENT with sampled negatives reaches the exact (regularised) negatives-only optimum.
    The L2 penalty keeps the per-sample nu* within a few units of 0; with weak
    regularisation some nu* fall below -20, where the default alpha freezes them
    (gamma = sigmoid(log alpha + nu) -> 0; see the user guide)."""
    X, y = problem
    alpha = 0.5
    classes, yi = np.unique(y, return_inverse=True)
    Xt, yt = torch.tensor(X, dtype=torch.float64), torch.tensor(yi)
    W = torch.zeros(len(classes), X.shape[1], dtype=torch.float64, requires_grad=True)

    def f():
        return exact_objective(Xt @ W.T, yt, "negatives", 1.0) + 0.5 * alpha * (W * W).sum()

    minimize_lbfgs(f, [W])
    clf = SCENTClassifier(loss="negatives", negatives=negatives, n_negatives=4, epochs=60,
                          lr=0.3, batch_size=30, alpha=alpha, random_state=0).fit(X, y)
    gap = clf.objective(X, y) - float(f().detach())
    assert -1e-6 < gap < 1e-2
    # the dual table tracks the log inner mean at the final weights
    z = X.astype(np.float64) @ clf.coef_.T.astype(np.float64)
    s = z - z[np.arange(len(y)), yi][:, None]
    s[np.arange(len(y)), yi] = -np.inf
    nu_star = np.log(np.exp(s).sum(1) / (len(classes) - 1))
    assert np.mean(np.abs(clf.nu_ - nu_star)) < 0.25


def test_bad_parameters(problem):
    X, y = problem
    with pytest.raises(ValueError, match="loss must be one of"):
        SCENTClassifier(loss="hinge", n_negatives=2).fit(X, y)
    with pytest.raises(ValueError, match="negatives must be one of"):
        SCENTClassifier(negatives="hard", n_negatives=2).fit(X, y)
    with pytest.raises(ValueError, match="n_negatives must be < n_classes"):
        SCENTClassifier(loss="negatives", n_negatives=100).fit(X, y)
    # n_negatives is unused by in-batch negatives
    SCENTClassifier(negatives="in_batch", n_negatives=100, epochs=1).fit(X, y)


@pytest.mark.parametrize("kw", [dict(momentum=0.5),
                                dict(loss="negatives", negatives="in_batch", momentum=0.3),
                                dict(),  # the row-sparse step, driven by the generator
                                dict(loss="negatives", negatives="uniform")])
def test_save_load_and_pickle_continue_exactly(tmp_path, problem, kw):
    X, y = problem
    a = SCENTClassifier(n_negatives=3, random_state=0, **kw)
    a.partial_fit(X, y, classes=np.unique(y))
    a.save(tmp_path / "a.pt")
    b = SCENTClassifier.load(tmp_path / "a.pt")
    c = pickle.loads(pickle.dumps(a))
    for est in (a, b, c):
        est.partial_fit(X, y)
        est.partial_fit(X, y)
    for other in (b, c):
        np.testing.assert_array_equal(other.coef_, a.coef_)
        np.testing.assert_array_equal(other.nu_, a.nu_)
        assert other.loss_curve_ == a.loss_curve_
