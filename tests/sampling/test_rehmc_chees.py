"""ChEES trajectory-length adaptation (``n_leapfrog="auto"``): gradient identity, Halton
jitter, the frozen post-warm-up kernel, determinism, bad input and exactness."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import mlpapers.sampling.rehmc._sampler as sampler_mod
from mlpapers.sampling import Box, Polytope, ReflectiveHMC, StiefelSampler
from mlpapers.sampling.rehmc._adapt import mass_windows
from mlpapers.sampling.rehmc._chees import ChEESAdaptation, chees_gradient, halton

D = torch.float64


def trunc_gauss(mu, sd):
    mu_t, sd_t = torch.as_tensor(mu, dtype=D), torch.as_tensor(sd, dtype=D)
    return lambda x: -0.5 * (((x - mu_t) / sd_t) ** 2).sum(-1)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_chees_gradient_is_the_derivative_of_the_criterion(C, d, seed):
    """d/dlogT of the acceptance-weighted ChEES criterion, with the proposal moving along
    t * v (the chain rule of x'(T)), equals ``chees_gradient``; centres are held fixed."""
    g = torch.Generator().manual_seed(seed)
    x0, x1, v1 = (torch.randn(C, d, generator=g, dtype=D) for _ in range(3))
    t = torch.rand(C, generator=g, dtype=D) + 0.1
    a = torch.rand(C, generator=g, dtype=D) * 0.9 + 0.05
    div = torch.zeros(C, dtype=torch.bool)
    c1 = (a[:, None] * x1).sum(0) / a.sum()
    c0 = x0.mean(0)
    s = torch.zeros((), dtype=D, requires_grad=True)
    x1s = x1 + s * t[:, None] * v1
    crit = 0.25 * (((x1s - c1) ** 2).sum(-1) - ((x0 - c0) ** 2).sum(-1)) ** 2
    (ref,) = torch.autograd.grad((a * crit).sum() / a.sum(), s)
    assert chees_gradient(x0, x1, v1, t, a, div) == pytest.approx(float(ref), rel=1e-9,
                                                                   abs=1e-12)


def test_chees_gradient_ignores_divergent_rejected_and_nonfinite_chains():
    g = torch.Generator().manual_seed(0)
    x0, x1, v1 = (torch.randn(4, 3, generator=g, dtype=D) for _ in range(3))
    t = torch.ones(4, dtype=D)
    a = torch.tensor([0.9, 0.5, 0.7, 1e-6], dtype=D)
    div = torch.tensor([False, False, True, False])
    x1_bad = x1.clone()
    x1_bad[1] = float("nan")
    # chain 1 (NaN) and 2 (divergent) drop out of the centre and the average; chain 3
    # (accept < 1e-4) only enters the accept-weighted centre: the result is chain 0's term
    c1 = (0.9 * x1[0] + 1e-6 * x1[3]) / (0.9 + 1e-6)
    d1, d0 = x1[0] - c1, x0[0] - x0.mean(0)
    expected = float(((d1 @ d1) - (d0 @ d0)) * (d1 @ v1[0]))
    assert chees_gradient(x0, x1_bad, v1, t, a, div) == pytest.approx(expected, rel=1e-12)
    assert chees_gradient(x0, x1, v1, t, torch.zeros(4, dtype=D), div) == 0.0


def test_halton_points():
    pts = [halton(k) for k in range(8)]
    assert sorted(pts) == pytest.approx([(i + 1) / 8 for i in range(8)])
    shifted = [halton(k, 0.3) for k in range(1024)]
    assert min(shifted) > 0 and max(shifted) <= 1
    assert np.histogram(shifted, bins=8, range=(0, 1))[0].tolist() == [128] * 8


def test_adaptation_moves_log_t_by_at_most_the_clip_and_averages():
    ad = ChEESAdaptation(1.0)
    for _ in range(20):
        t_prev = ad.trajectory_length
        t = ad.update(5.0, 1e-3, 1e3)
        assert 1.0 < t / t_prev <= math.exp(0.35) + 1e-12
    assert 1.0 < ad.final(1e-3, 1e3) < ad.trajectory_length  # averaged iterate lags
    assert ad.update(1e9, 1e-3, 2.0) <= 2.0 and ad.final(1e-3, 0.5) == 0.5
    ad2 = ChEESAdaptation(1.0)
    assert ad2.update(-3.0, 1e-3, 1e3) < 1.0


def test_restart_and_rescale():
    ad = ChEESAdaptation(1.0)
    for _ in range(5):
        ad.update(1e6, 1e-3, 1e3)  # a transient: huge gradients, T pushed up
    assert ad.restart(0.5) == 0.5 == ad.final(1e-3, 1e3)
    # the transient's squared gradients are forgotten: a typical gradient moves T by lr
    assert ad.update(3.0, 1e-3, 1e3) == pytest.approx(0.5 * math.exp(0.025))
    ad.rescale(2.0)
    assert ad.trajectory_length == pytest.approx(math.exp(0.025))
    assert ad.final(1e-3, 1e3) == pytest.approx(2 * 0.5 * math.exp(0.025))
    assert ad.update(-3.0, 1e-3, 1e3) == pytest.approx(1.0)


def test_bounds_stop_the_length_but_never_drag_it():
    """The floor (one step) and the cap stop ``T`` from stepping across them, but a
    bound that moves past ``T`` leaves it where it is (a floor of 14 steps' worth used
    to lift ``T = 1`` to 14 at once)."""
    ad = ChEESAdaptation(1.0)
    assert ad.update(0.0, 14.0, 1e4) == 1.0  # a floor above T does not lift it
    assert ad.update(-3.0, 14.0, 1e4) == 1.0  # nor lets it fall further
    assert ad.update(3.0, 14.0, 1e4) > 1.0  # ascent still moves it
    ad = ChEESAdaptation(1.0)
    assert ad.update(0.0, 1e-3, 0.5) == 1.0  # a cap below T does not pull it down
    assert ad.update(3.0, 1e-3, 0.5) == 1.0  # nor lets it rise further
    assert ad.update(-3.0, 1e-3, 0.5) < 1.0
    ad = ChEESAdaptation(1.0)
    assert ad.update(-3.0, 0.99, 1e4) == pytest.approx(0.99)  # a step stops at the floor
    assert ad.update(3.0, 1e-3, 1.0) == pytest.approx(1.0)  # and at the cap


def test_window_heuristic_runs_draw_the_same_momenta(monkeypatch):
    """At the end of a mass window the doubling heuristic runs under the old and the new
    metric from the same states, and (with ChEES) from the same generator state, so that
    the ratio of the two steps, which rescales ``T``, measures the change of metric, not
    the momenta's noise. Without ChEES the heuristic runs once per window."""
    calls = []
    real = sampler_mod.find_reasonable_step_size

    def spy(x, logp, grad, log_prob, container, inv_mass, max_refl, gen, *args, **kw):
        calls.append((inv_mass is None, gen.get_state().clone(), x.clone()))
        return real(x, logp, grad, log_prob, container, inv_mass, max_refl, gen, *args, **kw)

    monkeypatch.setattr(sampler_mod, "find_reasonable_step_size", spy)
    lp = lambda x: -0.5 * (x**2).sum(-1)  # noqa: E731
    box = Box([-10.0, -10.0], [10.0, 10.0])
    ReflectiveHMC(lp, box, mass="diag", random_state=0).sample(5, n_chains=4, warmup=200)
    first, windows = calls[0], calls[1:]  # the initial step, then a pair per window
    assert first[0] and len(windows) == 2 * len(mass_windows(200)) == 4
    for old, new in zip(windows[::2], windows[1::2]):
        assert torch.equal(old[1], new[1]) and torch.equal(old[2], new[2])
    states = [c[1] for c in windows[::2]]
    assert all(not torch.equal(a, b) for a, b in zip(states, states[1:]))
    calls.clear()
    ReflectiveHMC(lp, box, mass="diag", n_leapfrog=5, random_state=0).sample(
        5, n_chains=4, warmup=200)
    assert len(calls) == 1 + len(mass_windows(200))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_reaches_the_chees_optimum_from_a_spread_out_start(seed):
    """N(0, I_10) in the box [-50, 50]^10 from random points of the box, 16 chains.

    For a unit Gaussian the exact flow gives ChEES(t) = d sin^2(t); jittered over
    t = u T, u ~ U(0, 1], it is d (1/2 - sin(2T) / (4T)), maximal at T* = 2.247
    (tan 2T = 2T), with its first local minimum at T = 3.86 and flat, wavy
    beyond (leapfrog at the adapted step ~0.8 moves the peak by a few percent).
    The first iterations see gradients ~1e5 times the stationary ones from the
    spread-out chains; the adaptation must still end near T*, where the old
    start at 10 steps without a restart froze T at 10-34."""
    d = 10
    lp = trunc_gauss(np.zeros(d), np.ones(d))
    box = Box(np.full(d, -50.0), np.full(d, 50.0))
    res = ReflectiveHMC(lp, box, n_leapfrog="auto", random_state=seed).sample(
        20, n_chains=16, warmup=300)
    assert 1.5 < res.trajectory_length < 3.5


def _corner(d):
    return Box(np.zeros(d), np.ones(d)), trunc_gauss(np.ones(d), np.full(d, 0.5))


def test_auto_result_fields_and_determinism():
    box, lp = _corner(3)
    kw = dict(n_leapfrog="auto", random_state=3)
    r1 = ReflectiveHMC(lp, box, **kw).sample(60, n_chains=4, warmup=80)
    r2 = ReflectiveHMC(lp, box, **kw).sample(60, n_chains=4, warmup=80)
    np.testing.assert_array_equal(r1.samples, r2.samples)
    assert r1.trajectory_length == r2.trajectory_length > 0
    assert r1.n_leapfrog == "auto" and r1.mean_leapfrog >= 1
    assert np.isfinite(r1.reflections_per_step) and r1.summary()["mean_leapfrog"] >= 1
    r3 = ReflectiveHMC(lp, box, n_leapfrog="auto", random_state=4).sample(
        60, n_chains=4, warmup=80)
    assert not np.array_equal(r1.samples, r3.samples)
    fixed = ReflectiveHMC(lp, box, n_leapfrog=3, random_state=3).sample(5, warmup=5)
    assert fixed.trajectory_length is None and fixed.mean_leapfrog == 3


def test_trajectory_length_is_frozen_after_warmup(monkeypatch):
    """Adaptation runs once per warm-up iteration only; afterwards every transition uses
    the frozen step sizes and ``ceil(u T / mean step)`` leapfrog steps with u in (0, 1]."""
    calls, updates = [], []
    real_transition, real_update = sampler_mod.hmc_transition, ChEESAdaptation.update

    def spy_transition(x, logp, grad, step, n, *args, **kw):
        calls.append((step.clone(), n))
        return real_transition(x, logp, grad, step, n, *args, **kw)

    def spy_update(self, *args):
        updates.append(args)
        return real_update(self, *args)

    monkeypatch.setattr(sampler_mod, "hmc_transition", spy_transition)
    monkeypatch.setattr(ChEESAdaptation, "update", spy_update)
    box, lp = _corner(4)
    hmc = ReflectiveHMC(lp, box, n_leapfrog="auto", random_state=0)
    res = hmc.sample(300, n_chains=4, warmup=100)
    assert len(updates) == 100 and len(calls) == 400
    n_max = math.ceil(res.trajectory_length / float(res.step_size.mean()))
    post = calls[100:]
    for step, _ in post:
        np.testing.assert_array_equal(step.numpy(), res.step_size)
    steps = [n for _, n in post]
    assert min(steps) >= 1 and max(steps) == n_max
    assert res.mean_leapfrog == pytest.approx(np.mean(steps))
    assert hmc.trajectory_length_ == res.trajectory_length


def test_post_warmup_step_counts_depend_only_on_halton_points(monkeypatch):
    """After warm-up, transition k runs exactly ``ceil(T u_k / mean step)`` steps, with
    ``u_k`` the k-th point of one rotated Halton sequence: the count never reads the state."""
    points, counts = [], []
    real_halton, real_transition = sampler_mod.halton, sampler_mod.hmc_transition

    def spy_halton(k, shift, *args):
        u = real_halton(k, shift, *args)
        points.append((k, shift, u))
        return u

    def spy_transition(x, logp, grad, step, n, *args, **kw):
        counts.append(n)
        return real_transition(x, logp, grad, step, n, *args, **kw)

    monkeypatch.setattr(sampler_mod, "halton", spy_halton)
    monkeypatch.setattr(sampler_mod, "hmc_transition", spy_transition)
    box, lp = _corner(3)
    warmup = 60
    res = ReflectiveHMC(lp, box, n_leapfrog="auto", random_state=1).sample(
        40, n_chains=4, warmup=warmup)
    assert [k for k, _, _ in points] == list(range(len(counts)))
    assert len({shift for _, shift, _ in points}) == 1
    mean_step = float(torch.as_tensor(res.step_size).mean())
    expected = [min(max(math.ceil(res.trajectory_length * u / mean_step), 1), 1000)
                for _, _, u in points[warmup:]]
    assert counts[warmup:] == expected


def test_stiefel_sampler_passes_auto_through():
    res = StiefelSampler(n=3, k=1, n_leapfrog="auto", random_state=0).sample(
        30, n_chains=2, warmup=30)
    assert res.trajectory_length > 0 and res.Q.shape == (2, 30, 3, 1)
    np.testing.assert_allclose((res.Q ** 2).sum((-2, -1)), 1.0, atol=1e-10)


def test_auto_bad_input():
    box, lp = _corner(2)
    with pytest.raises(ValueError, match="n_leapfrog"):
        ReflectiveHMC(lp, box, n_leapfrog="nuts").sample(5)
    with pytest.raises((TypeError, ValueError), match="n_leapfrog"):
        ReflectiveHMC(lp, box, n_leapfrog=0).sample(5)


def test_default_is_auto_and_one_chain_falls_back_to_ten_steps():
    box, lp = _corner(2)
    assert ReflectiveHMC().n_leapfrog == "auto" == StiefelSampler().n_leapfrog
    res = ReflectiveHMC(lp, box, random_state=0).sample(20, n_chains=2, warmup=20)
    assert res.n_leapfrog == "auto" and res.trajectory_length > 0
    for kw in ({}, {"n_leapfrog": "auto"}):
        hmc = ReflectiveHMC(lp, box, random_state=0, **kw)
        with pytest.warns(UserWarning, match="n_chains >= 2.*n_leapfrog=10"):
            res = hmc.sample(20, n_chains=1, warmup=20)
        assert res.n_leapfrog == 10 and res.mean_leapfrog == 10
        assert res.trajectory_length is None and hmc.trajectory_length_ is None
        assert hmc.n_leapfrog == kw.get("n_leapfrog", "auto")  # the parameter is untouched
    fixed = ReflectiveHMC(lp, box, n_leapfrog=10, random_state=0).sample(20, n_chains=1,
                                                                         warmup=20)
    np.testing.assert_array_equal(fixed.samples, res.samples)
    with pytest.raises((TypeError, ValueError), match="n_leapfrog"):
        ReflectiveHMC(lp, box, n_leapfrog=2.5).sample(5)


def test_auto_exact_small_truncated_gaussian():
    """Marginal KS and moments against scipy.stats.truncnorm with the adaptive length."""
    mu, sd = np.array([1.0, 0.3]), np.array([0.5, 0.4])
    box = Box([0.0, 0.0], [1.0, 1.0])
    res = ReflectiveHMC(trunc_gauss(mu, sd), box, n_leapfrog="auto", random_state=0).sample(
        500, n_chains=8, warmup=150)
    n_eff = res.ess()
    assert res.n_divergent.sum() == 0 and np.all(res.rhat() < 1.02)
    for j in range(2):
        ref = stats.truncnorm(-mu[j] / sd[j], (1 - mu[j]) / sd[j], mu[j], sd[j])
        x = res.samples[..., j].ravel()
        assert stats.kstest(x, ref.cdf).statistic < 1.95 / np.sqrt(n_eff[j])
        se = ref.std() / np.sqrt(n_eff[j])
        assert abs(x.mean() - ref.mean()) < 4 * se


@pytest.mark.slow
def test_auto_exact_polytope_uniform_and_diag_mass():
    """Uniform simplex (Beta(1, d) marginals) and a d=6 corner Gaussian with mass='diag'."""
    d = 5
    simplex = Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0])
    res = ReflectiveHMC(lambda x: torch.zeros(x.shape[0], dtype=x.dtype), simplex,
                        n_leapfrog="auto", random_state=1).sample(1500, n_chains=16,
                                                                   warmup=300)
    n_eff = res.ess()
    for j in range(d):
        stat = stats.kstest(res.samples[..., j].ravel(), stats.beta(1, d).cdf).statistic
        assert stat < 1.95 / np.sqrt(n_eff[j])
    d = 6
    mu, sd = np.ones(d), np.linspace(0.2, 1.0, d)
    res = ReflectiveHMC(trunc_gauss(mu, sd), Box(np.zeros(d), np.ones(d)), mass="diag",
                        n_leapfrog="auto", random_state=2).sample(1500, n_chains=16,
                                                                   warmup=400)
    n_eff = res.ess()
    assert np.all(res.rhat() < 1.02)
    for j in range(d):
        ref = stats.truncnorm(-mu[j] / sd[j], (1 - mu[j]) / sd[j], mu[j], sd[j])
        assert stats.kstest(res.samples[..., j].ravel(), ref.cdf).statistic < 1.95 / np.sqrt(
            n_eff[j])


