"""Checks from the ReHMC research note (sections 1, 5 and 6)
that no other test covered: the step-size jitter of a fixed ``n_leapfrog`` (a factor
``U(1 - j, 1 + j)`` per chain and transition, "jitter the step size or L to avoid periodic
billiard orbits"), the default reflection cap of ``100 d`` per drift ("on overflow, reject
the proposal (count it as a divergence)") and the matrix Bingham density
``tr(Q^T A Q B)`` on the Stiefel manifold with ``B != I``: its values and the law that
the polar-expansion sampler draws."""

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

import mlpapers.sampling.rehmc._sampler as sampler_mod
from mlpapers.sampling import Box, ReflectiveHMC, StiefelSampler, bingham_log_density
from tests.sampling._ks import assert_ks_ess

D = torch.float64


def gauss(x):
    return -0.5 * (((x - torch.tensor([0.3, 0.6], dtype=x.dtype)) / 0.4) ** 2).sum(-1)


def const(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


# -- item 1: step-size jitter with a fixed n_leapfrog ---------------------------------

def _post_warmup_ratios(monkeypatch, jitter, warmup=50, n_samples=100, n_chains=4):
    """Step sizes handed to ``hmc_transition`` after warm-up, divided by the frozen step
    sizes of the result: shape ``(transitions, chains)`` (the spy of
    ``test_rehmc_chees.py::test_trajectory_length_is_frozen_after_warmup``)."""
    calls = []
    real_transition = sampler_mod.hmc_transition

    def spy_transition(x, logp, grad, step, n, *args, **kw):
        calls.append((step.clone(), n))
        return real_transition(x, logp, grad, step, n, *args, **kw)

    monkeypatch.setattr(sampler_mod, "hmc_transition", spy_transition)
    res = ReflectiveHMC(gauss, Box([0.0, 0.0], [1.0, 1.0]), n_leapfrog=3, jitter=jitter,
                        random_state=0).sample(n_samples, n_chains=n_chains, warmup=warmup)
    assert len(calls) == warmup + n_samples
    assert all(n == 3 for _, n in calls)  # the jitter never changes the number of steps
    steps = np.stack([s.numpy() for s, _ in calls[warmup:]])
    return steps / res.step_size, steps, res


@pytest.mark.parametrize("jitter, j", [(True, 0.2), (0.1, 0.1)])
def test_fixed_length_jitter_scales_each_step_by_uniform_1_pm_j(monkeypatch, jitter, j):
    """Every sampling transition of every chain runs at the frozen step times an
    independent ``U(1 - j, 1 + j)`` (``j = 0.2`` for ``jitter=True``): the ratios fill
    ``[1 - j, 1 + j]`` (to both ends) and follow the uniform law (exact KS, iid draws)."""
    ratio, _, _ = _post_warmup_ratios(monkeypatch, jitter)
    assert ratio.shape == (100, 4)
    assert ratio.min() >= 1 - j - 1e-12 and ratio.max() <= 1 + j + 1e-12
    assert ratio.min() < 1 - 0.75 * j and ratio.max() > 1 + 0.75 * j
    # one draw per chain: the chains' factors differ within a transition
    assert (np.ptp(ratio, axis=1) > 0).all()
    assert stats.kstest(ratio.ravel(), stats.uniform(1 - j, 2 * j).cdf).pvalue > 1e-3


def test_jitter_false_keeps_the_frozen_step_size(monkeypatch):
    """``jitter=False``: every sampling transition uses exactly the frozen step sizes."""
    _, steps, res = _post_warmup_ratios(monkeypatch, False)
    np.testing.assert_array_equal(steps, np.broadcast_to(res.step_size, steps.shape))


# -- item 2: the default reflection cap 100 d -------------------------------------------

@pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")
def test_default_reflection_cap_rejects_long_drifts_unless_raised():
    """A constant density in the unit square with step 1e5 needs ~10^5 reflections per
    drift: every transition is capped (divergent) under the default cap ``100 d``, and
    none is once ``max_reflections=10**6``, the constant density then accepting all."""
    box = Box([0.0, 0.0], [1.0, 1.0])
    res = ReflectiveHMC(const, box, step_size=1e5, n_leapfrog=1, random_state=0).sample(
        40, n_chains=4, warmup=0)
    np.testing.assert_array_equal(res.n_divergent, 40)
    assert (res.sample_stats["reflections"] > 200).all()
    assert (res.samples == res.samples[:, :1]).all()  # no proposal was accepted
    res = ReflectiveHMC(const, box, step_size=1e5, n_leapfrog=1, max_reflections=10**6,
                        random_state=0).sample(40, n_chains=4, warmup=0)
    np.testing.assert_array_equal(res.n_divergent, 0)
    np.testing.assert_array_equal(res.accept_rate, 1.0)
    assert res.sample_stats["reflections"].min() > 200  # the cap alone made the difference


@pytest.mark.parametrize("d", [2, 3])
def test_default_reflection_cap_is_exactly_100_d(d):
    """With one leapfrog step per transition, a constant density and step 100 (reflection
    counts on both sides of ``100 d``), a transition is divergent exactly when its drift
    needed more than ``100 d`` reflections."""
    res = ReflectiveHMC(const, Box(np.zeros(d), np.ones(d)), step_size=100.0, n_leapfrog=1,
                        jitter=False, random_state=0).sample(50, n_chains=4, warmup=0)
    s = res.sample_stats
    over = s["reflections"] > 100 * d
    assert 0 < over.sum() < over.size  # both sides of the cap are exercised
    np.testing.assert_array_equal(s["diverging"], over)
    np.testing.assert_array_equal(res.n_divergent, over.sum(1))


# -- item 3: the matrix Bingham density on V(n, k) ---------------------------------------

def _random_stiefel(rng, c, n, k):
    return np.linalg.qr(rng.standard_normal((c, n, k)))[0]


@pytest.mark.parametrize("symmetric", [True, False])
def test_bingham_log_density_is_the_trace_with_non_identity_B(symmetric):
    """``bingham_log_density(A, B)(Q) = tr(Q^T A Q B)`` (no constant, no sign) for a
    random symmetric ``A`` and diagonal ``B`` (the Bingham case) and for general square
    ``A``, ``B``, on a batch of points of ``V(4, 2)``, against numpy's trace."""
    rng = np.random.default_rng(0)
    n, k = 4, 2
    M = rng.standard_normal((n, n))
    if symmetric:
        A, B = M + M.T, np.diag([2.0, -0.7])
    else:
        A, B = M, rng.standard_normal((k, k))
    Q = _random_stiefel(rng, 6, n, k)
    got = bingham_log_density(A, B)(torch.from_numpy(Q))
    ref = np.array([np.trace(q.T @ A @ q @ B) for q in Q])
    assert got.shape == (6,) and got.dtype == D
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)
    # B matters: the identity-B value differs (what a B = I test could not see)
    assert np.abs(ref - np.array([np.trace(q.T @ A @ q) for q in Q])).max() > 0.1


