"""ReflectiveHMC: API contract, bad input, determinism, thinning, small exactness checks."""

import pickle
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import (
    Ball,
    Box,
    Polytope,
    ReflectiveHMC,
    Region,
    SampleResult,
    ess,
    rhat,
)

D = torch.float64


def const(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


def trunc_gauss(mu, sd):
    mu_t, sd_t = torch.as_tensor(mu, dtype=D), torch.as_tensor(sd, dtype=D)
    return lambda x: -0.5 * (((x - mu_t) / sd_t) ** 2).sum(-1)


def simplex(d):
    return Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0])


def test_shapes_diagnostics_and_membership():
    box = Box([0.0, -1.0], [1.0, 1.0])
    hmc = ReflectiveHMC(trunc_gauss([0.9, 0.0], [0.3, 2.0]), box, n_leapfrog=5, random_state=0)
    res = hmc.sample(150, n_chains=3, warmup=60)
    assert isinstance(res, SampleResult)
    assert res.samples.shape == (3, 150, 2) and res.samples.dtype == np.float64
    assert bool(box.contains(torch.from_numpy(res.samples.reshape(-1, 2))).all())
    for a in (res.accept_rate, res.n_reflections, res.n_divergent, res.kept_fraction,
              res.step_size):
        assert a.shape == (3,)
    assert res.ess().shape == (2,) and res.ess("tail").shape == (2,)
    assert res.rhat().shape == (2,) and np.all(res.rhat() < 1.1)
    s = res.summary()
    assert set(s) >= {"mean", "sd", "ess_bulk", "ess_tail", "rhat", "accept_rate"}
    assert res.n_iterations == 150 and np.all(res.kept_fraction == 1.0)
    assert hmc.step_size_.shape == (3,) and hmc.inv_mass_.shape == (2,)
    assert 0.5 < float(res.accept_rate.mean()) <= 1.0


def test_determinism_and_seed_dependence():
    kw = dict(n_leapfrog=4, random_state=7)
    c = simplex(3)
    a = ReflectiveHMC(const, c, **kw).sample(40, n_chains=2, warmup=30).samples
    b = ReflectiveHMC(const, c, **kw).sample(40, n_chains=2, warmup=30).samples
    np.testing.assert_array_equal(a, b)
    kw["random_state"] = 8
    c2 = ReflectiveHMC(const, c, **kw).sample(40, n_chains=2, warmup=30).samples
    assert not np.array_equal(a, c2)


def test_global_rng_untouched():
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    ReflectiveHMC(const, Box([0], [1]), n_leapfrog=2, random_state=0).sample(5, warmup=5)
    assert torch.equal(torch.rand(1), before)


def test_fixed_step_diag_mass_jitter_float32():
    hmc = ReflectiveHMC(trunc_gauss([0.0, 0.0], [0.05, 1.0]), Box([-1, -1], [1, 1]),
                        mass="diag", n_leapfrog=6, jitter=0.1, random_state=0)
    res = hmc.sample(50, n_chains=2, warmup=200)
    assert res.inv_mass[0] < 0.1 * res.inv_mass[1]  # learned the scales
    res = ReflectiveHMC(const, Ball([0, 0], 1.0), step_size=0.3, jitter=False, n_leapfrog=3,
                        dtype="float32", random_state=0).sample(20, n_chains=2, warmup=10)
    np.testing.assert_allclose(res.step_size, 0.3)
    assert res.samples.dtype == np.float32


def test_thin_and_container_plus_thinning():
    res = ReflectiveHMC(const, simplex(2), n_leapfrog=3, random_state=0).sample(
        30, n_chains=2, warmup=20, thin=3)
    assert res.n_iterations == 90
    annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)
    hmc = ReflectiveHMC(const, Ball([0.0, 0.0], 2.0), support=annulus, n_leapfrog=5,
                        random_state=1)
    res = hmc.sample(300, n_chains=4, warmup=100)
    r = np.linalg.norm(res.samples, axis=-1)
    assert r.min() >= 1.0 and r.max() <= 2.0 + 1e-12
    assert abs(res.kept_fraction.mean() - 0.75) < 0.08  # area of the annulus / ball
    # exactness: radius CDF of the uniform annulus is (r^2 - 1) / 3
    assert stats.kstest(r[:, ::2].ravel(), lambda t: (t**2 - 1) / 3).pvalue > 1e-3