def test_diag_mass_windows_do_not_inflate_the_trajectory_length():
    """Regressions, on a standard normal in a wide box, where the diagonal mass stays near
    the identity and the jittered ChEES optimum is T* = 2.25 (the identity mass ends at
    1.7-2.0):

    * at every mass window ``T`` was rescaled by the new *heuristic* step over the old
      *dual-averaged* one (about 3x smaller), so ``T`` grew about 3x per window and ended
      near 420 (220 leapfrog steps per transition). Both steps of the ratio now come from
      the same heuristic;
    * then ``T`` still ended at 7 to 121 (median 44 over these seeds): the floor of one
      step lifted ``T`` to the trial steps of the restarted dual averaging (up to 14), and
      the two heuristic runs drew different momenta, so their ratio alone moved ``T`` by
      up to 4x. Now the floor never lifts ``T`` and both runs draw the same momenta.

    The median over four seeds: one run's ``T`` is noisy with 4 chains (5.2 once in 16)."""
    lp = lambda x: -0.5 * (x**2).sum(-1)  # noqa: E731
    lengths = [ReflectiveHMC(lp, Box([-1e3, -1e3], [1e3, 1e3]), mass="diag",
                             random_state=seed).sample(20, warmup=1000).trajectory_length
               for seed in (0, 2, 5, 8)]
    assert 1.0 < np.median(lengths) < 4.5, lengths  # now 2.03, 2.35, 2.86, 2.18
