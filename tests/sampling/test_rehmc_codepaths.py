"""Paths the rest of the suite did not reach (found by branch coverage): the baselines of
the demo and the benchmark, the demo's reference problem, the oracles' keyword and pickling
forms, and the start's hints and checks when ``grad_log_prob`` is given."""

import copy
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import Box, ReflectiveHMC
from mlpapers.sampling.rehmc._baselines import (
    hard_rejection_hmc,
    random_walk_metropolis,
    rejection_truncated_normal,
    transform_hmc,
)
from mlpapers.sampling.rehmc._container import Hit
from mlpapers.sampling.rehmc._demo import corner_problem, max_ks
from mlpapers.sampling.rehmc._kernels import ContractError

# short runs: the split R-hat warning is expected and not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")

D = 2
LOG_PROB, BOX, MARGINAL = corner_problem(D)  # N(1, 0.5^2) truncated to [0, 1]^2


def test_corner_problem_density_is_the_truncnorm_of_its_marginal():
    x = np.random.default_rng(0).uniform(size=(50, D))
    lp = LOG_PROB(torch.as_tensor(x)).numpy()
    ref = MARGINAL.logpdf(x).sum(1)
    np.testing.assert_allclose(lp - lp[0], ref - ref[0], atol=1e-12)  # equal up to a constant


def test_exact_rejection_draws_pass_max_ks_and_accept_the_box_mass():
    mu, sd = np.ones(D), np.full(D, 0.5)
    draws, acc = rejection_truncated_normal(mu, sd, BOX, 4000, seed=0)
    assert draws.shape == (4000, D) and BOX.contains(draws).all()
    mass = stats.norm(1.0, 0.5).cdf(1.0) - stats.norm(1.0, 0.5).cdf(0.0)  # per coordinate
    assert abs(acc - mass**D) < 0.01  # 32 000 trials (two batches of 4n): binomial sd about 0.0023
    assert max_ks(draws[None], MARGINAL) < 0.035  # KS 1% critical value for n = 4000: 0.026


def test_random_walk_metropolis_targets_the_truncated_law():
    out = random_walk_metropolis(LOG_PROB, BOX, 500, x0=np.full(D, 0.5), n_chains=4,
                                 warmup=300, thin=4, random_state=0)
    assert out.shape == (4, 500, D) and BOX.contains(out.reshape(-1, D)).all()
    # correlated draws: a looser bound than iid (seeds reach 0.075; a uniform law is 0.3 away)
    assert max_ks(out, MARGINAL) < 0.09


def test_random_walk_metropolis_is_seeded():
    kw = dict(x0=np.full(D, 0.5), n_chains=2, warmup=20, random_state=3)
    a = random_walk_metropolis(LOG_PROB, BOX, 10, **kw)
    np.testing.assert_array_equal(a, random_walk_metropolis(LOG_PROB, BOX, 10, **kw))


def test_transform_hmc_jacobian_makes_a_flat_density_uniform():
    box = Box([-1.0, 2.0], [1.0, 5.0])  # bounds of both signs, unequal widths

    def flat(x):
        return torch.zeros(x.shape[0], dtype=x.dtype) + 0.0 * x.sum(-1)

    res = transform_hmc(flat, box, 150, x0=[0.0, 3.5], n_chains=4, warmup=60,
                        n_leapfrog=5, random_state=0)
    x = res.samples.reshape(-1, 2)
    assert box.contains(x).all()
    for j in range(2):  # without the log-Jacobian the draws would pile up at the bounds
        u = (x[:, j] - box.lo[j]) / (box.hi[j] - box.lo[j])
        assert stats.kstest(u, "uniform").statistic < 0.11  # 0.5-0.75 without the Jacobian


def test_hard_rejection_hmc_never_keeps_a_point_outside():
    res = hard_rejection_hmc(LOG_PROB, BOX, 100, x0=np.full(D, 0.5), n_chains=2, warmup=50,
                             n_leapfrog=5, random_state=0)
    assert BOX.contains(res.samples.reshape(-1, D)).all()
    # trajectories that left the box were rejected (as divergent), never kept
    assert res.sample_stats["diverging"].any()


