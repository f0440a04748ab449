"""Tests that kill mutants the rest of the suite let through (AMIPS).

Each test asserts a property against an independent reference: the documented layer
equations written out in float64, closed forms of the width solver, the loss and the
schedule, brute-force search, or the documented defaults.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.retrieval.amips import (
    Homogenize,
    KeyNet,
    SupportNet,
    amips_loss,
    soft_leaky_relu,
    solve_width,
    support_function,
)


def _phi(t, a=0.1, beta=20.0):
    # soft-leaky-ReLU written from its definition, overflow-safe softplus by hand
    return a * t + (1 - a) * (torch.clamp(beta * t, min=0)
                              + torch.log1p(torch.exp(-torch.abs(beta * t)))) / beta


def _reference_forward(stack, x):
    """The layer equations of the module docstring, in float64; returns the output and
    the hidden pre-activations."""
    depth = len(stack.hidden_dims)
    # the input enters every `wx_inject` layers and always at the output layer
    inject = stack.inject
    wz = [F.softplus(w) if stack.positive else w for w in stack.wz]
    b = list(stack.bias)
    pre = x @ stack.wx0.weight.T + (stack.wx0.bias if stack.wx0.bias is not None else 0)
    pres = [pre]
    z = _phi(pre, stack.negative_slope, stack.beta)
    for l in range(depth):
        pre = z @ wz[l].T
        if inject[l]:
            pre = pre + x @ stack.wx[l].weight.T
        if b:
            pre = pre + b[l]
        if l == depth - 1:
            return pre, pres
        pres.append(pre)
        z = _phi(pre, stack.negative_slope, stack.beta)


def _net(kind, d=5, depth=4, width=12, wx_inject=2, seed=0):
    torch.manual_seed(seed)
    if kind == "supportnet":
        net = SupportNet(d, [width] * depth, wx_inject=wx_inject)
    else:
        net = KeyNet(d, [width] * depth, wx_inject=wx_inject)
    net = net.double()
    with torch.no_grad():  # non-trivial biases and output weights
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("kind", ["supportnet", "keynet"])
@pytest.mark.parametrize("wx_inject", [2, True, False])
def test_forward_equals_the_documented_layer_equations(kind, wx_inject):
    net = _net(kind, wx_inject=wx_inject)
    x = torch.randn(7, 5, dtype=torch.float64)
    ref, _ = _reference_forward(net.stack, x)
    with torch.no_grad():
        out = net(x)
    torch.testing.assert_close(out, ref[:, 0] if kind == "supportnet" else ref)


@pytest.mark.parametrize("wx_inject", [False, 0, 3, True])
def test_parameter_count_closed_form_with_output_layer_always_injecting(wx_inject):
    d, w, depth = 5, 8, 4
    net = SupportNet(d, [w] * depth, wx_inject=wx_inject)
    if wx_inject is True:
        n_inj = depth - 1
    elif not wx_inject:
        n_inj = 0
    else:
        n_inj = sum(1 for layer in range(1, depth) if layer % wx_inject == 0)
    expected = (d * w + w) + (depth - 1) * (w * w + w) + (w + 1) + n_inj * d * w + d
    assert sum(p.numel() for p in net.parameters()) == expected


def test_soft_leaky_relu_default_parameters():
    t = torch.linspace(-3, 3, 61, dtype=torch.float64)
    torch.testing.assert_close(soft_leaky_relu(t), _phi(t, 0.1, 20.0))


def test_amips_loss_default_weights():
    ps, ts = torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])
    pk, tk = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.zeros(2, 2)
    total, sl, kl = amips_loss(ps, pk, ts, tk)
    assert sl.item() == pytest.approx((1 + 4) / 2) and kl.item() == pytest.approx(5 / 4)
    assert total.item() == pytest.approx(0.01 * 2.5 + 1.0 * 1.25)


def test_support_function_on_a_single_key():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 3, dtype=torch.float64, generator=g)
    key = torch.randn(1, 3, dtype=torch.float64, generator=g)
    value, index = support_function(q, key)
    torch.testing.assert_close(value, (q @ key.T)[:, 0])
    assert index.tolist() == [0] * 6


@pytest.mark.parametrize("budget", [30, 61, 97])
def test_solve_width_exact_root_without_hidden_to_hidden_layers(budget):
    # depth=1: the budget is linear in w, (d + out + bias) w + bias (out - 1) = budget
    d, out = 2, 3
    w = solve_width(budget, d, out, 1, multiple=1, min_width=1)
    assert w == round((budget - (out - 1)) / (d + out + 1))


def test_solve_width_exact_root_of_the_quadratic():
    d, out, depth, wx = 6, 1, 9, 4
    n_inj = 2  # hidden layers 4 and 8 re-inject (every 4th after the first)
    for w in (20, 33, 58):
        budget = (depth - 1) * w * w + (d + out + depth + n_inj * d) * w + (out - 1)
        assert solve_width(budget, d, out, depth, wx, multiple=1, min_width=1) == w


def test_solve_width_documented_defaults():
    # wx_inject=4, bias=True, multiple=4, min_width=16
    for budget, d, out, depth in [(2e4, 128, 1, 5), (2e5, 64, 64, 9), (10, 4, 1, 3)]:
        assert solve_width(budget, d, out, depth) == solve_width(
            budget, d, out, depth, 4, bias=True, multiple=4, min_width=16)
    assert solve_width(10, 4, 1, 3) == 16  # tiny budget: the floor of 16


def test_positive_init_has_half_normal_effective_weights():
    torch.manual_seed(0)
    net = SupportNet(3, [256, 256])
    wz = net.effective_wz()[0].detach()  # fan-in 256
    # |N(0, 1/fan_in)| has mean sqrt(2 / pi) / sqrt(fan_in)
    assert float(wz.mean()) == pytest.approx(math.sqrt(2 / math.pi) / 16, rel=0.05)


@pytest.mark.parametrize("kind", ["supportnet", "keynet"])
def test_data_init_standardises_every_hidden_pre_activation(kind):
    net = _net(kind, depth=4, width=10)
    x = torch.randn(300, 5, dtype=torch.float64) * 3 + 1
    net.data_init(x)
    with torch.no_grad():
        _, pres = _reference_forward(net.stack, x)
    assert len(pres) == 4
    for pre in pres:
        torch.testing.assert_close(pre.mean(0), torch.zeros(pre.shape[1], dtype=pre.dtype),
                                   atol=1e-9, rtol=0)
        torch.testing.assert_close(pre.std(0), torch.ones(pre.shape[1], dtype=pre.dtype),
                                   atol=1e-6, rtol=0)
    if kind == "supportnet":
        assert all(bool((w >= 0).all()) for w in net.effective_wz())


def test_homogenize_data_init_standardises_on_the_unit_sphere():
    net = Homogenize(_net("supportnet", depth=3, width=10))
    x = torch.randn(300, 5, dtype=torch.float64) * torch.rand(300, 1, dtype=torch.float64) * 9
    net.data_init(x)
    u = x / x.norm(dim=1, keepdim=True)  # the inner model only sees directions
    with torch.no_grad():
        _, pres = _reference_forward(net.model.stack, u)
    for pre in pres:
        torch.testing.assert_close(pre.mean(0), torch.zeros(pre.shape[1], dtype=pre.dtype),
                                   atol=1e-9, rtol=0)
        torch.testing.assert_close(pre.std(0), torch.ones(pre.shape[1], dtype=pre.dtype),
                                   atol=1e-6, rtol=0)


def test_score_and_key_keeps_no_graph_by_default():
    x = torch.randn(4, 5, dtype=torch.float64)
    for net in (_net("supportnet"), Homogenize(_net("supportnet"))):
        v, g = net.score_and_key(x)
        assert not v.requires_grad and not g.requires_grad
        v2, g2 = net.score_and_key(x, create_graph=True)
        assert g2.requires_grad
        torch.testing.assert_close(g, g2.detach())


def test_double_backprop_path_leaves_the_callers_tensor_alone():
    net = Homogenize(_net("supportnet"))
    x = torch.randn(4, 5, dtype=torch.float64)
    net.score_and_key(x, create_graph=True)
    assert not x.requires_grad


@pytest.mark.parametrize("noise_std", [0.02, 1.0])
def test_augment_queries_keeps_norms_and_replaces_the_documented_fraction(noise_std):
    from mlpapers.retrieval.amips._training import augment_queries

    gen = torch.Generator().manual_seed(0)
    n, d, n_noise = 20000, 8, 3
    data = torch.Generator().manual_seed(1)
    q = (torch.randn(n, d, dtype=torch.float64, generator=data)
         * torch.rand(n, 1, dtype=torch.float64, generator=data))
    out = augment_queries(q, noise_std, n_noise, gen)
    torch.testing.assert_close(out.norm(dim=1), q.norm(dim=1))
    replaced = (out != q).any(dim=1).double().mean().item()
    p = n_noise / (n_noise + 1)
    assert abs(replaced - p) < 4 * math.sqrt(p * (1 - p) / n)
    if noise_std < 0.1:  # small noise: the relative change is about noise_std * sqrt(d)
        rel = ((out - q).norm(dim=1) / q.norm(dim=1))[(out != q).any(dim=1)]
        assert float(rel.square().mean().sqrt()) == pytest.approx(noise_std * math.sqrt(d - 1),
                                                                  rel=0.05)
    assert augment_queries(q, 0.0, n_noise, gen) is q
    assert augment_queries(q, noise_std, 0, gen) is q


@pytest.mark.parametrize("kind", ["supportnet", "keynet"])
def test_match_output_scale_matches_the_mean_label_key_norm(kind):
    from mlpapers.retrieval.amips._training import match_output_scale

    net = _net(kind)
    if kind == "supportnet":
        net = Homogenize(net)
    x = torch.randn(64, 5, dtype=torch.float64)
    keys = 7.0 * torch.randn(30, 5, dtype=torch.float64)
    c = match_output_scale(net, x, keys)
    _, pred = net.score_and_key(x)
    target = keys[(x @ keys.T).argmax(1)].norm(dim=1).mean()
    assert c > 0
    torch.testing.assert_close(pred.norm(dim=1).mean(), target)


def test_match_output_scale_leaves_a_zero_output_model_alone():
    from mlpapers.retrieval.amips._training import match_output_scale

    net = _net("keynet")
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    x = torch.randn(16, 5, dtype=torch.float64)
    assert match_output_scale(net, x, torch.randn(9, 5, dtype=torch.float64)) == 1.0
    _, key = net.score_and_key(x)
    assert bool((key == 0).all())


def _train(n_steps, ema_decay, callback=None, warmup=0.25, lr=0.1, end_lr_ratio=0.5):
    from mlpapers.retrieval.amips._training import train_amips

    torch.manual_seed(0)
    model = KeyNet(3, [8, 8])
    keys = torch.randn(10, 3)
    g = torch.Generator().manual_seed(1)
    pool = torch.randn(200, 3, generator=g)

    def draw(n):
        return pool[torch.randint(200, (n,), generator=g)]

    init = [p.detach().clone() for p in model.parameters()]
    final, history = train_amips(
        model, keys, draw, augment=lambda q: q, n_steps=n_steps, batch_size=32, lr=lr,
        warmup=warmup, end_lr_ratio=end_lr_ratio, ema_decay=ema_decay, grad_clip=1.0,
        score_weight=0.01, target_weight=1.0, search_batch_size=64,
        callback=None if callback is None else lambda s, m: callback(s, m, model))
    return model, init, final, history


def test_train_amips_logs_the_warmup_cosine_learning_rate():
    n, lr, end = 20, 0.1, 0.05
    _, _, _, history = _train(n, 0.0)
    warm = 5  # round(0.25 * 20)
    expected = [lr * t / warm if t < warm else
                end + 0.5 * (lr - end) * (1 + math.cos(math.pi * min((t - warm) / (n - warm), 1)))
                for t in range(1, n + 1)]  # the rate of step s is that of s + 1
    assert [h["step"] for h in history] == list(range(n))
    np.testing.assert_allclose([h["lr"] for h in history], expected, rtol=1e-12)


def test_train_amips_returns_the_moving_average_of_the_weights():
    decay, seen = 0.6, []

    def snapshot(step, ema_model, raw_model):
        seen.append(([p.detach().clone() for p in raw_model.parameters()],
                     [p.detach().clone() for p in ema_model.parameters()]))

    raw, init, final, _ = _train(4, decay, snapshot)
    ema = init
    for raw_t, ema_t in seen:  # ema_t = decay * ema_{t-1} + (1 - decay) * raw_t
        ema = [decay * e + (1 - decay) * r for e, r in zip(ema, raw_t)]
        for a, b in zip(ema, ema_t):
            torch.testing.assert_close(a, b)
    for a, b in zip(ema, final.parameters()):
        torch.testing.assert_close(a, b)
    assert final is not raw and not final.training
    assert not any(p.requires_grad for p in final.parameters())
    # without EMA the trained model itself is returned, frozen in eval mode
    raw, _, final, _ = _train(3, 0.0)
    assert final is raw and not final.training
    assert not any(p.requires_grad for p in final.parameters())


@pytest.mark.parametrize("arch,resnet,expected", [("keynet", True, [0.01]),
                                                  ("keynet", False, None),
                                                  ("supportnet", False, None)])
def test_initial_output_scaling(monkeypatch, arch, resnet, expected):
    # resnet KeyNet: the residual branch is scaled by exactly 0.01 (the official value);
    # otherwise the output is scaled so the mean key norm matches the labels'
    from mlpapers.retrieval import AmortizedMIPS

    factors = []
    for cls in (KeyNet, SupportNet):
        orig = cls.scale_output
        monkeypatch.setattr(cls, "scale_output",
                            lambda self, c, _o=orig: (factors.append(c), _o(self, c))[1])
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((12, 3)) * 5
    AmortizedMIPS(arch=arch, resnet=resnet, depth=2, hidden_dim=8, n_steps=1,
                  batch_size=32, random_state=0).fit(keys)
    assert len(factors) == 1
    if expected is not None:
        assert factors == expected
    else:
        assert factors[0] > 0 and factors[0] != 1.0


def test_kneighbors_returns_ten_neighbours_by_default():
    from mlpapers.retrieval import AmortizedMIPS

    keys = np.random.default_rng(0).standard_normal((14, 3))
    model = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=2, batch_size=16,
                          random_state=0).fit(keys)
    sims, idx = model.kneighbors(keys[:3])
    assert sims.shape == idx.shape == (3, 10)
    # the returned similarities are the true inner products of the returned keys
    np.testing.assert_allclose(sims, np.einsum("nd,nkd->nk", keys[:3], keys[idx]),
                               rtol=1e-5, atol=1e-5)


def test_exact_score_does_not_refit_the_number_of_features():
    from mlpapers.retrieval import ExactMIPS

    keys = np.random.default_rng(0).standard_normal((6, 3))
    mips = ExactMIPS().fit(keys)
    with pytest.raises(ValueError, match="features"):
        mips.score(np.ones((2, 4)))
    assert mips.n_features_in_ == 3 and mips.score(keys) == 1.0
