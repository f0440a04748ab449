"""Exact math of the CLAPP kernels: closed forms, theory, hand-written rule."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.ssl.clapp import (
    DefaultAugment,
    GlobalSSLEncoder,
    clapp_layer_loss,
    contrastive_loss,
    exact_linear_feedback,
    infonce_loss,
    three_factor_grad,
)
from mlpapers.ssl.clapp._kernels import negative_indices, swap_views

LOSSES = ["hinge", "softhinge", "linear"]


def test_hinge_closed_form():
    u_pos = torch.tensor([-2.0, 0.0, 0.5, 1.0, 3.0])
    u_neg = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.0])
    got = contrastive_loss(u_pos, u_neg, "hinge").numpy()
    want = np.maximum(0, 1 - u_pos.numpy()) + np.maximum(0, 1 + u_neg.numpy())
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got, [3.0, 1.0, 1.5, 1.5, 3.0])


def test_softhinge_is_official_logsigmoid_form_and_stable():
    u_pos = torch.linspace(-50, 50, 11, dtype=torch.float64)
    u_neg = torch.linspace(50, -50, 11, dtype=torch.float64)
    got = contrastive_loss(u_pos, u_neg, "softhinge")
    want = -F.logsigmoid(u_pos - 1) - F.logsigmoid(-u_neg - 1)
    torch.testing.assert_close(got, want)
    assert torch.isfinite(contrastive_loss(torch.tensor([-1e4]), torch.tensor([1e4]),
                                           "softhinge")).all()


def test_linear_loss_and_unknown():
    np.testing.assert_allclose(
        contrastive_loss(torch.tensor([2.0]), torch.tensor([0.5]), "linear").numpy(), [-1.5])
    with pytest.raises(ValueError, match="loss must be one of"):
        contrastive_loss(torch.zeros(1), torch.zeros(1), "bogus")


def test_contrastive_loss_refuses_scores_that_are_not_tensors():
    # (a list failed with an AttributeError on .is_complex())
    with pytest.raises(TypeError, match="contrastive_loss: u_neg must be a torch.Tensor"):
        contrastive_loss(torch.tensor([2.0]), [0.5])
    with pytest.raises(TypeError, match=r"u_pos must be a torch.Tensor \(torch.from_numpy"):
        contrastive_loss(np.array([2.0]), torch.tensor([0.5]))


@pytest.mark.parametrize("loss", LOSSES)
def test_layer_loss_matches_loops(loss):
    g = torch.Generator().manual_seed(0)
    z, c = torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)
    B = torch.randn(4, 3, generator=g)
    neg = negative_indices(3)
    total = 0.0
    for i in range(6):
        up = float(z[i] @ B @ c[i])
        un = float(z[neg[i]] @ B @ c[i])
        f = {"hinge": lambda a, b: max(0, 1 - a) + max(0, 1 + b),
             "softhinge": lambda a, b: np.logaddexp(0, 1 - a) + np.logaddexp(0, 1 + b),
             "linear": lambda a, b: b - a}[loss]
        total += f(up, un)
    got = float(clapp_layer_loss(z, c, B, neg, loss))
    assert got == pytest.approx(total / 6, rel=1e-5)


def test_swap_views_pairs_rows():
    h = torch.arange(8.0)[:, None]
    s = swap_views(h)
    torch.testing.assert_close(s[:, 0], torch.tensor([4.0, 5, 6, 7, 0, 1, 2, 3]))
    with pytest.raises(ValueError, match="even"):
        swap_views(torch.zeros(3, 1))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.sampled_from(["next", "random"]), st.integers(0, 2**16))
def test_negatives_never_same_image(n_images, mode, seed):
    idx = negative_indices(n_images, mode=mode, generator=torch.Generator().manual_seed(seed))
    rows = torch.arange(2 * n_images)
    assert idx.shape == (2 * n_images,)
    assert ((idx % n_images) != (rows % n_images)).all()
    assert idx.min() >= 0 and idx.max() < 2 * n_images


def test_negatives_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        negative_indices(1)
    with pytest.raises(ValueError, match="negatives must be"):
        negative_indices(4, mode="bogus")


def test_infonce_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    p = torch.randn(6, 5, generator=g, dtype=torch.float64)
    t = 0.1
    q = p / p.norm(dim=1, keepdim=True)
    total = 0.0
    for i in range(6):
        j = (i + 3) % 6
        logits = [float(q[i] @ q[k]) / t for k in range(6) if k != i]
        total += -(float(q[i] @ q[j]) / t - np.log(np.sum(np.exp(logits))))
    assert float(infonce_loss(p, t)) == pytest.approx(total / 6, rel=1e-10)


def test_infonce_cross_is_the_one_directional_cross_view_loss():
    # the official BP-InfoNCE: view-A row i against the B view-B rows only (one direction)
    g = torch.Generator().manual_seed(2)
    p = torch.randn(8, 5, generator=g, dtype=torch.float64)
    t = 0.1
    a = p[:4].numpy() / np.linalg.norm(p[:4].numpy(), axis=1, keepdims=True)
    b = p[4:].numpy() / np.linalg.norm(p[4:].numpy(), axis=1, keepdims=True)
    total = 0.0
    for i in range(4):
        logits = [a[i] @ b[j] / t for j in range(4)]
        total += -(logits[i] - np.log(np.sum(np.exp(logits))))
    assert float(infonce_loss(p, t, pairs="cross")) == pytest.approx(total / 4, rel=1e-10)
    assert float(infonce_loss(p, t, pairs="cross")) != pytest.approx(float(infonce_loss(p, t)))
    with pytest.raises(ValueError, match="pairs must be"):
        infonce_loss(p, t, pairs="bogus")
    for pairs in ("cross", "all"):  # an odd row count has no view pairing at all
        for bad in (p[:7], p[:0], p[:, 0]):  # (no rows gave a NaN loss)
            with pytest.raises(ValueError, match=r"^p must have shape \(2B, P\) with B >= 1"):
                infonce_loss(bad, t, pairs=pairs)


# -- deep linear network theory ------------------------------------------------------
def _linear_net(seed, dims=(5, 4, 4, 3), n_images=6):
    g = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(b, a, generator=g, dtype=torch.float64) / np.sqrt(a)
          for a, b in zip(dims[:-1], dims[1:])]
    x = torch.randn(2 * n_images, dims[0], generator=g, dtype=torch.float64)
    B_top = torch.randn(dims[-1], dims[-1], generator=g, dtype=torch.float64)
    return Ws, x, B_top, negative_indices(n_images)


def _local_and_bp_grads(Ws, x, B_top, Bs, neg, mode, loss):
    Ws = [W.clone().requires_grad_(True) for W in Ws]
    # global: loss at the top only, full backprop, detached context
    h = x
    for W in Ws:
        h = h @ W.T
    g_bp = torch.autograd.grad(clapp_layer_loss(swap_views(h), h.detach(), B_top, neg, loss), Ws)
    # local: detached block inputs, one loss per layer
    zs, h = [], x
    for W in Ws:
        h = h.detach() @ W.T
        zs.append(h)
    top = zs[-1].detach()
    total = sum(
        clapp_layer_loss(swap_views(z), top if mode == "dfb" else z.detach(), B, neg, loss)
        for z, B in zip(zs, Bs)
    )
    g_loc = torch.autograd.grad(total, Ws)
    return g_loc, g_bp


def _cos(a, b):
    return float(F.cosine_similarity(a.reshape(-1), b.reshape(-1), dim=0))


@pytest.mark.parametrize("mode", ["dfb", "lateral"])
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_feedback_makes_local_equal_bp(mode, loss, seed):
    Ws, x, B_top, neg = _linear_net(seed)
    Bs = exact_linear_feedback(Ws, B_top, mode=mode)
    assert Bs[-1].shape == B_top.shape
    torch.testing.assert_close(Bs[-1], B_top)
    g_loc, g_bp = _local_and_bp_grads(Ws, x, B_top, Bs, neg, mode, loss)
    for a, b in zip(g_loc, g_bp):
        assert float(b.norm()) > 0
        assert _cos(a, b) > 1 - 1e-6
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", ["dfb", "lateral"])
def test_random_feedback_is_not_bp(mode):
    Ws, x, B_top, neg = _linear_net(3)
    g = torch.Generator().manual_seed(7)
    exact = exact_linear_feedback(Ws, B_top, mode=mode)
    Bs = [torch.randn(B.shape, generator=g, dtype=torch.float64) for B in exact[:-1]]
    Bs.append(B_top)
    g_loc, g_bp = _local_and_bp_grads(Ws, x, B_top, Bs, neg, mode, "linear")
    assert min(_cos(a, b) for a, b in zip(g_loc[:-1], g_bp[:-1])) < 0.99
    assert _cos(g_loc[-1], g_bp[-1]) > 1 - 1e-12          # the top layer is always exact


def test_exact_feedback_shapes_and_bad_mode():
    Ws = [torch.randn(4, 5), torch.randn(3, 4)]
    B = torch.randn(3, 3)
    assert [b.shape for b in exact_linear_feedback(Ws, B, "dfb")] == [(4, 3), (3, 3)]
    assert [b.shape for b in exact_linear_feedback(Ws, B, "lateral")] == [(4, 4), (3, 3)]
    with pytest.raises(ValueError, match="mode"):
        exact_linear_feedback(Ws, B, "bogus")


@pytest.mark.parametrize("loss", LOSSES)
def test_autograd_equals_three_factor_rule(loss):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    W = torch.randn(5, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    c = torch.randn(8, 3, generator=g, dtype=torch.float64)
    B = 0.3 * torch.randn(5, 3, generator=g, dtype=torch.float64)
    neg = negative_indices(4)
    z = torch.relu(x @ W.T)
    (auto,) = torch.autograd.grad(clapp_layer_loss(z, c, B, neg, loss), W)
    hand = three_factor_grad(x, W.detach(), c, B, neg, loss)
    torch.testing.assert_close(auto, hand)
    assert float(hand.abs().sum()) > 0


# -- augmentations ----------------------------------------------------------------
def test_augment_deterministic_shape_and_identity_limit():
    x = torch.rand(5, 3, 16, 16)
    aug = DefaultAugment()
    a = aug(x, torch.Generator().manual_seed(0))
    b = aug(x, torch.Generator().manual_seed(0))
    assert a.shape == x.shape
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, aug(x, torch.Generator().manual_seed(1)))
    ident = DefaultAugment(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=0.0, jitter_p=0.0,
                           gray_p=0.0, blur_p=0.0)
    torch.testing.assert_close(ident(x, torch.Generator().manual_seed(0)), x,
                               atol=1e-5, rtol=1e-5)
    flip = DefaultAugment(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=1.0, jitter_p=0.0,
                          gray_p=0.0, blur_p=0.0)
    torch.testing.assert_close(flip(x, torch.Generator()), x.flip(-1), atol=1e-5, rtol=1e-5)


def test_loss_kernels_refuse_inputs_that_would_broadcast():
    """A context or a neg_idx of one row served every row, and a 2-D neg_idx averaged
    a wrong loss, all without an error (session 23); the shapes are checked first."""
    from mlpapers.ssl.clapp import contrastive_loss, patch_prediction_loss, three_factor_grad

    g = torch.Generator().manual_seed(0)
    z, c = torch.randn(4, 2, generator=g), torch.randn(4, 3, generator=g)
    B, neg = torch.randn(2, 3, generator=g), torch.tensor([1, 2, 3, 0])
    ok = clapp_layer_loss(z, c, B, neg)
    assert torch.isfinite(ok)
    for same in (neg.int(), neg.tolist(), neg.numpy()):  # indices in other containers
        assert clapp_layer_loss(z, c, B, same) == ok
    # a 0-d negative score is a deliberate constant, broadcast to every pair
    assert contrastive_loss(z[:, 0], torch.tensor(0.5)).shape == (4,)
    for bad, match in [
        (dict(neg_idx=neg[:1]), r"^neg_idx must be integer indices of shape \(4,\)"),
        (dict(neg_idx=neg[None]), r"got \(1, 4\) torch.int64"),
        (dict(neg_idx=neg.float()), r"got \(4,\) torch.float32"),
        (dict(neg_idx=neg > 1), r"got \(4,\) torch.bool"),
        # (torch reads a uint8 index as a mask: a wrong loss, with a deprecation warning)
        (dict(neg_idx=neg.to(torch.uint8)), r"got \(4,\) torch.uint8"),
        (dict(c=c[:1]), r"^c must have shape \(4, K\) to match z"),
        (dict(weight=B.T), r"^weight must have shape \(2, 3\)"),
    ]:
        args = dict(z=z, c=c, weight=B, neg_idx=neg) | bad
        with pytest.raises(ValueError, match=match):
            clapp_layer_loss(**args)
    x, W = torch.randn(4, 5, generator=g), torch.randn(2, 5, generator=g)
    with pytest.raises(ValueError, match=r"^neg_idx must be integer indices of shape \(4,\)"):
        three_factor_grad(x, W, c, B, neg[:1])
    with pytest.raises(ValueError, match=r"^x must have shape \(N, K_in\) and W \(D, K_in\)"):
        three_factor_grad(x, W[:, :4], c, B, neg)
    with pytest.raises(ValueError, match=r"^u_pos and u_neg must have the same shape, got "
                                         r"\(4,\) and \(1,\)"):
        contrastive_loss(z[:, 0], z[:1, 1])
    zz = torch.randn(2, 4, 5, 3, generator=g)
    w = torch.zeros(2, 4, 4)
    for args, match in [
        ((zz, zz[:1], w, torch.tensor([1, 0])), r"^c must have shape \(2, K, 5, 3\)"),
        ((zz, zz, w, torch.tensor([1])), r"^neg_idx must be integer indices of shape \(2,\)"),
        ((zz, zz, w[0], torch.tensor([1, 0])), r"^weight must have shape \(steps, 4, 4\)"),
        ((zz, zz, w, torch.tensor([1, 2])), r"^neg_idx must index rows of z, in \[0, 2\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            patch_prediction_loss(*args)


def test_loss_kernels_refuse_indices_outside_the_batch_and_non_tensors():
    """torch wrapped neg_idx = -1 to the last row (a silently different loss) and gave a
    bare IndexError past the end; numpy inputs failed inside torch.promote_types."""
    from mlpapers.ssl.clapp import extract_patches, three_factor_grad

    g = torch.Generator().manual_seed(0)
    z, c = torch.randn(4, 2, generator=g), torch.randn(4, 3, generator=g)
    B = torch.randn(2, 3, generator=g)
    x, W = torch.randn(4, 5, generator=g), torch.randn(2, 5, generator=g)
    for neg, low, high in [([1, 2, 3, -1], -1, 3), ([1, 2, 3, 4], 1, 4)]:
        match = rf"in \[0, 4\), got values from {low} to {high}"
        with pytest.raises(ValueError, match=r"^neg_idx must index rows of z, " + match):
            clapp_layer_loss(z, c, B, neg)
        with pytest.raises(ValueError, match=r"^neg_idx must index rows of relu\(x W\^T\), "
                                             + match):
            three_factor_grad(x, W, c, B, torch.tensor(neg))
    # the valid extremes 0 and N - 1 are accepted and index those rows
    assert clapp_layer_loss(z, c, B, [3, 0, 0, 3]) == clapp_layer_loss(
        z, c, B, torch.tensor([3, 0, 0, 3]))
    for call, name in [(lambda: clapp_layer_loss(z.numpy(), c, B, [1, 2, 3, 0]), "z"),
                       (lambda: three_factor_grad(x, W, c.numpy(), B, [1, 2, 3, 0]), "c"),
                       (lambda: infonce_loss(z.numpy()), "p"),
                       (lambda: extract_patches(torch.zeros(1, 1, 4, 4).numpy(), 2, 1), "x")]:
        with pytest.raises(TypeError, match=rf": {name} must be a torch.Tensor"):
            call()


def test_a_temperature_whose_inverse_overflows_float32_is_refused():
    """Regression: temperature=1e-40 passed the positivity check and gave a NaN loss
    (1 / temperature is inf in float32); the fit then blamed the images."""
    p = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(infonce_loss(p, temperature=3e-39))  # just above the bound
    with pytest.raises(ValueError, match="temperature must be at least 2.94e-39"):
        infonce_loss(p, temperature=1e-40)
    assert torch.isfinite(infonce_loss(p.double(), temperature=1e-40))  # float64's bound
    with pytest.raises(ValueError, match="temperature must be at least 1.53e-05"):
        infonce_loss(p.half(), temperature=1e-5)
    with pytest.raises(ValueError, match="temperature must be at least"):
        GlobalSSLEncoder(loss="infonce", temperature=1e-40, architecture="tiny",
                         n_epochs=1).fit(np.random.default_rng(0).random((4, 1, 8, 8)))