def test_hit_pickles_and_copies_with_its_face():
    hit = BOX.hit(torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]))
    for other in (pickle.loads(pickle.dumps(hit)), copy.copy(hit), copy.deepcopy(hit)):
        assert isinstance(other, Hit)
        assert torch.equal(other.t, hit.t) and torch.equal(other.normal, hit.normal)
        assert torch.equal(other.face, hit.face)
    assert repr(hit).startswith("Hit(t=tensor([0.5")


@pytest.mark.parametrize("v", [np.array([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])])
def test_hit_takes_numpy_points_with_v_by_keyword(v):
    x = np.array([[0.5, 0.25]])
    t, normal = BOX.hit(x, v=v)
    t_pos, normal_pos = BOX.hit(x, np.array([[1.0, 0.0]]))
    assert isinstance(t, np.ndarray) and t.tolist() == t_pos.tolist() == [0.5]
    np.testing.assert_array_equal(normal, normal_pos)


def test_one_point_log_prob_with_grad_log_prob_gets_the_vmap_hint():
    # with grad_log_prob, log_prob runs under no_grad, so a one-point function may call
    # x.numpy(): the one-point test must call it the same way to recognise it
    def one_point(x):
        a = x.numpy()
        return torch.as_tensor(-0.5 * float(np.dot(a, a)))

    with pytest.raises(ValueError, match="aligned") as info:
        ReflectiveHMC(one_point, BOX, grad_log_prob=lambda x: -x,
                      random_state=0).sample(5, warmup=2)
    assert "torch.vmap" in "\n".join(getattr(info.value, "__notes__", []))


def test_log_prob_of_wrong_shape_with_grad_log_prob_is_a_contract_error():
    with pytest.raises(ContractError, match=r"log_prob must return a tensor of shape \(4,\)"):
        ReflectiveHMC(lambda x: -0.5 * (x * x), BOX, grad_log_prob=lambda x: -x,
                      random_state=0).sample(5, warmup=2)


def test_grad_log_prob_returning_a_graph_gives_the_same_draws():
    def grad_graph(x):  # e.g. computed by autograd inside, with create_graph
        w = torch.ones(1, dtype=x.dtype, requires_grad=True)
        return -(x - 1.0) / 0.25 * w

    kw = dict(n_leapfrog=3, random_state=0)
    a = ReflectiveHMC(LOG_PROB, BOX, grad_log_prob=grad_graph, **kw).sample(20, warmup=10)
    b = ReflectiveHMC(LOG_PROB, BOX, grad_log_prob=lambda x: -(x - 1.0) / 0.25,
                      **kw).sample(20, warmup=10)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert not torch.as_tensor(a.sample_stats["lp"]).requires_grad


# ---- documented errors and the objects' reprs ------------------------------------------

def test_diagnostics_refuse_bad_draws_and_kinds_and_are_defined_from_four_draws():
    from mlpapers.sampling import ess, rhat

    with pytest.raises(ValueError, match=r"draws must have shape \(chains, draws\[, d\]\)"):
        rhat(np.zeros(10))
    with pytest.raises(ValueError, match=r"kind must be one of \['bulk', 'tail'\]"):
        ess(np.zeros((2, 10)), kind="median")
    x = np.random.default_rng(0).standard_normal((3, 4))
    assert np.isfinite(rhat(x)) and np.isnan(rhat(x[:, :3]))  # MIN_DRAWS = 4 per chain


@pytest.mark.parametrize("make, err, match", [
    (lambda: Box(0.0, 1.0), ValueError, "Box needs vector bounds or dim="),
    (lambda: _sup().Polytope([[1.0, 0.0], [0.0, 0.0]], [1.0, 1.0]), ValueError,
     "all-zero row"),
    (lambda: _sup().Polytope([[1.0, 0.0], [1.0]], [1.0, 1.0]), ValueError,
     "A must be a rectangular numeric array"),
    (lambda: _sup().Ellipsoid([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]]), ValueError,
     "E must be symmetric"),
    (lambda: _sup().Ellipsoid([], [[1.0]]), ValueError, "center must not be empty"),
    (lambda: _sup().Ball([[0.0, 0.0]], 1.0), ValueError, "center must be 1D, got a 2D"),
    (lambda: _sup().ConvexSet(5), TypeError, "g must be callable"),
    (lambda: _sup().ConvexSet(lambda x: x.sum(-1), grad_g=5), TypeError,
     "grad_g must be callable or None"),
    (lambda: _sup().ConvexSet(lambda x: (x * x).sum(-1, keepdim=True) - 1.0, dim=2),
     ValueError, r"g must map \(C, d\) to \(C,\), got shape \(1, 1\)"),
    (lambda: _sup().polar_factor(np.ones(3)), ValueError, r"X must have shape \(\.\.\., n, k\)"),
])
def test_constructor_errors(make, err, match):
    with pytest.raises(err, match=match):
        make()


