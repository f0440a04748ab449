"""The math of ``docs/user_guide/clapp.rst`` checked against float64 references written
from the page's text alone (own conv forward, own adaptive pooling, own losses), with
gradients from autograd on those references."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity
from mlpapers.ssl.clapp import DefaultAugment, three_factor_grad


# -- references written from the page ---------------------------------------------------
def _params(enc):
    """float64 leaf copies of (conv weight, conv bias, has max-pool) per block."""
    out = []
    for blk in enc.encoder_.blocks:
        conv = blk[0]
        out.append((conv.weight.detach().double().clone().requires_grad_(),
                    conv.bias.detach().double().clone().requires_grad_(),
                    any(isinstance(m, torch.nn.MaxPool2d) for m in blk)))
    return out


def _leaf(t):
    return t.detach().double().clone().requires_grad_()


def _forward(params, x, detach):
    """3x3 conv (padding 1) + ReLU (+ 2x2 max-pool) per block; block inputs detached."""
    maps, h = [], x
    for W, b, mp in params:
        m = torch.relu(F.conv2d(h, W, b, padding=1))
        m = F.max_pool2d(m, 2) if mp else m
        maps.append(m)
        h = m.detach() if detach else m
    return maps


def _pool(m, g):
    """Adaptive average pooling to g x g, written with explicit windows, (c, y, x) order."""
    n, c, H, W = m.shape
    cells = []
    for i in range(g):
        for j in range(g):
            cells.append(m[:, :, (i * H) // g:-(-(i + 1) * H // g),
                           (j * W) // g:-(-(j + 1) * W // g)].mean((2, 3)))
    return torch.stack(cells, -1).reshape(n, c * g * g)


def _f(u, loss):
    return {"hinge": torch.relu(1 - u), "softhinge": F.softplus(1 - u), "linear": -u}[loss]


def _score_loss(z, c, B, neg, loss):
    """L = mean_i f(z_i^T B c_i) + f(-z_{neg(i)}^T B c_i)."""
    Bc = c @ B.T
    return (_f((z * Bc).sum(1), loss) + _f(-(z[neg] * Bc).sum(1), loss)).mean()


def _views_and_negatives(n_images, seed, side=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n_images, 1, side, side, generator=g)
    views = torch.cat([x + 0.1 * torch.randn(x.shape, generator=g), 0.8 * x.flip(-1)])
    n2 = 2 * n_images
    while True:                                   # a random other image for every row
        neg = torch.randperm(n2, generator=g)
        if bool((neg % n_images != torch.arange(n2) % n_images).all()):
            return x, views, neg


def _compare(got_losses, want_losses, lib_params, ref_params):
    torch.testing.assert_close(got_losses.double(), want_losses.detach(), rtol=1e-5, atol=1e-6)
    for a, r in zip(lib_params, ref_params):
        assert a.grad is not None and r.grad is not None
        scale = float(r.grad.abs().max())
        assert scale > 0
        assert float((a.grad.double() - r.grad).abs().max()) <= 1e-4 * scale


# -- "The math": u+, u-, L_l, swapped views, detached context, variants table -------------
@pytest.mark.parametrize("variant, loss", [("clapp", "softhinge"), ("clapp++", "hinge"),
                                           ("clapp++dfb", "hinge"), ("clapp++dfb", "linear"),
                                           ("clapp++both", "softhinge")])
def test_layer_local_losses_and_gradients_match_the_page(variant, loss):
    """Section "The math" (u^+, u^-, L_l, f, views swapped, context detached) and the
    variant table: clapp = same block, global pool; clapp++ = same block, 2x2 grid;
    clapp++dfb = top block of the other view; clapp++both = DFB loss + a lateral loss
    with its own B_l. Losses and the gradients of every conv weight, bias and B_l."""
    x, views, neg = _views_and_negatives(5, seed=len(variant) + len(loss))
    enc = CLAPPEncoder(variant=variant, architecture="tiny", loss=loss, n_epochs=0,
                       random_state=1).fit(x.numpy())
    with torch.no_grad():                         # scores of order 1: some hinges inactive
        for p in enc.heads_.parameters():
            p.mul_(40.0)
    params = _params(enc)
    pairs = [list(h) if variant == "clapp++both" else [h] for h in enc.heads_]
    heads = [[_leaf(h.weight) for h in hs] for hs in pairs]
    grid = 1 if variant == "clapp" else 2
    h = [_pool(m, grid) for m in _forward(params, views.double(), detach=True)]
    b = len(x)
    want = []
    for l in range(len(h)):
        z = torch.cat([h[l][b:], h[l][:b]])       # row i: the other view of row i's image
        lateral, top = h[l].detach(), h[-1].detach()
        if variant in ("clapp", "clapp++"):
            want.append(_score_loss(z, lateral, heads[l][0], neg, loss))
        elif variant == "clapp++dfb":
            want.append(_score_loss(z, top, heads[l][0], neg, loss))
        else:
            want.append(_score_loss(z, top, heads[l][0], neg, loss)
                        + _score_loss(z, lateral, heads[l][1], neg, loss))
    want = torch.stack(want)
    want.sum().backward()
    got = enc._train_step(views, neg)
    lib = [p for blk in enc.encoder_.blocks for p in blk[0].parameters()]
    lib += [m.weight for hs in pairs for m in hs]
    ref = [t for W, bias, _ in params for t in (W, bias)] + [t for hs in heads for t in hs]
    _compare(got, want, lib, ref)


@pytest.mark.parametrize("loss", ["clapp", "infonce", "infonce-cross"])
def test_global_baselines_match_the_page(loss):
    """Section "The math", GlobalSSLEncoder: the hinge at the top block only with a
    detached context and full backprop (BP-CLAPP++); NT-Xent with cosine similarity and
    temperature over the 2B - 1 other rows (``"infonce"``); each view-A row against the B
    view-B rows, one direction (``"infonce-cross"``)."""
    x, views, neg = _views_and_negatives(4, seed=3)
    tau = 0.3
    enc = GlobalSSLEncoder(loss=loss, architecture="tiny", temperature=tau, n_epochs=0,
                           random_state=2).fit(x.numpy())
    params, Wh = _params(enc), _leaf(enc.heads_[0].weight)
    top = _pool(_forward(params, views.double(), detach=False)[-1], 2)
    n2, b = len(views), len(x)
    if loss == "clapp":
        want = _score_loss(torch.cat([top[b:], top[:b]]), top.detach(), Wh, neg, "hinge")
    else:
        p = top @ Wh.T
        p = p / p.norm(dim=1, keepdim=True)
        S = p @ p.T / tau
        if loss == "infonce":
            S = S.masked_fill(torch.eye(n2, dtype=torch.bool), -np.inf)
            other = torch.cat([torch.arange(b, n2), torch.arange(b)])
            want = -S.log_softmax(1)[torch.arange(n2), other].mean()
        else:
            want = -S[:b, b:].log_softmax(1).diagonal().mean()
    want.backward()
    got = enc._train_step(views, neg)
    lib = [p for blk in enc.encoder_.blocks for p in blk[0].parameters()] + [enc.heads_[0].weight]
    ref = [t for W, bias, _ in params for t in (W, bias)] + [Wh]
    _compare(got, want[None], lib, ref)


@pytest.mark.parametrize("loss", ["hinge", "linear"])
def test_patch_prediction_clapp2021_matches_the_page(loss):
    """Section "The 2021 patch-prediction CLAPP": patches of view A (row-major grid), the
    block map averaged over each patch, u_{t,k} = z_{t+(k+1,0)}^T W_k c_t for k = 1..K
    against the same position in another image, averaged over images and positions then
    over K; the block loss is the sum of the two asymmetric halves z^T W_k sg(c) and
    sg(z)^T W'_k c."""
    x, views, neg = _views_and_negatives(4, seed=5)
    enc = CLAPPEncoder(variant="clapp2021", architecture="tiny", loss=loss, n_epochs=0,
                       random_state=3).fit(x.numpy())
    size, stride, ny, nx, K = enc.patch_grid_
    assert (size, stride, ny, nx, K) == (4, 2, 7, 7, 5)   # the page's 16 px geometry
    with torch.no_grad():
        for p in enc.heads_.parameters():
            p.mul_(30.0)
    params = _params(enc)
    preds = [(_leaf(hd.weight), _leaf(hd.mirror)) for hd in enc.heads_]
    b = len(x)
    va = views[:b].double()
    patches = torch.stack([va[:, :, i * stride:i * stride + size, j * stride:j * stride + size]
                           for i in range(ny) for j in range(nx)], 1).flatten(0, 1)
    neg_img = neg[:b] % b          # the estimator uses view A and its other-image negatives

    def half(z, c, Wk):
        total = 0.0
        for k in range(1, K + 1):
            target, ctx = z[:, :, k + 1:, :], c[:, :, :ny - k - 1, :]
            pred = torch.einsum("de,beyx->bdyx", Wk[k - 1], ctx)
            total = total + (_f((target * pred).sum(1), loss)
                             + _f(-(target[neg_img] * pred).sum(1), loss)).mean()
        return total / K

    want = []
    for m, (Wk, Wm) in zip(_forward(params, patches, detach=True), preds):
        h = m.mean((2, 3)).reshape(b, ny, nx, -1).permute(0, 3, 1, 2)
        want.append(half(h, h.detach(), Wk) + half(h.detach(), h, Wm))
    want = torch.stack(want)
    want.sum().backward()
    got = enc._train_step(views, neg)
    lib = [p for blk in enc.encoder_.blocks for p in blk[0].parameters()]
    lib += [t for hd in enc.heads_ for t in (hd.weight, hd.mirror)]
    ref = [t for W, bias, _ in params for t in (W, bias)] + [t for pr in preds for t in pr]
    _compare(got, want, lib, ref)


