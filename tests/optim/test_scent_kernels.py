"""Math of SCENT's dual update and of the EntropicRiskLoss (paper note, section 5)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    log_mean_exp,
    objective,
    sox_update,
    spmd_gamma,
    spmd_update,
)

f64 = torch.float64
finite = dict(allow_nan=False, allow_infinity=False)


def t(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


# -- 1. dual identity ---------------------------------------------------------------
@given(st.lists(st.floats(-20, 20, **finite), min_size=1, max_size=30))
@settings(max_examples=40, deadline=None)
def test_dual_identity_value_and_argmin(s):
    s = np.asarray(s)
    target = logsumexp(s) - math.log(len(s))
    shift = s.max()

    def dual(nu):  # min_nu mean exp(s - nu) + nu - 1
        return np.mean(np.exp(s - nu)) + nu - 1

    res = minimize_scalar(dual, bracket=(shift - 5, shift + 5), tol=1e-12)
    assert res.fun == pytest.approx(target, abs=1e-8)
    assert res.x == pytest.approx(target, abs=1e-5)
    assert float(log_mean_exp(t(s))) == pytest.approx(target, abs=1e-12)
    # the closed-form optimum attains the value exactly
    assert dual(target) == pytest.approx(target, abs=1e-12)


def test_log_mean_exp_mask_matches_subset(rng):
    s = t(rng.normal(size=(4, 7)))
    mask = torch.as_tensor(rng.random((4, 7)) < 0.6)
    mask[:, 0] = True
    got = log_mean_exp(s, mask=mask)
    for i in range(4):
        ref = logsumexp(s[i][mask[i]].numpy()) - math.log(int(mask[i].sum()))
        assert float(got[i]) == pytest.approx(ref, abs=1e-12)


# -- 2. SPMD closed form ---------------------------------------------------------------
def bregman(a, b):  # D_phi(a, b), phi(nu) = exp(-nu)
    return np.exp(-a) - np.exp(-b) + np.exp(-b) * (a - b)


@given(st.floats(-5, 5, **finite), st.floats(-5, 5, **finite), st.floats(-3, 3, **finite))
@settings(max_examples=60, deadline=None)
def test_spmd_closed_form_is_the_prox_argmin(nu_prev, L, log_alpha):
    g, alpha = math.exp(L), math.exp(log_alpha)

    def prox(nu):
        return g * np.exp(-nu) + nu + bregman(nu, nu_prev) / alpha

    res = minimize_scalar(prox, bracket=(-10, 10), tol=1e-12)
    got = float(spmd_update(t([nu_prev]), t([L]), log_alpha)[0])
    assert got == pytest.approx(res.x, abs=1e-5)
    assert prox(got) <= res.fun + 1e-12
    # linear-space forms: e^nu = (1-gamma) e^nu_prev + gamma g, y = (y_prev + a) / (1 + a g)
    gamma = alpha * math.exp(nu_prev) / (1 + alpha * math.exp(nu_prev))
    assert got == pytest.approx(math.log((1 - gamma) * math.exp(nu_prev) + gamma * g), abs=1e-10)
    y = (math.exp(-nu_prev) + alpha) / (1 + alpha * g)
    assert got == pytest.approx(-math.log(y), abs=1e-10)


# -- 3. limits ---------------------------------------------------------------------------
@given(st.floats(-50, 50, **finite), st.floats(-50, 50, **finite))
@settings(max_examples=40, deadline=None)
def test_alpha_limits_and_gamma_range(nu_prev, L):
    nu, Lt = t([nu_prev]), t([L])
    assert float(spmd_update(nu, Lt, 200.0)[0]) == pytest.approx(L, abs=1e-9)
    assert float(spmd_update(nu, Lt, -200.0)[0]) == pytest.approx(nu_prev, abs=1e-9)
    for la in (-3.0, 0.0, 3.0):
        g = float(spmd_gamma(t([max(min(nu_prev, 30), -30)]), la)[0])
        assert 0.0 < g < 1.0


# -- 4. shift invariance -----------------------------------------------------------------
@pytest.mark.parametrize("c", [-7.5, 3.0, 250.0])
def test_shift_invariance_of_trajectory_and_weights(c, rng):
    base = EntropicRiskLoss(6, log_alpha=0.3)
    shifted = EntropicRiskLoss(6, log_alpha=0.3 - c)
    for _ in range(12):
        idx = torch.as_tensor(rng.choice(6, size=3, replace=False))
        s = t(rng.normal(size=(3, 5)))
        s1, s2 = s.clone().requires_grad_(), (s + c).requires_grad_()
        base(s1, idx).backward()
        shifted(s2, idx).backward()
        torch.testing.assert_close(shifted.nu, base.nu + c * base.initialized, atol=1e-9,
                                   rtol=0)
        torch.testing.assert_close(s2.grad, s1.grad, atol=1e-10, rtol=1e-9)


# -- 5. running-mean schedule ------------------------------------------------------------
def test_running_mean_schedule_gives_log_of_mean(rng):
    loss = EntropicRiskLoss(1)
    gs = []
    for step in range(1, 30):
        s = t(rng.normal(2.0, 1.5, size=(1, 4)))
        gs.append(np.mean(np.exp(s.numpy())))
        if step > 1:  # alpha_t = exp(-nu_{t-1}) / (t - 1)
            loss.log_alpha = -float(loss.nu[0]) - math.log(step - 1)
        loss(s, torch.tensor([0]))
        assert float(loss.nu[0]) == pytest.approx(math.log(np.mean(gs)), abs=1e-12)


# -- 6. SOX equivalence ------------------------------------------------------------------
@given(st.floats(0.01, 0.99), st.floats(-20, 20, **finite), st.floats(-20, 20, **finite))
@settings(max_examples=40, deadline=None)
def test_sox_equivalence(gamma, nu_prev, L):
    log_alpha = math.log(gamma / (1 - gamma)) - nu_prev
    a = spmd_update(t([nu_prev]), t([L]), log_alpha)
    b = sox_update(t([nu_prev]), t([L]), gamma)
    assert float(a[0]) == pytest.approx(float(b[0]), abs=1e-10)


# -- 7. noiseless contraction ------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.01, 0.5, 3.0])
def test_noiseless_contraction_factor(alpha):
    m, nu = 7.0, t([-2.0])
    err = abs(1 - m * math.exp(-float(nu[0])))
    for _ in range(10):
        nu = spmd_update(nu, t([math.log(m)]), math.log(alpha))
        new = abs(1 - m * math.exp(-float(nu[0])))
        assert new == pytest.approx(err / (1 + alpha * m), rel=1e-9)
        err = new


# -- 9. stability ------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["scent", "sox", "bsgd", "umax"])
def test_huge_logits_in_float32(method):
    w = torch.tensor([1.0], requires_grad=True)
    scores = torch.tensor([[1e4, 1e4 - 1, 0.0]], dtype=torch.float32) * w
    loss = EntropicRiskLoss(1, method=method, log_alpha=0.0, nu_init=0.0 if method != "bsgd"
                            else None)
    for _ in range(40):
        w.grad = None
        value = loss(scores, torch.tensor([0]))
        value.backward(retain_graph=True)
        assert torch.isfinite(value) and torch.isfinite(w.grad).all()
    if method != "bsgd":
        assert float(loss.nu[0]) == pytest.approx(9999.2146, abs=1e-3)


def test_small_temperature_float32(rng):
    ell = torch.as_tensor(rng.exponential(size=(1, 50)), dtype=torch.float32)
    w = torch.ones(1, requires_grad=True)
    loss = EntropicRiskLoss(1, temperature=1e-3, log_alpha=-900.0)
    for _ in range(5):
        w.grad = None
        value = loss(ell * w, torch.tensor([0]))
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(w.grad).all()
    exact = float(objective(ell.double(), temperature=1e-3))
    assert 1e-3 * float(loss.nu[0]) == pytest.approx(exact, abs=1e-4)


# -- 10. surrogate gradient --------------------------------------------------------------
@pytest.mark.parametrize("method", ["scent", "sox", "umax", "asgd", "bsgd"])
def test_surrogate_gradient_is_full_lse_gradient_at_optimum(method, rng):
    X = t(rng.normal(size=(5, 8, 3)))
    w = t(rng.normal(size=3)).requires_grad_()
    scores = X @ w
    ref_w = w.detach().clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(objective(X @ ref_w, temperature=0.7), ref_w)
    loss = EntropicRiskLoss(5, method=method, log_alpha=0.0, gamma=0.5, temperature=0.7)
    nu_star = log_mean_exp(scores.detach() / 0.7)
    loss.nu.copy_(nu_star)
    loss.initialized.fill_(True)
    (g,) = torch.autograd.grad(loss(scores, torch.arange(5)), w)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-9)
    if method != "bsgd":  # nu* is a fixed point of every dual rule with exact estimates
        torch.testing.assert_close(loss.nu, nu_star, atol=1e-10, rtol=0)


@pytest.mark.parametrize("method", ["scent", "sox", "umax", "asgd", "asgd_softplus", "bsgd"])
@pytest.mark.parametrize("pad", [1e3, -1e3, 0.0])
def test_masked_items_never_reach_the_loss_or_gradient(method, pad, rng):
    # regression: exp(s - nu) was taken on padded items too and then multiplied by 0,
    # so a pad far above the valid scores gave inf * 0 = NaN loss and gradients
    s = rng.normal(size=(3, 6)) - 300.0  # valid scores far below a pad of 0 too
    mask = torch.as_tensor(rng.random((3, 6)) < 0.6)
    mask[:, 0] = True
    padded = t(np.where(mask.numpy(), s, pad)).requires_grad_()
    subset = t(s).requires_grad_()
    losses = [EntropicRiskLoss(3, method=method, log_alpha=0.3, temperature=0.5)
              for _ in range(2)]
    for _ in range(2):  # first visit, then a regular update
        a = losses[0](padded, torch.arange(3), mask)
        b = losses[1](subset, torch.arange(3), mask)
    (ga,) = torch.autograd.grad(a, padded)
    (gb,) = torch.autograd.grad(b, subset)
    assert torch.isfinite(a) and torch.isfinite(ga).all()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    assert not bool(ga[~mask].any())


def test_asgd_uses_old_nu_and_umax_resets(rng):
    s = t([[0.0, 1.0, 2.0]])
    L = float(log_mean_exp(s)[0])
    asgd = EntropicRiskLoss(1, method="asgd", dual_lr=0.5, nu_init=-3.0)
    sw = s.clone().requires_grad_()
    asgd(sw, torch.tensor([0])).backward()
    torch.testing.assert_close(sw.grad, torch.exp(s + 3.0) / 3)  # weights with old nu
    assert float(asgd.nu[0]) == pytest.approx(-3.0 - 0.5 * (1 - math.exp(L + 3.0)))
    umax = EntropicRiskLoss(1, method="umax", dual_lr=1e-3, delta=1.0, nu_init=-3.0)
    umax(s, torch.tensor([0]))
    assert float(umax.nu[0]) == pytest.approx(L)


def test_softplus_dual_step_is_gradient_of_its_dual(rng):
    s, rho, nu0, lr = rng.normal(size=5), 1e-2, 0.4, 0.1

    def dual(nu):
        return np.mean(np.log1p(rho * np.exp(s - nu))) / rho + nu

    grad = (dual(nu0 + 1e-6) - dual(nu0 - 1e-6)) / 2e-6
    loss = EntropicRiskLoss(1, method="asgd_softplus", rho=rho, dual_lr=lr, nu_init=nu0)
    loss(t([s]), torch.tensor([0]))
    assert float(loss.nu[0]) == pytest.approx(nu0 - lr * grad, abs=1e-7)


def test_bsgd_is_plugin_log_mean_exp(rng):
    s = t(rng.normal(size=(3, 4)))
    value = EntropicRiskLoss(3, method="bsgd", temperature=2.0)(s, torch.arange(3))
    assert float(value) == pytest.approx(float(objective(s, temperature=2.0)), abs=1e-12)


def test_first_visit_mask_not_nu_zero():
    loss = EntropicRiskLoss(2, log_alpha=-30.0)  # tiny alpha: nu barely moves after init
    loss(t([[0.0, 0.0]]), torch.tensor([0]))  # true nu* = 0
    assert float(loss.nu[0]) == 0.0 and bool(loss.initialized[0])
    loss(t([[5.0, 5.0]]), torch.tensor([0]))  # visited: no re-initialisation to 5
    assert float(loss.nu[0]) == pytest.approx(0.0, abs=1e-6)


# -- micro-benchmark claim: SPMD beats SGD on nu far from nu* ---------------------------
# -- 11. determinism and bad input ------------------------------------------------------
def test_same_seed_same_nu_table():
    def run():
        gen = torch.Generator().manual_seed(3)
        loss = EntropicRiskLoss(10, log_alpha=1.0)
        w = torch.zeros(4, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        X = torch.randn(10, 6, 4, generator=gen)
        for _ in range(20):
            idx = torch.randperm(10, generator=gen)[:4]
            opt.zero_grad()
            loss(X[idx] @ w, idx).backward()
            opt.step()
        return loss.nu.clone(), w.detach().clone()

    (a, wa), (b, wb) = run(), run()
    assert torch.equal(a, b) and torch.equal(wa, wb)


def test_bad_inputs():
    loss = EntropicRiskLoss(3)
    s = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="index must have shape"):
        loss(s, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="index must have shape"):
        loss(s, torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="index must hold integers"):
        loss(s, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        loss(s, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="repeat"):
        loss(s, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="NaN"):
        loss(torch.full((2, 4), float("nan")), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="scores must have shape"):
        loss(torch.zeros(4), torch.tensor([0]))
    with pytest.raises(ValueError, match="mask"):
        loss(s, torch.tensor([0, 1]), mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="method"):
        EntropicRiskLoss(3, method="adam")
    with pytest.raises(ValueError, match="gamma"):
        EntropicRiskLoss(3, gamma=1.5)
    with pytest.raises(ValueError, match="n_anchors"):
        EntropicRiskLoss(0)


def test_state_dict_round_trip():
    a = EntropicRiskLoss(4)
    a(torch.randn(2, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 2]))
    b = EntropicRiskLoss(4)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.nu, b.nu) and torch.equal(a.initialized, b.initialized)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmd_update_at_infinite_nu_and_alpha_takes_the_limits(dtype):
    # regression: nu = +inf gave inf - inf = NaN; the limit of
    # log((1 - gamma) e^nu + gamma g) is log(1/alpha + g). alpha = 0 keeps nu and
    # alpha = inf jumps to L, also at infinite nu (log_alpha + nu was NaN there)
    L = torch.tensor([2.0, -1.0], dtype=dtype)
    inf = torch.full((2,), math.inf, dtype=dtype)
    for la in (0.0, -2.3, 4.0):
        ref = torch.logaddexp(torch.full_like(L, -la), L)
        torch.testing.assert_close(spmd_update(inf, L, la), ref)
    torch.testing.assert_close(spmd_update(inf, L, math.inf), L)
    assert torch.isposinf(spmd_update(inf, L, -math.inf)).all()
    torch.testing.assert_close(spmd_update(-inf, L, math.inf), L)
    assert torch.isneginf(spmd_update(-inf, L, -math.inf)).all()
    assert torch.isneginf(spmd_update(-inf, L, 0.0)).all()


def test_spmd_update_keeps_the_digits_of_a_large_nu_in_float32():
    # nu + logsigmoid(-a) cancelled for nu >> 1 (ulp 0.0625 at 1e6): the exact step is
    # within float32 rounding of its limit log(1/alpha + g) there
    nu, L, la = torch.tensor([1e6]), torch.tensor([2.0]), math.log(0.1)
    ref = math.log(math.exp(2.0) + 10.0)
    assert abs(float(spmd_update(nu, L, la)) - ref) < 1e-6


def test_sox_update_takes_l_where_a_tensor_gamma_reaches_one():
    # regression: log1p(-gamma) was NaN for the entries of a tensor gamma above 1 (a
    # Python gamma >= 1 already gave L, as documented)
    nu = torch.tensor([0.0, 0.0, math.inf, 1.0], dtype=torch.float64)
    L = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    gamma = torch.tensor([0.5, 2.0, 1.0, 1.0], dtype=torch.float64)
    out = sox_update(nu, L, gamma)
    assert out[0] == pytest.approx(math.log(0.5 + 0.5 * math.e))
    torch.testing.assert_close(out[1:], L[1:])
