"""CLAPP at extreme scales and dtypes: no silent NaN, inf or scale-dependent cosine.

Each test pins a failure found by the numerical-robustness audit (session 11).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    GlobalSSLEncoder,
    clapp_layer_loss,
    exact_linear_feedback,
    extract_patches,
    infonce_loss,
    three_factor_grad,
)
from mlpapers.ssl.clapp._kernels import negative_indices

ARCH = [(4,), (8, "M")]


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).random((8, 1, 8, 8)).astype(np.float32)


def _infonce_reference(p, temperature, pairs):
    """NT-Xent from the definition, in float64."""
    p = p.double()
    q = p / p.norm(dim=1, keepdim=True)
    n, b = len(p), len(p) // 2
    if pairs == "cross":
        sim = q[:b] @ q[b:].T / temperature
        return float(torch.mean(torch.logsumexp(sim, 1) - sim.diagonal()))
    sim = (q @ q.T / temperature).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    target = (torch.arange(n) + b) % n
    return float(torch.mean(torch.logsumexp(sim, 1) - sim[torch.arange(n), target]))


@pytest.mark.parametrize("pairs", ["all", "cross"])
def test_infonce_is_invariant_to_the_scale_of_the_projections(pairs):
    # F.normalize's squared norm overflowed float32 for entries ~2^80 (every row became 0,
    # the loss log(2B - 1)) and its eps=1e-12 replaced norms below 1e-12 (entries ~2^-100):
    # a cosine loss that depended on the projections' scale
    p = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    ref = _infonce_reference(p, 0.1, pairs)
    base = infonce_loss(p, 0.1, pairs)
    assert float(base) == pytest.approx(ref, rel=1e-5)
    for k in (80, -100):
        # a power of two is exact: the same rows, so the same float32 loss, bit for bit
        assert torch.equal(infonce_loss(p * 2.0 ** k, 0.1, pairs), base)


def test_infonce_gradient_is_that_of_plain_normalize_at_ordinary_scales():
    # the power-of-two prescaling must leave ordinary training bit-identical
    p = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    infonce_loss(p).backward()
    g = p.grad.clone()
    q = p.detach().clone().requires_grad_(True)
    n, qn = len(q), F.normalize(q, dim=1)
    sim = (qn @ qn.T / 0.1).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    F.cross_entropy(sim, (torch.arange(n) + n // 2) % n).backward()
    assert torch.equal(g, q.grad)


def test_fit_on_overflowing_images_raises_instead_of_returning_nan_features(images):
    # images ~1e30: the scores z^T B c overflowed, the weights became NaN, and fit returned
    # with a NaN history and NaN transform features
    for est in (CLAPPEncoder(architecture=ARCH, n_epochs=1, batch_size=4, random_state=0),
                GlobalSSLEncoder(architecture=ARCH, n_epochs=1, batch_size=4,
                                 random_state=0)):
        with pytest.raises(FloatingPointError, match="Scale the images"):
            est.fit(images * 1e30)


def test_transform_raises_on_non_finite_features(images):
    enc = CLAPPEncoder(architecture=ARCH, n_epochs=1, batch_size=4, augment=None,
                       random_state=0).fit(images)
    assert np.isfinite(enc.transform(images)).all()
    with torch.no_grad():
        enc.encoder_.blocks[0][0].weight.mul_(1e30)  # a model whose maps overflow float32
    with pytest.raises(ValueError, match="non-finite features"):
        enc.transform(images * 1e10)


def test_tiny_batches_and_degenerate_images_stay_finite(images):
    # passing probes kept as guards: batches of 2 (one negative from the other image), a
    # trailing batch of 1 (skipped), constant, all-zero and duplicated images
    cases = [images[:3], np.full_like(images, 0.5), np.zeros_like(images),
             np.repeat(images[:1], 4, 0)]
    for X in cases:
        for variant in ("clapp++dfb", "clapp2021"):
            kw = dict(patch_size=4, patch_stride=1) if variant == "clapp2021" else {}
            enc = CLAPPEncoder(variant=variant, architecture=ARCH, n_epochs=2, batch_size=2,
                               random_state=0, **kw).fit(X)
            assert all(math.isfinite(v) for h in enc.history_ for v in h.values())
            assert np.isfinite(enc.transform(X)).all()


def test_three_factor_grad_promotes_mixed_dtypes_like_the_loss():
    # mixed float32/float64 inputs failed with "expected m1 and m2 to have the same dtype"
    # while clapp_layer_loss promoted them
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    W, c, B = (torch.randn(*s, generator=g) for s in ((3, 4), (6, 2), (3, 2)))
    neg = negative_indices(3)
    got = three_factor_grad(x, W, c, B, neg)
    W64 = W.double().requires_grad_(True)
    clapp_layer_loss(F.relu(x @ W64.T), c.double(), B.double(), neg).backward()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, W64.grad, rtol=1e-12, atol=1e-12)


def test_exact_linear_feedback_raises_when_the_products_overflow():
    # three float32 layers of scale 1e20: M = W_3 W_2 overflowed to inf and B_1 was NaN
    with pytest.raises(ValueError, match="overflow"):
        exact_linear_feedback([torch.eye(2) * 1e20] * 3, torch.eye(2))
    out = exact_linear_feedback([torch.eye(2, dtype=torch.float64) * 1e20] * 3,
                                torch.eye(2, dtype=torch.float64))
    torch.testing.assert_close(out[0], torch.eye(2, dtype=torch.float64) * 1e40)


def test_extract_patches_rejects_patches_larger_than_the_image():
    # a torch "maximum size for tensor at dimension 2" trace
    with pytest.raises(ValueError, match="size=5"):
        extract_patches(torch.zeros(1, 1, 4, 4), 5, 1)
    with pytest.raises(ValueError, match="stride"):
        extract_patches(torch.zeros(1, 1, 4, 4), 2, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_unit_rows_needs_no_frexp_and_matches_plain_normalize(monkeypatch, dtype):
    # torch.frexp has no MPS kernel: the power-of-two prescaling used it, so InfoNCE failed
    # on Apple GPUs. Rows of ordinary scale, with maxima just below, at and above powers
    # of two (where log2 may round up), and a zero row, must give F.normalize's values
    # and gradients bit for bit; a zero row stays 0 in every dtype (float16 gave NaN: the
    # default eps=1e-12 rounds to 0 there, so _unit_rows uses the dtype's tiny)
    from mlpapers.ssl.clapp import _kernels

    def no_frexp(*args, **kwargs):
        raise NotImplementedError("aten::frexp is not implemented for the MPS device")

    monkeypatch.setattr(torch, "frexp", no_frexp)
    gen = torch.Generator().manual_seed(2)
    p = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    e = 1 if dtype == torch.float16 else 3   # float16's squares overflow beyond ~2^7
    p = p * torch.logspace(-e, e, 8, dtype=torch.float64)[:, None]
    below = 1 - torch.finfo(dtype).eps / 2          # the largest value below 1 in dtype
    p[1, 2], p[2, 0], p[3, 4] = 4 * below, -8.0, 2 * below + 1e-3
    p[5] = 0.0
    p = p.to(dtype)
    a = p.clone().requires_grad_(True)
    b = p.clone().requires_grad_(True)
    ua, ub = _kernels._unit_rows(a), F.normalize(b, dim=1, eps=torch.finfo(dtype).tiny)
    torch.testing.assert_close(ua, ub, rtol=0, atol=0)
    w = torch.randn(8, 5, generator=gen).to(dtype)
    (ua[:5] * w[:5]).sum().backward()
    (ub[:5] * w[:5]).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    assert bool((ua[5] == 0).all())
    # ordinary rows are those of the default eps too
    torch.testing.assert_close(ua[:5], F.normalize(p[:5], dim=1), rtol=0, atol=0)
    # and the scale-free part still holds without frexp: 2^100-scaled rows, same result
    big = 2.0 ** 100 if torch.finfo(dtype).max > 2.0 ** 101 else 2.0 ** 8
    assert torch.equal(_kernels._unit_rows(p[:5] * big), ua[:5].detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_infonce_with_a_zero_row_is_finite_in_every_dtype(dtype):
    # a zero representation row has cosine 0 with every row: the loss is the float64 value
    # of that cosine matrix (float16 returned NaN: 0 / 0 in F.normalize's eps=1e-12 -> 0)
    from mlpapers.ssl.clapp import infonce_loss

    p = torch.zeros(4, 3, dtype=dtype)
    p[0] = 1
    p[2] = 1
    p.requires_grad_(True)
    loss = infonce_loss(p)
    loss.backward()
    ref = infonce_loss(p.detach().double())
    assert torch.isfinite(p.grad).all()
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    assert abs(float(loss.detach()) - float(ref)) <= tol
