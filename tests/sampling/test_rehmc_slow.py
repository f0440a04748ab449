"""Longer statistical exactness checks (run with ``pytest -m slow``)."""

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    ess,
    matrix_von_mises_fisher_log_density,
)

pytestmark = pytest.mark.slow
D = torch.float64


def const(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


def _ks_ok(draws, ref, n_eff):
    """KS statistic below the 0.1% critical value at the effective sample size."""
    stat = (stats.ks_2samp(draws, ref) if isinstance(ref, np.ndarray)
            else stats.kstest(draws, ref)).statistic
    crit = 1.95 * np.sqrt(1 / n_eff + (1 / len(ref) if isinstance(ref, np.ndarray) else 0))
    assert stat < crit, (stat, crit)


def test_corner_truncated_gaussian_d10_diag_mass():
    d = 10
    mu, sd = np.full(d, 1.0), np.linspace(0.2, 1.0, d)
    lp = lambda x: -0.5 * (((x - torch.as_tensor(mu)) / torch.as_tensor(sd)) ** 2).sum(-1)  # noqa
    res = ReflectiveHMC(lp, Box(np.zeros(d), np.ones(d)), mass="diag", n_leapfrog=8,
                        random_state=0).sample(1000, n_chains=4, warmup=300)
    assert res.n_divergent.sum() == 0 and np.all(res.rhat() < 1.02)
    n_eff = res.ess()
    for j in range(d):
        ref = stats.truncnorm(-mu[j] / sd[j], (1 - mu[j]) / sd[j], mu[j], sd[j])
        _ks_ok(res.samples[..., j].ravel(), ref.cdf, n_eff[j])


def test_gaussian_on_random_polytope_vs_rejection():
    rng = np.random.default_rng(0)
    d = 4
    A = rng.normal(size=(12, d))
    P = Polytope(A, np.ones(12))
    mu = torch.full((d,), 0.5, dtype=D)
    res = ReflectiveHMC(lambda x: -0.5 * ((x - mu) ** 2).sum(-1) / 0.25, P, n_leapfrog=8,
                        random_state=0).sample(800, n_chains=4, warmup=300)
    z = rng.normal(0.5, 0.5, size=(400_000, d))
    ref = z[np.all(z @ P.A.T <= P.b, axis=1)]
    n_eff = res.ess()
    for j in range(d):
        _ks_ok(res.samples[..., j].ravel(), ref[:, j], n_eff[j])


def test_uniform_simplex_d10_beta_marginals():
    d = 10
    P = Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0])
    res = ReflectiveHMC(const, P, n_leapfrog=6, random_state=0).sample(
        600, n_chains=4, warmup=200)
    n_eff = res.ess()
    for j in range(d):
        _ks_ok(res.samples[..., j].ravel(), stats.beta(1, d).cdf, n_eff[j])


def test_uniform_ellipsoid_radius_law_and_convexset():
    d = 4
    rng = np.random.default_rng(1)
    Q = rng.normal(size=(d, d))
    E = Q @ Q.T + np.eye(d)
    res = ReflectiveHMC(const, Ellipsoid(np.ones(d), E), n_leapfrog=5, random_state=0).sample(
        800, n_chains=4, warmup=200)
    y = res.samples - 1.0
    r = np.sqrt(np.einsum("cni,ij,cnj->cn", y, E, y))  # (chains, draws)
    # the ESS of the statistic tested (the radius mixes slower than the coordinates)
    _ks_ok(r.ravel(), lambda t: np.clip(t, 0, 1) ** d, float(ess(r[..., None])[0]))
    cs = ConvexSet(lambda x: (x**4).sum(-1) - 1.0, interior_point=np.zeros(2))
    res = ReflectiveHMC(const, cs, n_leapfrog=3, random_state=0).sample(
        300, n_chains=4, warmup=100)
    z = rng.uniform(-1, 1, size=(200_000, 2))
    ref = z[(z**4).sum(1) <= 1]
    _ks_ok(res.samples[..., 0].ravel(), ref[:, 0], float(res.ess()[0]))


def test_thinned_gaussian_annulus_radius_law():
    d = 2
    annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)
    res = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), Ball(np.zeros(d), 2.0),
                        support=annulus, n_leapfrog=5, random_state=0).sample(
        800, n_chains=4, warmup=200)
    r = np.linalg.norm(res.samples, axis=-1)
    # radius density ∝ r exp(-r^2/2) on [1, 2]
    cdf = lambda t: (np.exp(-0.5) - np.exp(-0.5 * np.clip(t, 1, 2) ** 2)) / (  # noqa
        np.exp(-0.5) - np.exp(-2.0))
    _ks_ok(r.ravel(), cdf, float(ess(r[..., None])[0]))  # ESS of the radius itself


def test_stiefel_vmf_and_uniform_longer():
    mu, kappa = np.array([0.0, 0.0, 1.0]), 2.5
    res = StiefelSampler(matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3, k=1,
                         n_leapfrog=5, random_state=3).sample(1200, n_chains=4, warmup=200)
    ref = stats.vonmises_fisher(mu, kappa).rvs(100_000, random_state=0) @ mu
    proj = res.Q.reshape(4, -1, 3) @ mu  # (chains, draws)
    _ks_ok(proj.ravel(), ref, float(ess(proj[..., None])[0]))
    n, k = 5, 3
    res = StiefelSampler(n=n, k=k, n_leapfrog=5, random_state=0).sample(
        600, n_chains=4, warmup=200)
    Q = res.Q.reshape(-1, n, k)
    np.testing.assert_allclose(np.einsum("nij,nlj->il", Q, Q) / len(Q), (k / n) * np.eye(n),
                               atol=0.03)
