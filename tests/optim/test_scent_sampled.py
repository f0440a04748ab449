"""Shared sampled negatives: unbiasedness, sparse step = dense step, and the data generator."""

import math

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim import SCENTClassifier
from mlpapers.optim.scent._kernels import log_mean_exp
from mlpapers.optim.scent._sampled import sampled_scores, shared_negatives


@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_one_draw_estimate_is_exactly_unbiased(tau):
    """With k = 1 draw, averaging the estimate over all C draws gives (1/C) sum_c e^{s_c}."""
    gen = torch.Generator().manual_seed(0)
    C, B = 7, 5
    z = torch.randn(B, C, generator=gen, dtype=torch.float64) * 3
    y = torch.randint(0, C, (B,), generator=gen)
    z_pos = z[torch.arange(B), y]
    est = []
    for u in range(C):
        neg = torch.tensor([u])
        valid = neg[None, :] != y[:, None]
        scores, mask = sampled_scores(z_pos, z[:, neg], valid, C, tau)
        est.append(torch.exp(log_mean_exp(scores, mask=mask)))
    exact = torch.exp((z - z_pos[:, None]) / tau).mean(1)
    torch.testing.assert_close(torch.stack(est).mean(0), exact)


def test_shared_negatives_masks_own_label_and_exhaustive_case():
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([0, 3, 3, 9])
    neg, valid = shared_negatives(100, 50, y, gen)
    assert neg.shape == (50,) and valid.shape == (4, 50)
    assert torch.equal(valid, neg[None, :] != y[:, None])
    neg, valid = shared_negatives(10, 9, y, gen)  # n_negatives = C - 1: every class once
    assert torch.equal(neg, torch.arange(10)) and int((~valid).sum()) == 4


def test_sparse_step_equals_dense_optimizer_step():
    """The row-sparse SGD step (momentum 0) equals the dense torch.optim step (whose first
    heavy-ball step is plain SGD), for every method."""
    X, y = make_extreme_classification(300, 40, 6, zipf_exponent=0.5, random_state=0)
    for method in ("scent", "bsgd", "asgd"):
        kw = dict(n_negatives=8, method=method, epochs=1, batch_size=len(X), lr=2.0,
                  fit_intercept=True, random_state=0)
        sparse = SCENTClassifier(momentum=0.0, **kw).fit(X, y)
        dense = SCENTClassifier(momentum=0.5, **kw).fit(X, y)
        np.testing.assert_allclose(sparse.coef_, dense.coef_, atol=1e-6)
        np.testing.assert_allclose(sparse.intercept_, dense.intercept_, atol=1e-6)
        np.testing.assert_array_equal(sparse.nu_, dense.nu_)
        assert np.abs(sparse.coef_).sum() > 0


@pytest.mark.filterwarnings("ignore:The number of unique classes")
def test_step_touches_only_sampled_rows():
    X, y = make_extreme_classification(64, 500, 4, zipf_exponent=0.0, random_state=0)
    clf = SCENTClassifier(n_negatives=5, epochs=1, batch_size=64, lr=1.0, random_state=0)
    clf.partial_fit(X, y, classes=np.arange(500))
    touched = np.flatnonzero(np.abs(clf.coef_).sum(1) > 0)
    assert len(touched) <= len(np.unique(y)) + 5


def test_generator_min_samples_per_class():
    _, y = make_extreme_classification(3000, 1000, 4, zipf_exponent=1.2,
                                       min_samples_per_class=2, random_state=0)
    counts = np.bincount(y, minlength=1000)
    assert counts.min() >= 2 and counts.sum() == 3000
    # the remaining points keep the Zipf head
    assert counts[0] > 100 and math.isclose(np.median(counts), 2, abs_tol=1)
    _, y0 = make_extreme_classification(3000, 1000, 4, random_state=0)
    assert len(np.unique(y0)) < 1000  # without it the tail is missing
    with pytest.raises(ValueError, match="min_samples_per_class"):
        make_extreme_classification(10, 20, 2, min_samples_per_class=1)
    with pytest.raises(ValueError, match="min_samples_per_class"):
        make_extreme_classification(100, 20, 2, min_samples_per_class=-1)
