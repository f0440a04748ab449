"""Properties that must hold for every valid input, on inputs hypothesis generates.

CLAPP / CLAPP++ kernels (losses, InfoNCE, the linear-network theory, the three-factor
rule, the 2021 patch loss, pooling, augmentations) and the encoders (transform
contract, locality, limiting cases where local learning *is* backprop) on tiny
generated images and networks. ``PROP_EXAMPLES`` raises the number of examples for
exploration (``HYPOTHESIS_PROFILE=explore PROP_EXAMPLES=500 pytest <this file>``).

Tolerances: the kernel relations are checked in float64, where they are exact up to
a few ulps of the values involved (``1e-9`` relative); the encoder relations compare
float32 computations of the same values, most of them bitwise.
"""

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity
from mlpapers.ssl.clapp import (
    DefaultAugment,
    clapp_layer_loss,
    contrastive_loss,
    exact_linear_feedback,
    extract_patches,
    infonce_loss,
    patch_prediction_loss,
    three_factor_grad,
)
from mlpapers.ssl.clapp._kernels import negative_indices, swap_views
from mlpapers.ssl.clapp._networks import pool_representations

N_EX = int(os.environ.get("PROP_EXAMPLES", 15))
LOSSES = ("hinge", "softhinge", "linear")
F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _orthogonal(n, g):
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


# -- losses ----------------------------------------------------------------------------------
@settings(max_examples=N_EX, deadline=None)
@given(u=st.lists(st.tuples(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(0, 10)),
                  min_size=1, max_size=20))
def test_contrastive_losses_bounds_and_monotonicity(u):
    """hinge >= 0; hinge <= softhinge <= hinge + 2 log 2 (relu <= softplus <= relu +
    log 2); linear = u- - u+; every f is non-increasing in u+ and non-decreasing in u-."""
    up, un, d = (torch.tensor(v, dtype=F64) for v in zip(*u))
    hinge = contrastive_loss(up, un, "hinge")
    soft = contrastive_loss(up, un, "softhinge")
    assert torch.all(hinge >= 0) and torch.all(torch.isfinite(soft))
    assert torch.all(soft >= hinge) and torch.all(soft <= hinge + 2 * math.log(2) + 1e-12)
    torch.testing.assert_close(contrastive_loss(up, un, "linear"), un - up)
    for loss in LOSSES:
        base = contrastive_loss(up, un, loss)
        assert torch.all(contrastive_loss(up + d, un, loss) <= base + 1e-12)
        assert torch.all(contrastive_loss(up, un + d, loss) >= base - 1e-12)


@st.composite
def layer_problems(draw, integer=False):
    n_images = draw(st.integers(2, 6))
    N, D, K = 2 * n_images, draw(st.integers(1, 6)), draw(st.integers(1, 6))
    g = _gen(draw(st.integers(0, 2**32 - 1)))
    draw_t = (lambda *s: torch.randint(-2, 3, s, generator=g).to(F64)) if integer else (
        lambda *s: torch.randn(*s, generator=g, dtype=F64))
    z, c, W = draw_t(N, D), draw_t(N, K), draw_t(D, K)
    mode = draw(st.sampled_from(["next", "random", "any"]))
    neg = (torch.randint(0, N, (N,), generator=g) if mode == "any"
           else negative_indices(n_images, mode=mode, generator=g))
    return z, c, W, neg, g


