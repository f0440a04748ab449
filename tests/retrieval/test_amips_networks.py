"""Math properties of SupportNet, KeyNet, the homogenization and the oracle sigma_K."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.retrieval import (
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
    amips_loss,
    soft_leaky_relu,
    solve_width,
    support_function,
)


@functools.cache
def _supportnet(d=5, seed=0, depth=4, width=16, wx_inject=2):
    torch.manual_seed(seed)
    net = SupportNet(d, [width] * depth, wx_inject=wx_inject).double()
    # a non-trivial, data-initialised network
    net.data_init(torch.randn(64, d, dtype=torch.float64))
    return net


@functools.cache
def _oracle(d=5, N=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return SupportFunction(torch.randn(N, d, generator=g, dtype=torch.float64))


NETS = {"supportnet": _supportnet, "oracle": _oracle}

vec = st.lists(st.floats(-3, 3), min_size=5, max_size=5)


@pytest.mark.parametrize("kind", sorted(NETS))
@settings(max_examples=40, deadline=None)
@given(x=vec, y=vec, t=st.floats(0, 1), seed=st.integers(0, 3))
def test_convex_along_lines(kind, x, y, t, seed):
    f = NETS[kind](seed=seed)
    x, y = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    with torch.no_grad():
        lhs = f(torch.stack([t * x + (1 - t) * y]))[0]
        rhs = t * f(x[None])[0] + (1 - t) * f(y[None])[0]
    assert lhs <= rhs + 1e-6 * (1 + abs(rhs))


def test_effective_weights_nonnegative_and_hessian_psd():
    net = _supportnet()
    assert all(bool((w >= 0).all()) for w in net.effective_wz())
    for _ in range(3):
        x = torch.randn(5, dtype=torch.float64)
        H = torch.func.hessian(lambda v: net(v[None])[0])(x)
        assert torch.allclose(H, H.T, atol=1e-10)
        assert torch.linalg.eigvalsh(H).min() >= -1e-8


@pytest.mark.parametrize("kind", ["homogenized", "oracle"])
@settings(max_examples=30, deadline=None)
@given(x=vec, c=st.floats(1e-3, 1e3), seed=st.integers(0, 3))
def test_homogeneity_and_euler(kind, x, c, seed):
    f = Homogenize(_supportnet(seed=seed)) if kind == "homogenized" else _oracle(seed=seed)
    x = torch.tensor([x], dtype=torch.float64)
    if x.norm() < 1e-3:
        return
    v, g = f.score_and_key(x)
    vc, gc = f.score_and_key(c * x)
    assert torch.allclose(vc, c * v, rtol=1e-9, atol=1e-9)  # f(cx) = c f(x)
    assert torch.allclose(gc, g, rtol=1e-7, atol=1e-9)  # grad f(cx) = grad f(x)
    assert torch.allclose((x * g).sum(-1), v, rtol=1e-9, atol=1e-9)  # Euler


def test_oracle_gradient_is_argmax_key_and_loss_zero():
    f = _oracle(d=6, N=40, seed=3)
    x = torch.randn(200, 6, dtype=torch.float64)
    value, idx = support_function(x, f.keys)
    v, g = f.score_and_key(x)
    torch.testing.assert_close(g, f.keys[idx])
    torch.testing.assert_close(v, value)
    # the training path (double backprop) gives the same and a zero loss
    v2, g2 = f.score_and_key(x, create_graph=True)
    total, _, _ = amips_loss(v2, g2, value, f.keys[idx])
    assert total.item() == 0.0


def test_double_backprop_gradient_matches_finite_differences():
    net = Homogenize(_supportnet(seed=7))
    x = torch.randn(8, 5, dtype=torch.float64)
    target = torch.randn(8, 5, dtype=torch.float64)
    params = [p for p in net.parameters()]

    def loss():
        _, g = net.score_and_key(x, create_graph=True)
        return (g - target).square().mean()

    (grad_w,) = torch.autograd.grad(loss(), [params[0]])
    eps = 1e-6
    with torch.no_grad():
        params[0][0, 0] += eps
        up = loss().item()
        params[0][0, 0] -= 2 * eps
        down = loss().item()
        params[0][0, 0] += eps
    assert grad_w[0, 0].item() == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-8)


def test_inference_path_under_no_grad_matches_autograd():
    net = Homogenize(_supportnet())
    x = torch.randn(10, 5, dtype=torch.float64)
    v1, g1 = net.score_and_key(x, create_graph=True)
    with torch.no_grad():
        v2, g2 = net.score_and_key(x)
    assert not g2.requires_grad
    torch.testing.assert_close(g1.detach(), g2)
    torch.testing.assert_close(v1.detach(), v2)


def test_homogenize_zero_vector_is_finite():
    net = Homogenize(_supportnet())
    assert net(torch.zeros(1, 5, dtype=torch.float64)).item() == 0.0


def test_keynet_euler_score_and_resnet():
    torch.manual_seed(0)
    net = KeyNet(4, [8, 8, 8], wx_inject=2)
    x = torch.randn(6, 4)
    v, k = net.score_and_key(x)
    torch.testing.assert_close(v, (x * net(x)).sum(-1))
    assert k.shape == (6, 4)
    res = KeyNet(4, [8, 8], resnet=True)
    torch.testing.assert_close(res(x) - x, res.stack(x))


def test_soft_leaky_relu_shape_and_limits():
    t = torch.linspace(-50, 50, 1001, dtype=torch.float64)
    y = soft_leaky_relu(t, 0.1, 20.0)
    assert torch.isfinite(soft_leaky_relu(torch.tensor([1e30, -1e30]))).all()
    torch.testing.assert_close(y[0], torch.tensor(-5.0, dtype=torch.float64))
    torch.testing.assert_close(y[-1], torch.tensor(50.0, dtype=torch.float64))
    assert (torch.diff(y) > 0).all() and (torch.diff(y, 2) >= -1e-12).all()


@pytest.mark.parametrize("beta", [1.0, 20.0])
def test_soft_leaky_relu_is_exact_and_increasing_across_softplus_threshold(beta):
    # F.softplus's default threshold=20 returned beta*x / beta itself above beta*x = 20,
    # a drop of e^-20 / beta there: float64 values fell by 1.7e-9 across it (beta=1)
    t = (20.0 + torch.tensor([-1e-10, 1e-10, 1.0, 10.0, 25.0], dtype=torch.float64)) / beta
    y = soft_leaky_relu(t, 0.1, beta)
    exact = 0.1 * t + 0.9 * torch.logaddexp(beta * t, torch.zeros_like(t)) / beta
    torch.testing.assert_close(y, exact, rtol=1e-15, atol=0.0)
    assert (torch.diff(y) > 0).all()


@pytest.mark.parametrize("d,n_keys,depth,wx,out", [
    (16, 20000, 8, 4, 1), (16, 20000, 8, 4, 16), (16, 20000, 3, True, 1),
    (16, 20000, 2, False, 16), (128, 1000, 8, 4, 128), (64, 1000, 4, 4, 64)])
def test_solve_width_meets_the_official_budget(d, n_keys, depth, wx, out):
    # The official solver budgets every weight except the output layer's input weights
    # (d * out) and one output bias: count them on the real network and remove those.
    budget = 0.2 * n_keys * d

    def counted(w):
        net = (SupportNet(d, [w] * depth, wx_inject=wx) if out == 1
               else KeyNet(d, [w] * depth, wx_inject=wx))
        return sum(p.numel() for p in net.parameters()) - d * out - 1

    w = solve_width(budget, d, out, depth, wx, min_width=4)
    # rounding to a multiple of 4 moves the count by at most one step of the width
    assert abs(counted(w) - budget) <= counted(w + 4) - counted(w)
    assert w % 4 == 0 and np.isfinite(w)


@pytest.mark.parametrize("cls", [KeyNet, SupportNet])
@pytest.mark.parametrize("hidden_dims, error, match", [
    ([2.5], TypeError, "hidden_dims entries must be an integer, got 2.5"),
    ([True], TypeError, "hidden_dims entries must be an integer, got True"),
    (["8"], TypeError, "hidden_dims entries must be an integer"),
    ([8, 0], ValueError, "hidden_dims entries must be > 0, got 0"),
    ([-3], ValueError, "hidden_dims entries must be > 0"),
    (8, TypeError, "hidden_dims must be a list of ints"),
    ([], ValueError, "at least one width"),
])
def test_networks_check_their_widths_by_name(cls, hidden_dims, error, match):
    """Regression: 2.5, True and "8" were cast to widths 2, 1 and 8; a width of 0 failed
    with a ZeroDivisionError, -3 with a torch error about negative dimensions."""
    with pytest.raises(error, match=match):
        cls(4, hidden_dims)
    with pytest.raises(ValueError, match="in_features must be > 0"):
        cls(0, [4])
    assert cls(4, range(2, 4)).forward(torch.ones(3, 4)).shape[0] == 3


def test_data_init_leaves_units_without_spread_unscaled():
    # one row (std undefined) set every parameter to NaN; identical rows (std 0, then
    # clamped to 1e-6) multiplied the weights by about 1e6
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    for batch in (x[:1], x[:1].repeat(8, 1)):
        for net in (SupportNet(5, [8, 8], generator=torch.Generator().manual_seed(0)),
                    KeyNet(5, [8], generator=torch.Generator().manual_seed(0))):
            before = max(p.abs().max().item() for p in net.parameters())
            net.data_init(batch)
            after = max(p.abs().max().item() for p in net.parameters())
            assert np.isfinite(after) and after < 100 * before


def test_amortized_mips_fits_one_repeated_query_without_noise():
    from mlpapers.retrieval import AmortizedMIPS

    rng = np.random.default_rng(0)
    K = rng.normal(size=(40, 6)).astype(np.float32)
    q = rng.normal(size=(1, 6)).astype(np.float32)
    est = AmortizedMIPS(depth=2, hidden_dim=16, n_steps=200, batch_size=32, noise_std=0,
                        random_state=0).fit(K, queries=np.repeat(q, 50, axis=0))
    np.testing.assert_allclose(est.value(q), (q @ K.T).max(1), rtol=0.02)
    assert est.predict(q)[0] == (q @ K.T).argmax()


@pytest.mark.parametrize("model", ["support", "key", "homogenized"])
def test_scale_output_is_exact_for_small_factors_and_refuses_bad_ones(model):
    gen = torch.Generator().manual_seed(0)
    net = {"support": lambda: SupportNet(5, [8], generator=gen),
           "key": lambda: KeyNet(5, [8], generator=gen),
           "homogenized": lambda: Homogenize(SupportNet(5, [8], generator=gen))}[model]()
    x = torch.randn(3, 5, generator=gen)
    before = net(x).detach()
    net.scale_output(1e-14)  # (W_z * c fell below a 1e-12 floor: off by ~450x)
    torch.testing.assert_close(net(x).detach(), 1e-14 * before, rtol=1e-4, atol=0)
    for c in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="c must be"):
            net.scale_output(c)
