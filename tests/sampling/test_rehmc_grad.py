"""ReflectiveHMC's fast paths: a user-supplied gradient and the identity-mass shortcut.

Both must leave the chain unchanged: the draws are compared bit for bit.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import Box, Polytope, ReflectiveHMC, Region
from mlpapers.sampling.rehmc._kernels import (
    hmc_transition,
    kinetic_energy,
    log_prob_and_grad,
    reflect_momentum,
    reflective_leapfrog,
)

D = torch.float64
MU = torch.tensor([0.9, 0.2, 0.7, 1.0], dtype=D)
SD = torch.tensor([0.3, 0.7, 1.3, 0.45], dtype=D)


def gauss(x):
    return -0.5 * (((x - MU) / SD) ** 2).sum(-1)


def gauss_grad(x):
    # the operations autograd runs backwards through ``gauss``, in the same order, so the
    # two gradients agree bit for bit (not only to round-off)
    return -((x - MU) / SD) / SD


class Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, x):
        self.calls += 1
        return self.fn(x)


def test_analytic_gradient_matches_autograd_bitwise():
    x = torch.rand(7, 4, generator=torch.Generator().manual_seed(0), dtype=D)
    lp_a, g_a = log_prob_and_grad(gauss, x)
    lp_b, g_b = log_prob_and_grad(gauss, x, gauss_grad)
    assert torch.equal(lp_a, lp_b) and torch.equal(g_a, g_b)


@pytest.mark.parametrize("kw", [
    dict(n_leapfrog=6),
    dict(n_leapfrog="auto"),
    dict(n_leapfrog="auto", mass="diag"),
    dict(n_leapfrog=3, mass="diag", step_size=0.1, thin=2),
    dict(n_leapfrog="auto", support=True),
    dict(n_leapfrog=4, polytope=True),
])
def test_grad_log_prob_gives_the_draws_of_autograd(kw):
    kw = dict(kw)
    thin = kw.pop("thin", 1)
    container = Box(np.zeros(4), np.ones(4))
    if kw.pop("polytope", False):  # a masked reflection loop instead of the box fold
        container = Polytope(np.vstack([-np.eye(4), np.ones((1, 4))]), np.r_[np.zeros(4), 2.0])
    if kw.pop("support", False):  # container plus thinning
        kw["support"] = Region(lambda x: x[:, 0] > 0.2)
    runs = []
    for grad in (None, gauss_grad):
        hmc = ReflectiveHMC(gauss, container, grad_log_prob=grad, random_state=5, **kw)
        runs.append(hmc.sample(120, n_chains=4, warmup=120, thin=thin))
    a, b = runs
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.step_size, b.step_size)
    np.testing.assert_array_equal(a.inv_mass, b.inv_mass)
    np.testing.assert_array_equal(a.accept_rate, b.accept_rate)
    np.testing.assert_array_equal(a.n_reflections, b.n_reflections)
    assert a.trajectory_length == b.trajectory_length
    assert a.mean_leapfrog == b.mean_leapfrog


def test_log_prob_runs_once_per_trajectory_with_grad_log_prob():
    lp, grad = Counted(gauss), Counted(gauss_grad)
    res = ReflectiveHMC(lp, Box(np.zeros(4), np.ones(4)), grad_log_prob=grad, n_leapfrog=5,
                        step_size=0.05, random_state=0).sample(30, n_chains=3, warmup=10)
    transitions = 10 + res.n_iterations
    assert lp.calls == 1 + transitions  # the start, then the end of each trajectory
    assert grad.calls == 1 + 5 * transitions
    lp_auto = Counted(gauss)
    ReflectiveHMC(lp_auto, Box(np.zeros(4), np.ones(4)), n_leapfrog=5, step_size=0.05,
                  random_state=0).sample(30, n_chains=3, warmup=10)
    assert lp_auto.calls == 1 + 5 * transitions  # autograd: one call per step


@pytest.mark.parametrize("bad", [
    lambda x: x.sum(-1),              # (C,) instead of (C, d)
    lambda x: x[:, :2],               # wrong d
    lambda x: x.detach().numpy(),     # not a tensor
])
def test_bad_gradient_shape_raises(bad):
    hmc = ReflectiveHMC(gauss, Box(np.zeros(4), np.ones(4)), grad_log_prob=bad, n_leapfrog=2)
    with pytest.raises(ValueError, match="grad_log_prob must return a tensor of shape"):
        hmc.sample(5, n_chains=2, warmup=2)


def test_gradient_shape_is_checked_at_every_step():
    calls = []

    def late_bad(x):  # right shape at the start, wrong inside a trajectory
        calls.append(1)
        return gauss_grad(x) if len(calls) == 1 else gauss_grad(x)[:, :3]

    hmc = ReflectiveHMC(gauss, Box(np.zeros(4), np.ones(4)), grad_log_prob=late_bad,
                        n_leapfrog=3, step_size=0.1)
    with pytest.raises(ValueError, match=r"grad_log_prob .* got \(2, 3\)"):
        hmc.sample(5, n_chains=2, warmup=2)


def test_bad_gradient_type_and_values():
    box = Box(np.zeros(4), np.ones(4))
    with pytest.raises(TypeError, match="grad_log_prob must be callable"):
        ReflectiveHMC(gauss, box, grad_log_prob="grad").sample(5, n_chains=2, warmup=2)
    with pytest.raises(ValueError, match="not finite"):
        ReflectiveHMC(gauss, box, grad_log_prob=lambda x: torch.full_like(x, float("nan"))
                      ).sample(5, n_chains=2, warmup=2)


def test_gradient_dtype_is_cast_to_the_sampler_dtype():
    res = ReflectiveHMC(gauss, Box(np.zeros(4), np.ones(4)), dtype=torch.float32,
                        grad_log_prob=lambda x: gauss_grad(x.double()), n_leapfrog=3,
                        random_state=0).sample(20, n_chains=2, warmup=20)
    assert res.samples.dtype == np.float32 and np.isfinite(res.samples).all()


@pytest.mark.slow
def test_wrong_gradient_keeps_the_chain_exact():
    """The kicks are shears for any gradient field and the Metropolis test uses
    ``log_prob``, so a wrong gradient changes the efficiency, never the target."""
    mu, sd = 1.0, 0.5
    res = ReflectiveHMC(lambda x: -0.5 * (((x - mu) / sd) ** 2).sum(-1), Box([0.0], [1.0]),
                        grad_log_prob=lambda x: 0.3 - 2.0 * x, n_leapfrog=4,
                        random_state=0).sample(3000, n_chains=4, warmup=300)
    marg = stats.truncnorm(-mu / sd, (1 - mu) / sd, loc=mu, scale=sd)
    assert stats.kstest(res.samples[:, ::3].ravel(), marg.cdf).pvalue > 1e-3


def test_identity_mass_shortcut_is_bitwise_identical():
    """``inv_mass=None`` (the identity) skips the multiplications by one exactly."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(5, 4, generator=g, dtype=D)
    p = torch.randn(5, 4, generator=g, dtype=D)
    ones = torch.ones(4, dtype=D)
    n = torch.randn(5, 4, generator=g, dtype=D)
    n = n / n.norm(dim=1, keepdim=True)
    assert torch.equal(kinetic_energy(p, None), kinetic_energy(p, ones))
    assert torch.equal(reflect_momentum(p, n, None), reflect_momentum(p, n, ones))
    lp, gr = log_prob_and_grad(gauss, x)
    step = torch.full((5,), 0.3, dtype=D)
    poly = Polytope(np.vstack([-np.eye(4), np.ones((1, 4))]), np.r_[np.zeros(4), 2.0])
    for c in (Box(np.zeros(4), np.ones(4)), poly):
        a = reflective_leapfrog(x, p, lp, gr, step, 7, gauss, c, None, 10**4)
        b = reflective_leapfrog(x, p, lp, gr, step, 7, gauss, c, ones, 10**4)
        for u, v in zip(a, b, strict=True):
            assert torch.equal(u, v)
        outs = [hmc_transition(x, lp, gr, step, 4, gauss, c, m, 10**4,
                               torch.Generator().manual_seed(2)) for m in (None, ones)]
        for key in outs[0]:
            assert torch.equal(outs[0][key], outs[1][key]), key