def _abs_q0_cdf(t, c=5.0):
    """CDF of ``|q_0|`` for ``q`` uniform on S^2 weighted by ``exp(c q_0^2)``: ``q_0`` of a
    uniform point is uniform on [-1, 1] (Archimedes), so ``|q_0|`` has density
    ``∝ exp(c t^2)`` on [0, 1] and CDF ``erfi(sqrt(c) t) / erfi(sqrt(c))``."""
    s = np.sqrt(c)
    return special.erfi(s * np.clip(t, 0.0, 1.0)) / special.erfi(s)


@pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")
def test_bingham_sampler_draws_the_exp_5t2_law_of_q0():
    """``StiefelSampler`` with Bingham ``A = diag(5, 0, 0)`` on ``V(3, 1) = S^2``: ``q_0``
    has density ``∝ exp(5 t^2)`` on [-1, 1]. Its law is symmetric and the chains seldom
    cross between the modes at +-1 (an ESS near 40 for ``q_0``), so the KS (with the ESS)
    compares ``|q_0|`` with ``erfi(sqrt(5) t) / erfi(sqrt(5))`` (checked by quadrature)."""
    z = integrate.quad(lambda s: np.exp(5.0 * s * s), 0.0, 1.0)[0]
    for t in (0.2, 0.5, 0.9):
        assert _abs_q0_cdf(t) == pytest.approx(
            integrate.quad(lambda s: np.exp(5.0 * s * s), 0.0, t)[0] / z, rel=1e-10)
    res = StiefelSampler(bingham_log_density(np.diag([5.0, 0.0, 0.0]), np.eye(1)), n=3,
                         k=1, n_leapfrog=5, random_state=0).sample(100, n_chains=16,
                                                                   warmup=100)
    q0 = np.abs(res.Q[..., 0, 0])
    assert q0.shape == (16, 100)
    assert_ks_ess(q0, _abs_q0_cdf)