def _sup():
    import mlpapers.sampling as sampling

    return sampling


def test_convex_set_hit_needs_the_bracket():
    disc = _sup().ConvexSet(lambda x: (x * x).sum(-1) - 1.0, dim=2)
    with pytest.raises(ValueError, match="ConvexSet.hit needs t_max"):
        disc.hit(torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64))


def test_sampler_parameter_errors():
    with pytest.raises(ValueError, match=r"jitter must be in \[0, 1\) with an integer "
                                         r"n_leapfrog .*got 1.0"):
        ReflectiveHMC(LOG_PROB, BOX, n_leapfrog=10, jitter=1.0).sample(5, warmup=2)
    with pytest.raises(ValueError, match=r"jitter must be in \[0, 1\] with n_leapfrog='auto', "
                                         r"got 1.5"):
        ReflectiveHMC(LOG_PROB, BOX, jitter=1.5).sample(5, warmup=2)
    # j = 1 is what True means with "auto" (it was refused, so the default could not be
    # written out): the same draws
    default, explicit = (ReflectiveHMC(LOG_PROB, BOX, jitter=j, random_state=0).sample(
        5, warmup=20, n_chains=4).samples for j in (True, 1.0))
    np.testing.assert_array_equal(default, explicit)
    with pytest.raises(TypeError, match="support must be a Region, a ConvexContainer or None"):
        ReflectiveHMC(LOG_PROB, BOX, support="annulus").sample(5, warmup=2)
    disc = _sup().ConvexSet(lambda x: (x * x).sum(-1) - 1.0)  # dimension from x0
    with pytest.raises(ValueError, match="support has dimension 3 but x0 gives the container "
                                         "dimension 2"):
        ReflectiveHMC(LOG_PROB, disc, support=Box([-1.0] * 3, [1.0] * 3)).sample(
            5, x0=[0.0, 0.0], warmup=2)
    with pytest.raises(TypeError, match="log_density must be callable or None"):
        _sup().StiefelSampler(5, n=3, k=1).sample(5, warmup=2)


def test_reprs_name_the_object_and_its_size():
    s = _sup()
    assert repr(Box([0.0, 0.0], [1.0, 2.0])) == "Box(dim=2)"
    assert repr(s.Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))) == \
        "Polytope(n_faces=4, dim=2)"
    assert repr(s.Ball([0.0, 0.0, 0.0], 2.5)) == "Ball(dim=3, radius=2.5)"
    assert repr(s.Ellipsoid([0.0, 0.0], np.eye(2))) == "Ellipsoid(dim=2)"
    assert repr(s.ConvexSet(lambda x: (x * x).sum(-1) - 1.0, dim=2)) == "ConvexSet(dim=2)"
    assert repr(s.Region(lambda x: x[:, 0] > 0)) == "Region(...)"
    F = np.ones((3, 2))
    assert repr(s.matrix_von_mises_fisher_log_density(F)) == \
        "matrix_von_mises_fisher_log_density(F of shape (3, 2))"
    assert repr(s.bingham_log_density(np.eye(3), np.eye(2))).startswith(
        "bingham_log_density(A of shape (3, 3), ")


def test_summary_pretty_prints_as_its_text():
    res = ReflectiveHMC(LOG_PROB, BOX, n_leapfrog=2, random_state=0).sample(10, warmup=5)
    summary = res.summary()
    printed = []

    class Printer:  # IPython's pretty printer: only .text is used
        def text(self, s):
            printed.append(s)

    summary._repr_pretty_(Printer(), False)
    assert printed == [str(summary)]


