"""The AMIPS user guide's math (docs/user_guide/amips.rst) against float64 references
written from the page's formulas alone."""
import numpy as np
import pytest
import torch

from mlpapers.retrieval import AmortizedMIPS
from mlpapers.retrieval.amips import Homogenize, KeyNet, SupportNet, amips_loss


def _softplus(t, beta=1.0):
    return np.logaddexp(0.0, beta * t) / beta


def _phi(t, a=0.1, beta=20.0):
    """The page's soft-leaky-ReLU a t + (1 - a) softplus(beta t) / beta."""
    return a * t + (1 - a) * _softplus(t, beta)


def _reference_stack(net, x, convex):
    """The page's network: z0 = phi(W_x0 x + b0); hidden layer l (1-based after the
    first) z_l = phi(W_z z + b [+ W_x x every wx_inject-th layer]); a linear output
    layer that always re-injects x; W_z = softplus(V) for SupportNet."""
    P = {n: p.detach().double().numpy() for n, p in net.named_parameters()}
    z = _phi(x @ P["stack.wx0.weight"].T + P["stack.wx0.bias"])
    n_z = sum(n.startswith("stack.wz.") for n in P)
    for i in range(n_z):
        W = _softplus(P[f"stack.wz.{i}"]) if convex else P[f"stack.wz.{i}"]
        h = z @ W.T + P[f"stack.bias.{i}"]
        if f"stack.wx.{i}.weight" in P:
            h = h + x @ P[f"stack.wx.{i}.weight"].T
        z = h if i == n_z - 1 else _phi(h)
    return z


@pytest.mark.parametrize("d,hidden,wx_inject", [(3, [5, 6, 7, 4, 5], 2),
                                                (4, [6] * 8, 4), (2, [7, 5, 3], True)])
def test_networks_are_the_documented_stacks(d, hidden, wx_inject):
    """Section "The math": SupportNet (W_z = softplus(V), input re-injected every
    ``wx_inject`` layers and at the linear output), Homogenize f = ||x|| h(x/||x||),
    KeyNet (same stack, no sign constraint, residual x + F(x))."""
    g = torch.Generator().manual_seed(d)
    x = np.random.default_rng(d).normal(size=(9, d))
    nets = [SupportNet(d, hidden, wx_inject=wx_inject, generator=g, dtype=torch.float64),
            KeyNet(d, hidden, wx_inject=wx_inject, generator=g, dtype=torch.float64),
            KeyNet(d, hidden, wx_inject=wx_inject, resnet=True, generator=g,
                   dtype=torch.float64)]
    with torch.no_grad():  # random weights of both signs, not the init's
        for net in nets:
            for p in net.parameters():
                p.normal_(generator=g).mul_(0.5)
    xt = torch.as_tensor(x)
    h = _reference_stack(nets[0], x, True)[:, 0]
    np.testing.assert_allclose(nets[0](xt).detach().numpy(), h, rtol=1e-9)
    norm = np.linalg.norm(x, axis=1)
    f = norm * _reference_stack(nets[0], x / norm[:, None], True)[:, 0]
    np.testing.assert_allclose(Homogenize(nets[0])(xt).detach().numpy(), f, rtol=1e-9)
    for net, ref in ((nets[1], _reference_stack(nets[1], x, False)),
                     (nets[2], x + _reference_stack(nets[2], x, False))):
        # torch's softplus is linear beyond beta t > 20 (error < 1e-10 relative)
        np.testing.assert_allclose(net(xt).detach().numpy(), ref, rtol=1e-9,
                                   atol=1e-9 * np.abs(ref).max())


