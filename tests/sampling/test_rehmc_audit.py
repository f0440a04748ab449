"""Regression tests from an adversarial audit of the public rehmc API (edge cases)."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    bingham_log_density,
    ess,
    matrix_von_mises_fisher_log_density,
    polar_factor,
    rhat,
)

from ._ks import assert_ks_ess


def gauss(x):
    return -0.5 * (x**2).sum(-1)


def const(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


UNIT = Box([0.0, 0.0], [1.0, 1.0])


@pytest.mark.parametrize("n_samples", [1, 3])
def test_summary_with_fewer_than_four_draws_is_nan_not_an_error(n_samples):
    res = ReflectiveHMC(gauss, UNIT, n_leapfrog=3, random_state=0).sample(
        n_samples, n_chains=2, warmup=2)
    summ = res.summary()
    for key in ("ess_bulk", "ess_tail", "rhat"):
        assert summ[key].shape == (2,) and np.isnan(summ[key]).all()
    assert np.isnan(ess(np.ones((2, 3)), kind="tail"))
    assert np.isnan(rhat(np.zeros((2, 3, 4)))).all()


def test_rhat_of_chains_stuck_at_different_values_is_inf():
    stuck = np.repeat(np.arange(4.0)[:, None], 100, axis=1)
    assert rhat(stuck) == np.inf
    assert np.isnan(rhat(np.ones((4, 100))))  # constant draws: undefined


@pytest.mark.parametrize("log_density", [lambda Q: Q.sum(), lambda Q: Q.sum((-2, -1))[:, None]])
def test_stiefel_log_density_of_wrong_shape_raises(log_density):
    s = StiefelSampler(log_density, n=3, k=1, n_leapfrog=3, random_state=0)
    with pytest.raises(ValueError, match="log_density must map"):
        s.sample(5, n_chains=2, warmup=2)


def test_vmf_and_bingham_parameters_are_checked_against_n_k():
    with pytest.raises(ValueError, match="F of shape"):
        StiefelSampler(matrix_von_mises_fisher_log_density(np.ones((4, 2))), n=3, k=2,
                       n_leapfrog=3, random_state=0).sample(5, n_chains=2, warmup=2)
    with pytest.raises(ValueError, match="A of shape"):
        StiefelSampler(bingham_log_density(np.eye(4), np.eye(3)), n=3, k=2,
                       n_leapfrog=3, random_state=0).sample(5, n_chains=2, warmup=2)
    with pytest.raises(ValueError, match="square"):
        bingham_log_density(np.ones((3, 2)), np.eye(2))
    with pytest.raises(ValueError, match="F must be finite"):
        matrix_von_mises_fisher_log_density([[np.nan], [0.0]])


@pytest.mark.parametrize("container, region", [
    (UNIT, lambda x: x[:, 0] < 0.02),  # 2% of the box, along a wall
    (Ball([0.0, 0.0], 1.0), lambda x: x.norm(dim=-1) > 0.97),  # a thin outer shell
])
def test_start_points_found_in_a_support_hugging_the_boundary(container, region):
    res = ReflectiveHMC(const, container, support=Region(region), n_leapfrog=3,
                        random_state=0).sample(5, n_chains=3, warmup=2)
    x = torch.from_numpy(res.samples.reshape(-1, 2))
    assert bool(region(x).all())


def test_support_of_measure_zero_raises_instead_of_hanging():
    hmc = ReflectiveHMC(const, UNIT, support=Region(lambda x: x[:, 0] == 0.5), n_leapfrog=2,
                        random_state=0)
    with pytest.raises(RuntimeError, match="no draw of chain"):
        hmc.sample(1000, x0=[0.5, 0.5], n_chains=2, warmup=0)


@pytest.mark.parametrize("n_chains", [1, 3])
def test_log_prob_without_autograd_graph_warns(n_chains):
    def numpy_log_prob(x):
        return torch.as_tensor(gauss(x).detach().numpy())

    with pytest.warns(UserWarning, match="not connected to its input by autograd"):
        ReflectiveHMC(numpy_log_prob, UNIT, n_leapfrog=2, random_state=0).sample(
            3, n_chains=n_chains, warmup=1)
    with warnings.catch_warnings():  # constant, differentiable or gradient given: silent
        warnings.simplefilter("error")
        for lp, glp in ((const, None), (gauss, None),
                        (lambda x: (x[:, 0] > 0.5).double(), torch.zeros_like)):
            ReflectiveHMC(lp, UNIT, grad_log_prob=glp, n_leapfrog=2, random_state=0).sample(
                3, n_chains=n_chains, warmup=1)


def test_non_numeric_inputs_raise_type_errors_naming_them():
    with pytest.raises(TypeError, match="x0 must be a numeric"):
        ReflectiveHMC(gauss, UNIT, n_leapfrog=2).sample(3, x0=["a", "b"], n_chains=2, warmup=1)
    for bad in ("2", [2.0], True):
        with pytest.raises(TypeError, match="radius must be a real number"):
            Ball([0.0, 0.0], bad)
    assert Ball([0.0], np.float32(2.0)).radius == 2.0
    assert Ball([0.0], torch.tensor(3)).radius == 3.0


@pytest.mark.parametrize("lo, hi", [([3.0, -4.0], [4.0, -3.0]),  # mass piled at the walls
                                    ([0.0, -1e-3], [1e-3, 0.0]),  # very narrow
                                    ([-5e3, 2.5], [5e3, 1e4])])   # very wide
def test_truncated_normal_marginals_in_extreme_boxes(lo, hi):
    res = ReflectiveHMC(gauss, Box(lo, hi), random_state=1).sample(
        1000, n_chains=4, warmup=300)
    for j in range(2):  # (a p-value from all 4000 correlated draws failed for 2 of 7 seeds)
        assert_ks_ess(res.samples[..., j], stats.truncnorm(lo[j], hi[j]).cdf)


def _disc_set(with_grad):
    return ConvexSet(lambda x: (x**2).sum(-1) - 1, (lambda x: 2 * x) if with_grad else None,
                     interior_point=[0.0, 0.0])


def test_convex_set_hit_from_a_boundary_point_crosses_the_set():
    # starting exactly on the boundary (g = 0) and moving inwards, the exit is the far side
    x = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    v = torch.tensor([[-1.0, 0.0], [0.6, 0.8]], dtype=torch.float64)
    t, normal = _disc_set(True).hit(x, v, torch.full((2,), 10.0, dtype=torch.float64))
    np.testing.assert_allclose(t.numpy(), [2.0, 1.6], rtol=1e-12)
    np.testing.assert_allclose(normal.numpy(), [[-1.0, 0.0], [0.96, 0.28]], atol=1e-10)


@pytest.mark.parametrize("with_grad", [True, False])
def test_convex_set_flat_disc_has_no_divergences_and_a_finite_width(with_grad):
    disc = _disc_set(with_grad)
    assert disc.width() == pytest.approx(2.0, rel=1e-12)
    assert ConvexSet(lambda x: x[:, 0] - 1, interior_point=[0.0, 0.0]).width() == np.inf
    res = ReflectiveHMC(const, disc, random_state=0).sample(100, n_chains=4, warmup=100)
    assert res.n_divergent.sum() == 0 and res.warmup_divergent.sum() == 0
    assert res.step_size.max() <= 2.0 / np.sqrt(2) + 1e-12


@pytest.mark.slow
def test_convex_set_disc_is_uniform():
    res = ReflectiveHMC(const, _disc_set(False), random_state=0).sample(
        1000, n_chains=4, warmup=200)
    r2 = (res.samples.reshape(-1, 2) ** 2).sum(1)  # uniform disc: |x|^2 ~ U(0, 1)
    assert stats.kstest(r2, stats.uniform.cdf).pvalue > 1e-3


@pytest.mark.parametrize("make, err, match", [
    (lambda: Box([0, 0, 0], [1, 1]), ValueError, "same length"),
    (lambda: Box(["a"], ["b"]), TypeError, "lo must be numeric"),
    (lambda: Box(0, 1, dim=2.0), TypeError, "dim must be an integer"),
    (lambda: Box(0, 1, dim=0), ValueError, "dim must be > 0"),
    (lambda: Box([0, 0], [1, 0]), ValueError, r"lo\[1\]=0 >= hi\[1\]=0"),
    (lambda: Box([0, -np.inf], [1, np.inf]), ValueError, "lo must be finite"),
    (lambda: ConvexSet(lambda x: (x**2).sum(-1) - 1, interior_point=[0, 0], n_bisect=0),
     ValueError, "n_bisect"),
])
def test_container_constructor_errors_name_the_parameter(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_polar_factor_accepts_numpy():
    X = np.random.default_rng(0).normal(size=(3, 5, 2))
    Q = polar_factor(X)
    assert isinstance(Q, np.ndarray) and Q.shape == (3, 5, 2)
    np.testing.assert_allclose(np.swapaxes(Q, 1, 2) @ Q, np.broadcast_to(np.eye(2), (3, 2, 2)),
                               atol=1e-12)
    np.testing.assert_allclose(Q, polar_factor(torch.from_numpy(X)).numpy(), rtol=1e-14)