@settings(max_examples=N_EX, deadline=None)
@given(prob=layer_problems(), loss=st.sampled_from(LOSSES), a=st.floats(1e-3, 1e3))
def test_layer_loss_invariances(prob, loss, a):
    """The score z^T B c is invariant under a joint permutation of the rows (negatives
    re-indexed), orthogonal changes of basis of z- and c-space (B -> Q1^T B Q2) and
    z -> a z, c -> c / a; the loss, a mean of the per-row scores' f, is unchanged."""
    z, c, W, neg, g = prob
    want = clapp_layer_loss(z, c, W, neg, loss)
    perm = torch.randperm(len(z), generator=g)
    inv = torch.argsort(perm)
    torch.testing.assert_close(clapp_layer_loss(z[perm], c[perm], W, inv[neg[perm]], loss),
                               want, rtol=1e-9, atol=1e-9)
    Q1, Q2 = _orthogonal(z.shape[1], g), _orthogonal(c.shape[1], g)
    torch.testing.assert_close(clapp_layer_loss(z @ Q1, c @ Q2, Q1.T @ W @ Q2, neg, loss),
                               want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(clapp_layer_loss(z * a, c / a, W, neg, loss), want,
                               rtol=1e-9, atol=1e-9)
    # swap_views pairs row i with the other view of the same image, and is an involution
    if len(z) % 2 == 0:
        assert torch.equal(swap_views(swap_views(z)), z)


def test_softhinge_is_exact_far_from_the_kink():
    """Regression (found by the three-factor property): ``F.softplus`` returns x above
    its threshold 20, so the float64 softhinge loss and its gradient were off by up to
    2e-9 from the documented -logsigmoid form (and from the hand-written rule)."""
    u = torch.tensor([-30.0, -21.5, 0.3, 21.5, 40.0], dtype=F64)
    got = contrastive_loss(u, -u, "softhinge")
    def softplus(x):  # log(1 + e^x) without overflow or cancellation
        return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))

    want = torch.tensor([2 * softplus(1 - float(v)) for v in u], dtype=F64)  # u- = -u+
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    ur = u.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(contrastive_loss(ur, torch.zeros_like(u), "softhinge").sum(), ur)
    torch.testing.assert_close(g, -torch.sigmoid(1 - u), rtol=1e-14, atol=0)


@settings(max_examples=N_EX, deadline=None)
@given(prob=layer_problems(), integer=st.booleans(), loss=st.sampled_from(LOSSES),
       k_in=st.integers(1, 6))
def test_three_factor_rule_equals_autograd(prob, integer, loss, k_in):
    """The hand-written three-factor update equals autograd of the local loss for any
    shapes, any negative indices (repeats, self) and any loss; integer-valued inputs put
    pre-activations on the ReLU kink (0) and scores on the hinge kinks (+-1), where both
    use the same one-sided derivative."""
    z, c, B, neg, g = prob
    N, D = z.shape
    if integer:
        x = torch.randint(-2, 3, (N, k_in), generator=g).to(F64)
        W = torch.randint(-1, 2, (D, k_in), generator=g).to(F64)
    else:
        x = torch.randn(N, k_in, generator=g, dtype=F64)
        W = torch.randn(D, k_in, generator=g, dtype=F64)
    Wr = W.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(clapp_layer_loss(torch.relu(x @ Wr.T), c, B, neg, loss), Wr)
    hand = three_factor_grad(x, W, c, B, neg, loss)
    torch.testing.assert_close(hand, auto, rtol=1e-9, atol=1e-12)


@settings(max_examples=N_EX, deadline=None)
@given(n_images=st.integers(2, 8), P=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       tau=st.floats(0.05, 2.0), pairs=st.sampled_from(["all", "cross"]),
       scale=st.floats(1e-3, 1e3), same=st.booleans())
