"""ReflectiveHMC on targets not made by ``mlpapers.datasets``, against exact references.

Truncated normals far in the tail, very narrow, offset by 1e3 (in float32) or of scale
1e-4 (``scipy.stats.truncnorm``); the uniform law on a 4-simplex written as a
``Polytope`` (Beta(1, 4) marginals); a correlated Gaussian with condition number 1e3
truncated to the unit cube (a large exact rejection sample from
``scipy.stats.multivariate_normal``'s law). The sampler runs with its defaults
(``n_leapfrog="auto"``, identity mass, dual averaging) apart from shorter runs, and the
draws are checked with the ESS-scaled KS test of ``_ks.py`` (about a 1e-3 level).
"""

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import Box, Polytope, ReflectiveHMC

from ._ks import assert_ks_ess


@pytest.mark.parametrize(
    ("mu", "sd", "lo", "hi", "dtype"),
    [
        (0.0, 1.0, 8.0, 9.0, torch.float64),  # 8 sd in the tail: mass 6e-16 untruncated
        (0.0, 1.0, 0.0, 1e-3, torch.float64),  # 1e-3 wide: almost uniform
        (1e3, 1.0, 1e3 - 0.5, 1e3 + 2.0, torch.float32),  # offset 1e3 in float32
        (0.0, 1e-4, -1e-4, 5e-4, torch.float64),  # scale 1e-4
        (-5.0, 1.0, 0.0, 1.0, torch.float64),  # mode 5 sd outside: exponential-like
    ],
)
def test_truncated_normal_matches_scipy(mu, sd, lo, hi, dtype):
    """Measured KS distances 0.009-0.024 with ESS 1200-4100 (the bound 1.95 / sqrt(ESS)
    is 0.03-0.056); every draw in the box, no divergence. About 0.5 s each."""
    res = ReflectiveHMC(lambda x: -0.5 * (((x - mu) / sd) ** 2).sum(-1), Box([lo], [hi]),
                        grad_log_prob=lambda x: -(x - mu) / sd ** 2, dtype=dtype,
                        random_state=0).sample(500, n_chains=8, warmup=300)
    x = res.samples[..., 0]
    cast = np.float32 if dtype == torch.float32 else float  # the box in the chains' dtype
    assert (x >= cast(lo)).all() and (x <= cast(hi)).all()
    assert int(np.sum(res.n_divergent)) == 0
    assert_ks_ess(x, stats.truncnorm((lo - mu) / sd, (hi - mu) / sd, mu, sd).cdf)


def test_uniform_simplex_as_polytope_has_beta_marginals():
    """Uniform law on {x >= 0, sum x <= 1} in R^4 (Dirichlet(1, ..., 1) on 5 parts): each
    coordinate is Beta(1, 4). Measured KS 0.012-0.021 with ESS 1400-1560 (bound about
    0.05)."""
    A = np.vstack([-np.eye(4), np.ones((1, 4))])
    b = np.r_[np.zeros(4), 1.0]
    res = ReflectiveHMC(lambda x: x.sum(-1) * 0.0, Polytope(A, b), random_state=0).sample(
        300, n_chains=8, warmup=150)
    x = res.samples
    assert (x >= 0).all() and (x.sum(-1) <= 1 + 1e-12).all()
    for j in range(4):
        assert_ks_ess(x[..., j], stats.beta(1, 4).cdf)


@pytest.mark.parametrize("mass", ["identity", "diag"])
def test_correlated_gaussian_in_cube_matches_rejection(mass):
    """N(0.3, Sigma) with eigenvalues 1e-4, 3e-3, 0.1 along a random basis (condition
    number 1e3), truncated to [0, 1]^3; reference: 166k exact draws by rejection. Measured
    KS 0.010-0.028 (identity, ESS >= 1550) and 0.011-0.018 (diag, ESS >= 2880); the
    bound is 1.95 / sqrt(ESS), 0.036-0.05."""
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    Sig = Q @ np.diag([1e-3, 3e-2, 1.0]) @ Q.T * 0.1
    P = torch.tensor(np.linalg.inv(Sig))
    mu = torch.full((3,), 0.3, dtype=torch.float64)
    z = rng.multivariate_normal(mu.numpy(), Sig, 200_000)
    z = z[((z >= 0) & (z <= 1)).all(1)]
    res = ReflectiveHMC(lambda x: -0.5 * torch.einsum("ci,ij,cj->c", x - mu, P, x - mu),
                        Box(np.zeros(3), np.ones(3)), grad_log_prob=lambda x: -(x - mu) @ P,
                        mass=mass, random_state=0).sample(500, n_chains=8, warmup=300)
    for j in range(3):
        ref = np.sort(z[:, j])
        assert_ks_ess(res.samples[..., j],
                      lambda v, ref=ref: np.searchsorted(ref, v, side="right") / ref.size)
