"""Numerical robustness of reflective HMC: scale, conditioning, precision, degeneracy.

Hitting times are checked against a float64 bisection written from the definition of
each set; membership of every kept state is exact (tolerance 0) in float64, also for
float32 chains, whose draws are float64 numbers.
"""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    StiefelSampler,
)
from mlpapers.sampling.rehmc._kernels import hmc_transition, reflected_drift

D = torch.float64
SQUARE = np.vstack([np.eye(2), -np.eye(2)])


def flat(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


def _in_float64(container, x) -> torch.Tensor:
    return container.contains(torch.as_tensor(np.asarray(x, dtype=np.float64)).reshape(
        -1, container.dim))


# -- every state stays in K ---------------------------------------------------------------
EDGE_CONTAINERS = {
    "polytope": lambda: Polytope(SQUARE, np.ones(4)),
    "ball": lambda: Ball([0.3, -0.2], 1.0),
    "ellipsoid": lambda: Ellipsoid([0.3, -0.2], np.diag([1.0, 4.0])),
    # bounds of both signs: lo + (hi - lo) rounds 1 ulp above hi in the second coordinate
    "box_mixed_signs": lambda: Box([0.7, -0.9], [0.9, 0.7]),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(EDGE_CONTAINERS))
def test_drift_ending_on_the_boundary_never_leaves_the_container(name, dtype):
    # A flat target accepts every proposal; the step size is each chain's exact hitting
    # time along the momentum it is about to draw, so every drift ends on the boundary,
    # where rounding puts x + t v on either side. Before, those outside were accepted:
    # kept draws (and last_state, which resume then refused) lay outside K.
    c = EDGE_CONTAINERS[name]()
    C = 400
    x = c.random_interior(C, torch.Generator().manual_seed(0)).to(dtype)
    z = torch.randn(C, 2, generator=torch.Generator().manual_seed(1), dtype=D).to(dtype)
    t = c.hit(x, z, torch.full((C,), 1e9, dtype=dtype))[0]
    gen = torch.Generator().manual_seed(1)  # draws z again as the momentum
    out = hmc_transition(x, flat(x), torch.zeros_like(x), t, 1, flat, c, None, 100, gen)
    proposal_out = ~_in_float64(c, out["proposal"])
    assert int(proposal_out.sum()) >= 5  # the situation arises
    assert bool(_in_float64(c, out["x"]).all())  # exact, in float64
    torch.testing.assert_close(out["divergent"], proposal_out)  # rejected as divergent
    assert bool((out["accepted"] == ~proposal_out).all())


@pytest.mark.parametrize("lo, hi", [([0.0, 0.0], [1.0, 1.0]), ([1e8, 1e8], [1e8 + 1, 1e8 + 3]),
                                    ([-3.0, -1e-8], [-1.0, 0.0])])
def test_float64_box_fold_provably_ends_inside(lo, hi):
    # the sampler skips the membership test of float64 box proposals when lo + (hi - lo)
    # does not round above hi: then lo + w y (0 <= y <= 1) lies in [lo, hi] by monotone
    # rounding. Drive every chain exactly onto a wall and beyond.
    box = Box(lo, hi)
    assert box._keeps_inside(torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = box.random_interior(2000, gen)
    v = torch.randn(2000, 2, generator=gen, dtype=D)
    t = box.hit(x, v)[0]
    for tau in (t, torch.nextafter(t, torch.zeros_like(t)), 3.7 * t):
        x1 = reflected_drift(x, v, tau, box, None, 10**6)[0]
        assert bool(box.contains(x1).all())


def test_float32_run_keeps_draws_in_the_float64_container():
    # float32 chains in a small ball far from the origin (positions resolved to 0.6% of
    # the radius): an ulp outside the ball, 2 to 7 of these 1600 draws were kept
    ball = Ball([1e3, 1e3], 0.01)
    res = ReflectiveHMC(flat, ball, n_leapfrog=3, step_size=0.005, dtype=torch.float32,
                        random_state=0).sample(100, n_chains=16, warmup=0)
    assert res.samples.dtype == np.float32
    assert bool(_in_float64(ball, res.samples).all())
    assert bool(_in_float64(ball, res.last_state).all())


def test_float32_start_rounded_outside_the_box_is_a_clear_error():
    box = Box([0.7], [0.9])  # float32(0.7) < 0.7
    hmc = ReflectiveHMC(flat, box, dtype=torch.float32, n_leapfrog=2, random_state=0)
    with pytest.raises(ValueError, match=r"outside the container \(after rounding to "
                                         r"torch.float32\)"):
        hmc.sample(5, x0=[[0.7]], n_chains=1, warmup=0)
    assert hmc.sample(5, x0=[[0.8]], n_chains=1, warmup=0).samples.min() >= 0.7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, "float16",
                                   # not float dtypes: the message lists only the two
                                   # (it listed float16 and bfloat16 too, refused next)
                                   "int32", torch.int64, "banana"])
