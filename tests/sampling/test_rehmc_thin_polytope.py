"""Default starting points of a long, thin polytope (its Chebyshev centre can be an end)."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.sampling import Box, Polytope, ReflectiveHMC

SQUARE = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])


def _slab(eps, angle=0.0):
    """``[-1, 1] x [-eps, eps]`` rotated by ``angle`` (rows of unit norm)."""
    c, s = np.cos(angle), np.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    return Polytope(SQUARE @ rot.T, np.array([1.0, 1.0, eps, eps])), rot


def _uniform(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


def test_thin_slab_is_sampled_like_the_same_box():
    """Uniform on ``[-1, 1] x [-2e-4, 2e-4]`` as a Polytope vs as a Box: the Chebyshev
    centre LP returns the end ``(1 - eps, 0)``; the chains started within 1e-4 of it
    and drew a mean of 0.98 (exact 0) with a standard deviation of 0.01 (exact 0.577)."""
    eps = 2e-4
    poly, _ = _slab(eps)
    box = Box([-1.0, -eps], [1.0, eps])
    for container in (poly, box):
        draws = np.asarray(ReflectiveHMC(_uniform, container, mass="diag", random_state=0)
                           .sample(1000).samples)[..., 0].ravel()
        assert abs(draws.mean()) < 0.1, type(container).__name__
        assert abs(draws.std() - 1 / np.sqrt(3)) < 0.05, type(container).__name__


@pytest.mark.parametrize("angle", [0.0, 0.6, 1.3])
def test_starting_points_are_inside_and_spread_along_the_long_axis(angle):
    poly, rot = _slab(1e-4, angle)
    x = poly.random_interior(64, torch.Generator().manual_seed(0))
    assert bool(poly.contains(x).all())
    along = x.numpy() @ rot[:, 0]            # coordinate along the slab's long axis
    assert along.max() - along.min() > 1.0   # (all within 2e-4 of one end before)
    # the same generator state gives the same points
    again = poly.random_interior(64, torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, again, rtol=0, atol=0)


def test_extreme_points_follow_a_rebuilt_polytope_and_survive_pickling():
    poly, _ = _slab(1e-3)
    poly.random_interior(2, torch.Generator().manual_seed(0))
    poly.b = np.array([5.0, 5.0, 1e-3, 1e-3])          # now [-5, 5] x [-1e-3, 1e-3]
    x = poly.random_interior(64, torch.Generator().manual_seed(1)).numpy()
    assert bool(poly.contains(torch.as_tensor(x)).all()) and x[:, 0].max() - x[:, 0].min() > 5
    clone = pickle.loads(pickle.dumps(poly))
    torch.testing.assert_close(clone.random_interior(4, torch.Generator().manual_seed(2)),
                               poly.random_interior(4, torch.Generator().manual_seed(2)))


def test_unbounded_polytope_keeps_its_start_near_the_origin():
    orthant = Polytope(-np.eye(3), np.zeros(3))      # x >= 0: no extreme points
    x = orthant.random_interior(32, torch.Generator().manual_seed(0))
    assert bool(orthant.contains(x).all())
    assert float(x.abs().max()) < 3.0


@pytest.mark.parametrize("lo, w, h", [(5e7, 1.0, 1e-4), (-1e9, 10.0, 1e-3)])
def test_narrow_polytope_far_from_the_origin_gets_its_own_centre(lo, w, h):
    """``[lo, lo + w] x [0, h]``, narrower than 1e-7 of its distance from the origin:
    the LP's absolute tolerances (in units of max|b|) put the Chebyshev centre at
    ``(lo + w/2, w/2)``, outside, with radius ``w/2``; sampling then raised "could not
    find starting points". Solved again about the first centre, the exact one."""
    poly = Polytope(SQUARE, np.array([lo + w, -lo, h, 0.0]))
    centre = poly.interior_point()
    assert centre[1] == pytest.approx(h / 2, rel=1e-6)
    assert poly.width() == pytest.approx(h, rel=1e-6)
    assert poly._scaled_width(np.array([1.0, 1.0])) == pytest.approx(h, rel=1e-6)
    draws = np.asarray(ReflectiveHMC(_uniform, poly, mass="diag", random_state=0)
                       .sample(500).samples).reshape(-1, 2)
    assert bool(poly.contains(torch.as_tensor(draws)).all())
    assert abs((draws[:, 0] - lo).mean() - w / 2) < 0.1 * w
    assert abs((draws[:, 1].mean()) - h / 2) < 0.1 * h


def test_no_extreme_point_falls_back_to_chords(monkeypatch):
    """Every extreme-point LP failing leaves the centre-plus-chord starting points."""
    import mlpapers.sampling.rehmc._supports as supports

    monkeypatch.setattr(supports, "_extreme_points", lambda A, b: np.zeros((0, 2)))
    square = Polytope(SQUARE, np.ones(4))
    x = square.random_interior(16, torch.Generator().manual_seed(0))
    assert x.shape == (16, 2) and bool(square.contains(x).all())
