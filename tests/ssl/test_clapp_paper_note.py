"""CLAPP / CLAPP++: checks from the research note.

The note's settings that the implementation follows but no other test pinned down:
the 2026 augmentation recipe (flip p = 0.5, colour jitter (0.8, 0.8, 0.8) applied with
p = 0.8, grayscale p = 0.2, Gaussian blur p = 0.5 with a kernel of about 10% of the
image side), the ``"vgg6"`` channel plan and its 32,768 probe features on STL-10's
96 px images, the per-epoch shuffle (the ``"next"`` negative is only a random other
image because of it), and the optimiser / BP-InfoNCE defaults (batch 32, weight decay
0, temperature 0.1).
"""

import math

import pytest
import torch

from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder
from mlpapers.ssl.clapp import DefaultAugment, infonce_loss

# -- augmentations -------------------------------------------------------------------------

N_AUG = 4000  # images per frequency test


def _only(**kw):
    """A DefaultAugment whose crop is the identity on square images (full area, aspect
    ratio 1) and whose flip, jitter, grayscale and blur are off, except the
    probabilities named in ``keep``, left at their defaults (other ``kw`` are passed on)."""
    off = dict(flip=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    for name in kw.pop("keep", ()):
        off.pop(name)
    return DefaultAugment(scale=(1.0, 1.0), ratio=(1.0, 1.0), **off, **kw)


def _assert_binomial(hits: torch.Tensor, p: float, n_sigma: float = 5.0):
    """The fraction of ``hits`` is ``p`` within ``n_sigma`` binomial standard errors."""
    n = hits.numel()
    frac = hits.double().mean().item()
    assert abs(frac - p) < n_sigma * math.sqrt(p * (1 - p) / n), (frac, p)


def test_default_augment_fields_are_the_papers_recipe():
    """The note's augmentations: flip 0.5, jitter (0.8, 0.8, 0.8) with p 0.8, grayscale
    0.2, blur 0.5 (the library's crop scale (0.25, 1) is the note's CIFAR setting)."""
    aug = DefaultAugment()
    assert aug.flip == 0.5
    assert tuple(aug.jitter) == (0.8, 0.8, 0.8)
    assert aug.jitter_p == 0.8
    assert aug.gray_p == 0.2
    assert aug.blur_p == 0.5
    assert tuple(aug.scale) == (0.25, 1.0)


@pytest.mark.parametrize("H, W, k", [(96, 96, 9), (16, 16, 3), (32, 32, 3), (40, 40, 5),
                                     (64, 64, 7), (24, 96, 3), (96, 50, 5)])
def test_blur_kernel_is_about_ten_percent_of_the_smaller_side(H, W, k):
    """Blur kernel "about 10% of the image size": the odd size
    max(3, floor(0.1 * min(H, W)) rounded down to odd), e.g. 9 px at STL-10's 96 px.
    Read off the blur of a centred point with a huge sigma (a flat k x k kernel): its
    support is exactly k x k with value 1 / k**2."""
    assert k == max(3, int(0.1 * min(H, W)) // 2 * 2 + 1)
    x = torch.zeros(1, 1, H, W)
    x[0, 0, H // 2, W // 2] = 1.0
    aug = DefaultAugment(blur_p=1.0, sigma=(1e4, 1e4))
    y = aug.blur(x, torch.Generator().manual_seed(0))[0, 0]
    support = y > 1e-3 / k**2
    rows, cols = support.any(1).nonzero()[:, 0], support.any(0).nonzero()[:, 0]
    assert int(support.sum()) == k * k
    assert rows.tolist() == list(range(H // 2 - k // 2, H // 2 + k // 2 + 1))
    assert cols.tolist() == list(range(W // 2 - k // 2, W // 2 + k // 2 + 1))
    torch.testing.assert_close(y[support], torch.full((k * k,), 1.0 / k**2))


def test_default_flip_probability_is_one_half():
    """Horizontal flip with the default p = 0.5: with the crop the identity and the
    other operations off, each output is either the image or its mirror, and the
    mirrored fraction over 4000 images is 0.5 within 5 binomial sigmas."""
    x = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4).repeat(N_AUG, 1, 1, 1)
    y = _only(keep=("flip",))(x, torch.Generator().manual_seed(0))
    same = (y - x).abs().amax(dim=(1, 2, 3)) < 1e-4
    flipped = (y - x.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-4
    assert torch.all(same ^ flipped)
    _assert_binomial(flipped, 0.5)


def test_default_blur_probability_is_one_half():
    """Gaussian blur with the default p = 0.5 (sigma fixed at 1 px so that every blur is
    visible): the blurred fraction over 4000 images is 0.5 within 5 binomial sigmas,
    and the blurred images are the 3-tap Gaussian of sigma 1 (16 px images)."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(N_AUG, 1, 16, 16, generator=g)
    y = _only(keep=("blur_p",), sigma=(1.0, 1.0))(x, g)
    kept = (y - x).abs().amax(dim=(1, 2, 3)) < 1e-5
    t = torch.tensor([-1.0, 0.0, 1.0])
    ker = torch.exp(-0.5 * t**2)
    ker = ker / ker.sum()
    pad = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate")
    ref = torch.nn.functional.conv2d(pad, (ker[:, None] * ker[None, :]).view(1, 1, 3, 3))
    blurred = (y - ref).abs().amax(dim=(1, 2, 3)) < 1e-5
    assert torch.all(kept ^ blurred)
    _assert_binomial(blurred, 0.5)


def test_default_grayscale_probability_is_one_fifth():
    """Random grayscale with the default p = 0.2 on colour images: the fraction whose
    three channels equal the ITU-R 601 luma is 0.2 within 5 binomial sigmas; the
    others are unchanged."""
    g = torch.Generator().manual_seed(2)
    x = torch.rand(N_AUG, 3, 4, 4, generator=g)
    y = _only(keep=("gray_p",))(x, g)
    luma = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    gray = (y - luma).abs().amax(dim=(1, 2, 3)) < 1e-5
    kept = (y - x).abs().amax(dim=(1, 2, 3)) < 1e-5
    assert torch.all(gray ^ kept)
    _assert_binomial(gray, 0.2)


def test_default_colour_jitter_probability_and_strengths():
    """Colour jitter with the default p = 0.8 and strengths 0.8 (torchvision's
    ColorJitter(0.8, 0.8, ...) draws factors in [0.2, 1.8]): on a one-channel
    image of two pixel values the brightness b = mean(y) / mean(x) and the contrast k (the
    pixel difference over b times the input's) are recovered; the jittered fraction
    is 0.8 within 5 binomial sigmas and the factors span [0.2, 1.8]."""
    x = torch.tensor([0.2, 0.6]).view(1, 1, 1, 2).repeat(N_AUG, 1, 2, 1)  # square: crop = id
    y = _only(keep=("jitter_p",))(x, torch.Generator().manual_seed(3)).double()
    b = y.mean(dim=(1, 2, 3)) / 0.4
    k = (y[:, 0, 0, 1] - y[:, 0, 0, 0]) / (0.4 * b)
    on = (b - 1).abs() > 1e-6
    assert torch.equal(on, (k - 1).abs() > 1e-6)
    _assert_binomial(on, 0.8)
    for f in (b[on], k[on]):
        assert float(f.min()) >= 0.2 - 1e-5 and float(f.max()) <= 1.8 + 1e-5
        assert float(f.min()) < 0.2 + 0.01 and float(f.max()) > 1.8 - 0.01


# -- the vgg6 network ----------------------------------------------------------------------

def test_vgg6_channel_plan_and_stl10_feature_count():
    """The note's STL-10 encoder: blocks [128], [256, M], [256], [512, M], [1024, M],
    [1024, M] (3x3 convs + ReLU, no BatchNorm); on 96 px images the blocks output
    128/256/256/512/1024/1024 channels on 96/48/48/24/12/6 px maps, and the official
    probe grids 8-4-4-4-2-2 give 32,768 concatenated features (one forward, 1 image)."""
    X = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    enc = CLAPPEncoder(variant="clapp", architecture="vgg6", spatial_pool=1, n_epochs=0,
                       augment=None, random_state=0).fit(X)
    assert enc.encoder_.channels == [128, 256, 256, 512, 1024, 1024]
    sides = [96, 48, 48, 24, 12, 6]
    assert enc.encoder_.map_sizes(96, 96) == [(s, s) for s in sides]
    kinds = [[type(m).__name__ for m in block] for block in enc.encoder_.blocks]
    conv, relu, pool = "Conv2d", "ReLU", "MaxPool2d"
    assert kinds == [[conv, relu], [conv, relu, pool], [conv, relu], [conv, relu, pool],
                     [conv, relu, pool], [conv, relu, pool]]
    for block in enc.encoder_.blocks:
        assert block[0].kernel_size == (3, 3) and block[0].padding == (1, 1)
    shapes = []
    hooks = [b.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
             for b in enc.encoder_.blocks]
    try:
        F = enc.transform(X[:1], spatial_pool=[8, 4, 4, 4, 2, 2])
    finally:
        for h in hooks:
            h.remove()
    assert shapes == [(1, c, s, s) for c, s in zip(enc.encoder_.channels, sides)]
    assert F.shape == (1, 32768)
    assert 128 * 64 + 256 * 16 + 256 * 16 + 512 * 16 + 1024 * 4 + 1024 * 4 == 32768


# -- training loop -------------------------------------------------------------------------

def _index_images(n=8, side=8):
    """``n`` constant images, image ``i`` of value ``(i + 1) / n``: a view's pixel names
    its image (with ``augment=None`` the views are the images themselves)."""
    return ((torch.arange(n, dtype=torch.float32) + 1) / n).view(n, 1, 1, 1).expand(
        n, 1, side, side).contiguous()


def _record_batches(monkeypatch, cls):
    """Spy on ``cls._train_step``: the image indices of view A of every batch."""
    seen = []
    original = cls._train_step

    def spy(self, views, neg_idx):
        b = views.shape[0] // 2
        seen.append((views[:b, 0, 0, 0] * 8 - 1).round().long().tolist())
        return original(self, views, neg_idx)

    monkeypatch.setattr(cls, "_train_step", spy)
    return seen


def test_images_are_reshuffled_every_epoch_from_the_estimator_generator(monkeypatch):
    """The batches are reshuffled every epoch (the note's pitfall: the "next" negative
    is a random other image only because of it): epoch e's batches are
    ``randperm(n, generator)`` cut into ``batch_size`` chunks, drawn from the
    estimator's generator right after the network's initialisation (replayed from an
    unfitted twin), with a new permutation each epoch."""
    X = _index_images()
    kw = dict(architecture="tiny", augment=None, batch_size=4, random_state=5)
    twin = CLAPPEncoder(**kw, n_epochs=0).fit(X)   # the generator after initialisation
    gen = twin._torch_gen
    perms = [torch.randperm(8, generator=gen).tolist() for _ in range(2)]
    seen = _record_batches(monkeypatch, CLAPPEncoder)
    enc = CLAPPEncoder(**kw, n_epochs=2).fit(X)
    assert seen == [perms[0][:4], perms[0][4:], perms[1][:4], perms[1][4:]]
    assert perms[0] != perms[1]
    assert perms[0] != list(range(8))
    # no other draw: augment=None and the "next" negatives consume nothing
    assert torch.equal(enc._torch_gen.get_state(), gen.get_state())


# -- optimiser and baseline defaults -------------------------------------------------------

@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
def test_default_batch_size_and_weight_decay(monkeypatch, cls):
    """The note's optimiser: AdamW, weight decay 0, batch 32. Checked on the
    parameters, on the optimiser fit builds and on the batches it trains on (40
    images: one batch of 32 and one of 8)."""
    est = cls()
    assert est.batch_size == 32
    assert est.weight_decay == 0.0
    built = []

    class SpyAdamW(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", SpyAdamW)
    seen = []
    original = cls._train_step

    def spy(self, views, neg_idx):
        seen.append(views.shape[0] // 2)
        return original(self, views, neg_idx)

    monkeypatch.setattr(cls, "_train_step", spy)
    X = torch.rand(40, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    cls(architecture="tiny", augment=None, n_epochs=1, random_state=0).fit(X)
    assert len(built) == 1
    assert [g["weight_decay"] for g in built[0].param_groups] == [0.0]
    assert seen == [32, 8]


def test_bp_infonce_default_temperature_is_one_tenth():
    """BP-InfoNCE baseline: cosine similarity with temperature 0.1 by default. A one-batch
    epoch's recorded loss (computed before the step, on the initial network) equals
    NT-Xent at tau = 0.1 of the projected top-block features, both from
    ``infonce_loss(p, 0.1)`` and from the formula written out; tau = 0.2 differs."""
    assert GlobalSSLEncoder().temperature == 0.1
    X = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    kw = dict(loss="infonce", architecture="tiny", augment=None, random_state=3)
    enc = GlobalSSLEncoder(**kw, n_epochs=1).fit(X)
    init = GlobalSSLEncoder(**kw, n_epochs=0).fit(X)   # the same initial network
    with torch.no_grad():
        views = torch.cat([X, X])                      # NT-Xent ignores the image order
        p = init.heads_[0](init._pooled(views, detach=True)[-1]).double()
    q = p / p.norm(dim=1, keepdim=True)
    n = len(q)
    S = (q @ q.T / 0.1).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    manual = -S.log_softmax(1)[torch.arange(n), (torch.arange(n) + n // 2) % n].mean()
    got = enc.history_[0]["loss"]
    assert got == pytest.approx(float(infonce_loss(p, 0.1)), rel=1e-5)
    assert got == pytest.approx(float(manual), rel=1e-5)
    assert abs(got - float(infonce_loss(p, 0.2))) > 1e-2