def test_three_factor_rule_as_displayed():
    """Section "The math", the three-factor display: the descent step is
    -(1/N) sum_i [f'(u_i^+) (B c_i * phi'(a_i)) x_i^T - f'(-u_i^-) (B c_i * phi'(a_n(i)))
    x_n(i)^T]: the negative term has the opposite sign and the negative's own
    post-synaptic gate and pre-synaptic input, with the context of row i."""
    rng = np.random.default_rng(0)
    for loss in ["hinge", "softhinge", "linear"]:
        N, K_in, D, K = 7, 5, 4, 3
        x, W = rng.normal(size=(N, K_in)), rng.normal(size=(D, K_in))
        c, B = rng.normal(size=(N, K)), 2 * rng.normal(size=(D, K))
        neg = (np.arange(N) + 3) % N
        a = x @ W.T
        Bc = c @ B.T
        up, un = (np.maximum(a, 0) * Bc).sum(1), (np.maximum(a[neg], 0) * Bc).sum(1)
        fprime = {"hinge": lambda u: -(u < 1.0).astype(float), "linear": lambda u: -np.ones_like(u),
                  "softhinge": lambda u: -1.0 / (1.0 + np.exp(u - 1.0))}[loss]
        step = -(np.einsum("i,id,ik->dk", fprime(up), Bc * (a > 0), x)
                 - np.einsum("i,id,ik->dk", fprime(-un), Bc * (a[neg] > 0), x[neg])) / N
        grad = three_factor_grad(*(torch.tensor(t) for t in (x, W, c, B)),
                                 torch.tensor(neg), loss=loss).numpy()
        np.testing.assert_allclose(-grad, step, rtol=1e-12, atol=1e-12)