def test_half_precision_is_refused_before_any_work(dtype):
    calls = []

    def lp(x):
        calls.append(1)
        return -0.5 * (x**2).sum(-1)

    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        ReflectiveHMC(lp, Box([0.0], [1.0]), dtype=dtype).sample(5, n_chains=2, warmup=5)
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        StiefelSampler(None, 3, 1, dtype=dtype).sample(5, n_chains=2, warmup=5)
    assert not calls


# -- scale: constructors ------------------------------------------------------------------
@pytest.mark.parametrize("lo, hi", [([0.0], [5e-324]), ([-1e308], [1e308])])
def test_box_width_outside_the_float64_range_is_a_clear_error(lo, hi):
    # before: ZeroDivisionError at the first step, or "could not find starting points"
    with pytest.raises(ValueError, match=r"Box widths hi - lo must be finite.*rescale"):
        Box(lo, hi)


@pytest.mark.parametrize("radius", [1e-200, 1e200])
def test_ball_radius_whose_square_under_or_overflows_is_a_clear_error(radius):
    # before: OverflowError (34, 'Numerical result out of range') in the first drift, or
    # radius**2 == 0 and every drift capped (all divergent, the chain never moved)
    with pytest.raises(ValueError, match=r"radius must lie in \[1e-150, 1e\+150\]"):
        Ball([0.0, 0.0], radius)


@pytest.mark.parametrize("half_width", [1e-30, 1e-12, 1e20, 1e25])
def test_polytope_chebyshev_centre_at_any_scale(half_width):
    # the Chebyshev LP is solved for b / max|b|: at 1e-12 and below HiGHS's absolute
    # tolerances refused the square as flat, at 1e20 and above it read b as infinite
    # ("unbounded"); the right triangle's inradius is (2 - sqrt 2) / 2 of its legs
    P = Polytope(SQUARE, np.full(4, half_width))
    np.testing.assert_allclose(P.width(), 2 * half_width, rtol=1e-9)
    T = Polytope([[-1.0, 0.0], [0.0, -1.0], [1.0, 1.0]], [0.0, 0.0, half_width])
    center, radius = T._chebyshev()
    r = (2 - np.sqrt(2)) / 2 * half_width
    np.testing.assert_allclose(radius, r, rtol=1e-9)
    np.testing.assert_allclose(center, [r, r], rtol=1e-9)


def test_polytope_flat_relative_to_b_is_refused():
    # two faces 1e-14 apart, at distance 1 from the origin: below the LP's resolution
    with pytest.raises(ValueError, match=r"empty interior \(it is flat\).*at most 1e-12"):
        Polytope(SQUARE, [1.0, 1.0, -1.0 + 1e-14, 1.0])


def test_tiny_and_huge_supports_sample_in_scale():
    # the doubling heuristic and dual averaging find the scale over 30 orders of magnitude
    for w in (1e-12, 1e15):
        box = Box([0.0, 0.0], [w, w])
        res = ReflectiveHMC(lambda x, w=w: -0.5 * ((x / w - 0.3) ** 2 / 0.04).sum(-1), box,
                            n_leapfrog=3, random_state=0).sample(150, n_chains=2,
                                                                  warmup=150)
        s = res.samples / w
        assert bool(_in_float64(box, res.samples).all())
        assert abs(s.mean() - 0.3) < 0.1 and 0.1 < s.std() < 0.3
        assert res.n_divergent.sum() == 0 and 0.5 < res.accept_rate.mean()


# -- hitting times against a float64 bisection from the definition -------------------------
def _brute_exit(violation, x, v, t_max, n_grid=4001):
    """First t in (0, t_max] with violation(x + t v) > 0: grid, then bisection (float64)."""
    ts = np.linspace(0.0, t_max, n_grid)
    bad = np.flatnonzero([violation(x + t * v) > 0 for t in ts])
    if bad.size == 0:
        return np.inf
    lo, hi = ts[bad[0] - 1], ts[bad[0]]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if violation(x + mid * v) > 0:
            hi = mid
        else:
            lo = mid
    return lo


ROT = np.array([[0.6, 0.8], [-0.8, 0.6]])
E_ILL = ROT @ np.diag([1.0, 1e8]) @ ROT.T  # condition number 1e8
ROW_SCALE = np.array([1e-10, 1e10, 1.0, 1.0])
THIN = np.array([[-1.0, 0.0], [0.0, -1.0], [1.0, 1e6]])  # simplex of height 1e-6
NEAR_PARALLEL = np.vstack([SQUARE, [[1.0, 1e-9]]])

