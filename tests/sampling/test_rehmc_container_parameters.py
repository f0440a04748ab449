"""Polytope, Ball and Ellipsoid keep their parameters consistent with what the
constructor derived from them, as Box does: read-only arrays, checked assignment,
pickles of the former layout."""

import copy
import pickle

import numpy as np
import pytest
import torch

from mlpapers.sampling import Ball, Ellipsoid, Polytope, ReflectiveHMC

POINTS = np.array([[0.2, 0.2], [0.6, 0.1], [1.5, 0.1]])


def test_polytope_rows_cannot_be_edited_in_place():
    # contains reads A, hit read a transposed copy made at construction (and both
    # read cached tensors): an in-place edit made them disagree
    tri = Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 1])
    with pytest.raises(ValueError, match="read-only"):
        tri.A[2] = [1.0, 0.0]
    with pytest.raises(ValueError, match="read-only"):
        tri.b[2] = 2.0


def test_polytope_assignment_rebuilds_it_as_the_constructor_would():
    tri = Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 1])
    tri.contains(POINTS)  # (fills the tensor cache)
    tri.b = [0.0, 0.0, 2.0]  # rows already have unit norm: b is taken as given
    fresh = Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 2 * np.sqrt(2)])
    np.testing.assert_allclose(tri.b, fresh.b)
    np.testing.assert_array_equal(tri.contains(POINTS), fresh.contains(POINTS))
    np.testing.assert_allclose(tri.interior_point(), fresh.interior_point())
    assert tri.width() == pytest.approx(fresh.width())
    x, v = np.array([[0.1, 0.1]]), np.array([[1.0, 1.0]])
    np.testing.assert_allclose(tri.hit(x, v)[0], fresh.hit(x, v)[0])
    tri.A = [[-2, 0], [0, -1], [1, 1]]  # new rows rescaled, b divided alike
    np.testing.assert_allclose(tri.A[0], [-1.0, 0.0])
    np.testing.assert_allclose(tri.b, [0.0, 0.0, 2.0 / np.sqrt(2)])
    with pytest.raises(ValueError, match="A has 1 rows but b has 3"):
        tri.A = [[1.0, 0.0]]
    np.testing.assert_allclose(tri.b, [0.0, 0.0, 2.0 / np.sqrt(2)])  # all or nothing


def test_ball_parameters_are_checked_and_dim_follows_the_centre():
    ball = Ball([0.0, 0.0], 1.0)
    assert ball.contains(np.array([[0.5, 0.0]])).all()
    with pytest.raises(ValueError, match="read-only"):
        ball.center[0] = 5.0
    with pytest.raises(ValueError, match="radius must be a finite number > 0"):
        ball.radius = -1.0
    assert ball.radius == 1.0
    ball.center = [5.0, 0.0]  # the cached tensor of the former centre is not reused
    assert not ball.contains(np.array([[0.5, 0.0]])).any()
    ball.center = [0.0, 0.0, 0.0]
    assert ball.dim == 3
    res = ReflectiveHMC(lambda x: -(x**2).sum(-1), ball, n_leapfrog=3,
                        random_state=0).sample(200, n_chains=2, warmup=100)
    assert res.samples.shape == (2, 200, 3)


def test_ellipsoid_shape_matrix_is_checked_on_assignment():
    ell = Ellipsoid([0.0, 0.0], [[4.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="read-only"):
        ell.E[0, 1] = 3.0  # (also left E asymmetric)
    with pytest.raises(ValueError, match="positive definite"):
        ell.E = [[1.0, 2.0], [2.0, 1.0]]
    ell.E = [[1.0, 0.0], [0.0, 1.0]]
    assert ell.width() == pytest.approx(2.0)
    t, _ = ell.hit(torch.zeros(1, 2, dtype=torch.float64),
                   torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert float(t[0]) == pytest.approx(1.0)


@pytest.mark.parametrize("make", [
    lambda: Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 1]),
    lambda: Ball([0.0, 0.0], 1.0),
    lambda: Ellipsoid([0.0, 0.0], [[4.0, 0.0], [0.0, 1.0]]),
])
def test_copies_keep_parameters_read_only_and_former_pickles_load(make):
    container = make()
    names = container._parameters
    for other in (pickle.loads(pickle.dumps(container)), copy.deepcopy(container)):
        np.testing.assert_array_equal(other.contains(POINTS), container.contains(POINTS))
        arr = getattr(other, names[0])
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 0.0
    # the former layout stored the parameters under their public names
    state = {k: v for k, v in container.__dict__.items()
             if k not in {"_" + n for n in names} | {"_tensor_cache"}}
    state.update({n: np.array(getattr(container, n), copy=True) if
                  isinstance(getattr(container, n), np.ndarray) else getattr(container, n)
                  for n in names})
    old = type(container).__new__(type(container))
    old.__setstate__(state)
    np.testing.assert_array_equal(old.contains(POINTS), container.contains(POINTS))
    assert old.width() == pytest.approx(container.width())
    assert not getattr(old, names[0]).flags.writeable