def test_tiny_support_warns_or_raises():
    """A support holding 0.25% of the container's mass: either outcome is documented,
    the kept-fraction warning, or the RuntimeError when some chain misses the support
    for 2000 recorded states (which happened for 1 seed of 10: expecting the warning
    alone passed by luck). Over 40 seeds the kept fraction was at most 0.0087 < 1%."""
    tiny = Region(lambda x: x.norm(dim=-1) <= 0.05)
    hmc = ReflectiveHMC(const, Ball([0.0, 0.0], 1.0), support=tiny, n_leapfrog=2,
                        random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            hmc.sample(2, n_chains=2, warmup=5, x0=[0.0, 0.0])
        except RuntimeError as exc:
            assert "support" in str(exc)
        else:
            assert any(issubclass(w.category, RuntimeWarning) and "support" in str(w.message)
                       for w in caught)


def test_bad_inputs():
    box = Box([0, 0], [1, 1])
    with pytest.raises(ValueError, match="outside the container"):
        ReflectiveHMC(const, box).sample(5, x0=[2.0, 0.5], warmup=0)
    with pytest.raises(ValueError, match="outside the support"):
        ReflectiveHMC(const, box, support=Region(lambda x: x[:, 0] > 0.5)).sample(
            5, x0=[0.2, 0.5], warmup=0)
    with pytest.raises(ValueError, match="shape"):
        ReflectiveHMC(lambda x: x.sum(), box).sample(5, warmup=0)
    with pytest.raises(ValueError, match="not finite"):
        ReflectiveHMC(lambda x: x.sum(-1) * np.nan, box).sample(5, warmup=0)
    with pytest.raises(ValueError, match="x0 must have shape"):
        ReflectiveHMC(const, box).sample(5, x0=[0.5, 0.5, 0.5], warmup=0)
    with pytest.raises(ValueError, match="n_chains"):
        ReflectiveHMC(const, box).sample(5, x0=np.full((3, 2), 0.5), warmup=0)
    with pytest.raises(ValueError, match="dimension"):
        ReflectiveHMC(const, box, support=Ball([0, 0, 0], 1.0)).sample(5)
    with pytest.raises(ValueError, match="empty"):
        Polytope([[1.0, 0.0], [-1.0, 0.0]], [0.0, -1.0])
    with pytest.raises(TypeError, match="container"):
        ReflectiveHMC(const, "box").sample(5)
    with pytest.raises(TypeError, match="log_prob"):
        ReflectiveHMC(None, box).sample(5)
    with pytest.raises(ValueError, match="mass"):
        ReflectiveHMC(const, box, mass="full").sample(5)
    with pytest.raises(ValueError, match="target_accept"):
        ReflectiveHMC(const, box, target_accept=1.5).sample(5)
    with pytest.raises(ValueError, match="n_leapfrog"):
        ReflectiveHMC(const, box, n_leapfrog=0).sample(5)
    with pytest.raises(TypeError, match="n_samples"):
        ReflectiveHMC(const, box).sample(2.5)
    with pytest.raises(ValueError, match="thin"):
        ReflectiveHMC(const, box).sample(5, thin=0)
    with pytest.raises(ValueError, match="x0 must be finite"):
        ReflectiveHMC(const, box).sample(5, x0=[np.nan, 0.5], warmup=0)


def test_params_and_pickle():
    hmc = ReflectiveHMC(const, Box([0], [1]), n_leapfrog=3, random_state=0)
    assert hmc.get_params()["n_leapfrog"] == 3
    assert ReflectiveHMC._estimator_check_instances() == []
    hmc2 = pickle.loads(pickle.dumps(ReflectiveHMC(None, Box([0], [1]), n_leapfrog=3)))
    assert hmc2.n_leapfrog == 3 and hmc2.container.dim == 1


def test_truncated_gaussian_box_marginals_match_truncnorm():
    mu, sd = np.array([0.9, -0.2]), np.array([0.4, 1.0])
    lo, hi = np.array([0.0, -1.0]), np.array([1.0, 0.5])
    hmc = ReflectiveHMC(trunc_gauss(mu, sd), Box(lo, hi), n_leapfrog=8, random_state=0)
    res = hmc.sample(600, n_chains=4, warmup=200)
    assert res.n_divergent.sum() == 0
    for j in range(2):
        ref = stats.truncnorm((lo[j] - mu[j]) / sd[j], (hi[j] - mu[j]) / sd[j], mu[j], sd[j])
        assert stats.kstest(res.samples[:, ::2, j].ravel(), ref.cdf).pvalue > 1e-3


def test_uniform_simplex_marginals_are_beta():
    d = 3
    res = ReflectiveHMC(const, simplex(d), n_leapfrog=4, random_state=0).sample(
        300, n_chains=4, warmup=100)
    x = res.samples
    assert x.min() >= -1e-12 and x.sum(-1).max() <= 1 + 1e-12
    for j in range(d):
        assert stats.kstest(x[..., j].ravel(), stats.beta(1, d).cdf).pvalue > 1e-3


def test_uniform_ball_radius_law():
    d = 3
    res = ReflectiveHMC(const, Ball(np.zeros(d), 1.5), n_leapfrog=4, random_state=0).sample(
        300, n_chains=4, warmup=100)
    r = np.linalg.norm(res.samples, axis=-1) / 1.5
    assert r.max() <= 1 + 1e-12
    assert stats.kstest(r.ravel(), lambda t: np.clip(t, 0, 1) ** d).pvalue > 1e-3


def test_diagnostics_reference_values():
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(4, 1000))
    assert abs(rhat(iid) - 1) < 0.01
    assert 3000 < ess(iid) < 5000 and 3000 < ess(iid, "tail") < 5000
    ar = np.zeros((4, 4000))  # AR(1), rho = 0.8: ESS = N (1 - rho) / (1 + rho)
    for t in range(1, 4000):
        ar[:, t] = 0.8 * ar[:, t - 1] + rng.normal(size=4)
    assert ess(ar) == pytest.approx(16000 / 9, rel=0.2)
    shifted = iid + np.arange(4)[:, None]
    assert rhat(shifted) > 1.5
    az = pytest.importorskip("arviz")
    np.testing.assert_allclose(ess(ar), az.ess(ar, method="bulk"), rtol=1e-6)
    np.testing.assert_allclose(rhat(ar), az.rhat(ar), rtol=1e-6)


def test_verbose_progress_bar_and_return_tensor(capsys):
    hmc = ReflectiveHMC(const, Box([0, 0], [1, 1]), n_leapfrog=2, verbose=1, random_state=0)
    res = hmc.sample(5, n_chains=2, warmup=5, return_tensor=True)
    assert isinstance(res.samples_tensor, torch.Tensor)
    np.testing.assert_array_equal(res.samples_tensor.numpy(), res.samples)
