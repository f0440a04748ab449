"""Stiefel sampling through the polar reparameterisation."""

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import (
    StiefelSampler,
    bingham_log_density,
    matrix_von_mises_fisher_log_density,
    polar_factor,
)


def test_polar_factor_is_orthonormal_and_gradient_is_exact():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    Q = polar_factor(X)
    np.testing.assert_allclose((Q.transpose(1, 2) @ Q).detach().numpy(),
                               np.broadcast_to(np.eye(3), (4, 3, 3)), atol=1e-12)
    # Q = X (X^T X)^{-1/2}
    w, V = torch.linalg.eigh(X.detach().transpose(1, 2) @ X.detach())
    ref = X.detach() @ V @ torch.diag_embed(w.rsqrt()) @ V.transpose(1, 2)
    np.testing.assert_allclose(Q.detach().numpy(), ref.numpy(), atol=1e-12)
    assert torch.autograd.gradcheck(polar_factor, (X,))
    # repeated singular values: the custom backward stays finite
    Xr = (2.0 * torch.eye(3, dtype=torch.float64)[None].repeat(2, 1, 1)).requires_grad_(True)
    F = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((polar_factor(Xr) * F).sum(), Xr)
    assert bool(torch.isfinite(grad).all())


def test_uniform_stiefel_moments_and_orthonormality():
    n, k = 4, 2
    res = StiefelSampler(n=n, k=k, n_leapfrog=5, random_state=0).sample(
        300, n_chains=4, warmup=150)
    Q = res.Q.reshape(-1, n, k)
    assert res.Q.shape == (4, 300, n, k) and res.samples.shape == (4, 300, n * k)
    assert np.abs(np.einsum("nij,nil->njl", Q, Q) - np.eye(k)).max() < 1e-10
    np.testing.assert_allclose(Q.mean(0), 0.0, atol=0.06)
    np.testing.assert_allclose(np.einsum("nij,nlj->il", Q, Q) / len(Q), (k / n) * np.eye(n),
                               atol=0.04)
    s = np.linalg.svd(res.X.reshape(-1, n, k), compute_uv=False)
    a, b = 0.25 * (np.sqrt(n) - np.sqrt(k - 1)), np.sqrt(n) + np.sqrt(k) + 1
    assert s.min() >= a and s.max() <= b  # every kept draw is well conditioned
    assert 0.5 < res.kept_fraction.mean() <= 1.0


def test_von_mises_fisher_k1_matches_scipy():
    mu, kappa = np.array([0.0, 1.0, 0.0]), 4.0
    res = StiefelSampler(matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3, k=1,
                         n_leapfrog=5, random_state=1).sample(400, n_chains=4, warmup=150)
    t = res.Q.reshape(-1, 3) @ mu
    ref = stats.vonmises_fisher(mu, kappa).rvs(100_000, random_state=0) @ mu
    # draws are autocorrelated: compare the KS statistic with the 0.1% critical value
    # at the effective sample size instead of using the iid p-value
    n_eff = float(res.ess().min())
    assert stats.ks_2samp(t, ref).statistic < 1.95 / np.sqrt(n_eff)


def test_bingham_prefers_the_top_eigenvector_and_bad_input():
    A = np.diag([5.0, 0.0, 0.0])
    res = StiefelSampler(bingham_log_density(A, np.eye(1)), n=3, k=1, n_leapfrog=5,
                         random_state=0).sample(200, n_chains=2, warmup=100)
    q = res.Q.reshape(-1, 3)
    assert np.mean(q[:, 0] ** 2) > 0.6  # uniform would give 1/3
    with pytest.raises(ValueError, match="k must be <= n"):
        StiefelSampler(n=2, k=3).sample(5)
    with pytest.raises(ValueError, match="a must be smaller than b"):
        StiefelSampler(n=3, k=1, a=2.0, b=1.0).sample(5)
    # tr(B Q^T A Q) needs a square A (n x n) and a square B (k x k)
    with pytest.raises(ValueError, match="A must be a square matrix"):
        bingham_log_density(np.ones((3, 2)), np.eye(2))
    with pytest.raises(ValueError, match="B must be a square matrix"):
        bingham_log_density(np.eye(3), np.ones((2, 1)))
    assert StiefelSampler._estimator_check_instances() == []


