"""The math of ``docs/user_guide/rehmc.rst`` checked against references written from the text.

Each test names the page section it checks. The references are float64 numpy loops
written from the page's formulas (not from the implementation); they cover what no
other test checks against an independent reference: the reflected leapfrog of a
polytope (unnormalised rows, global minimum over faces) and of an ellipsoid (the
quadratic's root, normal along ``E y``) with a diagonal mass, ChEES's Adam update and
iterate average, the diagonal-mass step-size cap, and the Stiefel defaults.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    StiefelSampler,
)
from mlpapers.sampling.rehmc._chees import ChEESAdaptation
from mlpapers.sampling.rehmc._kernels import log_prob_and_grad, reflective_leapfrog

D = torch.float64


# ----------------------------------------------------------------------------------------
# "The billiard picture": kick, drift split at the first hit, reflection in the M^{-1}
# metric, kick. Reference: a scalar float64 loop per chain.
def _reflect(p, n, inv_mass):
    # p' = p - 2 (n^T M^{-1} p) / (n^T M^{-1} n) n   (page, displayed equation)
    return p - 2.0 * (n @ (inv_mass * p)) / (n @ (inv_mass * n)) * n


def _polytope_hit(A, b, x, v):
    # rows normalised to unit norm; t_i = (b_i - a_i.x) / (a_i.v) over a_i.v > 0; global min
    norms = np.linalg.norm(A, axis=1)
    An, bn = A / norms[:, None], b / norms
    av = An @ v
    t = np.where(av > 0, (bn - An @ x) / np.where(av > 0, av, 1.0), np.inf)
    j = int(np.argmin(t))
    return t[j], An[j]


def _ellipsoid_hit(c, E, x, v):
    # (y + t v)^T E (y + t v) = 1: coefficients v^T E v, 2 y^T E v, y^T E y - 1; normal ~ E y*
    y = x - c
    qa, qb, qc = v @ E @ v, 2.0 * (y @ E @ v), y @ E @ y - 1.0
    t = (-qb + math.sqrt(qb * qb - 4.0 * qa * qc)) / (2.0 * qa)
    n = E @ (y + t * v)
    return t, n / np.linalg.norm(n)


def _leapfrog_reference(x, p, h, n_steps, grad, hit, inv_mass):
    n_ref = 0
    for _ in range(n_steps):
        p = p + 0.5 * h * grad(x)  # half kick: p <- p + h/2 grad log pi(x)
        tau = h
        while True:
            v = inv_mass * p
            t, n = hit(x, v)
            if t >= tau:
                x = x + tau * v
                break
            x = x + t * v
            p = _reflect(p, n, inv_mass)
            tau -= t
            n_ref += 1
        p = p + 0.5 * h * grad(x)  # half kick at the new position
    return x, p, n_ref


@pytest.mark.parametrize("kind", ["polytope", "ellipsoid"])
@pytest.mark.parametrize("seed", [0, 1])
def test_reflected_leapfrog_matches_the_billiard_of_the_page(kind, seed):
    """User guide, "The billiard picture": steps 1-3 and the reflection p' (diag mass)."""
    rng = np.random.default_rng(seed)
    C, d, n_steps = 5, 3, 6
    if kind == "polytope":
        # rows of arbitrary length (normalised by the oracle), a bounded polytope
        A = np.vstack([rng.normal(size=(4, d)), np.eye(d), -np.eye(d)])
        A *= rng.uniform(0.2, 5.0, size=(A.shape[0], 1))
        b = rng.uniform(0.5, 1.5, size=A.shape[0]) * np.linalg.norm(A, axis=1)
        container = Polytope(A, b)

        def hit(x, v):
            return _polytope_hit(A, b, x, v)
    else:
        c = rng.normal(size=d)
        L = rng.normal(size=(d, d))
        E = L @ L.T + 0.5 * np.eye(d)
        container = Ellipsoid(c, E)

        def hit(x, v):
            return _ellipsoid_hit(c, E, x, v)

    mu, prec = rng.normal(size=d), rng.uniform(0.5, 3.0, size=d)

    def log_prob(y):
        return -0.5 * (((y - torch.as_tensor(mu)) ** 2) * torch.as_tensor(prec)).sum(-1)

    def grad(y):
        return -(y - mu) * prec

    x0 = container.random_interior(C, torch.Generator().manual_seed(seed)).numpy()
    p0 = 2.0 * rng.normal(size=(C, d))
    h = rng.uniform(0.1, 0.4, size=C)
    inv_mass = rng.uniform(0.3, 3.0, size=d)
    xt = torch.as_tensor(x0)
    lp, gr = log_prob_and_grad(log_prob, xt)
    x1, p1, lp1, g1, nref, capped = reflective_leapfrog(
        xt, torch.as_tensor(p0), lp, gr, torch.as_tensor(h), n_steps, log_prob, container,
        torch.as_tensor(inv_mass), 10**4)
    assert not bool(capped.any())
    total = 0
    for ci in range(C):
        xr, pr, nr = _leapfrog_reference(x0[ci], p0[ci], h[ci], n_steps, grad, hit, inv_mass)
        np.testing.assert_allclose(x1[ci].numpy(), xr, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(p1[ci].numpy(), pr, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(g1[ci].numpy(), grad(xr), rtol=1e-9, atol=1e-11)
        assert int(nref[ci]) == nr
        total += nr
    assert total >= C  # the walls were hit


# ----------------------------------------------------------------------------------------
# "Adaptive trajectory length (ChEES)", Optimiser: Adam on log T with beta1 = 0,
# beta2 = 0.95, learning rate 0.025, each step clipped to +-0.35, T within [one step,
# 1000 steps]; frozen value: the iterate average with weights k^{-1/2}.
def test_chees_adam_step_and_iterate_average_match_the_page():
    """User guide, "Adaptive trajectory length (ChEES)", bullet "Optimiser"."""
    rng = np.random.default_rng(3)
    grads = np.concatenate([rng.normal(size=30) * 10.0 ** rng.integers(-3, 4, size=30),
                            [1e6, -1e6, 0.0, 2.0]])
    t_min, t_max = 0.05, 0.05 * 1000
    ad = ChEESAdaptation(t_min)
    log_t = log_bar = math.log(t_min)
    v = 0.0
    for k, g in enumerate(grads, start=1):
        v = 0.95 * v + 0.05 * g * g
        v_hat = v / (1.0 - 0.95**k)  # bias-corrected second moment (beta1 = 0: no first)
        step = float(np.clip(0.025 * g / math.sqrt(v_hat + 1e-20), -0.35, 0.35))
        log_t = min(max(log_t + step, math.log(t_min)), math.log(t_max))
        w = k**-0.5
        log_bar = w * log_t + (1.0 - w) * log_bar
        assert ad.update(float(g), t_min, t_max) == pytest.approx(math.exp(log_t), rel=1e-12)
    assert ad.final(t_min, t_max) == pytest.approx(math.exp(log_bar), rel=1e-12)
    # "T climbs from one step by about the learning rate, 0.025 in log T per iteration,
    # when the gradient keeps its sign" (Benchmark, Default): exactly 0.025 for a constant
    # gradient, whatever its size, so k steps take 40 ln k iterations
    ad = ChEESAdaptation(1.0)
    for _ in range(10):
        ad.update(123.0, 1e-3, 1e3)
    assert math.log(ad.trajectory_length) == pytest.approx(10 * 0.025, rel=1e-12)


# ----------------------------------------------------------------------------------------
# "Choices", Adaptation: with an adapted diagonal mass the step-size cap is the larger of
# the inscribed diameter over sqrt(sum_i M^-1_ii) and the inscribed diameter in the
# coordinates x_i / sqrt(M^-1_ii) over sqrt(d).
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diag_mass_step_cap_is_the_documented_maximum(seed):
    """User guide, "Choices", bullet "Adaptation" (step-size cap with ``mass="diag"``)."""
    rng = np.random.default_rng(seed)
    d = 5
    inv_mass = rng.uniform(0.01, 100.0, size=d)
    s = np.sqrt(inv_mass)
    im = torch.as_tensor(inv_mass)

    def cap(width, scaled_width):
        return max(width / math.sqrt(inv_mass.sum()), scaled_width / math.sqrt(d))

    lo = rng.normal(size=d)
    w = rng.uniform(1e-2, 1e2, size=d)
    # box: inscribed diameter min(w); in scaled coordinates min(w_i / s_i)
    assert Box(lo, lo + w)._step_cap(im) == pytest.approx(cap(w.min(), (w / s).min()),
                                                          rel=1e-12)
    # the same box as a polytope (its scaled width comes from a linear program)
    A = np.vstack([np.eye(d), -np.eye(d)]) * rng.uniform(0.5, 2.0, size=(2 * d, 1))
    b = np.concatenate([(lo + w) * np.abs(A[:d]).sum(1), -lo * np.abs(A[d:]).sum(1)])
    assert Polytope(A, b)._step_cap(im) == pytest.approx(cap(w.min(), (w / s).min()),
                                                         rel=1e-6)
    # ball of radius r: the scaled set is an ellipsoid of semi-axes r / s_i
    r = float(rng.uniform(0.1, 10.0))
    assert Ball(lo, r)._step_cap(im) == pytest.approx(cap(2 * r, 2 * r / s.max()), rel=1e-12)
    # ellipsoid y^T E y <= 1: semi-axes 1/sqrt(eig E); scaled: y^T (S E S) y <= 1
    L = rng.normal(size=(d, d))
    E = L @ L.T + 0.1 * np.eye(d)
    ref = cap(2 / math.sqrt(np.linalg.eigvalsh(E).max()),
              2 / math.sqrt(np.linalg.eigvalsh(np.diag(s) @ E @ np.diag(s)).max()))
    assert Ellipsoid(lo, E)._step_cap(im) == pytest.approx(ref, rel=1e-10)
    # identity mass: both caps are width / sqrt(d)
    assert Box(lo, lo + w)._step_cap(torch.ones(d, dtype=D)) == pytest.approx(
        w.min() / math.sqrt(d), rel=1e-12)


# ----------------------------------------------------------------------------------------
def test_stiefel_defaults_container_and_lp_statistic():
    """User guide, "Stiefel manifold", "Stiefel bounds" and "Per-draw statistics".

    Defaults a = (sqrt(n) - sqrt(k - 1))/4 and b = sqrt(n) + sqrt(k) + 1; the chain reflects off the
    Frobenius ball of radius b sqrt(k) and keeps a <= sigma_min, sigma_max <= b; ``lp`` of
    a draw is log g(Q) - |X|_F^2 / 2 with Q = X (X^T X)^{-1/2}.
    """
    n, k = 5, 2
    F = np.arange(1.0, 1.0 + n * k).reshape(n, k) / 4.0
    Ft = torch.as_tensor(F)
    res = StiefelSampler(lambda Q: (Q * Ft).sum((-2, -1)), n=n, k=k, n_leapfrog=4,
                         random_state=0).sample(30, n_chains=3, warmup=40)
    a, b = (math.sqrt(n) - math.sqrt(k - 1)) / 4.0, math.sqrt(n) + math.sqrt(k) + 1.0
    X = res.X.reshape(-1, n, k)
    sv = np.linalg.svd(X, compute_uv=False)
    assert (sv[:, -1] >= a).all() and (sv[:, 0] <= b).all()
    assert (np.linalg.norm(X.reshape(len(X), -1), axis=1) <= b * math.sqrt(k)).all()
    # polar factor from the definition, by an eigendecomposition of X^T X
    w, V = np.linalg.eigh(np.swapaxes(X, 1, 2) @ X)
    Q = X @ V @ (w[:, :, None] ** -0.5 * np.swapaxes(V, 1, 2))
    np.testing.assert_allclose(res.Q.reshape(-1, n, k), Q, atol=1e-10)
    lp = (Q * F).sum((1, 2)) - 0.5 * (X**2).sum((1, 2))
    np.testing.assert_allclose(res.sample_stats["lp"].reshape(-1), lp, rtol=1e-10, atol=1e-10)
    # the container of the last state: the ball of radius b sqrt(k) (resume refuses a
    # smaller b whose ball no longer holds the final states; a larger one is accepted)
    assert np.linalg.norm(res.last_state, axis=1).max() <= b * math.sqrt(k)


# ----------------------------------------------------------------------------------------
def test_defaults_in_the_signatures_match_the_page():
    """User guide, "Usage", "Choices" and the PyMC table: the documented defaults."""
    sig = inspect.signature(ReflectiveHMC)
    defaults = {k: p.default for k, p in sig.parameters.items()}
    assert defaults["n_leapfrog"] == "auto"
    assert defaults["step_size"] == "auto"
    assert defaults["target_accept"] == 0.8
    assert defaults["mass"] == "identity"
    assert defaults["jitter"] is True
    assert defaults["dtype"] is torch.float64
    assert defaults["max_reflections"] is None  # 100 d
    s = inspect.signature(ReflectiveHMC.sample).parameters
    assert s["n_chains"].default in (None, 4) and s["warmup"].default in (None, 1000)
    assert s["thin"].default == 1
    st = inspect.signature(StiefelSampler).parameters
    assert st["n_leapfrog"].default == "auto" and st["target_accept"].default == 0.8
    # None means 4 chains and 1000 warm-up iterations
    calls = {}

    def log_prob(x):
        calls["n"] = calls.get("n", 0) + 1
        return -0.5 * (x * x).sum(-1)

    res = ReflectiveHMC(log_prob, Box(-1.0, 1.0, dim=2), n_leapfrog=1, step_size=0.5,
                        random_state=0).sample(3)
    # one log_prob call per transition (one leapfrog step): 1000 warm-up + 3 draws
    assert res.samples.shape == (4, 3, 2) and 1003 <= calls["n"] <= 1010


# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1.0, 3.5])
def test_chees_gradient_of_a_unit_gaussian_matches_the_closed_form(T):
    """User guide, "Adaptive trajectory length (ChEES)", bullet "Start and transient".

    For N(0, I_d) the jittered criterion is d (1/2 - sin(2T) / (4T)) (lengths uT, u
    uniform), so the expected per-chain gradient with respect to log T is
    T d/dT of it: positive before the peak at T* = 2.25 (tan 2T = 2T), negative after.
    Exact harmonic flow x' = x cos t + p sin t, v' = -x sin t + p cos t, t = uT.
    """
    from mlpapers.sampling.rehmc._chees import chees_gradient

    g = torch.Generator().manual_seed(11)
    C, d = 400_000, 3
    x = torch.randn(C, d, generator=g, dtype=D)
    p = torch.randn(C, d, generator=g, dtype=D)
    t = T * torch.rand(C, generator=g, dtype=D)
    c, s = torch.cos(t)[:, None], torch.sin(t)[:, None]
    x1, v1 = x * c + p * s, -x * s + p * c
    got = chees_gradient(x, x1, v1, t, torch.ones(C, dtype=D), torch.zeros(C, dtype=torch.bool))
    ref = T * d * -(2 * T * math.cos(2 * T) - math.sin(2 * T)) / (4 * T * T)
    assert got == pytest.approx(ref, rel=0.05)
    # the peak of the criterion: the first positive root of tan 2T = 2T
    from scipy.optimize import brentq

    t_star = brentq(lambda u: math.tan(2 * u) - 2 * u, 2.0, 2.3)
    assert round(t_star, 2) == 2.25