def test_loss_averages_the_key_term_over_all_elements():
    """Section "The math": L = w_s mean_b (s^ - sigma)^2 + w_k mean_{b,j} (k^ - k*)^2,
    the key term a mean over the b*d elements (not over rows of squared norms)."""
    rng = np.random.default_rng(0)
    ps, ts = rng.normal(size=7), rng.normal(size=7)
    pk, tk = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    total, s_loss, k_loss = amips_loss(*map(torch.as_tensor, (ps, pk, ts, tk)),
                                       score_weight=0.3, target_weight=2.0)
    ref_s, ref_k = np.mean((ps - ts) ** 2), np.mean((pk - tk) ** 2)
    assert float(s_loss) == pytest.approx(ref_s, rel=1e-14)
    assert float(k_loss) == pytest.approx(ref_k, rel=1e-14)
    assert float(total) == pytest.approx(0.3 * ref_s + 2.0 * ref_k, rel=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_homogenize_holds_for_rows_of_any_norm(dtype):
    """Section "The math": Homogenize makes f 1-homogeneous with Euler's identity
    exactly, so f(cx) = c f(x) and grad f(cx) = grad f(x) for every c > 0. The norm was
    clamped at eps = 1e-12 and squared in the dtype: rows below 1e-12 got another value
    and key, float32 rows of norm 1e20 (squares overflowing) NaN keys."""
    g = torch.Generator().manual_seed(0)
    f = Homogenize(SupportNet(3, [8, 8], generator=g, dtype=dtype))
    x = torch.tensor([[0.3, -0.5, 0.8], [-2.0, 0.1, 0.4]], dtype=dtype)
    v1, k1 = f.score_and_key(x)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10,
                                                                         atol=1e-13)
    for c in (1e-30, 1e-20, 1e-13, 1e20):  # (float32 keys overflow in backward near 1e30)
        xc = x * c
        vc, kc = f.score_and_key(xc)
        torch.testing.assert_close(f(xc) / c, v1, **tol)
        torch.testing.assert_close(vc / c, v1, **tol)
        torch.testing.assert_close(kc, k1, **tol)
        torch.testing.assert_close((xc * kc).sum(-1) / c, v1, **tol)  # Euler
    assert torch.equal(f(torch.zeros(2, 3, dtype=dtype)), torch.zeros(2, dtype=dtype))


def test_supportnet_predictions_do_not_depend_on_a_query_scale():
    """The MIPS answer, and SupportNet's 0-homogeneous key, do not change when a query is
    scaled: a query 1e-13 (or 1e20) times the training units was answered wrongly
    (or got NaN keys)."""
    rng = np.random.default_rng(0)
    keys, q = rng.normal(size=(40, 4)), rng.normal(size=(20, 4))
    est = AmortizedMIPS(arch="supportnet", depth=2, hidden_dim=16, n_steps=5,
                        batch_size=64, random_state=0).fit(keys)
    idx, key = est.predict(q), est.predict_key(q)
    for c in (1e-13, 1e-25, 1e20):
        np.testing.assert_array_equal(est.predict(q * c), idx)
        np.testing.assert_allclose(est.predict_key(q * c), key, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [SupportNet, KeyNet])
def test_data_init_gives_unit_std_pre_activations_without_biases(cls):
    """data_init (LSUV-style): every hidden unit's pre-activation has unit standard
    deviation on the batch, also with ``bias=False``. Regression: the next layer was
    scaled on the centred activations although a network without biases never
    centres them, so from the third hidden layer on the std was off (by up to 0.93)."""
    torch.manual_seed(0)
    x = torch.randn(300, 6, dtype=torch.float64) * 3 + 1
    net = cls(6, [12, 10, 9, 8], bias=False, wx_inject=2).double()
    net.data_init(x)
    stack = net.stack
    z = stack._act(stack.wx0(x))
    pres = [x @ stack.wx0.weight.T]
    for l, wz in enumerate(stack.effective_wz()[:-1]):
        pre = stack._layer(l, z, x, wz)
        pres.append(pre)
        z = stack._act(pre)
    for pre in pres:
        np.testing.assert_allclose(pre.std(0).detach().numpy(), 1.0, rtol=1e-9)


def test_homogenize_needs_no_frexp(monkeypatch):
    """torch.frexp has no MPS kernel: the power-of-two rescaling of Homogenize must not
    use it (it did, so SupportNet failed on Apple GPUs), and gives the same values."""
    torch.manual_seed(1)
    f = Homogenize(SupportNet(3, [8, 8]))
    x = torch.randn(5, 3) * torch.tensor([[1e-20], [1e-3], [1.0], [7.0], [1e18]])
    want = f(x)

    def no_frexp(*args, **kwargs):
        raise NotImplementedError("aten::frexp is not implemented for the MPS device")

    monkeypatch.setattr(torch, "frexp", no_frexp)
    assert torch.equal(f(x), want)
