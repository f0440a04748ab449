"""What the supports' docstrings promise (session 15): numpy points in, numpy answers
out, the ``Hit`` pair, each container's ``tol`` and ``width``, and a ``ConvexSet`` width
that does not depend on where its interior point lies."""

import math

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
    Region,
    SampleResult,
)

CONTAINERS = {
    "box": lambda: Box([-1.0, -2.0], [1.0, 2.0]),
    "polytope": lambda: Polytope([[-1, 0], [0, -1], [1, 1]], [1, 1, 1]),
    "ball": lambda: Ball([0.0, 0.0], 1.0),
    "ellipsoid": lambda: Ellipsoid([0.0, 0.0], [[4.0, 0.0], [0.0, 1.0]]),
    "convexset": lambda: ConvexSet(lambda x: (x ** 2).sum(-1) - 1.0, interior_point=[0, 0]),
}


@pytest.mark.parametrize("name", sorted(CONTAINERS))
def test_numpy_points_give_numpy_answers_equal_to_the_tensor_ones(name):
    K = CONTAINERS[name]()
    rng = np.random.default_rng(0)
    x = 0.3 * rng.uniform(-1, 1, (5, 2))
    v = rng.standard_normal((5, 2))
    inside = K.contains(x)
    assert isinstance(inside, np.ndarray) and inside.dtype == bool and inside.shape == (5,)
    np.testing.assert_array_equal(inside, K.contains(torch.from_numpy(x)).numpy())
    t, normal = hit = K.hit(x, v, 100.0)
    t_ref, n_ref = K.hit(torch.from_numpy(x), torch.from_numpy(v), 100.0)
    assert isinstance(t, np.ndarray) and isinstance(normal, np.ndarray)
    np.testing.assert_array_equal(t, t_ref.numpy())
    np.testing.assert_array_equal(normal, n_ref.numpy())
    assert hit.face.shape == (5,)
    # the exit point lies on the boundary: inside, and just beyond it is outside
    end = x + t[:, None] * v
    assert K.contains(end, 1e-9).all()
    assert not K.contains(end + 1e-6 * normal).any()
    np.testing.assert_allclose(np.linalg.norm(normal, axis=1), 1.0)


def test_tol_is_a_distance_for_box_polytope_ball_and_a_form_value_for_ellipsoid():
    out = np.array([[1.05, 0.0]])  # 0.05 beyond the face x = 1 of each
    assert Box([-1, -1], [1, 1]).contains(out, 0.06) and not Box([-1, -1], [1, 1]).contains(
        out, 0.04)
    square = Polytope([[1, 0], [-1, 0], [0, 1], [0, -1]], [1, 1, 1, 1])
    assert square.contains(out, 0.06) and not square.contains(out, 0.04)
    assert Ball([0, 0], 1.0).contains(out, 0.06) and not Ball([0, 0], 1.0).contains(out, 0.04)
    # the ellipsoid's tol is on (x - c)^T E (x - c) = 1.1025: a factor sqrt(1 + tol)
    E = Ellipsoid([0, 0], np.eye(2))
    assert E.contains(out, 0.11) and not E.contains(out, 0.1)


def test_region_contains_ignores_tol():
    R = Region(lambda x: x[:, 0] > 0)
    x = torch.tensor([[-1e-3, 0.0], [1.0, 0.0]])
    assert R.contains(x, tol=1.0).tolist() == [False, True]


def test_widths_are_the_documented_closed_forms():
    assert Box([0, 0], [1, 3]).width() == 1.0
    assert Ball([0, 0, 0], 2.5).width() == 5.0
    assert Ellipsoid([0, 0], [[4.0, 0.0], [0.0, 1.0]]).width() == 1.0  # 2 / sqrt(4)
    triangle = Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 1])
    assert triangle.width() == pytest.approx(2 * (1 - 1 / math.sqrt(2)), rel=1e-7)
    assert Polytope([[1.0, 0.0]], [1.0]).width() == 2e6  # the LP's radius cap


@pytest.mark.parametrize("start", [[0.0, 0.999999], [0.7, -0.7], [-0.999, 0.0]])
def test_convexset_width_does_not_depend_on_the_interior_point(start):
    # A valid interior point near the boundary gave the chords through it alone: the
    # tangent chord of the unit disc from (0, 1 - 1e-6) is 0.003 long, so the step size
    # was capped at 0.002 (bulk ESS 12 of 1200 draws instead of ~1700).
    disc = ConvexSet(lambda x: (x ** 2).sum(-1) - 1.0, interior_point=start)
    assert disc.width() == pytest.approx(2.0, rel=1e-6)
    # the step-size cap of the sampler follows
    assert disc._step_cap(torch.ones(2, dtype=torch.float64)) == pytest.approx(
        math.sqrt(2.0), rel=1e-6)


def test_convexset_width_is_unchanged_for_a_centred_point_and_a_half_space():
    box = ConvexSet(lambda x: (x / torch.tensor([1.0, 3.0], dtype=x.dtype)).abs().amax(-1) - 1,
                    interior_point=[0.0, 0.0])
    assert box.width() == pytest.approx(2.0, rel=1e-12)
    assert ConvexSet(lambda x: x[:, 0] - 1, interior_point=[0.0, 0.0]).width() == np.inf


def test_convexset_centring_stays_inside_a_thin_set():
    # a needle along the diagonal: the full step to the axis midpoints can leave it, the
    # shorter ones (down to the average of the midpoints) stay inside
    A = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64) / math.sqrt(2)
    scale = torch.tensor([10.0, 0.01], dtype=torch.float64)
    needle = ConvexSet(lambda x: ((x @ A.to(x.dtype).T) / scale.to(x.dtype)).pow(2).sum(-1) - 1,
                       interior_point=[6.0, 6.0])
    w = needle.width()
    # an axis chord of the needle is at most the width across it over sin(45 deg)
    assert 0 < w <= 2 * 0.01 * math.sqrt(2) * (1 + 1e-9)


def test_sampler_on_a_convexset_from_a_boundary_point_takes_full_steps():
    disc = ConvexSet(lambda x: (x ** 2).sum(-1) - 1.0, interior_point=[0.0, 0.999999])
    hmc = ReflectiveHMC(lambda x: torch.zeros(len(x), dtype=x.dtype), disc, n_leapfrog=3,
                        random_state=0)
    hmc.sample(20, n_chains=2, warmup=20)
    assert (hmc.step_size_ > 0.1).all()


def test_attribute_entries_of_a_docstring_without_attributes_is_empty():
    # python -OO strips docstrings and dataclasses write one of their fields: StiefelResult's
    # documentation of its inherited fields must not fail the import then
    from mlpapers.sampling.rehmc._result import attribute_entries

    assert attribute_entries("SampleResult(samples: numpy.ndarray, ...)") == {}
    entries = attribute_entries(SampleResult.__doc__)
    assert list(entries)[:2] == ["samples", "accept_rate"]
    assert entries["n_iterations"].startswith("n_iterations : int\n    Sampling iterations")


@pytest.mark.slow
def test_the_packages_import_without_docstrings():
    # python -OO: the docstring templates of CLoVE/IFCA/FedAvg called None.replace
    # (AttributeError on import) and StiefelResult's parsed a docstring that was not there
    import subprocess
    import sys

    code = "import mlpapers.sampling, mlpapers.federated; print('ok')"
    out = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