HIT_CASES = {
    # name: (container, violation in numpy, start point, time bracket, rtol). The rtol is
    # what float64 resolves: 1e-12, but a position near 1e8 only to ulp(1e8) = 1.5e-8 and
    # the boundary of a form with condition number 1e8 only to about 1e8 * eps in g
    "box_width_1e-8": (Box([0.0, 0.0], [1e-8, 1e-8]),
                       lambda z: max(-z.min(), (z - 1e-8).max()), [3e-9, 6e-9], 1e-7, 1e-12),
    "box_width_1e8": (Box([0.0, 0.0], [1e8, 1e8]),
                      lambda z: max(-z.min(), (z - 1e8).max()), [3e7, 6e7], 1e9, 1e-12),
    "box_centre_1e8": (Box([1e8 - 0.5] * 2, [1e8 + 0.5] * 2),
                       lambda z: np.abs(z - 1e8).max() - 0.5, [1e8 + 0.1, 1e8 - 0.2], 10.0,
                       1e-6),
    "ellipsoid_cond_1e8": (Ellipsoid([0.0, 0.0], E_ILL), lambda z: z @ E_ILL @ z - 1.0,
                           ROT @ [0.3, 2e-5], 10.0, 1e-8),
    "polytope_rows_1e-10_1e10": (Polytope(SQUARE * ROW_SCALE[:, None], ROW_SCALE),
                                 lambda z: (SQUARE @ z - 1.0).max(), [0.4, -0.7], 10.0, 1e-12),
    "polytope_duplicated_rows": (Polytope(np.vstack([SQUARE] * 3), np.ones(12)),
                                 lambda z: (SQUARE @ z - 1.0).max(), [0.4, -0.7], 10.0, 1e-12),
    "polytope_near_parallel": (Polytope(NEAR_PARALLEL, np.ones(5)),
                               lambda z: (NEAR_PARALLEL @ z - 1.0).max(), [0.4, -0.7], 10.0,
                               1e-12),
    "thin_simplex": (Polytope(THIN, [0.0, 0.0, 1.0]),
                     lambda z: (THIN @ z - [0.0, 0.0, 1.0]).max(), [0.3, 2e-7], 10.0, 1e-12),
    "convexset_centre_1e8": (ConvexSet(lambda z: ((z - 1e8) ** 2).sum(-1) - 1.0,
                                       interior_point=[1e8, 1e8]),
                             lambda z: ((z - 1e8) ** 2).sum() - 1.0, [1e8 + 0.3, 1e8], 10.0,
                             1e-6),
}


@pytest.mark.parametrize("name", list(HIT_CASES))
def test_hit_time_matches_bisection_from_the_definition(name):
    c, violation, x0, t_max, rtol = HIT_CASES[name]
    rng = np.random.default_rng(7)
    x = np.asarray(x0, dtype=np.float64)
    for _ in range(4):
        v = rng.normal(size=2)
        t = c.hit(torch.as_tensor(x)[None], torch.as_tensor(v)[None],
                  torch.tensor([t_max], dtype=D))[0]
        ref = _brute_exit(violation, x, v, t_max)
        assert np.isfinite(ref)
        np.testing.assert_allclose(float(t[0]), ref, rtol=rtol)


# -- grazing, corners, starts on the boundary -------------------------------------------
def test_tangent_start_on_a_sphere_is_capped_and_rejected_not_an_escape():
    # a start on the sphere moving tangentially leaves at t = 0 and reflects without
    # changing direction: the drift hits the cap (rejected as divergent), never hangs
    for c in (Ball([0.0, 0.0], 1.0), Ellipsoid([0.0, 0.0], np.diag([1.0, 1.0])),
              ConvexSet(lambda z: (z**2).sum(-1) - 1.0, interior_point=[0.0, 0.0])):
        x, p = torch.tensor([[0.0, 1.0]], dtype=D), torch.tensor([[1.0, 0.0]], dtype=D)
        x1, p1, n_ref, capped = reflected_drift(x, p, torch.tensor([0.5], dtype=D), c, None,
                                                50)
        assert bool(capped[0]) and int(n_ref[0]) == 51
        assert bool(c.contains(x1, tol=1e-12).all())
        np.testing.assert_allclose(float(p1.norm()), 1.0, rtol=1e-14)


