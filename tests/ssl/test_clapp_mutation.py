"""CLAPP / CLAPP++: tests that kill mutants the rest of the suite let through.

Each test asserts a property from the paper's definitions (the context each block
reads, the backprop reference of the gradient analysis...) that a plausible
one-token bug would break and that no other test checks.
"""

import pytest
import torch
import torch.nn.functional as F

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder, update_similarity
from mlpapers.ssl.clapp import clapp_layer_loss
from mlpapers.ssl.clapp._kernels import negative_indices, swap_views


def _digits(n=8):
    return torch.from_numpy(make_shifted_digits(n_samples=n, random_state=1)[0])


def test_direct_feedback_reads_the_top_block_even_when_widths_match():
    # blocks of equal width: the DFB context of block 0 is still the top block's
    # output of the other view, not block 0's own (lateral) output
    x = _digits()
    for variant in ("clapp++dfb", "clapp++both"):
        enc = CLAPPEncoder(variant=variant, architecture=[(4,), (4,)], n_epochs=0,
                           random_state=0).fit(x.numpy())
        assert enc.layer_dims_[0] == enc.layer_dims_[1]
        views = torch.cat([x, x.flip(-1)])
        neg = negative_indices(len(x))
        with torch.no_grad():
            out0 = enc.encoder_.blocks[0](views)
            h0 = F.adaptive_avg_pool2d(out0, enc.grids_[0]).flatten(1)
            h1 = F.adaptive_avg_pool2d(enc.encoder_.blocks[1](out0), enc.grids_[1]).flatten(1)
            got = enc._layer_losses(views, neg)
        head = enc.heads_[0]
        w_fb = head.weight if variant == "clapp++dfb" else head[0].weight
        want = clapp_layer_loss(swap_views(h0), h1, w_fb, neg)
        if variant == "clapp++both":
            want = want + clapp_layer_loss(swap_views(h0), h0, head[1].weight, neg)
        assert not torch.allclose(h0, h1)
        torch.testing.assert_close(got[0], want)


def _cos(a, b):
    return float(F.cosine_similarity(a.double(), b.double(), dim=0))


@pytest.mark.parametrize("batch_size", [None, 4])
def test_update_similarity_compares_local_updates_with_backprop_of_the_top_loss(batch_size):
    # the paper's gradient analysis, written out: per block, the cosine between the
    # gradient of its own local loss (detached input) and the gradient of the TOP
    # block's loss backpropagated through the whole network, on one batch of
    # ``batch_size`` images (None: the encoder's, 8)
    x = _digits()
    enc = CLAPPEncoder(variant="clapp++dfb", architecture="tiny", augment=None, n_epochs=1,
                       batch_size=8, random_state=0).fit(x.numpy())
    got = update_similarity(enc, x.numpy(), n_batches=1, batch_size=batch_size,
                            random_state=torch.Generator().manual_seed(5))
    # the same batch: a permutation from the same generator, identity views, next negatives
    bs = 8 if batch_size is None else batch_size
    xb = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(5))[:bs]]
    views, neg = torch.cat([xb, xb]), negative_indices(bs)
    blocks, heads, grids = list(enc.encoder_.blocks), list(enc.heads_), enc.grids_

    def flat_grad(loss, block):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(
            loss, list(block.parameters()), retain_graph=True)])

    def pooled(detach):
        hs, h = [], views
        for b, g in zip(blocks, grids):
            h = b(h.detach() if detach else h)
            hs.append(F.adaptive_avg_pool2d(h, g).flatten(1))
        return hs

    hs = pooled(detach=True)
    top = hs[-1].detach()
    local = [flat_grad(clapp_layer_loss(swap_views(h), top, hd.weight, neg), b)
             for h, hd, b in zip(hs, heads, blocks)]
    z = pooled(detach=False)[-1]
    bp_loss = clapp_layer_loss(swap_views(z), z.detach(), heads[-1].weight, neg)
    bp = [flat_grad(bp_loss, b) for b in blocks]
    want = [_cos(a, b) for a, b in zip(local, bp)]
    assert sorted(got) == list(range(len(blocks)))
    for i in got:
        assert abs(got[i] - want[i]) < 1e-5, (i, got[i], want[i])
    assert want[-1] > 1 - 1e-9 and min(want[:-1]) < 0.99