@pytest.mark.parametrize("field, value, match", [
    ("step_size", np.ones(3), r"step_size has shape \(3,\), expected \(2,\)"),
    ("inv_mass", np.array([1.0, np.nan]), "inv_mass is not finite"),
    ("step_size", np.array([0.1, -0.1]), "step_size and inv_mass must be positive"),
])
def test_resume_refuses_a_result_modified_by_hand(field, value, match):
    hmc = ReflectiveHMC(LOG_PROB, BOX, n_leapfrog=2, random_state=0)
    res = hmc.sample(5, n_chains=2, warmup=5)
    setattr(res, field, value)
    with pytest.raises(ValueError, match=match):
        hmc.sample(5, resume=res)


# ---- regression: ConvexSet's start-up search handed g its own points ------------------

CENTRE = torch.tensor([3.0, 3.0], dtype=torch.float64)


def _g_in_place(x):  # the disc of radius 1 about (3, 3), written as x -= c (numpy style)
    x -= CENTRE
    return (x * x).sum(-1) - 1.0


def _grad_g_in_place(x):
    x -= CENTRE
    return 2.0 * x


@pytest.mark.parametrize("grad_g", [None, _grad_g_in_place])
def test_convex_set_interior_point_survives_a_g_that_works_in_place(grad_g):
    s = _sup()
    given = s.ConvexSet(_g_in_place, grad_g, interior_point=[3.2, 2.9])
    np.testing.assert_array_equal(given.interior_point(), [3.2, 2.9])  # was [0.2, -0.1]
    found = s.ConvexSet(_g_in_place, grad_g, dim=2)  # searched from the origin: was refused
    x0 = found.interior_point()
    assert np.linalg.norm(x0 - CENTRE.numpy()) < 1.0
    bound = s.ConvexSet(_g_in_place, grad_g)
    bound._bind(np.array([[3.5, 3.0], [3.0, 3.5]]))  # from sample's x0: their mean
    np.testing.assert_array_equal(bound.interior_point(), [3.25, 3.25])


# ---- a user's container: the oracle check -------------------------------------------

class _UnitSquare(_sup().ConvexContainer):
    """[-1, 1]^2 with a user's hit: ``face`` of the wrong shape, or the plain pair."""

    dim = 2

    def __init__(self, bad_face):
        self.bad_face = bad_face

    def contains(self, x, tol=0.0):
        return (x.abs() <= 1.0 + tol).all(-1)

    def interior_point(self):
        return np.zeros(2)

    def hit(self, x, v, t_max=None, exclude=None):
        t_axis = torch.where(v > 0, (1.0 - x) / v,
                             torch.where(v < 0, (-1.0 - x) / v, torch.full_like(x, math.inf)))
        t, j = t_axis.min(-1)
        normal = torch.nn.functional.one_hot(j, 2).to(x) * torch.sign(
            v.gather(1, j[:, None]))
        if self.bad_face:
            return Hit(t, normal, j[:, None])  # (C, 1): would broadcast
        return t, normal


def test_a_user_container_with_faces_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"hit must return face indices, a tensor of shape "
                                         r"\(2,\), for \(2, 2\) points"):
        ReflectiveHMC(LOG_PROB, _UnitSquare(bad_face=True)).sample(5, x0=[0.5, 0.5], warmup=2)


def test_a_user_container_answering_the_pair_samples_inside():
    res = ReflectiveHMC(lambda x: -0.5 * (x * x).sum(-1) / 4.0, _UnitSquare(bad_face=False),
                        n_leapfrog=4, random_state=0).sample(50, x0=[0.5, 0.5], warmup=30)
    assert (np.abs(res.samples) <= 1.0).all() and np.sum(res.n_reflections) > 0


def test_no_starting_point_in_a_support_the_container_misses_is_an_error():
    tiny = _sup().Region(lambda x: (x - 0.5).norm(dim=-1) < 1e-9)
    with pytest.raises(ValueError, match="could not find starting points in the support"):
        ReflectiveHMC(LOG_PROB, BOX, support=tiny, random_state=0).sample(5, warmup=2)