def test_infonce_invariances_and_bounds(n_images, P, seed, tau, pairs, scale, same):
    """InfoNCE of cosines: invariant under positive rescaling of rows, rotations, and a
    joint permutation of the images (both views); "all" is symmetric in the views. As a
    cross-entropy over m candidates with logits in [-1/tau, 1/tau] (m = 2B - 1 for
    "all", B for "cross") it lies in [log(1 + (m-1) e^{-2/tau}), log m + 2/tau], and is
    exactly log m when every row is the same vector."""
    g = _gen(seed)
    p = torch.randn(2 * n_images, P, generator=g, dtype=F64)
    if same:
        p = p[:1].expand_as(p).clone()
    loss = infonce_loss(p, tau, pairs)
    m = 2 * n_images - 1 if pairs == "all" else n_images
    lo, hi = math.log(1 + (m - 1) * math.exp(-2 / tau)), math.log(m) + 2 / tau
    assert lo - 1e-9 <= float(loss) <= hi + 1e-9
    if same:
        assert float(loss) == pytest.approx(math.log(m), rel=1e-9, abs=1e-12)
    s = torch.rand(len(p), 1, generator=g, dtype=F64) * scale + 1e-3
    torch.testing.assert_close(infonce_loss(p * s, tau, pairs), loss, rtol=1e-9, atol=1e-9)
    Q = _orthogonal(P, g)
    torch.testing.assert_close(infonce_loss(p @ Q, tau, pairs), loss, rtol=1e-9, atol=1e-9)
    perm = torch.randperm(n_images, generator=g)
    both = torch.cat([perm, perm + n_images])
    torch.testing.assert_close(infonce_loss(p[both], tau, pairs), loss, rtol=1e-9, atol=1e-9)
    if pairs == "all":
        torch.testing.assert_close(infonce_loss(swap_views(p), tau, pairs), loss,
                                   rtol=1e-9, atol=1e-9)


# -- linear-network theory ---------------------------------------------------------------------
@st.composite
def linear_nets(draw):
    dims = draw(st.lists(st.integers(1, 5), min_size=2, max_size=5))
    g = _gen(draw(st.integers(0, 2**32 - 1)))
    Ws = [torch.randn(b, a, generator=g, dtype=F64) / math.sqrt(a)
          for a, b in zip(dims[:-1], dims[1:])]
    B_top = torch.randn(dims[-1], dims[-1], generator=g, dtype=F64)
    n_images = draw(st.integers(2, 5))
    x = torch.randn(2 * n_images, dims[0], generator=g, dtype=F64)
    neg = negative_indices(n_images, mode=draw(st.sampled_from(["next", "random"])),
                           generator=g)
    return Ws, B_top, x, neg


@settings(max_examples=N_EX, deadline=None)
@given(net=linear_nets(), mode=st.sampled_from(["dfb", "lateral"]),
       loss=st.sampled_from(LOSSES))
