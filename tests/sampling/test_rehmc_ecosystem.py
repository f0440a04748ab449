"""Session-7 audit: unbounded polytopes, arviz agreement, user-side lifecycle."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.sampling import Polytope, ReflectiveHMC, ess, rhat


def test_unbounded_polytope_starts_near_the_origin():
    # The Chebyshev LP of an unbounded polytope stops at its radius cap (1e6), so the
    # interior point (and every default starting point) used to lie ~1e6 from the faces:
    # an exponential target on the orthant then kept R-hat 2.4 after 500 warm-up steps.
    orthant = Polytope(-np.eye(3), np.zeros(3))
    np.testing.assert_allclose(orthant.interior_point(), np.ones(3), atol=1e-7)
    half = Polytope([[-1.0, 0.0]], [-2.0])  # x_0 >= 2
    c = half.interior_point()
    assert c[0] == pytest.approx(3.0) and abs(c[1]) <= 3.0 + 1e-7
    x = orthant.random_interior(64, torch.Generator().manual_seed(0))
    assert bool(orthant.contains(x).all()) and float(x.abs().max()) < 2.0
    assert orthant.width() >= 1e6  # still treated as uncapped for the step size
    # a bounded polytope keeps its Chebyshev centre
    box = Polytope(np.vstack([np.eye(2), -np.eye(2)]), [5.0, 3.0, -1.0, -1.0])  # [1,5]x[1,3]
    c = box.interior_point()
    assert 2.0 - 1e-7 <= c[0] <= 4.0 + 1e-7 and c[1] == pytest.approx(2.0) and box.width() == 2


def test_unbounded_orthant_exponential_target():
    hmc = ReflectiveHMC(lambda x: -x.sum(-1), Polytope(-np.eye(2), np.zeros(2)),
                        n_leapfrog=8, random_state=0)
    res = hmc.sample(200, n_chains=4, warmup=200)
    assert (res.samples >= 0).all()
    assert np.abs(res.samples.mean((0, 1)) - 1.0).max() < 0.3  # Exp(1) marginals
    assert np.nanmax(res.rhat()) < 1.1


def test_diagnostics_match_arviz():
    az = pytest.importorskip("arviz")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 203))
    for t in range(1, x.shape[1]):
        x[:, t] += 0.8 * x[:, t - 1]
    assert ess(x, "bulk") == pytest.approx(float(az.ess(x, method="bulk")), rel=1e-10)
    assert ess(x, "tail") == pytest.approx(float(az.ess(x, method="tail")), rel=1e-10)
    assert rhat(x) == pytest.approx(float(az.rhat(x, method="rank")), rel=1e-10)


def test_result_pickles_and_feeds_arviz_summary():
    az = pytest.importorskip("arviz")
    hmc = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), Polytope(np.eye(2), [1.0, 1.0]),
                        n_leapfrog=5, random_state=0)
    res = pickle.loads(pickle.dumps(hmc.sample(100, n_chains=2, warmup=100)))
    summ = az.summary(res.to_inference_data())
    np.testing.assert_allclose(summ["mean"].to_numpy(), res.samples.mean((0, 1)), atol=6e-3)
    np.testing.assert_allclose(summ["ess_bulk"].to_numpy(), res.ess("bulk"), atol=0.51)


def test_float32_module_log_prob_gets_a_dtype_hint():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    box = Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))
    with pytest.raises(RuntimeError, match="dtype=torch.float32"):
        ReflectiveHMC(lambda x: net(x).squeeze(-1), box).sample(5, n_chains=2, warmup=0)
    res = ReflectiveHMC(lambda x: net(x).squeeze(-1), box, dtype=torch.float32, n_leapfrog=3,
                        random_state=0).sample(20, n_chains=2, warmup=20)
    assert res.samples.dtype == np.float32
    with pytest.raises(ValueError, match=r"got \(2, 1\)\. .*squeeze"):
        ReflectiveHMC(net, box, dtype=torch.float32).sample(5, n_chains=2, warmup=0)


def test_huge_bounded_polytope_keeps_its_chebyshev_centre():
    # inradius above the 1e6 cap but bounded: not treated as unbounded
    box = Polytope(np.vstack([np.eye(2), -np.eye(2)]), [1e7, 1e7, 0.0, 0.0])
    c = box.interior_point()
    assert c.min() >= 1e6 - 1 and c.max() <= 9e6 + 1
    strip = Polytope([[1.0, 0.0], [-1.0, 0.0], [0.0, -1.0]], [3e6, 0.0, 0.0])  # unbounded
    assert strip.interior_point().max() <= 1.0 + 1e-7


def test_stiefel_warnings_point_at_the_caller():
    from mlpapers.sampling import StiefelSampler

    with pytest.warns(UserWarning, match="n_chains >= 2") as rec:
        StiefelSampler(n=3, k=1, random_state=0).sample(20, n_chains=1, warmup=20)
    assert all(r.filename == __file__ for r in rec)


def test_convex_set_with_a_numpy_level_function():
    from mlpapers.sampling import ConvexSet

    def g(x):
        return (np.asarray(x) ** 2).sum(-1) - 1.0

    with pytest.raises(TypeError, match="pass grad_g"):  # used to fail deep inside torch
        ConvexSet(g, interior_point=[0.0, 0.0])
    K = ConvexSet(g, lambda x: 2 * np.asarray(x), interior_point=[0.0, 0.0])
    x = torch.tensor([[0.0, 0.0], [0.5, 0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    t, normal = K.hit(x, v, torch.full((2,), 4.0, dtype=torch.float64))
    np.testing.assert_allclose(t.numpy(), [1.0, np.sqrt(0.75) / 2], rtol=1e-10)
    np.testing.assert_allclose(normal[1].numpy(), [0.5, np.sqrt(0.75)], rtol=1e-10)


@pytest.mark.parametrize("width", [0.5, 1000.0, 1.9e6, 2.1e6])
def test_unbounded_polytope_below_the_radius_cap_starts_near_the_origin(width):
    # a half-strip 0 <= x0 <= width, x1 >= 0: unbounded with a finite inradius (width/2),
    # whose Chebyshev centre can sit anywhere along x1 (at width/2 with HiGHS)
    strip = Polytope([[-1.0, 0.0], [1.0, 0.0], [0.0, -1.0]], [0.0, width, 0.0])
    ball = min(1.0, width / 2)
    c = strip.interior_point()
    assert np.abs(c).max() <= ball + 1e-7
    assert strip.contains(torch.as_tensor(c)[None]).all()
    starts = strip.random_interior(200, torch.Generator().manual_seed(0))
    assert strip.contains(starts).all()
    assert (starts - torch.as_tensor(c)).norm(dim=1).max() <= ball + 1e-7


def test_float64_module_on_float32_chains_gets_the_matching_hint():
    net = torch.nn.Linear(2, 1).double()
    box = Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))
    with pytest.raises(RuntimeError, match=r"convert the model to torch\.float32") as info:
        ReflectiveHMC(lambda x: net(x).squeeze(-1), box, dtype=torch.float32).sample(
            5, n_chains=2, warmup=0)
    assert "pass dtype=torch.float32" not in str(info.value)