def test_transform_pools_adaptively_on_maps_that_are_not_multiples_of_the_grid():
    """Section "Choices", Pooling: adaptive average pooling (overlapping windows covering
    the whole map when its side is not a multiple of the grid), features concatenated
    block by block in (channel, y, x) order, as ``get_feature_names_out`` names them."""
    rng = np.random.default_rng(1)
    X = rng.random((5, 1, 20, 22)).astype(np.float32)  # block maps 20x22, 10x11, 5x5
    enc = CLAPPEncoder(variant="clapp++", architecture="tiny", spatial_pool=3, n_epochs=0,
                       random_state=0).fit(X)
    with torch.no_grad():
        maps = _forward(_params(enc), torch.from_numpy(X).double(), detach=True)
        want = torch.cat([_pool(m, 3) for m in maps], 1).numpy()
    np.testing.assert_allclose(enc.transform(X), want, rtol=1e-5, atol=1e-6)
    names = enc.get_feature_names_out()
    assert names[0].endswith("layer0_ch0_y0_x0") and names[1].endswith("layer0_ch0_y0_x1")
    assert names[9].endswith("layer0_ch1_y0_x0")


def test_random_resized_crop_keeps_the_aspect_ratio_on_non_square_images():
    """Section "Choices", Augmentations: the random resized crop draws the crop's area
    fraction in ``scale`` and its aspect ratio (width / height, in pixels) in ``ratio``,
    as torchvision does, also on images that are not square. Regression: the crop
    sides were sqrt(area * r) and sqrt(area / r) as fractions of the width and height,
    so a 16 x 32 image got crops twice as wide as high for r = 1."""
    aug = DefaultAugment(scale=(0.3, 0.3), ratio=(1.0, 1.0), flip=0.0, jitter=(0, 0, 0),
                         jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    for H, W, r in [(16, 32, 1.0), (30, 12, 1.0), (24, 40, 0.8)]:
        aug.ratio = (r, r)
        cols = torch.arange(W, dtype=torch.float32).expand(1, 1, H, W)
        rows = torch.arange(H, dtype=torch.float32)[:, None].expand(1, 1, H, W)
        x = torch.cat([cols, rows]).repeat(4, 1, 1, 1)     # 8 images: ramps along x and y
        out = aug(x, torch.Generator().manual_seed(0))
        # bilinear resampling of a ramp: the sampled span is (crop side) * (n - 1) / n
        crop_w = (out[0::2, 0, 0, -1] - out[0::2, 0, 0, 0]) * W / (W - 1)
        crop_h = (out[1::2, 0, -1, 0] - out[1::2, 0, 0, 0]) * H / (H - 1)
        want_w, want_h = np.sqrt(0.3 * H * W * r), np.sqrt(0.3 * H * W / r)
        np.testing.assert_allclose(crop_w.numpy(), want_w, rtol=1e-4)
        np.testing.assert_allclose(crop_h.numpy(), want_h, rtol=1e-4)


@pytest.mark.parametrize("variant", ["clapp++dfb", "clapp++both", "clapp2021"])
def test_update_similarity_is_the_cosine_of_local_and_backprop_gradients(variant):
    """Section "Linear-network theorem", last paragraph: ``update_similarity`` is, per
    block, the cosine between the gradient of the summed layer-local losses and the
    gradient of the top block's loss backpropagated through the whole network, all the
    block's conv weights and biases flattened. Two images and identical views
    (``augment=None``) make the batch order irrelevant, so the reference is exact."""
    rng = np.random.default_rng(4)
    X = rng.random((2, 1, 16, 16)).astype(np.float32)
    enc = CLAPPEncoder(variant=variant, architecture="tiny", augment=None, n_epochs=0,
                       batch_size=2, random_state=0).fit(X)
    got = update_similarity(enc, X, n_batches=2, random_state=0)
    views = torch.from_numpy(X).double().repeat(2, 1, 1, 1)
    neg = torch.tensor([1, 2, 3, 0])                  # the next row, another image

    def losses(params, detach):
        if variant == "clapp2021":
            size, stride, ny, nx, K = enc.patch_grid_
            va = views[:2]
            patches = torch.stack([va[:, :, i * stride:i * stride + size,
                                      j * stride:j * stride + size]
                                   for i in range(ny) for j in range(nx)], 1).flatten(0, 1)
            out = []
            for m, hd in zip(_forward(params, patches, detach), enc.heads_):
                h = m.mean((2, 3)).reshape(2, ny, nx, -1).permute(0, 3, 1, 2)
                total = 0.0
                for Wk, z, c in [(hd.weight, h, h.detach()), (hd.mirror, h.detach(), h)]:
                    for k in range(1, K + 1):
                        pred = torch.einsum("de,beyx->bdyx", Wk[k - 1].double(),
                                            c[:, :, :ny - k - 1, :])
                        t = z[:, :, k + 1:, :]
                        total = total + (torch.relu(1 - (t * pred).sum(1))
                                         + torch.relu(1 + (t[[1, 0]] * pred).sum(1))).mean() / K
                out.append(total)
            return out
        h = [_pool(m, 2) for m in _forward(params, views, detach)]
        top, out = h[-1].detach(), []
        for l, hd in enumerate(enc.heads_):
            z = torch.cat([h[l][2:], h[l][:2]])
            if variant == "clapp++dfb":
                out.append(_score_loss(z, top, hd.weight.double(), neg, "hinge"))
            else:
                out.append(_score_loss(z, top, hd[0].weight.double(), neg, "hinge")
                           + _score_loss(z, h[l].detach(), hd[1].weight.double(), neg, "hinge"))
        return out

    params = _params(enc)
    leaves = [[W, b] for W, b, _ in params]
    local = torch.autograd.grad(sum(losses(params, True)), [t for wb in leaves for t in wb])
    bp = torch.autograd.grad(losses(params, False)[-1], [t for wb in leaves for t in wb])
    for l in range(len(params)):
        a = torch.cat([local[2 * l].flatten(), local[2 * l + 1].flatten()])
        b = torch.cat([bp[2 * l].flatten(), bp[2 * l + 1].flatten()])
        want = float(a @ b / (a.norm() * b.norm()))
        # the patch gradients sum many cancelling float32 terms: the library's own
        # computation run in float64 gives the reference to 1e-15, in float32 to ~3e-4
        tol = 1e-3 if variant == "clapp2021" else 1e-5
        assert got[l] == pytest.approx(want, abs=tol), (l, got[l], want)
    assert got[len(params) - 1] == pytest.approx(1.0, abs=1e-6)


def test_colour_jitter_is_switched_on_as_a_whole_with_probability_jitter_p():
    """Section "Choices", Augmentations: colour jitter applied with p = 0.8, as the
    paper's ``RandomApply([ColorJitter], p=0.8)``: one switch per image for all
    factors. Regression: each factor had its own switch, so only 0.2**2 = 4% of
    one-channel images were left unjittered instead of 20%."""
    n = 4000
    aug = DefaultAugment(jitter=(0.5, 0.5, 0.5), jitter_p=0.8, gray_p=0.0)
    x = torch.tensor([0.2, 0.6]).view(1, 1, 1, 2).repeat(n, 1, 1, 1)
    y = aug.color(x, torch.Generator().manual_seed(3)).double()
    # brightness b then contrast k about the mean: mean(y) = 0.4 b, y2 - y1 = 0.4 b k
    b = y.mean(dim=(1, 2, 3)) / 0.4
    k = (y[:, 0, 0, 1] - y[:, 0, 0, 0]) / (0.4 * b)
    b_on, k_on = (b - 1).abs() > 1e-6, (k - 1).abs() > 1e-6
    assert torch.equal(b_on, k_on)
    assert abs((~b_on).double().mean().item() - 0.2) < 0.03


def _crop_sides(aug, H, W, n=64, seed=0):
    """Pixel width and height of each image's crop, read off the slope of bilinear ramps
    between output pixels a quarter and three quarters across (away from the image's
    border, where the border padding flattens the ramps)."""
    cols = torch.arange(W, dtype=torch.float32).expand(n, 1, H, W)
    rows = torch.arange(H, dtype=torch.float32)[:, None].expand(n, 1, H, W)
    out = aug.crop_flip(torch.cat([cols, rows], 1), torch.Generator().manual_seed(seed))
    a, b = W // 4, 3 * W // 4
    crop_w = (out[:, 0, 0, b] - out[:, 0, 0, a]).abs() / (b - a) * W
    a, b = H // 4, 3 * H // 4
    crop_h = (out[:, 1, b, 0] - out[:, 1, a, 0]) / (b - a) * H
    return crop_w, crop_h, out


@pytest.mark.parametrize("H, W", [(24, 40), (32, 32), (40, 18)])
def test_random_resized_crop_keeps_ratio_in_range_by_retrying(H, W):
    """Section "Choices", Augmentations: as torchvision's RandomResizedCrop, up to 10
    (area, ratio) draws per image, the first crop that fits is kept, so every crop's
    pixel aspect ratio stays in ``ratio``. Regression: a crop that did not fit was
    clamped side by side, its ratio leaving the range (up to 1.48 on 24 x 40 images)."""
    aug = DefaultAugment()
    crop_w, crop_h, _ = _crop_sides(aug, H, W, n=256)
    ratio = (crop_w / crop_h).numpy()
    assert ratio.min() >= 3 / 4 * (1 - 1e-4) and ratio.max() <= 4 / 3 * (1 + 1e-4)
    area = (crop_w * crop_h / (H * W)).numpy()
    assert area.min() >= 0.25 * (1 - 1e-4) and area.max() <= 1 + 1e-4


def test_random_resized_crop_falls_back_to_the_centre_crop_at_the_clipped_ratio():
    """When no draw fits (here every draw asks for the whole area at ratio 1/2 of a
    square image), torchvision's fallback: the centre crop of the largest size at the
    image's aspect ratio clipped to ``ratio``: full height, half the width."""
    aug = DefaultAugment(scale=(1.0, 1.0), ratio=(0.5, 0.5), flip=0.0)
    crop_w, crop_h, out = _crop_sides(aug, 20, 20, n=4)
    np.testing.assert_allclose(crop_w.numpy(), 10.0, rtol=1e-4)
    np.testing.assert_allclose(crop_h.numpy(), 20.0, rtol=1e-4)
    # centred: the column ramp spans [5, 15) around the image's centre 9.5
    np.testing.assert_allclose(out[:, 0, 0].mean(dim=1).numpy(), 9.5, atol=1e-4)
