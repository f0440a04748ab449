"""Tests that kill mutants the rest of the suite let through (mlpapers.sampling.rehmc).

Each test asserts a real property against an independent reference (a scalar float64
loop written from the published update rule, numpy, a closed form, or a documented
behaviour); the mutation audit found that the other test files would not notice the
corresponding wrong code.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from mlpapers.sampling.rehmc._adapt import (
    DualAveraging,
    WelfordVariance,
    initial_buffer,
    mass_windows,
)


def test_dual_averaging_follows_hoffman_gelman_algorithm_5():
    # scalar float64 loop of Hoffman & Gelman (2014, Alg. 5) with Stan's constants
    eps0 = np.array([0.3, 1.7])
    target, gamma, t0, kappa = 0.8, 0.05, 10.0, 0.75
    alphas = np.random.default_rng(0).random((40, 2))
    da = DualAveraging(torch.tensor(eps0, dtype=torch.float64), target)
    got = np.array([da.update(torch.tensor(a, dtype=torch.float64)).numpy() for a in alphas])
    for c in range(2):
        mu, h_bar, log_eps_bar = math.log(10 * eps0[c]), 0.0, math.log(eps0[c])
        for m in range(1, 41):
            h_bar = (1 - 1 / (m + t0)) * h_bar + (target - alphas[m - 1, c]) / (m + t0)
            log_eps = mu - math.sqrt(m) / gamma * h_bar
            eta = m ** -kappa
            log_eps_bar = eta * log_eps + (1 - eta) * log_eps_bar
            assert got[m - 1, c] == pytest.approx(math.exp(log_eps), rel=1e-11)
        assert float(da.final()[c]) == pytest.approx(math.exp(log_eps_bar), rel=1e-11)


def test_dual_averaging_restart_resets_the_averages():
    da = DualAveraging(torch.tensor([0.5], dtype=torch.float64), 0.8)
    for _ in range(5):
        da.update(torch.tensor([0.1], dtype=torch.float64))
    da.restart(torch.tensor([2.0], dtype=torch.float64))
    # right after a restart the first update is that of a fresh instance
    fresh = DualAveraging(torch.tensor([2.0], dtype=torch.float64), 0.8)
    a = torch.tensor([0.95], dtype=torch.float64)
    assert torch.equal(da.update(a), fresh.update(a))
    assert torch.equal(da.final(), fresh.final())


@pytest.mark.parametrize("sizes", [[1], [3, 1, 4], [2, 2, 2, 2, 5]])
def test_welford_pools_batches_like_numpy(sizes):
    rng = np.random.default_rng(len(sizes))
    rows = [rng.normal(3.0, 2.0, size=(s, 3)) * [1, 10, 0.1] for s in sizes]
    w = WelfordVariance(3)
    for r in rows:
        w.update(torch.as_tensor(r))
    allx = np.concatenate(rows)
    n = len(allx)
    assert w.n == n
    np.testing.assert_allclose(w.mean.numpy(), allx.mean(0), rtol=1e-12)
    var = allx.var(0, ddof=1) if n > 1 else np.zeros(3)
    # Stan's regularisation: n/(n+5) var + 1e-3 * 5/(n+5)
    np.testing.assert_allclose(w.regularized_variance().numpy(),
                               n / (n + 5) * var + 1e-3 * 5 / (n + 5), rtol=1e-10, atol=1e-15)


def test_mass_windows_follow_the_documented_buffer_and_doubling_rule():
    # the documented rule: 15% initial buffer, 10% terminal buffer, doubling windows from
    # 25 in between, the last absorbing a remainder shorter than twice its own size
    for warmup in [19, 20, 50, 100, 150, 333, 1000, 5000]:
        w = mass_windows(warmup)
        if warmup < 20:
            assert w == [] and initial_buffer(warmup) == 0
            continue
        init, end = int(0.15 * warmup), warmup - int(0.1 * warmup)
        assert initial_buffer(warmup) == init
        assert w[0][0] == init and w[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(w))  # contiguous
        sizes = [b - a for a, b in w]
        for k, s in enumerate(sizes[:-1]):
            assert s == 25 * 2**k
        nominal = 25 * 2 ** (len(sizes) - 1)
        assert sizes[-1] >= min(nominal, end - w[-1][0])
        assert sizes[-1] < 3 * nominal or len(sizes) == 1
    assert mass_windows(1000) == [(150, 175), (175, 225), (225, 325), (325, 900)]


# ---------------------------------------------------------------- kernels ---------
def _ball_transition_reference(x, z, u, eps, n_steps, a, inv_mass, radius):
    """One reflective-HMC transition per chain by a scalar float64 loop (numpy only).

    Target ``log pi(x) = -sum_i a_i (x_i - 0.3)^2 / 2`` in the ball ``|x| <= radius``;
    momenta ``p = z / sqrt(m)`` for the inverse mass ``m``; exact reflections
    ``p' = p - 2 (n.m p)/(n.m n) n``; accept if ``u < min(1, exp(H0 - H1))``.
    """
    def logp(y):
        return -0.5 * float((a * (y - 0.3) ** 2).sum())

    def grad(y):
        return -a * (y - 0.3)

    out = []
    for c in range(len(x)):
        m = inv_mass[c]
        q = x[c].copy()
        p = z[c] / np.sqrt(m)
        h0 = -logp(q) + 0.5 * float((m * p * p).sum())
        refl = 0
        for _ in range(n_steps):
            p = p + 0.5 * eps[c] * grad(q)
            tau = eps[c]
            while True:
                v = m * p
                vv, yv, yy = v @ v, q @ v, q @ q
                t = (-yv + np.sqrt(yv * yv - vv * (yy - radius**2))) / vv
                if t >= tau:
                    q = q + tau * v
                    break
                q = q + t * v
                nrm = q / np.linalg.norm(q)
                p = p - 2 * (nrm @ (m * p)) / (nrm @ (m * nrm)) * nrm
                tau -= t
                refl += 1
            p = p + 0.5 * eps[c] * grad(q)
        h1 = -logp(q) + 0.5 * float((m * p * p).sum())
        acc = min(1.0, float(np.exp(h0 - h1)))
        out.append((q, acc, bool(u[c] < acc), refl, m * p))
    return out


@pytest.mark.parametrize("mass", ["identity", "diag", "per_chain"])
def test_hmc_transition_matches_a_scalar_reference_loop(mass):
    from mlpapers.sampling import Ball
    from mlpapers.sampling.rehmc._kernels import hmc_transition, log_prob_and_grad

    C, d, radius, n_steps = 6, 3, 0.8, 7
    a = np.array([1.0, 4.0, 9.0])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(C, d))
    x *= 0.5 * radius / np.linalg.norm(x, axis=1, keepdims=True)
    eps = np.linspace(0.05, 0.4, C)
    inv_mass = {"identity": np.ones((C, d)), "diag": np.tile([0.5, 2.0, 1.5], (C, 1)),
                "per_chain": rng.uniform(0.3, 3.0, size=(C, d))}[mass]
    at = torch.as_tensor(a)

    def log_prob(y):
        return -0.5 * ((y - 0.3) ** 2 * at).sum(-1)

    xt = torch.as_tensor(x)
    lp, gr = log_prob_and_grad(log_prob, xt)
    im = {"identity": None, "diag": torch.as_tensor(inv_mass[0]),
          "per_chain": torch.as_tensor(inv_mass)}[mass]
    gen = torch.Generator().manual_seed(7)
    twin = torch.Generator().manual_seed(7)  # the same stream: momenta, then uniforms
    z = torch.randn(C, d, generator=twin, dtype=torch.float64).numpy()
    u = torch.rand(C, generator=twin, dtype=torch.float64).numpy()
    out = hmc_transition(xt, lp, gr, torch.as_tensor(eps), n_steps, log_prob,
                         Ball(np.zeros(d), radius), im, 10**4, gen)
    ref = _ball_transition_reference(x, z, u, eps, n_steps, a, inv_mass, radius)
    refl = np.array([r[3] for r in ref])
    assert refl.sum() > 0  # walls are hit
    for c, (q, acc, accepted, nr, vel) in enumerate(ref):
        np.testing.assert_allclose(out["proposal"][c].numpy(), q, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["velocity"][c].numpy(), vel, rtol=1e-9, atol=1e-12)
        assert float(out["accept_prob"][c]) == pytest.approx(acc, rel=1e-9, abs=1e-12)
        assert bool(out["accepted"][c]) == accepted
        assert int(out["n_reflections"][c]) == nr
        np.testing.assert_allclose(out["x"][c].numpy(), q if accepted else x[c],
                                   rtol=1e-10, atol=1e-12)
    assert not bool(out["divergent"].any())


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_proposal_energy_is_divergent_and_rejected(bad):
    # documented: a non-finite energy counts as divergent and is rejected
    from mlpapers.sampling import Box
    from mlpapers.sampling.rehmc._kernels import hmc_transition

    def log_prob(y):  # +inf (an energy of -inf) or NaN right of x_0 = 0.2
        return torch.where(y[:, 0] > 0.2, torch.tensor(bad, dtype=y.dtype),
                           torch.zeros((), dtype=y.dtype))

    def grad_log_prob(y):
        return torch.zeros_like(y)

    C = 64
    x = torch.full((C, 2), -0.5, dtype=torch.float64)
    out = hmc_transition(x, log_prob(x), grad_log_prob(x), torch.full((C,), 0.5,
                         dtype=torch.float64), 2, log_prob, Box([-1, -1], [1, 1]), None,
                         100, torch.Generator().manual_seed(0), grad_log_prob=grad_log_prob)
    bad_end = out["proposal"][:, 0] > 0.2
    assert 0 < int(bad_end.sum()) < C
    assert bool(out["divergent"][bad_end].all()) and not bool(out["divergent"][~bad_end].any())
    assert not bool(out["accepted"][bad_end].any())
    assert bool((out["accept_prob"][bad_end] == 0).all())
    assert torch.equal(out["x"][bad_end], x[bad_end])
    # constant density elsewhere: reflections keep the energy, so those moves are accepted
    assert bool(out["accepted"][~bad_end].all())


# ------------------------------------------------------------ diagnostics ---------
def _classic_split_rhat(x):
    """Gelman et al. (BDA3, eq. 11.4) split R-hat of (M, N) draws, written out."""
    half = x.shape[1] // 2
    chains = [c[:half] for c in x] + [c[x.shape[1] - half:] for c in x]
    n = half
    means = np.array([np.mean(c) for c in chains])
    W = np.mean([np.var(c, ddof=1) for c in chains])
    B = n * np.var(means, ddof=1)
    return math.sqrt(((n - 1) / n * W + B / n) / W)


@pytest.mark.parametrize("shape", [(1, 9), (3, 10), (4, 31)])
def test_split_rhat_classic_matches_the_textbook_formula(shape):
    from mlpapers.sampling.rehmc._diagnostics import split_rhat_classic

    rng = np.random.default_rng(shape[1])
    x = rng.normal(size=(*shape, 2)).cumsum(axis=1)  # random walks: R-hat well above 1
    x[..., 1] = rng.normal(size=shape) * np.arange(1, shape[0] + 1)[:, None]
    got = split_rhat_classic(x)
    for j in range(2):
        assert got[j] == pytest.approx(_classic_split_rhat(x[..., j]), rel=1e-12)


def test_rhat_of_stuck_chains_is_infinite_and_of_constant_draws_nan():
    from mlpapers.sampling.rehmc._diagnostics import ess, rhat, split_rhat_classic

    stuck = np.repeat(np.array([[0.0], [1.0], [2.0]]), 20, axis=1)  # each chain constant
    assert rhat(stuck) == math.inf
    assert split_rhat_classic(stuck[..., None])[0] == math.inf
    const = np.ones((3, 20))
    assert math.isnan(rhat(const)) and math.isnan(ess(const))
    assert math.isnan(split_rhat_classic(const[..., None])[0])
    short = np.random.default_rng(0).normal(size=(2, 3))  # fewer than 4 draws per chain
    assert math.isnan(rhat(short)) and math.isnan(ess(short))
    assert math.isnan(split_rhat_classic(short[..., None])[0])
    # no chain at all is an error (it gave NaN after numpy's empty-slice warnings)
    for fn in (rhat, ess):
        with pytest.raises(ValueError, match=r"^draws must hold at least one chain"):
            fn(np.zeros((0, 100)))


# --------------------------------------------------------------- thinning ---------
def _truncated_gauss(x):
    return -0.5 * ((x - 0.2) ** 2).sum(-1) * 4.0


@pytest.mark.filterwarnings("ignore:the chains disagree")
@pytest.mark.parametrize("thin", [1, 3])
def test_thinning_and_support_keep_exactly_the_recorded_states_in_s(thin):
    # the transitions do not depend on thin or on the support, so a support run keeps,
    # per chain, the first n_samples states k (1-based) with k % thin == 0 that lie in S
    # of a plain run from the same start and seed; kept_fraction is the in-S share of the
    # states recorded until the last chain had its n_samples draws
    from mlpapers.sampling import Box, ReflectiveHMC, Region

    box = Box([-1.0, -1.0], [1.0, 1.0])
    region = Region(lambda x: x[:, 0] + x[:, 1] > 0.3)
    x0 = np.array([[0.5, 0.5], [0.4, 0.3]])
    kw = {"log_prob": _truncated_gauss, "container": box, "n_leapfrog": 4, "random_state": 0}
    n = 25
    plain = ReflectiveHMC(**kw).sample(300, x0=x0, n_chains=2, warmup=30)
    cut = ReflectiveHMC(support=region, **kw).sample(n, x0=x0, n_chains=2, warmup=30,
                                                     thin=thin)
    states = plain.samples  # every state of the plain run (thin=1, no support)
    rec = np.arange(thin - 1, states.shape[1], thin)  # 0-based indices of recorded states
    ins = states[:, rec, 0] + states[:, rec, 1] > 0.3
    n_rec = None
    for c in range(2):
        idx = rec[ins[c]][:n]
        assert len(idx) == n
        np.testing.assert_allclose(cut.samples[c], states[c, idx], rtol=0, atol=1e-12)
        last = int(np.flatnonzero(ins[c])[n - 1]) + 1  # records needed by chain c
        n_rec = last if n_rec is None else max(n_rec, last)
    assert cut.n_iterations == n_rec * thin
    np.testing.assert_allclose(cut.kept_fraction, ins[:, :n_rec].mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(cut.last_state, states[:, n_rec * thin - 1], atol=1e-12)


# --------------------------------------------------------------- supports ---------
@pytest.mark.parametrize("scale", [1e-3, 0.5, 1.0, 1e3])
def test_box_hit_is_the_first_wall_at_any_speed(scale):
    # closed form per coordinate, and the same box written as a polytope
    from mlpapers.sampling import Box, Polytope

    lo, hi = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 0.5, 5.0])
    box = Box(lo, hi)
    poly = Polytope(np.vstack([np.eye(3), -np.eye(3)]), np.r_[hi, -lo])
    g = torch.Generator().manual_seed(1)
    x = box.random_interior(50, g)
    v = torch.randn(50, 3, generator=g, dtype=torch.float64) * scale
    t, normal = box.hit(x, v)
    xn, vn = x.numpy(), v.numpy()
    wall = np.where(vn > 0, (hi - xn) / vn, (lo - xn) / vn)
    j = wall.argmin(1)
    np.testing.assert_allclose(t.numpy(), wall.min(1), rtol=1e-12)
    sign = np.sign(vn[np.arange(50), j])[:, None]
    np.testing.assert_array_equal(normal.numpy(), np.eye(3)[j] * sign)
    tp, npoly = poly.hit(x, v)
    np.testing.assert_allclose(t.numpy(), tp.numpy(), rtol=1e-12)
    np.testing.assert_allclose(normal.numpy(), npoly.numpy(), atol=1e-15)


# ------------------------------------------------------ step-size heuristic ---------
def test_step_heuristic_doubles_up_to_the_cap_when_every_step_is_accepted():
    # constant density in a box: reflections keep the energy, acceptance is always 1, so
    # the doubling heuristic doubles while 2 eps stays <= max_step
    from mlpapers.sampling import Box
    from mlpapers.sampling.rehmc._adapt import find_reasonable_step_size
    from mlpapers.sampling.rehmc._kernels import log_prob_and_grad

    def const(y):
        return torch.zeros(y.shape[0], dtype=y.dtype)

    box = Box([0.0, 0.0], [1.0, 1.0])
    g = torch.Generator().manual_seed(0)
    x = box.random_interior(3, g)
    lp, gr = log_prob_and_grad(const, x)
    init = torch.tensor([0.01, 0.1, 0.3], dtype=torch.float64)
    eps = find_reasonable_step_size(x, lp, gr, const, box, None, 100, g, init, max_step=1.0)
    np.testing.assert_allclose(eps.numpy(), [0.64, 0.8, 0.6], rtol=1e-12)


def test_step_heuristic_halves_below_the_stability_limit_of_a_stiff_target():
    # N(0, 1e-6) in one dimension: the leapfrog is unstable above eps = 2 sqrt(1e-6), so
    # from eps = 1 the heuristic must halve to the 1e-3 scale (and not below 1e-10)
    from mlpapers.sampling import Box
    from mlpapers.sampling.rehmc._adapt import find_reasonable_step_size
    from mlpapers.sampling.rehmc._kernels import log_prob_and_grad

    def stiff(y):
        return -0.5e6 * (y**2).sum(-1)

    box = Box([-10.0], [10.0])
    x = torch.full((8, 1), 1e-3, dtype=torch.float64)
    lp, gr = log_prob_and_grad(stiff, x)
    eps = find_reasonable_step_size(x, lp, gr, stiff, box, None, 100,
                                    torch.Generator().manual_seed(0),
                                    torch.ones(8, dtype=torch.float64), max_step=20.0)
    assert bool((eps <= 2e-3).all()) and bool((eps >= 1e-5).all())
    # the result is init / 2^k: the heuristic only halves from an unstable start
    k = -torch.log2(eps)
    np.testing.assert_allclose(k.numpy(), np.round(k.numpy()), atol=1e-9)


@pytest.mark.parametrize("n", [20, 40])
def test_ess_of_antithetic_chains_hits_the_documented_floor(n):
    # alternating draws: the Geyer sum is tiny, so the autocorrelation time is floored
    # at 1 / log10(N) (as ArviZ and Stan) and the bulk ESS is N log10(N) > N
    from mlpapers.sampling.rehmc._diagnostics import ess

    x = (-1.0) ** np.arange(n) * (1 + 0.1 * np.random.default_rng(0).random((2, n)))
    total = 2 * n
    assert ess(x) == pytest.approx(total * math.log10(total), rel=1e-12)
    # and the classic split ESS of the warning, floored the same way
    from mlpapers.sampling.rehmc._diagnostics import split_ess_classic

    got = split_ess_classic(x[:, :, None])[0]
    assert got == pytest.approx(total * math.log10(total), rel=1e-12)


def test_kept_fraction_warns_below_one_percent_only():
    import warnings

    from mlpapers.sampling.rehmc._draws import Draws

    def draws(n_in):
        z = torch.zeros(2, dtype=torch.long)
        return Draws(samples=torch.zeros(2, 1, 1), x=torch.zeros(2, 1),
                     accept_sum=torch.zeros(2, dtype=torch.float64), n_reflections=z,
                     n_divergent=z, n_in=torch.tensor(n_in), n_recorded=1000,
                     n_iterations=1000, leapfrog_sum=0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(draws([12, 18]).kept_fraction(), [0.012, 0.018])
    with pytest.warns(RuntimeWarning, match="fall in the support"):
        np.testing.assert_allclose(draws([8, 10]).kept_fraction(), [0.008, 0.010])


@pytest.mark.parametrize("n_samples", [1, 3])
def test_accept_rate_and_mean_leapfrog_at_any_length(n_samples):
    # reflections keep the kinetic energy and a constant density adds nothing: every
    # proposal has acceptance probability 1, even for a single sampling iteration; with a
    # fixed n_leapfrog, mean_leapfrog equals it (documented)
    from mlpapers.sampling import Box, ReflectiveHMC

    def const(y):
        return torch.zeros(y.shape[0], dtype=y.dtype)

    res = ReflectiveHMC(const, Box([0.0, 0.0], [1.0, 2.0]), step_size=0.3, n_leapfrog=3,
                        random_state=0).sample(n_samples, n_chains=2, warmup=0)
    assert res.n_iterations == n_samples
    np.testing.assert_allclose(res.accept_rate, 1.0, rtol=1e-12)
    assert res.mean_leapfrog == 3.0