@pytest.mark.parametrize("n, k", [(6, 6), (6, 5)])
def test_square_and_near_square_stiefel_sample_uniformly_with_the_defaults(n, k):
    # regression: the default a = sqrt(n)/4 kept 0.5% of Gaussian matrices on V(10, 10)
    # and the chains' random start in the Frobenius ball (sigma_max near 2b) never lay
    # in R: sample raised, advising an x0 that it does not take
    res = StiefelSampler(n=n, k=k, n_leapfrog=5, random_state=0).sample(
        300, n_chains=4, warmup=150)
    Q = res.Q.reshape(-1, n, k)
    assert np.abs(np.einsum("nij,nil->njl", Q, Q) - np.eye(k)).max() < 1e-10
    # Haar moments: E[Q] = 0 and E[Q Q^T] = (k/n) I
    np.testing.assert_allclose(Q.mean(0), 0.0, atol=0.08)
    np.testing.assert_allclose(np.einsum("nij,nlj->il", Q, Q) / len(Q), (k / n) * np.eye(n),
                               atol=0.05)
    s = np.linalg.svd(res.X.reshape(-1, n, k), compute_uv=False)
    assert s.min() >= 0.25 * (np.sqrt(n) - np.sqrt(k - 1))
    assert 0.5 < res.kept_fraction.mean() <= 1.0
    if k == n:  # both components of O(n) are visited: det(Q) = +-1 about equally
        assert 0.3 < np.mean(np.linalg.det(Q) > 0) < 0.7


@pytest.mark.parametrize("n, k", [(3, 1), (4, 4)])
def test_starts_are_redrawn_where_the_density_vanishes(n, k):
    # regression: the sampler's own starts were passed as x0, which turned off the
    # redraw of chains starting where log g = -inf ("not finite at the starting points")
    def half(Q):
        return torch.where(Q[:, 0, 0] > 0, torch.zeros(len(Q), dtype=Q.dtype),
                           torch.full((len(Q),), -np.inf, dtype=Q.dtype))

    res = StiefelSampler(half, n=n, k=k, n_leapfrog=3, random_state=0).sample(
        40, n_chains=8, warmup=40)
    assert (res.Q[..., 0, 0] > 0).all()


def test_a_density_infinite_nowhere_names_log_density_and_no_x0():
    # the starts are redrawn like ReflectiveHMC's random ones, but the error must not
    # advise an x0 or a support, which StiefelSampler.sample does not take
    def nowhere(Q):
        return torch.full((len(Q),), -np.inf, dtype=Q.dtype)

    sampler = StiefelSampler(nowhere, n=3, k=2, n_leapfrog=3, random_state=0)
    with pytest.raises(ValueError, match=r"log_density \(or its gradient\) is not finite at "
                       r"2 of the 2 chains' starting points after 100 random points each; "
                       r"check where log_density is finite") as info:
        sampler.sample(5, n_chains=2, warmup=5)
    assert "x0" not in str(info.value) and "support" not in str(info.value)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (R-hat of these short runs)
def test_a_log_density_cut_off_from_autograd_warns_and_errors_name_it():
    # the wrapper's Gaussian term always had a graph, so the sampler's check never saw
    # a detached log_density: gradient zero, min ESS 11 against 552, no specific warning
    import warnings

    F = np.zeros((3, 1))
    F[0, 0] = 20.0

    def numpy_density(Q):
        return torch.as_tensor((F * Q.detach().cpu().numpy()).sum((-2, -1)))

    def torch_density(Q):
        return (torch.as_tensor(F) * Q).sum((-2, -1))

    kw = dict(n_chains=4, warmup=20)
    with pytest.warns(UserWarning, match="^log_density's output is not connected"):
        StiefelSampler(numpy_density, n=3, k=1, n_leapfrog=5, random_state=0).sample(20, **kw)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not connected")
        StiefelSampler(torch_density, n=3, k=1, n_leapfrog=5, random_state=0).sample(20, **kw)
        # a constant density has no gradient to lose
        StiefelSampler(lambda Q: torch.zeros(len(Q), dtype=Q.dtype), n=3, k=1, n_leapfrog=5,
                       random_state=0).sample(20, **kw)
    # the note on torch's error names log_density and no grad_log_prob (it has none)
    with pytest.raises(RuntimeError) as info:
        StiefelSampler(lambda Q: torch.as_tensor(Q.numpy().sum((-2, -1))), n=3, k=1,
                       random_state=0).sample(5, n_chains=2, warmup=5)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert notes.startswith("log_density leaves torch") and "grad_log_prob" not in notes


@pytest.mark.parametrize("n, k, low, high", [(3, 1, 0.96, 0.997), (5, 2, 0.96, 0.997),
                                             (10, 3, 0.96, 0.997), (3, 3, 0.80, 0.88),
                                             (10, 10, 0.80, 0.88)])
def test_share_of_gaussian_matrices_within_the_default_bounds_is_as_documented(n, k, low, high):
    # the docs said 80-90% for every (n, k): 96-99.7% for k < n
    s = StiefelSampler(n=n, k=k)
    a, b = s._bounds()
    sv = np.linalg.svd(np.random.default_rng(0).standard_normal((20000, n, k)),
                       compute_uv=False)
    share = float(np.mean((sv.min(-1) >= a) & (sv.max(-1) <= b)))
    assert low <= share <= high, share