def test_exact_feedback_makes_local_updates_backprop_on_any_linear_net(net, mode, loss):
    """For any depth (one layer included) and widths (down to 1), the prediction
    matrices of ``exact_linear_feedback`` make the layer-local gradients equal the
    backprop gradient of the top loss, layer by layer; and the matrices of a net's
    upper layers are those of the upper sub-network (``M_l`` only looks upwards)."""
    Ws, B_top, x, neg = net
    Bs = exact_linear_feedback(Ws, B_top, mode=mode)
    for j in range(1, len(Ws)):
        for a, b in zip(exact_linear_feedback(Ws[j:], B_top, mode=mode), Bs[j:]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    Wg = [W.clone().requires_grad_(True) for W in Ws]
    h = x
    for W in Wg:
        h = h @ W.T
    g_bp = torch.autograd.grad(clapp_layer_loss(swap_views(h), h.detach(), B_top, neg, loss),
                               Wg)
    zs, h = [], x
    for W in Wg:
        h = h.detach() @ W.T
        zs.append(h)
    top = zs[-1].detach()
    total = sum(clapp_layer_loss(swap_views(z), top if mode == "dfb" else z.detach(), B, neg,
                                 loss) for z, B in zip(zs, Bs))
    g_loc = torch.autograd.grad(total, Wg)
    for a, b in zip(g_loc, g_bp):
        scale = float(b.abs().max()) + 1e-300
        torch.testing.assert_close(a / scale, b / scale, rtol=0, atol=1e-10)


@settings(max_examples=N_EX, deadline=None)
@given(d=st.integers(1, 5), depth=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_lateral_feedback_of_orthogonal_layers_is_the_identity(d, depth, seed):
    """Orthogonal weights and B_L = I give B_l = M_l^T M_l = I: the Forward-Forward-like
    identity score is exact backprop (the note's limiting case)."""
    g = _gen(seed)
    Ws = [_orthogonal(d, g) for _ in range(depth)]
    for B in exact_linear_feedback(Ws, torch.eye(d, dtype=F64), mode="lateral"):
        torch.testing.assert_close(B, torch.eye(d, dtype=F64), rtol=0, atol=1e-12)


# -- 2021 patch loss, patches and pooling ------------------------------------------------------
@settings(max_examples=N_EX, deadline=None)
@given(n_images=st.integers(2, 5), D=st.integers(1, 4), Kc=st.integers(1, 4),
       ny=st.integers(3, 7), nx=st.integers(1, 4), data=st.data(),
       loss=st.sampled_from(LOSSES), seed=st.integers(0, 2**32 - 1))
def test_patch_loss_invariances(n_images, D, Kc, ny, nx, data, loss, seed):
    """The 2021 loss predicts down the rows, position by position, and averages over
    positions and images: mirroring every map left-right, or permuting the images with
    their negatives re-indexed, leaves it unchanged; it equals the mean over steps of
    the contrastive loss of explicit row shifts."""
    steps = data.draw(st.integers(1, ny - 2))
    g = _gen(seed)
    z = torch.randn(n_images, D, ny, nx, generator=g, dtype=F64)
    c = torch.randn(n_images, Kc, ny, nx, generator=g, dtype=F64)
    W = torch.randn(steps, D, Kc, generator=g, dtype=F64)
    neg = torch.randint(0, n_images, (n_images,), generator=g)
    want = patch_prediction_loss(z, c, W, neg, loss)
    torch.testing.assert_close(patch_prediction_loss(z.flip(-1), c.flip(-1), W, neg, loss),
                               want, rtol=1e-9, atol=1e-9)
    perm = torch.randperm(n_images, generator=g)
    inv = torch.argsort(perm)
    torch.testing.assert_close(patch_prediction_loss(z[perm], c[perm], W, inv[neg[perm]], loss),
                               want, rtol=1e-9, atol=1e-9)
    ref = 0.0
    for k in range(1, steps + 1):
        off = k + 1
        up = torch.einsum("bdyx,dk,bkyx->byx", z[:, :, off:], W[k - 1], c[:, :, :ny - off])
        un = torch.einsum("bdyx,dk,bkyx->byx", z[neg][:, :, off:], W[k - 1],
                          c[:, :, :ny - off])
        ref = ref + contrastive_loss(up, un, loss).mean()
    torch.testing.assert_close(want, ref / steps, rtol=1e-9, atol=1e-9)


@settings(max_examples=N_EX, deadline=None)
@given(B=st.integers(1, 3), C=st.integers(1, 3), H=st.integers(1, 12), W=st.integers(1, 12),
       data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_extract_patches_is_slicing_on_any_geometry(B, C, H, W, data, seed):
    size = data.draw(st.integers(1, min(H, W)))
    stride = data.draw(st.integers(1, 4))
    x = torch.randn(B, C, H, W, generator=_gen(seed))
    p, ny, nx = extract_patches(x, size, stride)
    assert (ny, nx) == ((H - size) // stride + 1, (W - size) // stride + 1)
    assert p.shape == (B * ny * nx, C, size, size)
    want = torch.stack([x[b, :, i * stride:i * stride + size, j * stride:j * stride + size]
                        for b in range(B) for i in range(ny) for j in range(nx)])
    assert torch.equal(p, want)


@settings(max_examples=N_EX, deadline=None)
@given(N=st.integers(1, 3), C=st.integers(1, 4), g=st.integers(1, 4), fy=st.integers(1, 3),
       fx=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_pooling_grids_nest(N, C, g, fy, fx, seed):
    """On a map whose sides are multiples of the grid, every cell has the same size:
    the global average (grid 1) is the mean of the grid's cells, each cell is the mean
    of its pixels, and features are channel-major (``c * g * g + i * g + j``)."""
    m = torch.randn(N, C, g * fy, g * fx, generator=_gen(seed), dtype=F64)
    (glob,), (cells,) = pool_representations([m], [1]), pool_representations([m], [g])
    assert glob.shape == (N, C) and cells.shape == (N, C * g * g)
    torch.testing.assert_close(cells.reshape(N, C, g * g).mean(-1), glob, rtol=1e-12,
                               atol=1e-12)
    want = m.reshape(N, C, g, fy, g, fx).mean(dim=(3, 5)).reshape(N, -1)
    torch.testing.assert_close(cells, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=N_EX, deadline=None)
@given(N=st.integers(1, 4), C=st.sampled_from([1, 3]), H=st.integers(2, 20),
       W=st.integers(2, 20), seed=st.integers(0, 2**32 - 1), light=st.booleans())
def test_augment_convexity_and_constant_images(N, C, H, W, seed, light):
    """Crops (bilinear, border padding) and the blur (normalised positive kernel,
    replicate padding) are convex combinations of pixels of the same image and channel:
    without colour jitter every output lies in that channel's [min, max]. A spatially
    constant image stays spatially constant through the full augmentation (brightness,
    contrast around the image mean, saturation and grayscale act on pixel values)."""
    g = _gen(seed)
    x = torch.rand(N, C, H, W, generator=g)
    base = DefaultAugment.light() if light else DefaultAugment()
    aug = DefaultAugment(scale=base.scale, ratio=base.ratio, flip=base.flip, jitter_p=0.0,
                         gray_p=0.0, blur_p=1.0)
    y = aug(x, g)
    assert y.shape == x.shape
    lo, hi = x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)
    assert torch.all(y >= lo - 1e-6) and torch.all(y <= hi + 1e-6)
    const = torch.rand(N, C, 1, 1, generator=g).expand(N, C, H, W).contiguous()
    yc = base(const, g)
    torch.testing.assert_close(yc, yc[:, :, :1, :1].expand_as(yc), rtol=0, atol=1e-6)


# -- encoders ----------------------------------------------------------------------------------
ARCHS = [[(4,)], [(4,), (6, "M")], [(3, 5), ("M", 4)], [(4,), (5,), (6, "M")]]


@st.composite
def encoders(draw, variants=("clapp", "clapp++", "clapp++dfb", "clapp++both", "clapp2021"),
             epochs=(0, 1)):
    arch = draw(st.sampled_from(ARCHS))
    n_blocks = len(arch)
    C = draw(st.sampled_from([1, 3]))
    H, W = draw(st.integers(4, 10)), draw(st.integers(4, 10))
    n = draw(st.integers(2, 8))
    X = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).random(
        (n, C, H, W), dtype=np.float32)
    max_grid = [min(H, W) // (2 ** sum(code == "M" for b in arch[:i + 1] for code in b))
                for i in range(n_blocks)]
    sp = draw(st.one_of(st.none(), st.lists(st.integers(1, 3), min_size=n_blocks,
                                            max_size=n_blocks)))
    if sp is not None:
        sp = [min(s, m) for s, m in zip(sp, max_grid)]
    elif min(max_grid) < 2:
        sp = 1
    kw = dict(architecture=arch, spatial_pool=sp, n_epochs=draw(st.sampled_from(epochs)),
              batch_size=draw(st.integers(2, 5)), random_state=draw(st.integers(0, 99)),
              negatives=draw(st.sampled_from(["next", "random"])),
              augment=draw(st.sampled_from(["default", "light", None])))
    variant = draw(st.sampled_from(variants))
    if variant == "global":
        enc = GlobalSSLEncoder(loss=draw(st.sampled_from(["clapp", "infonce",
                                                          "infonce-cross"])), **kw)
    else:
        enc = CLAPPEncoder(variant=variant, loss=draw(st.sampled_from(LOSSES)), **kw)
    return enc, X


@settings(max_examples=N_EX, deadline=None)
@given(prob=encoders(variants=("clapp", "clapp++", "clapp++dfb", "clapp++both", "clapp2021",
                               "global")), seed=st.integers(0, 99), data=st.data())
def test_transform_is_per_image_and_layers_are_column_blocks(prob, seed, data):
    """Each image's features depend on that image only (a permuted or split input gives
    permuted or split rows); ``layers`` selects the blocks' column ranges in the given
    order (negative indices count from the top); the width is ``sum(layer_dims_)``;
    input layouts (float64, torch, Fortran, strided, read-only, (n, H, W)) are the same
    images."""
    enc, X = prob
    enc.fit(X)
    full = enc.transform(X)
    assert full.dtype == np.float32 and full.shape == (len(X), sum(enc.layer_dims_))
    perm = np.random.default_rng(seed).permutation(len(X))
    np.testing.assert_allclose(enc.transform(X[perm]), full[perm], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(enc.transform(X[-1:]), full[-1:], rtol=1e-5, atol=1e-6)
    bounds = np.cumsum([0, *enc.layer_dims_])
    n_blocks = len(enc.layer_dims_)
    # each block at most once (a repeated block is refused)
    layers = data.draw(st.lists(st.integers(-n_blocks, n_blocks - 1), min_size=1,
                                max_size=4, unique_by=lambda i: i % n_blocks))
    want = np.hstack([full[:, bounds[i % n_blocks]:bounds[i % n_blocks + 1]]
                      for i in layers])
    np.testing.assert_array_equal(enc.transform(X, layers=layers), want)
    ro = X.copy()
    ro.setflags(write=False)
    wide = np.zeros(X.shape[:-1] + (2 * X.shape[-1],), np.float32)
    wide[..., ::2] = X
    for Xv in (X.astype(np.float64), torch.from_numpy(X), np.asfortranarray(X), ro,
               wide[..., ::2]):
        np.testing.assert_array_equal(enc.transform(Xv), full)
    if X.shape[1] == 1 and not (X.shape[-1] in (3, 4) and X.shape[-2] > 4):
        # (n, H, W) with W in (3, 4) and H > 4 is read as one (H, W, C) colour image and
        # rejected with a clear error (an ambiguous layout, see the shared validation)
        np.testing.assert_array_equal(enc.transform(X[:, 0]), full)


@settings(max_examples=N_EX, deadline=None)
@given(prob=encoders(epochs=(0,)), g=st.integers(1, 3))
def test_transform_spatial_pool_override_nests(prob, g):
    """``transform(spatial_pool=1)`` is the mean of the cells of ``spatial_pool=g``
    when ``g`` divides every pooled map (cells of equal size; for ``"clapp2021"`` the
    pooled map is the patch grid)."""
    enc, X = prob
    enc.fit(X)
    sizes = (enc.encoder_.map_sizes(*X.shape[-2:]) if enc.patch_grid_ is None
             else [enc.patch_grid_[2:4]] * len(enc.grids_))  # 2021: the pooled patch grid
    if any(h % g or w % g for h, w in sizes):
        g = 1
    coarse = enc.transform(X, spatial_pool=1)
    fine = enc.transform(X, spatial_pool=g)
    chans = enc.encoder_.channels
    fine_b = np.split(fine, np.cumsum([c * g * g for c in chans])[:-1], axis=1)
    want = np.hstack([f.reshape(len(X), c, g * g).mean(-1) for f, c in zip(fine_b, chans)])
    np.testing.assert_allclose(coarse, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=N_EX, deadline=None)
@given(prob=encoders(epochs=(0,)), seed=st.integers(0, 2**16))
def test_block_losses_are_local_and_the_blockwise_step_is_their_gradient(prob, seed):
    """For any architecture, loss, grid and negatives: the gradient of block l's loss
    reaches only block l and its predictor, and the block-by-block training step
    accumulates exactly the gradient of the summed block losses."""
    enc, X = prob
    enc.fit(X)
    g = _gen(seed)
    xb = torch.from_numpy(X)
    views = torch.cat([xb, DefaultAugment.light()(xb, g)])
    neg = negative_indices(len(X), mode=enc.negatives, generator=g)
    blocks, heads = list(enc.encoder_.blocks), list(enc.heads_)
    params = [p for m in blocks + heads for p in m.parameters()]
    losses = enc._layer_losses(views, neg)
    for l in range(len(blocks)):
        grads = torch.autograd.grad(losses[l], params, retain_graph=True, allow_unused=True)
        owner = [i for i, m in enumerate(blocks + heads) for _ in m.parameters()]
        for gr, i in zip(grads, owner):
            if i not in (l, len(blocks) + l):
                assert gr is None or not gr.any()
    want = torch.autograd.grad(losses.sum(), params, allow_unused=True)
    for p in params:
        p.grad = None
    got_losses = enc._train_step(views, neg)
    torch.testing.assert_close(got_losses, losses.detach(), rtol=1e-5, atol=1e-6)
    for p, w in zip(params, want):
        got = torch.zeros_like(p) if p.grad is None else p.grad
        torch.testing.assert_close(got, torch.zeros_like(p) if w is None else w,
                                   rtol=1e-4, atol=1e-6)
        p.grad = None


@settings(max_examples=N_EX, deadline=None)
@given(prob=encoders(variants=("clapp++",), epochs=(1, 2)), data=st.data())
def test_a_single_block_is_trained_identically_by_every_rule(prob, data):
    """With one block the top is the block itself: direct feedback reads the same
    context as the lateral loss, and backprop of the top (hinge) loss is the local
    gradient. CLAPP++, CLAPP++DFB and the global BP-CLAPP baseline then train
    identically (same initialisation, views, negatives and updates), and the local
    update is the backprop update (update similarity 1)."""
    enc, X = prob
    params = enc.get_params()
    block = data.draw(st.sampled_from([(4,), (3, "M", 5), (5, 4)]))
    max_grid = min(X.shape[-2:]) // (2 if "M" in block else 1)
    params.update(architecture=[block], loss="hinge",
                  spatial_pool=data.draw(st.integers(1, min(3, max_grid))))
    lateral = CLAPPEncoder(**params).fit(X)
    dfb = CLAPPEncoder(**dict(params, variant="clapp++dfb")).fit(X)
    glob_kw = {k: v for k, v in params.items()
               if k not in ("variant", "patch_size", "patch_stride", "prediction_steps")}
    bp = GlobalSSLEncoder(**dict(glob_kw, loss="clapp")).fit(X)
    want = lateral.transform(X)
    for other in (dfb, bp):
        np.testing.assert_allclose(other.transform(X), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([h["loss"] for h in other.history_],
                                   [h["loss"] for h in lateral.history_], rtol=1e-5,
                                   atol=1e-6)
    for rs in range(2):  # per batch: 1, or 0 when every hinge term is satisfied (documented)
        sim = update_similarity(lateral, X, n_batches=1, random_state=rs)
        assert list(sim) == [0]
        assert sim[0] == pytest.approx(1.0, abs=1e-6) or sim[0] == 0.0


@settings(max_examples=N_EX, deadline=None)
@given(prob=encoders(variants=("clapp", "clapp++", "clapp++dfb", "clapp++both", "clapp2021",
                               "global"), epochs=(1,)))
def test_fits_are_deterministic_and_training_is_finite(prob):
    """The same ``random_state`` gives the same network and history; losses are finite
    and the hinge losses non-negative (each block's f is a hinge, softhinge or linear)."""
    enc, X = prob
    a = enc.fit(X).transform(X)
    hist = [dict(h) for h in enc.history_]
    from sklearn.base import clone
    b = clone(enc).fit(X)
    np.testing.assert_array_equal(b.transform(X), a)
    assert [dict(h) for h in b.history_] == hist
    assert all(np.isfinite(v) for h in hist for v in h.values())
    if getattr(enc, "loss", None) in ("hinge", "softhinge", "clapp"):
        assert all(h["loss"] >= 0 for h in hist)