def test_random_starts_where_log_prob_is_minus_inf_are_drawn_again():
    # a density that is -inf on part of the container (a constraint written into
    # log_prob) failed at the random starting points; chains there now draw new
    # points, as Stan retries its random inits, and sample the truncated law
    def truncated(x):
        return torch.where(x[:, 0] > 0.5, -torch.inf, 0.0 * x[:, 0])

    box = Box([-1.0, -1.0], [1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the -inf side's rejections count as divergent
        res = ReflectiveHMC(truncated, box, random_state=0).sample(1000, n_chains=4,
                                                                   warmup=300)
    x = res.samples.reshape(-1, 2)
    assert x[:, 0].max() <= 0.5
    # uniform on [-1, 0.5] x [-1, 1]; a KS bound loose enough for correlated draws
    assert stats.kstest(x[:, 0], "uniform", args=(-1.0, 1.5)).statistic < 0.05
    # nowhere finite: the error says how many chains and what to do
    with pytest.raises(ValueError, match=r"not finite at 4 of the 4 chains' starting "
                                         r"points after 100 random points each; pass x0"):
        ReflectiveHMC(lambda x: truncated(x) - torch.inf, box, random_state=0).sample(
            5, n_chains=4, warmup=2)
    # a user's x0 is not moved: the error is about the starting points given
    with pytest.raises(ValueError, match="not finite at the starting points"):
        ReflectiveHMC(truncated, box, random_state=0).sample(5, x0=[0.9, 0.0], n_chains=4,
                                                             warmup=2)


# -- inputs a probe found accepted or failing deep inside (session 37) -----------------
def _flat(x):
    return 0.0 * x.sum(-1)


def test_a_container_the_dtype_cannot_resolve_is_refused():
    """A float32 box [1e8, 1e8 + 1] (values 8 apart there) held every draw at one point
    with acceptance 1 and no warning; a polytope of that width failed with a
    ZeroDivisionError. float64 resolves it, and float32 resolves it near the origin."""
    from mlpapers.sampling import Ball, Polytope

    far = [Box([1e8], [1e8 + 1]), Polytope([[1.0], [-1.0]], [1e8 + 1, -1e8]),
           Ball([1e8, 0.0], 1.0)]
    with pytest.raises(ValueError, match=r"^the container is too narrow for float32 along "
                                         r"coordinate 0: width 1 at values up to 1e\+08, "
                                         r"where they are 8 apart"):
        ReflectiveHMC(_flat, far[0], dtype="float32", random_state=0).sample(
            5, n_chains=4, warmup=5)
    for container in far[1:]:
        with pytest.raises(ValueError, match=r"^the container is too narrow for float32 where "
                                             r"it lies: width [12] at coordinates up to "
                                             r"1e\+08, where its values are 8 apart"):
            ReflectiveHMC(_flat, container, dtype="float32", random_state=0).sample(
                5, n_chains=4, warmup=5)
    draws = ReflectiveHMC(_flat, far[0], random_state=0).sample(
        300, n_chains=4, warmup=100).samples
    assert draws.min() >= 1e8 and draws.max() <= 1e8 + 1
    assert 0.2 < draws.std() < 0.4  # uniform on a unit interval: 0.289
    near = ReflectiveHMC(_flat, Box([0.0], [1.0]), dtype="float32", random_state=0).sample(
        300, n_chains=4, warmup=100).samples
    assert 0.2 < near.std() < 0.4


def test_a_box_is_resolved_coordinate_by_coordinate():
    """A rate in (0, 1e-3) beside a count in (1e5, 2e5) was refused in float32: the
    smallest side was compared with the spacing at the largest coordinate, though each
    coordinate is resolved on its own (float64: (0, 1e-8) beside (1e10, 2e10))."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a short run: only that it is not refused)
        far = ReflectiveHMC(_flat, Box([0.0, 1e10], [1e-8, 2e10]), mass="diag",
                            random_state=0).sample(20, n_chains=2, warmup=20).samples
    assert np.all(far >= [0.0, 1e10]) and np.all(far <= [1e-8, 2e10])
    lo, hi = [0.0, 1e5], [1e-3, 2e5]
    res = ReflectiveHMC(_flat, Box(lo, hi), mass="diag", dtype="float32",
                        random_state=0).sample(400, n_chains=4, warmup=300)
    x = res.samples.reshape(-1, 2).astype(np.float64)
    side = np.subtract(hi, lo)
    assert np.all(x >= lo) and np.all(x <= hi)
    # uniform per coordinate: sd side / sqrt(12) (0.289 of the side)
    np.testing.assert_allclose(x.std(0) / side, 1 / np.sqrt(12), rtol=0.15)
    assert len(np.unique(x[:, 0])) > 0.9 * len(x)


def test_a_step_size_that_adapts_to_zero_is_an_error(monkeypatch):
    # the guard behind the resolution check: without it, the same polytope collapsed the
    # step size and math.ceil(length / 0) raised a bare ZeroDivisionError
    from mlpapers.sampling import Polytope
    from mlpapers.sampling.rehmc import _sampler

    monkeypatch.setattr(_sampler, "check_resolution", lambda container, dtype: None)
    with pytest.raises(FloatingPointError, match=r"^the adapted step size fell to 0.0"):
        ReflectiveHMC(_flat, Polytope([[1.0], [-1.0]], [1e8 + 1, -1e8]), dtype="float32",
                      random_state=0).sample(200, n_chains=4, warmup=100)


@pytest.mark.parametrize("with_grad", [False, True])
def test_complex_log_densities_are_refused(with_grad):
    # the imaginary part was dropped, with only torch's casting warning
    def lp(x):
        return -0.5 * (x ** 2).sum(-1) + 1j * x.sum(-1)

    def glp(x):
        return -x + 0j

    kw = dict(grad_log_prob=glp) if with_grad else {}
    name = "log_prob"
    with pytest.raises(TypeError, match=rf"^{name} must return real values, got torch.complex"):
        ReflectiveHMC(lp, Box([-1.0], [1.0]), random_state=0, **kw).sample(5, warmup=5)
    if with_grad:  # a real log_prob with a complex gradient
        with pytest.raises(TypeError, match=r"^grad_log_prob must return real values"):
            ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([-1.0], [1.0]),
                          grad_log_prob=glp, random_state=0).sample(5, warmup=5)


@pytest.mark.parametrize("with_grad", [False, True])
def test_boolean_log_densities_are_refused(with_grad):
    # a mask returned by mistake was read as the log densities 0 and 1, silently
    kw = dict(grad_log_prob=lambda x: torch.zeros_like(x)) if with_grad else {}
    with pytest.raises(TypeError, match=r"^log_prob must return real values, got "
                                        r"torch.bool \(a mask\?\); for a density restricted"):
        ReflectiveHMC(lambda x: (x < 0.5).all(-1), Box([0.0, 0.0], [1.0, 1.0]),
                      random_state=0, **kw).sample(5, warmup=5)
    if with_grad:
        with pytest.raises(TypeError, match=r"^grad_log_prob must return real values, got "
                                            r"torch.bool \(a mask\?\)\.$"):
            ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([-1.0], [1.0]),
                          grad_log_prob=lambda x: x > 0, random_state=0).sample(5, warmup=5)


def test_hit_checks_the_brackets_and_faces_users_pass():
    """numpy t_max arrays passed unchecked (inf: a bounded ConvexSet "never left"; -1:
    the same), and arrays of another length than the points failed inside torch."""
    from mlpapers.sampling.rehmc import ConvexSet

    disc = ConvexSet(lambda x: x.norm(dim=-1) - 1.0, dim=2)
    x, v = np.zeros((2, 2)), np.eye(2)
    np.testing.assert_allclose(disc.hit(x, v, np.array([5.0, 5.0])).t, [1.0, 1.0])
    for t_max, match in [(np.array([np.inf, np.inf]), "^ConvexSet.hit needs a finite t_max"),
                         (np.array([-1.0, -1.0]), r"^t_max must be >= 0"),
                         (np.array([5.0, 5.0, 5.0]), r"^t_max must be a number or an array "
                                                     r"of shape \(2,\), one per point")]:
        with pytest.raises(ValueError, match=match):
            disc.hit(x, v, t_max)
    box = Box([0.0] * 3, [1.0] * 3)
    x3, v3 = np.full((2, 3), 0.5), np.ones((2, 3))
    np.testing.assert_allclose(box.hit(x3, v3, np.array([np.inf, np.inf])).t, [0.5, 0.5])
    np.testing.assert_allclose(box.hit(x3, v3, None, np.array([-1, -1])).t, [0.5, 0.5])
    with pytest.raises(ValueError, match=r"^exclude must be a number or an array of shape "
                                         r"\(2,\)"):
        box.hit(x3, v3, None, np.array([0, 0, 0]))
    for bad in (-1, np.array([0.0, 1.0])):
        with pytest.raises(TypeError, match=r"^exclude must be None or an integer tensor"):
            box.hit(x3, v3, None, bad)