def test_torch_func_gradient_gives_the_draws_of_autograd():
    """A gradient built with :mod:`torch.func` is a valid ``grad_log_prob`` too."""
    func_grad = torch.func.grad(lambda x: gauss(x).sum())
    kw = dict(n_leapfrog=4, random_state=2)
    a = ReflectiveHMC(gauss, Box(np.zeros(4), np.ones(4)), **kw).sample(
        40, n_chains=3, warmup=40)
    b = ReflectiveHMC(gauss, Box(np.zeros(4), np.ones(4)), grad_log_prob=func_grad,
                      **kw).sample(40, n_chains=3, warmup=40)
    np.testing.assert_array_equal(a.samples, b.samples)


def test_gradient_written_into_a_reused_buffer_gives_the_same_draws():
    # the sampler keeps the current state's gradient while it integrates the proposal;
    # a grad_log_prob that returns one reused buffer used to overwrite it (a kick that is
    # not a function of position: the chain was no longer exact)
    buf = {}

    def into_buffer(x):
        out = buf.setdefault(x.shape, torch.empty_like(x))
        return torch.div(-((x - MU) / SD), SD, out=out)  # the ops of gauss_grad

    container = Box(np.zeros(4), np.ones(4))
    runs = [ReflectiveHMC(gauss, container, grad_log_prob=g, n_leapfrog=4, random_state=2)
            .sample(80, n_chains=3, warmup=80) for g in (gauss_grad, into_buffer)]
    np.testing.assert_array_equal(runs[0].samples, runs[1].samples)


def test_non_finite_energy_change_is_divergent_even_without_an_energy_threshold():
    x = torch.full((3, 4), 0.5, dtype=D)

    def nan_away_from_start(z):  # NaN wherever the trajectory ends
        return torch.where((z - 0.5).abs().sum(-1) > 0, torch.nan, gauss(z))

    logp, grad = log_prob_and_grad(gauss, x)
    out = hmc_transition(x, logp, grad, torch.full((3,), 0.1, dtype=D), 3, nan_away_from_start,
                         Box(np.zeros(4), np.ones(4)), None, 100,
                         torch.Generator().manual_seed(0), max_energy_error=float("inf"))
    assert out["divergent"].all() and not out["accepted"].any()