def test_corner_hits_and_face_parallel_motion_are_exact():
    square = Polytope(SQUARE, np.ones(4))
    # into a corner along the diagonal: both faces tie, the lowest index reflects first,
    # the other at t = 0; the particle comes straight back
    x1, p1, n_ref, capped = reflected_drift(torch.tensor([[0.0, 0.0]], dtype=D),
                                            torch.tensor([[1.0, 1.0]], dtype=D),
                                            torch.tensor([2.0], dtype=D), square, None, 10)
    np.testing.assert_allclose(x1.numpy(), [[0.0, 0.0]], atol=1e-15)
    np.testing.assert_allclose(p1.numpy(), [[-1.0, -1.0]], atol=1e-15)
    assert int(n_ref[0]) == 2 and not bool(capped[0])
    # on a face, moving along it: the face is never hit (zero normal speed)
    x1, p1, n_ref, _ = reflected_drift(torch.tensor([[1.0, 0.0]], dtype=D),
                                       torch.tensor([[0.0, 1.0]], dtype=D),
                                       torch.tensor([0.5], dtype=D), square, None, 10)
    np.testing.assert_allclose(x1.numpy(), [[1.0, 0.5]], atol=0)
    assert int(n_ref[0]) == 0


@pytest.mark.parametrize("container, x0", [
    (Polytope(SQUARE, np.ones(4)), [1.0, 1.0]),  # a corner
    (Ball([0.0, 0.0], 1.0), [0.6, 0.8]),  # on the sphere
    (Box([0.0, 0.0], [1.0, 1.0]), [1.0, 0.0]),  # a corner of the box
])
def test_start_exactly_on_the_boundary(container, x0):
    res = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), container, n_leapfrog=3,
                        random_state=0).sample(100, x0=x0, n_chains=2, warmup=50)
    assert bool(_in_float64(container, res.samples).all())
    assert np.isfinite(res.samples).all() and res.accept_rate.min() > 0.3


# -- degenerate inputs --------------------------------------------------------------------
def test_convexset_with_flat_g_at_the_boundary_reflects_with_the_outer_normal():
    # g is flat (exactly 0 gradient) at the inner end of the hit bracket; the normal was
    # zero, the reflection's (n.p)/(n.n) = 0/0 made the momentum and positions NaN
    cs = ConvexSet(lambda z: torch.relu(z.norm(dim=-1) - 1.0) ** 2 - 1e-300,
                   interior_point=[0.0, 0.0])
    t, normal = cs.hit(torch.zeros(1, 2, dtype=D), torch.tensor([[0.0, 2.0]], dtype=D),
                          torch.tensor([3.0], dtype=D))
    np.testing.assert_allclose(float(t[0]), 0.5, rtol=1e-12)
    np.testing.assert_allclose(normal.numpy(), [[0.0, 1.0]], atol=1e-12)
    res = ReflectiveHMC(flat, cs, n_leapfrog=2, step_size=0.8, random_state=0).sample(
        15, n_chains=2, warmup=0)
    assert res.n_divergent.sum() == 0 and res.n_reflections.sum() > 0
    assert np.linalg.norm(res.samples, axis=-1).max() <= 1.0


def test_one_ulp_wide_coordinate_gives_a_summary_and_a_warning():
    # a coordinate of width one ulp: two values only; the step-size cap (the inscribed
    # width) freezes the other coordinate, which the R-hat warning reports
    box = Box([1.0, 0.0], [np.nextafter(1.0, 2.0), 1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ReflectiveHMC(flat, box, n_leapfrog=3, random_state=0).sample(
            60, n_chains=2, warmup=30)
    assert any("R-hat" in str(w.message) for w in caught)
    assert bool(_in_float64(box, res.samples).all())
    summ = res.summary()
    assert np.all(summ["sd"] >= 0) and "x[0]" in str(summ)
    assert np.all(np.isnan(summ["rhat"]) | (summ["rhat"] > 0))


@pytest.mark.parametrize("n, k", [(1, 1), (3, 3), (4, 1)])
def test_stiefel_extreme_shapes(n, k):
    res = StiefelSampler(None, n, k, n_leapfrog=3, random_state=0).sample(
        20, n_chains=2, warmup=20)
    Q = res.Q
    assert Q.shape == (2, 20, n, k)
    np.testing.assert_allclose(np.einsum("cdij,cdik->cdjk", Q, Q),
                               np.broadcast_to(np.eye(k), (2, 20, k, k)), atol=1e-12)


def test_float32_ball_radius_is_range_checked_without_a_cast_overflow():
    # the range bounds 1e-150 / 1e150 used to be cast to float32 (inf and 0) with a
    # RuntimeWarning, and then checked nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Ball([0.0], np.float32(2)).radius == 2.0
        assert Ball([0.0], torch.tensor(2.0)).radius == 2.0
    with pytest.raises(ValueError, match="radius must lie in"):
        Ball([0.0], np.float64(1e-200))
