"""Boundary oracles: exact hitting times, normals, membership, the closed-form box fold."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.sampling import Ball, Box, ConvexSet, Ellipsoid, Polytope, Region
from mlpapers.sampling.rehmc._kernels import reflected_drift

D = torch.float64


def _containers(d=3, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(3 * d, d))
    Q = rng.normal(size=(d, d))
    return {
        "box": Box(-rng.uniform(0.5, 2, d), rng.uniform(0.5, 2, d)),
        "polytope": Polytope(A, np.ones(3 * d)),
        "ball": Ball(rng.normal(size=d) * 0.1, 1.3),
        "ellipsoid": Ellipsoid(np.zeros(d), Q @ Q.T + 0.5 * np.eye(d)),
        "convexset": ConvexSet(lambda x: (x**4).sum(-1) - 1.0, interior_point=np.zeros(d)),
    }


def _bisect_exit(c, x, v, t_hi=100.0, n=200):
    """Brute-force exit time: bisection on membership along each ray."""
    lo = torch.zeros(len(x), dtype=D)
    hi = torch.full((len(x),), t_hi, dtype=D)
    for _ in range(n):
        mid = 0.5 * (lo + hi)
        inside = c.contains(x + mid[:, None] * v)
        lo, hi = torch.where(inside, mid, lo), torch.where(inside, hi, mid)
    return lo


def _inside_points(c, n, gen):
    return c.random_interior(n, gen)


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
def test_hit_time_matches_bisection_and_normal_is_outward(name):
    c = _containers()[name]
    gen = torch.Generator().manual_seed(1)
    x = _inside_points(c, 64, gen)
    assert bool(c.contains(x).all())
    v = torch.randn(64, c.dim, generator=gen, dtype=D)
    t, normal = c.hit(x, v, torch.full((64,), 100.0, dtype=D))
    ref = _bisect_exit(c, x, v)
    np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(normal.norm(dim=1).numpy(), 1.0, atol=1e-12)
    # outward: the velocity leaves through the face, and a step back along -n stays inside
    assert bool(((normal * v).sum(1) > 0).all())
    xs = x + t[:, None] * v
    assert bool(c.contains(xs, tol=1e-12).all())
    assert not bool(c.contains(xs + 1e-6 * normal).any())


def test_hit_known_values():
    x = torch.tensor([[0.0, 0.0]], dtype=D)
    v = torch.tensor([[2.0, 0.0]], dtype=D)
    t, n = Ball([0, 0], 3.0).hit(x, v)
    assert float(t[0]) == pytest.approx(1.5) and n[0].tolist() == pytest.approx([1, 0])
    t, n = Ellipsoid([0, 0], np.diag([1 / 16, 1.0])).hit(x, v)
    assert float(t[0]) == pytest.approx(2.0) and n[0].tolist() == pytest.approx([1, 0])
    h = Polytope([[1.0, 1.0], [-1.0, 0.0]], [2.0, 1.0]).hit(x, v)
    (t, n), f = h, h.face
    assert float(t[0]) == pytest.approx(1.0)
    np.testing.assert_allclose(n[0].numpy(), [2**-0.5, 2**-0.5])
    assert int(f[0]) == 0


def test_corner_tie_picks_lowest_face_and_grazing_is_ignored():
    box = Box([0, 0], [1, 1])
    x = torch.tensor([[0.5, 0.5]], dtype=D)
    t, n = box.hit(x, torch.tensor([[1.0, 1.0]], dtype=D))  # exact corner
    assert float(t[0]) == 0.5 and n[0].tolist() == [1.0, 0.0]
    t, n = box.hit(x, torch.tensor([[1.0, 0.0]], dtype=D))  # parallel to y faces
    assert float(t[0]) == 0.5 and n[0].tolist() == [1.0, 0.0]
    P = Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))
    h = P.hit(torch.zeros(1, 2, dtype=D), torch.tensor([[1.0, 1e-18]], dtype=D))
    t, face = h.t, h.face
    assert int(face[0]) == 0 and float(t[0]) == 1.0


def test_exclude_face_just_hit():
    P = Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))
    x = torch.tensor([[1.0, 0.0]], dtype=D)  # on face 0, moving along it slightly outwards
    v = torch.tensor([[1e-3, 1.0]], dtype=D)
    h0 = P.hit(x, v)
    t0, f0 = h0.t, h0.face
    assert float(t0[0]) == 0.0 and int(f0[0]) == 0
    h1 = P.hit(x, v, exclude=torch.tensor([0]))
    t1, f1 = h1.t, h1.face
    assert float(t1[0]) == pytest.approx(1.0) and int(f1[0]) == 1


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 30.0))
def test_box_fold_equals_sequential_reflection_loop(seed, scale):
    g = torch.Generator().manual_seed(seed)
    d = 3
    lo = -torch.rand(d, generator=g, dtype=D) - 0.1
    hi = torch.rand(d, generator=g, dtype=D) + 0.1
    box = Box(lo, hi)
    as_polytope = Polytope(np.vstack([np.eye(d), -np.eye(d)]),
                           np.r_[hi.numpy(), -lo.numpy()])
    x = box.random_interior(8, g)
    p = torch.randn(8, d, generator=g, dtype=D) * scale
    inv_mass = torch.rand(d, generator=g, dtype=D) + 0.5
    tau = torch.rand(8, generator=g, dtype=D)
    xf, pf, nf, _ = reflected_drift(x, p, tau, box, inv_mass, 10**6)
    xl, pl, nl, _ = reflected_drift(x, p, tau, as_polytope, inv_mass, 10**6)
    np.testing.assert_allclose(xf.numpy(), xl.numpy(), atol=1e-9)
    np.testing.assert_allclose(pf.numpy(), pl.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(nf.numpy(), nl.numpy())
    assert bool(box.contains(xf).all())


def test_box_fold_one_coordinate_closed_form():
    # [0, 2]: from 0.5 at speed 5 for time 1 the unfolded position is 5.5: the walls at 2
    # and then 0 are hit and the particle ends at 1.5 moving up (two flips); [0, 1]: from
    # 0.5 at speed 0.7 it hits 1 once and ends at 0.8 moving down
    box = Box([0.0, 0.0], [2.0, 1.0])
    x = torch.tensor([[0.5, 0.5]], dtype=D)
    v = torch.tensor([[5.0, 0.7]], dtype=D)
    x_new, flipped, n_ref = box.fold(x, v, torch.ones(1, dtype=D))
    np.testing.assert_allclose(x_new.numpy(), [[1.5, 0.8]], atol=1e-15)
    assert flipped.dtype == torch.bool and flipped.tolist() == [[False, True]]
    assert n_ref.tolist() == [2 + 1]


def test_free_drift_fast_path_of_the_transform_baseline():
    from mlpapers.sampling.rehmc._baselines import Unbounded

    g = torch.Generator().manual_seed(0)
    x, p = torch.randn(5, 3, generator=g, dtype=D), torch.randn(5, 3, generator=g, dtype=D)
    inv_mass, tau = torch.tensor([1.0, 2.0, 0.5], dtype=D), torch.rand(5, generator=g, dtype=D)
    x1, p1, nr, cap = reflected_drift(x, p, tau, Unbounded(3), inv_mass, 10)
    np.testing.assert_allclose(x1.numpy(), (x + tau[:, None] * inv_mass * p).numpy(),
                               atol=1e-15)
    assert torch.equal(p1, p) and not nr.any() and not cap.any()


def test_convexset_with_gradient_matches_ball():
    ball = Ball([0.0, 0.0, 0.0], 2.0)
    cs = ConvexSet(lambda x: (x * x).sum(-1) - 4.0, lambda x: 2 * x, interior_point=[0, 0, 0])
    g = torch.Generator().manual_seed(0)
    x = ball.random_interior(16, g)
    v = torch.randn(16, 3, generator=g, dtype=D)
    t1, n1 = ball.hit(x, v)
    t2, n2 = cs.hit(x, v, torch.full((16,), 50.0, dtype=D))
    np.testing.assert_allclose(t1.numpy(), t2.numpy(), rtol=1e-12)
    np.testing.assert_allclose(n1.numpy(), n2.numpy(), atol=1e-10)
    t3, _ = cs.hit(x, v, 0.5 * t1)  # no hit before t_max
    assert bool(torch.isinf(t3).all())


def test_region_and_bad_constructors():
    r = Region(lambda x: x[:, 0] > 0)
    assert r.contains(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])).tolist() == [True, False]
    with pytest.raises(ValueError, match="shape"):
        Region(lambda x: x > 0).contains(torch.zeros(3, 2))
    with pytest.raises(TypeError, match="callable"):
        Region(3)
    with pytest.raises(ValueError, match="empty"):
        Polytope([[1.0], [-1.0]], [-1.0, -1.0])  # x <= -1 and x >= 1
    with pytest.raises(ValueError, match="interior"):
        Polytope([[1.0], [-1.0]], [0.0, 0.0])
    with pytest.raises(ValueError, match="rows"):
        Polytope(np.eye(2), np.ones(3))
    with pytest.raises(ValueError, match="lo < hi"):
        Box([0, 1], [1, 0])
    with pytest.raises(ValueError, match="finite"):
        Box([0, np.nan], [1, 1])
    with pytest.raises(ValueError, match="radius"):
        Ball([0, 0], -1.0)
    with pytest.raises(ValueError, match="positive definite"):
        Ellipsoid([0, 0], -np.eye(2))
    with pytest.raises(ValueError, match="shape"):
        Ellipsoid([0, 0], np.eye(3))
    with pytest.raises(ValueError, match="g\\(interior_point\\) < 0"):
        ConvexSet(lambda x: (x * x).sum(-1) - 1.0, interior_point=[2.0, 0.0])
    assert Box(0.0, 1.0, dim=3).dim == 3


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
@pytest.mark.parametrize("as_numpy", [False, True])
def test_oracles_refuse_points_of_another_shape(name, as_numpy):
    """Points of another dimension failed with torch broadcasting errors."""
    c = _containers()[name]
    conv = (lambda t: t.numpy()) if as_numpy else (lambda t: t)
    x = conv(torch.zeros(2, 3, dtype=D))
    with pytest.raises(ValueError, match=r"^x must have shape \(C, 3\), one point per row, "
                                         r"or \(3,\) for one point, got \(2, 4\)"):
        c.contains(conv(torch.zeros(2, 4, dtype=D)))
    with pytest.raises(ValueError, match=r"got \(4,\)"):
        c.contains(conv(torch.zeros(4, dtype=D)))
    with pytest.raises(ValueError, match=r"^x must have shape \(C, 3\)"):
        c.hit(conv(torch.zeros(2, 2, dtype=D)), conv(torch.ones(2, 2, dtype=D)), 10.0)
    with pytest.raises(ValueError, match=r"^v must have the shape of x \(2, 3\), got \(3, 3\)"):
        c.hit(x, conv(torch.ones(3, 3, dtype=D)), 10.0)
    # the documented shapes still work
    assert tuple(c.contains(x).shape) == (2,)
    assert tuple(c.hit(x, conv(torch.ones(2, 3, dtype=D)), 10.0)[1].shape) == (2, 3)


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
def test_contains_refuses_a_nan_tolerance(name):
    """A NaN tol compared False everywhere: every point was reported outside (or
    inside), without an error."""
    c = _containers()[name]
    x = torch.zeros(2, 3, dtype=D)
    for call in (lambda: c.contains(x, float("nan")), lambda: c.contains(x, tol=float("nan")),
                 lambda: c.contains(x.numpy(), float("nan"))):
        with pytest.raises(ValueError, match="^tol must be a number"):
            call()
    assert bool(c.contains(x, tol=float("inf")).all())
    for bad in ("0.1", None, True):  # (failed in torch arithmetic, not naming tol)
        with pytest.raises(TypeError, match="^tol must be a real number"):
            c.contains(x, tol=bad)


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
def test_contains_takes_a_tolerance_held_in_a_numpy_array(name):
    """``tol=np.asarray(1e-6)`` (a 0-d array, or ``np.median`` of an array kept as an
    array) was refused by the NaN check that d6beae4 added; a one-value tensor was
    accepted. Both mean the number they hold, for tensor and numpy points."""
    c = _containers()[name]
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.uniform(-3, 3, size=(64, 3)))
    for tol in (0.0, 0.4):
        want = c.contains(x, tol)
        for held in (np.asarray(tol), np.asarray([tol]), np.asarray(tol, dtype=np.float32),
                     torch.tensor(tol)):
            assert torch.equal(c.contains(x, held), want)
            assert torch.equal(c.contains(x, tol=held), want)
            np.testing.assert_array_equal(c.contains(x.numpy(), tol=held), want.numpy())
    with pytest.raises(ValueError, match="^tol must be a number"):
        c.contains(x, np.asarray(np.nan))
    with pytest.raises(TypeError, match="^tol must be a real number"):
        c.contains(x, np.asarray("0.1"))


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
def test_hit_refuses_a_bad_scalar_t_max(name):
    """A NaN or negative t_max left the bisection oracle no bracket, without an error;
    None, a non-negative number and a per-chain tensor are accepted."""
    c = _containers()[name]
    x, v = torch.zeros(2, 3, dtype=D), torch.ones(2, 3, dtype=D)
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="^t_max must be >= 0"):
            c.hit(x, v, bad)
    with pytest.raises(TypeError, match="^t_max must be None, a number"):
        c.hit(x, v, t_max="10")
    expected = c.hit(x, v, 10.0)
    torch.testing.assert_close(c.hit(x, v, torch.full((2,), 10.0, dtype=D))[1], expected[1])
    if name != "convexset":  # (the bisection oracle requires a bracket)
        torch.testing.assert_close(c.hit(x, v)[1], expected[1])


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
@pytest.mark.parametrize("as_numpy", [False, True])
def test_one_point_is_answered_as_a_batch_of_one(name, as_numpy):
    """A single point (d,) gets the answer of the batch [point] without the batch axis:
    contains of one point was a scalar for the closed-form containers by accident and an
    error for ConvexSet, and hit failed with an IndexError."""
    c = _containers()[name]
    conv = (lambda t: t.numpy()) if as_numpy else (lambda t: t)
    x = torch.tensor([[0.1, -0.2, 0.05], [5.0, 0.0, 0.0]], dtype=D)
    v = torch.tensor([[0.3, 1.0, -0.5], [1.0, 0.0, 0.0]], dtype=D)
    both = c.contains(conv(x))
    for i in range(2):
        one = c.contains(conv(x[i]))
        assert np.shape(one) == () and bool(one) == bool(both[i])
    t, n = c.hit(conv(x[:1]), conv(v[:1]), 100.0)
    t1, n1 = c.hit(conv(x[0]), conv(v[0]), 100.0)
    assert np.shape(t1) == () and np.shape(n1) == (3,)
    np.testing.assert_allclose(np.asarray(t1), np.asarray(t)[0], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(n1), np.asarray(n)[0], rtol=1e-12)
