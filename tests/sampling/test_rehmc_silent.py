"""Regression tests from a silent-wrong-answer audit of rehmc (valid inputs, wrong results)."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import Ball, Box, ConvexSet, Ellipsoid, ReflectiveHMC, ess
from mlpapers.sampling.rehmc._diagnostics import split_rhat_classic
from mlpapers.sampling.rehmc._kernels import reflected_drift

from ._ks import assert_ks_ess


@pytest.mark.parametrize("n_draws", [21, 101])
def test_tail_ess_uses_quantiles_of_all_draws_for_odd_chain_lengths(n_draws):
    # tail ESS = min over q in {5%, 95%} of the ESS of the indicator x <= q, q a quantile
    # of ALL draws (Vehtari et al. 2021, ArviZ, posterior); the bulk ESS of a 0/1 array
    # is the ESS of the indicator itself (rank normalisation is affine on two values)
    rng = np.random.default_rng(n_draws)
    x = np.cumsum(rng.standard_normal((3, n_draws)), axis=1) + 3.0 * rng.standard_normal(
        (3, n_draws))
    lo, hi = np.quantile(x, [0.05, 0.95])
    ref = min(ess((x <= lo).astype(float)), ess((x <= hi).astype(float)))
    assert ess(x, kind="tail") == pytest.approx(ref, rel=1e-10)


def test_diag_mass_adapts_to_a_box_with_very_different_side_lengths():
    # sides 1e-3, 1e3 and 1 (far from 0): the step-size cap of a box is per coordinate in
    # the adapted metric; with the isotropic cap min(w) / sqrt(sum(inv_mass)) the adapted
    # step stayed at the narrowest side's scale and the wide side did not move (R-hat ~ 6)
    lo, hi = np.array([0.0, 0.0, 1e6]), np.array([1e-3, 1e3, 1e6 + 1.0])

    def uniform(x):
        return torch.zeros(x.shape[0], dtype=x.dtype)

    res = ReflectiveHMC(uniform, Box(lo, hi), mass="diag", n_leapfrog=4,
                        random_state=0).sample(500, n_chains=4, warmup=500)
    u = (res.samples.reshape(-1, 3) - lo) / (hi - lo)
    assert res.rhat().max() < 1.05
    for j in range(3):
        assert stats.kstest(u[::4, j], "uniform").pvalue > 1e-3


@pytest.mark.parametrize(("center", "radius"), [(1e3, 1.0), (0.0, 1e-2), (1e6, 1.0)])
def test_convex_set_billiard_equals_the_ball_oracle_away_from_the_origin(center, radius):
    # after a reflection the start lies on the boundary, where g is 0 up to round-off;
    # false position from there probed that round-off band and took a positive g at
    # t ~ 1e-16 for the exit: spurious ping-pong reflections, wrong end points, caps
    c = torch.tensor([center, -5.0], dtype=torch.float64)
    level = ConvexSet(lambda x: ((x - c) ** 2).sum(-1) - radius**2,
                      interior_point=c.numpy())
    ball = Ball(c.numpy(), radius)
    gen = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(500, 2, generator=gen, dtype=torch.float64))
    x = c + 0.9 * radius * torch.rand(500, 1, generator=gen, dtype=torch.float64) * u
    p = torch.randn(500, 2, generator=gen, dtype=torch.float64)
    tau = torch.full((500,), 3.0 * radius, dtype=torch.float64)
    x1, p1, n1, cap1 = reflected_drift(x, p, tau, level, None, 200)
    x2, p2, n2, cap2 = reflected_drift(x, p, tau, ball, None, 200)
    assert not cap1.any() and not cap2.any()
    torch.testing.assert_close(n1, n2, rtol=0, atol=0)
    torch.testing.assert_close(x1, x2, rtol=0, atol=1e-8 * radius)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-6)


def test_diag_mass_adapts_to_a_needle_shaped_ellipsoid():
    # semi-axes 1e-3 and 1e2: the step-size cap uses the width of the ellipsoid in the
    # adapted metric (old cap: the 2e-3 inscribed diameter over the typical speed)
    E = np.diag([1e6, 1e-4])

    def uniform(x):
        return torch.zeros(x.shape[0], dtype=x.dtype)

    res = ReflectiveHMC(uniform, Ellipsoid([5.0, -3.0], E), mass="diag", n_leapfrog=4,
                        random_state=0).sample(400, n_chains=4, warmup=500)
    y = res.samples - np.array([5.0, -3.0])
    q = np.einsum("cij,jk,cik->ci", y, E, y)  # uniform in a 2-D ellipsoid: q ~ U(0, 1)
    assert res.rhat().max() < 1.05
    # ESS-scaled KS bounds (p-values of every 4th draw failed for some seeds)
    assert_ks_ess(q, stats.uniform.cdf)
    assert_ks_ess(y[..., 1] / 1e2, stats.semicircular.cdf)


def test_ellipsoid_start_points_fill_a_needle():
    """Default starting points of an ellipsoid are uniform in it (shrunk by 0.9): the
    centre-plus-random-chord points sat within about 1e-3 of the centre of this needle
    along its 1e2 axis, so the diag-mass warm-up of the test above learned a long-axis
    variance 2-50x too small (R-hat 1.07 and 1.4 for 2 of 9 seeds)."""
    E = np.diag([1e6, 1e-4])
    ell = Ellipsoid([5.0, -3.0], E)
    x = ell.random_interior(4000, torch.Generator().manual_seed(0))
    assert x.dtype == torch.float64 and x.shape == (4000, 2)
    assert bool(ell.contains(x).all())
    y = x.numpy() - np.array([5.0, -3.0])
    q = np.einsum("ij,jk,ik->i", y, E, y) / 0.81  # uniform in the 0.9 ellipse: U(0, 1)
    assert stats.kstest(q, "uniform").pvalue > 1e-3  # independent points: a plain KS test
    assert abs(y[:, 1].std() / 1e2 - 0.45) < 0.03  # semicircle of radius 0.9: sd 0.45


def test_tail_ess_is_nan_whichever_tail_indicator_is_constant():
    """Splitting drops the middle draw of an odd chain; when it is the only draw in a
    tail, that tail's indicator is constant (ESS NaN), and ``min`` returned NaN for the
    low tail but silently dropped the high one."""
    x = np.random.default_rng(0).standard_normal(13)
    x_max = x.copy()
    i = int(np.argmax(x_max))
    x_max[[i, 6]] = x_max[[6, i]]  # the maximum in the middle
    x_min = -x_max  # the minimum in the middle
    assert np.isnan(ess(x_max[None], kind="tail"))
    assert np.isnan(ess(x_min[None], kind="tail"))


def test_split_rhat_classic_is_the_per_dimension_formula():
    x = np.random.default_rng(1).standard_normal((3, 41, 4)) + np.arange(3)[:, None, None] / 4
    half = 20
    s = np.concatenate([x[:, :half], x[:, -half:]])  # (6, 20, 4)
    w = s.var(axis=1, ddof=1).mean(0)
    b = half * s.mean(axis=1).var(axis=0, ddof=1)
    expected = np.sqrt(((half - 1) / half * w + b / half) / w)
    np.testing.assert_allclose(split_rhat_classic(x), expected, rtol=1e-12)
    x[:, :, 1] = 1.0  # constant: undefined
    x[:, :, 2] = np.arange(3)[:, None]  # every chain stuck at its own value
    r = split_rhat_classic(x)
    assert np.isnan(r[1]) and np.isinf(r[2])


def test_sample_warns_when_the_chains_disagree():
    """A sampler that returns draws of chains that never met (a target with two far
    modes, one chain started in each) gave no sign that the answer was wrong."""
    def two_modes(x):
        return torch.logaddexp(-0.5 * ((x - 8.0) ** 2).sum(-1) / 0.05,
                               -0.5 * ((x + 8.0) ** 2).sum(-1) / 0.05)

    box = Box(np.full(2, -10.0), np.full(2, 10.0))
    x0 = np.array([[8.0, 8.0], [-8.0, -8.0], [8.0, 8.0], [-8.0, -8.0]])
    with pytest.warns(RuntimeWarning, match="chains disagree"):
        ReflectiveHMC(two_modes, box, n_leapfrog=5, random_state=0).sample(
            200, x0=x0, n_chains=4, warmup=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ReflectiveHMC(two_modes, box, n_leapfrog=5, random_state=0).sample(
            200, x0=x0[[0, 2]], n_chains=2, warmup=100)


def test_integer_points_are_tested_against_the_float64_sets():
    # the float64 bounds were cast to the points' integer dtype: Box([0.5], [1.5]) was
    # read as [0, 1] and the corner (0, 0) reported inside; numpy integer points were
    # right, and are the reference
    from mlpapers.sampling import Polytope

    sets = [Box([0.5, 0.5], [1.5, 1.5]),
            Polytope([[1.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], [1.0, 0.0, 0.0]),
            Ellipsoid([0.0, 0.0], np.diag([0.25, 0.25])), Ball([0.3, 0.0], 1.2)]
    points = np.array([[0, 0], [1, 1], [1, 0], [3, 0], [2, 0], [-1, 0]])
    for dtype in (torch.int64, torch.int32, torch.uint8):
        pts = torch.as_tensor(points[(points >= 0).all(1)] if dtype == torch.uint8
                              else points, dtype=dtype)
        for s in sets:
            expected = s.contains(pts.numpy().astype(np.float64))
            np.testing.assert_array_equal(s.contains(pts).numpy(), expected)
    # integer rays: the same exit times as float64 ones (a torch error before)
    x, v = torch.tensor([[1, 1]]), torch.tensor([[1, 0]])
    for s in (Box([0.0, 0.0], [2.0, 2.0]), Ball([1.0, 1.0], 1.0)):
        assert float(s.hit(x, v).t[0]) == float(s.hit(x.double(), v.double()).t[0]) == 1.0


@pytest.mark.parametrize("radius", [1e-150, 1e-100, 1e-10, 1.0, 1e10, 1e100, 1e150])
def test_ball_exit_times_do_not_depend_on_the_scale(radius):
    # (y.v)^2 overflowed for |y| |v| above 1e154: t = 0 at radius 1e100 with speeds near
    # it (and draws biased towards the centre), and underflowed below 1e-154 (t = 1.5,
    # outside the ball); the exit time of the unit problem is the reference
    ball, unit = Ball([0.0, 0.0], radius), Ball([0.0, 0.0], 1.0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.7, 0.7, size=(50, 2))
    v = rng.normal(size=(50, 2)) * np.exp(rng.uniform(-3, 3, size=(50, 1)))
    ref = unit.hit(x, v)
    for speed in (radius, 1.0):
        got = ball.hit(x * radius, v * speed)
        np.testing.assert_allclose(got.t * speed / radius, ref.t, rtol=1e-12)
        np.testing.assert_allclose(got.normal, ref.normal, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ball.hit([[0.0, 0.5 * radius]], [[radius, radius]]).t,
                               [(np.sqrt(7) - 1) / 4], rtol=1e-12)


def test_convex_set_exit_time_does_not_depend_on_a_large_t_max():
    # 60 halvings of [0, 1e19] left the bracket at [0, 8.7]: t = 0 was returned (and
    # 0.867 for 1e18), silently; t_max = inf gave inf ("never leaves") for a disc
    disc = ConvexSet(lambda x: (x**2).sum(-1) - 1.0, dim=2)
    for t_max in (2.0, 10.0, 1e18, 1e19, 1e300):
        t = float(disc.hit([[0.0, 0.0]], [[1.0, 0.0]], t_max).t[0])
        assert t == pytest.approx(1.0, rel=1e-14) and t <= 1.0
    with pytest.raises(ValueError, match="finite t_max"):
        disc.hit([[0.0, 0.0]], [[1.0, 0.0]], float("inf"))
    # a ray that stays inside up to t_max still reports inf
    assert float(disc.hit([[0.0, 0.0]], [[1.0, 0.0]], 0.5).t[0]) == np.inf


@pytest.mark.parametrize("tol", [np.array([1.0, 0.0]), torch.tensor([1.0, 0.0]),
                                 np.array([True, False])])
def test_contains_refuses_several_tolerances(tol):
    # a box and a polytope failed with torch errors, the others read one tolerance per
    # point: tol is documented as one number
    from mlpapers.sampling import Polytope

    for s in (Box([0.0, 0.0], [1.0, 1.0]), Ball([0.0, 0.0], 1.0),
              Polytope([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], [1.0] * 4)):
        with pytest.raises(TypeError, match="tol must be one real number"):
            s.contains([[0.5, 1.5], [0.5, 0.5]], tol=tol)
    # one value, as an array or a tensor, is that number
    box = Box([0.0, 0.0], [1.0, 1.0])
    for one in (np.array(0.6), torch.tensor([0.6]), np.float32(0.6)):
        np.testing.assert_array_equal(box.contains([[0.5, 1.5], [0.5, 2.0]], tol=one),
                                      [True, False])


def test_box_refuses_a_dim_that_contradicts_its_bounds():
    assert Box(0.0, 1.0, dim=3).dim == 3 and Box([0, 0], [1, 1], dim=2).dim == 2
    for lo, hi in (([0, 0], [1, 1]), (0, [1, 1])):
        with pytest.raises(ValueError, match="dim=3 contradicts"):
            Box(lo, hi, dim=3)
