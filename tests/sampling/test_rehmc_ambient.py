"""ReflectiveHMC / StiefelSampler and the rehmc functions under the caller's ambient state.

Every public entry point gives bitwise the draws it gives outside a caller's no_grad,
inference_mode, other default dtype, deterministic algorithms or anomaly detection
(``tests/_ambient.py``), leaves the global state and the user's objects alone, and runs
in threads with the results of sequential calls.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mlpapers.sampling.rehmc import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    bingham_log_density,
    ess,
    matrix_von_mises_fisher_log_density,
    polar_factor,
    rhat,
)
from tests._ambient import AMBIENT, check_ambient, check_state_untouched, check_thread_safe

pytestmark = pytest.mark.filterwarnings(
    "ignore:the chains disagree:RuntimeWarning",  # short runs, on purpose
    "ignore:only .* of the draws fall in the support:RuntimeWarning",
)


def _log_prob(x):  # a standard normal, pulled away from the origin by the supports
    return -0.5 * ((x - 0.25) ** 2).sum(-1)


CONTAINERS = {
    "box": lambda: Box([-1.0, -1.0], [1.0, 2.0]),
    "polytope": lambda: Polytope([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], [1.0, 1.0, 1.0]),
    "ball": lambda: Ball([0.0, 0.0], 1.5),
    "ellipsoid": lambda: Ellipsoid([0.0, 0.0], [[2.0, 0.0], [0.0, 1.0]]),
    # a bisection oracle whose normals come from autograd
    "convexset": lambda: ConvexSet(lambda x: (x**2).sum(-1) - 1.0, interior_point=[0.0, 0.0]),
}


def _draws(container: str, **options):
    def call():
        sampler = ReflectiveHMC(_log_prob, CONTAINERS[container](), n_leapfrog=2,
                                random_state=0, **options)
        res = sampler.sample(6, n_chains=2, warmup=8)
        return res.samples, res.sample_stats, res.last_state, sampler.step_size_
    return call


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("container", list(CONTAINERS))
def test_sample_is_indifferent_to_the_ambient_state(container, context):
    # inside inference_mode the autograd gradient of log_prob used to be silently zero
    # (other draws: a random walk), and the ConvexSet normals raised a torch error
    # (a fixed step for the bisection oracle: the step-size search costs 30 leapfrogs)
    options = {"step_size": 0.3} if container == "convexset" else {}
    check_ambient(_draws(container, **options), context)


def _adaptive_thinned():
    # ChEES lengths, a diagonal mass, thinning and a non-convex support kept by thinning
    sampler = ReflectiveHMC(_log_prob, Ball([0.0, 0.0], 2.0), mass="diag",
                            support=Region(lambda x: x.norm(dim=-1) >= 0.5), random_state=0)
    res = sampler.sample(5, n_chains=2, warmup=24, thin=2)
    return res.samples, res.inv_mass, res.trajectory_length, res.kept_fraction


def _resumed():
    sampler = ReflectiveHMC(_log_prob, Box([-1.0, -1.0], [1.0, 2.0]), n_leapfrog=2,
                            random_state=0)
    first = sampler.sample(4, n_chains=2, warmup=10)
    return sampler.sample(4, resume=first).samples


def _with_gradient():  # grad_log_prob: log_prob runs under no_grad at trajectory ends
    sampler = ReflectiveHMC(_log_prob, Ball([0.0, 0.0], 1.5), grad_log_prob=lambda x: 0.25 - x,
                            n_leapfrog=2, random_state=0)
    return sampler.sample(6, n_chains=2, warmup=10).samples


def _float32():
    sampler = ReflectiveHMC(_log_prob, Polytope([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]],
                                                [1.0, 1.0, 1.0]),
                            n_leapfrog=2, dtype=torch.float32, random_state=0)
    res = sampler.sample(6, n_chains=2, warmup=10, return_tensor=True)
    return res.samples, res.samples_tensor


def _stiefel():
    sampler = StiefelSampler(matrix_von_mises_fisher_log_density(np.ones((3, 2))), n=3, k=2,
                             n_leapfrog=2, random_state=0)
    first = sampler.sample(3, n_chains=2, warmup=6)
    return first.Q, sampler.sample(3, resume=first).X


RUNS = {"adaptive_thinned": _adaptive_thinned, "resumed": _resumed,
        "grad_log_prob": _with_gradient, "float32": _float32, "stiefel": _stiefel}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("run", list(RUNS))
def test_options_resume_and_stiefel_are_indifferent_to_the_ambient_state(run, context):
    check_ambient(RUNS[run], context)


@pytest.fixture(scope="module")
def result():
    return ReflectiveHMC(_log_prob, Box([-1.0, -1.0], [1.0, 2.0]), n_leapfrog=2,
                         random_state=0).sample(30, n_chains=2, warmup=10)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_diagnostics_and_densities_are_indifferent_to_the_ambient_state(result, context):
    X = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64).reshape(4, 3, 2) + torch.eye(
        3, 2, dtype=torch.float64)
    vmf = matrix_von_mises_fisher_log_density(np.arange(6.0).reshape(3, 2))
    bingham = bingham_log_density(np.diag([3.0, 2.0, 1.0]), np.diag([1.0, 0.5]))

    def call():
        return (result.ess(), result.ess("tail"), result.rhat(), result.summary(),
                ess(result.samples), rhat(result.samples), polar_factor(X),
                polar_factor(X.numpy()), vmf(X), bingham(X))

    check_ambient(call, context)


def test_polar_factor_follows_the_callers_grad_mode():
    """A public differentiable function: a graph only where the caller records one."""
    X = (torch.eye(3, 2, dtype=torch.float64) + 0.1).requires_grad_(True)
    with torch.no_grad():
        assert polar_factor(X).grad_fn is None
    Q = polar_factor(X)
    assert Q.grad_fn is not None
    (g,) = torch.autograd.grad(Q.sum(), X)
    assert torch.isfinite(g).all()


def test_inference_tensors_in_log_prob_raise_with_a_hint():
    """The sampler differentiates log_prob even inside inference_mode (it used to run with a
    zero gradient there); torch refuses a tensor made in that mode, and the note says what
    to do."""
    with torch.inference_mode():
        A = torch.eye(2, dtype=torch.float64)
        sampler = ReflectiveHMC(lambda x: -0.5 * ((x @ A) * x).sum(-1), Box([-1, -1], [1, 1]),
                                n_leapfrog=2, random_state=0)
        with pytest.raises(RuntimeError, match="[Ii]nference tensors") as info:
            sampler.sample(3, n_chains=2, warmup=2)
    assert any("created under torch.inference_mode()" in n and "grad_log_prob" in n
               for n in getattr(info.value, "__notes__", []))
    # with grad_log_prob no autograd is needed: it runs, with the draws of a normal tensor
    with torch.inference_mode():
        A = torch.eye(2, dtype=torch.float64)
        inside = ReflectiveHMC(lambda x: -0.5 * ((x @ A) * x).sum(-1), Box([-1, -1], [1, 1]),
                               grad_log_prob=lambda x: -(x @ A), n_leapfrog=2,
                               random_state=0).sample(4, n_chains=2, warmup=4)
    B = torch.eye(2, dtype=torch.float64)
    outside = ReflectiveHMC(lambda x: -0.5 * ((x @ B) * x).sum(-1), Box([-1, -1], [1, 1]),
                            n_leapfrog=2, random_state=0).sample(4, n_chains=2, warmup=4)
    np.testing.assert_array_equal(inside.samples, outside.samples)


def test_convex_set_oracle_works_in_inference_mode():
    """ConvexSet.hit is public: its autograd normals used to raise inside inference_mode."""
    K = ConvexSet(lambda x: (x**2).sum(-1) - 1.0, interior_point=[0.0, 0.0])
    x = torch.tensor([[0.0, 0.0], [0.5, 0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    t_max = torch.full((2,), 10.0, dtype=torch.float64)
    expected = K.hit(x, v, t_max)
    with torch.inference_mode():
        xi, vi, ti = x.clone(), v.clone(), t_max.clone()  # inference tensors
        got = K.hit(xi, vi, ti)
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the exact exit of the unit circle and its outward normal
    torch.testing.assert_close(expected[0], torch.tensor([1.0, 0.75**0.5], dtype=torch.float64))
    torch.testing.assert_close(expected[1][1], torch.tensor([0.5, 0.75**0.5],
                                                            dtype=torch.float64))


@pytest.mark.parametrize("context", ["default_float16", "default_bfloat16", "default_float64"])
def test_log_prob_in_the_default_dtype_loses_no_precision_in_the_sampler(context):
    """A log_prob whose constants follow the default dtype computes other numbers under
    another default (the user's function), but the sampler adds no rounding: the draws are
    those of the same constants given explicitly, in float64."""

    def default_dtype_log_prob(x):
        return -0.5 * ((x - torch.tensor([0.3, -0.2])) ** 2).sum(-1)

    def run(log_prob):
        res = ReflectiveHMC(log_prob, Ball([0.0, 0.0], 1.5), n_leapfrog=2,
                            random_state=0).sample(6, n_chains=2, warmup=10)
        return res.samples, res.sample_stats["lp"], res.sample_stats["energy"]

    with AMBIENT[context]():
        mu = torch.tensor([0.3, -0.2]).to(torch.float64)  # the constants as rounded there
        got = run(default_dtype_log_prob)
    expected = run(lambda x: -0.5 * ((x - mu) ** 2).sum(-1))
    for a, b in zip(expected, got):
        assert b.dtype == np.float64
        np.testing.assert_array_equal(a, b)


def test_sampling_leaves_the_global_state_untouched():
    sampler = ReflectiveHMC(_log_prob, Ball([0.0, 0.0], 2.0), n_leapfrog=2, random_state=0,
                            support=Region(lambda x: x[:, 0] > -1.0))
    sampler.sample(2, n_chains=2, warmup=2)  # torch's first autograd call imports sympy
    check_state_untouched(lambda: sampler.sample(6, n_chains=2, warmup=10))
    stiefel = StiefelSampler(bingham_log_density(np.eye(3), np.diag([1.0, 2.0])), n=3, k=2,
                             n_leapfrog=2, random_state=0)
    check_state_untouched(lambda: stiefel.sample(3, n_chains=2, warmup=10))


@pytest.mark.parametrize("container", ["polytope", "convexset"])
def test_samplers_in_threads_give_the_sequential_draws(container):
    check_thread_safe(_draws(container, step_size=0.3))


def test_stiefel_samplers_in_threads_give_the_sequential_draws():
    check_thread_safe(_stiefel)


def test_user_inputs_are_accepted_and_left_untouched():
    def run(x0, log_prob=_log_prob, **kw):
        return ReflectiveHMC(log_prob, Box([-1.0, -1.0], [1.0, 2.0]), n_leapfrog=2,
                             random_state=0).sample(5, x0=x0, n_chains=2, warmup=6, **kw)

    expected = run(np.array([0.1, 0.2])).samples
    read_only = np.array([0.1, 0.2])
    read_only.flags.writeable = False
    with warnings.catch_warnings():
        # torch warned that a read-only array cannot back a tensor
        warnings.simplefilter("error", UserWarning)
        np.testing.assert_array_equal(run(read_only).samples, expected)
    needs_grad = torch.tensor([0.1, 0.2], dtype=torch.float64, requires_grad=True)
    res = run(needs_grad, return_tensor=True)
    np.testing.assert_array_equal(res.samples, expected)
    assert needs_grad.grad is None and res.samples_tensor.grad_fn is None
    with torch.inference_mode():
        made_there = torch.tensor([0.1, 0.2], dtype=torch.float64)
    np.testing.assert_array_equal(run(made_there).samples, expected)
    assert made_there.tolist() == [0.1, 0.2]

    class Normal(torch.nn.Module):  # a user's module as log_prob, in training mode
        def __init__(self):
            super().__init__()
            self.shift = torch.nn.Parameter(torch.full((2,), 0.25, dtype=torch.float64))

        def forward(self, x):
            return -0.5 * ((x - self.shift) ** 2).sum(-1)

    model = Normal()
    res = run(np.array([0.1, 0.2]), log_prob=model, return_tensor=True)
    np.testing.assert_array_equal(res.samples, expected)
    assert model.training and model.shift.requires_grad and model.shift.grad is None
    assert not res.samples_tensor.requires_grad


def test_numpy_answers_of_user_functions_may_be_read_only():
    """A ConvexSet g (with grad_g) and a Region may answer in numpy, e.g. a broadcast view."""

    def g(x):
        return np.broadcast_to(np.asarray((x**2).sum(-1) - 1.0), (x.shape[0],))

    def grad_g(x):
        return np.broadcast_to(2.0 * np.asarray(x), tuple(x.shape))

    region = Region(lambda x: np.broadcast_to(np.asarray(x[:, 0] > -0.9), (x.shape[0],)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        res = ReflectiveHMC(_log_prob, ConvexSet(g, grad_g, interior_point=[0.0, 0.0]),
                            support=region, n_leapfrog=2, random_state=0).sample(
            5, n_chains=2, warmup=6)
    assert np.all((res.samples**2).sum(-1) <= 1.0) and np.all(res.samples[..., 0] > -0.9)