def test_global_clapp_loss_pairs_each_view_with_the_other_view():
    # BP-CLAPP: the top block's z of one view is scored against the (detached) context
    # of the OTHER view of the same image, as in the layer-local rule
    from mlpapers.ssl import GlobalSSLEncoder

    x = _digits()
    enc = GlobalSSLEncoder(loss="clapp", architecture="tiny", n_epochs=0,
                           random_state=0).fit(x.numpy())
    views = torch.cat([x, x.flip(-1)])
    neg = negative_indices(len(x))
    params = list(enc.encoder_.parameters())
    got = enc._batch_losses(views, neg)
    top = enc._pooled(views, detach=False)[-1]
    # the context is detached (asymmetric predictor): gradients reach z only
    want = clapp_layer_loss(swap_views(top), top.detach(), enc.heads_[0].weight, neg)
    torch.testing.assert_close(got, want[None])
    for a, b in zip(torch.autograd.grad(got.sum(), params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(a, b)


def test_random_negatives_are_uniform_over_both_views_of_the_other_images():
    # "random": a uniformly random row of another image, from either view
    B, draws = 3, 400
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([negative_indices(B, mode="random", generator=g) for _ in range(draws)])
    for i in range(2 * B):
        counts = torch.bincount(idx[:, i], minlength=2 * B).double() / draws
        others = [j for j in range(2 * B) if j % B != i % B]        # 2 (B - 1) rows
        assert all(counts[j] == 0 for j in range(2 * B) if j not in others)
        assert torch.all((counts[others] - 1 / len(others)).abs() < 0.1), (i, counts)


def test_three_factor_rule_equals_autograd_at_the_hinge_kinks():
    # scores exactly at the hinge kinks (u+ = 1, u- = -1) and pre-activations exactly 0:
    # the hand-written rule must use autograd's convention there (zero derivative)
    from mlpapers.ssl.clapp import three_factor_grad

    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    c = torch.tensor([[1.0, 0.0], [0.5, -1.0], [-2.0, 1.0], [2.0, -2.0]], dtype=torch.float64)
    W = torch.eye(2, dtype=torch.float64).requires_grad_(True)
    B = torch.eye(2, dtype=torch.float64)
    neg = negative_indices(2)                       # next row: 1, 2, 3, 0
    z = torch.relu(x @ W.T)
    u_pos, u_neg = (z * c).sum(1), (z[neg] * c).sum(1)
    assert 1.0 in u_pos.tolist() and -1.0 in u_neg.tolist()
    (auto,) = torch.autograd.grad(clapp_layer_loss(z, c, B, neg, "hinge"), W)
    torch.testing.assert_close(three_factor_grad(x, W.detach(), c, B, neg, "hinge"), auto)


def test_clapp2021_too_many_prediction_steps_is_a_clear_error_before_training():
    # 16 px images, 4 px patches, stride 2: 7 patch rows; 6 steps + the skipped row need 8
    X = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(0)).numpy()
    kw = dict(variant="clapp2021", architecture=[(4,)], patch_size=4, patch_stride=2,
              n_epochs=1, random_state=0)
    with pytest.raises(ValueError, match="too few for prediction_steps=6"):
        CLAPPEncoder(prediction_steps=6, **kw).fit(X)
    assert CLAPPEncoder(prediction_steps=5, **kw).fit(X).patch_grid_ == (4, 2, 7, 7, 5)


def test_a_batch_of_two_images_is_trained_on():
    # two images are the smallest valid batch (each one is the other's negative): a
    # fit on them, or a last batch of two, must update the weights and log a loss
    X = _digits(5).numpy()
    kw = dict(architecture="tiny", augment=None, random_state=0)
    init = CLAPPEncoder(n_epochs=0, **kw).fit(X[:2])
    enc = CLAPPEncoder(n_epochs=1, **kw).fit(X[:2])
    assert enc.history_[0]["loss"] > 0
    w0, w1 = init.encoder_.blocks[0][0].weight, enc.encoder_.blocks[0][0].weight
    assert not torch.equal(w0, w1)
    # 5 images in batches of 3: the last batch (2 images) counts in the epoch's loss
    full = CLAPPEncoder(n_epochs=1, batch_size=3, **kw).fit(X)
    assert full.history_[0]["loss"] > 0


def test_initialisation_is_pytorchs_default_uniform_fan_in_bounds():
    # every conv / linear weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's
    # default (kaiming_uniform with a = sqrt(5) gives the same bound for the weights)
    enc = CLAPPEncoder(architecture="small", n_epochs=0, random_state=0).fit(
        _digits().numpy())
    mods = [m for m in [*enc.encoder_.modules(), *enc.heads_.modules()]
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(mods) == 8
    for m in mods:
        bound = 1.0 / m.weight[0].numel() ** 0.5
        for p in (m.weight, m.bias):
            if p is None:
                continue
            p = p.detach()
            assert float(p.abs().max()) <= bound
            if p.numel() >= 32:                     # spread over the whole interval
                assert float(p.abs().max()) > 0.8 * bound
                assert abs(float(p.mean())) < 0.3 * bound


def test_grayscale_is_the_itu_r_601_luma_and_saturation_keeps_gray_pixels():
    # the documented grayscale (ITU-R 601 luma on three channels, as PIL's "L";
    # torchvision's tensor version uses 0.2989): 0.299 R + 0.587 G + 0.114 B; and a
    # saturation factor scales the distance from that luma, so gray pixels (R = G = B)
    # are unchanged by the jitter
    from mlpapers.ssl import DefaultAugment

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 5, 6, generator=gen, dtype=torch.float64)
    gray = DefaultAugment(jitter_p=0.0, gray_p=1.0).color(x, gen)
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    torch.testing.assert_close(gray, luma[:, None].expand_as(x), rtol=0, atol=1e-15)
    flat = x[:, :1].expand_as(x).clone()  # gray pixels, varying over the image
    only_saturation = DefaultAugment(jitter=(0.0, 0.0, 0.8), jitter_p=1.0, gray_p=0.0)
    torch.testing.assert_close(only_saturation.color(flat, gen), flat, rtol=0, atol=1e-15)
