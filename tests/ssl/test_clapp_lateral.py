"""Lateral CLAPP / CLAPP++: the official loss wiring, and why block 0 of the globally
pooled variant stays at chance on shifted digits (a property of the data, not a bug)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder
from mlpapers.ssl.clapp._kernels import negative_indices


def _official_lateral_loss(maps, heads, grid):
    """Independent transcription of the official ``CPLoss.forward`` (zihan-wu/local-SSL,
    ``vision/models/SSLModel.py`` + ``SSLLoss.py``) with ``--asymmetric_W_pred`` and the
    default deterministic negatives: post-ReLU block output, average-pooled (global
    ``mean((2, 3))`` without ``--customize_loss_pool``), z = views swapped, negative =
    next row of z, context = the detached representation itself, hinge on both terms."""
    losses = []
    for m, W in zip(maps, heads):
        h = m.mean((2, 3)) if grid == 1 else F.avg_pool2d(m, m.shape[-1] // grid).flatten(1)
        b = len(h) // 2
        z_pos = torch.vstack([h[b:], h[:b]])
        z_neg = z_pos[(torch.arange(len(h)) + 1) % len(h)]
        wc = W(h.detach())
        u_pos, u_neg = (z_pos * wc).sum(-1), (z_neg * wc).sum(-1)
        losses.append((F.relu(1 - u_pos) + F.relu(1 + u_neg)).mean())
    return torch.stack(losses)


@pytest.mark.parametrize("variant, grid", [("clapp", 1), ("clapp++", 2)])
def test_lateral_loss_and_gradients_match_the_official_formula(variant, grid):
    X, _ = make_shifted_digits(n_samples=8, random_state=1)
    enc = CLAPPEncoder(variant=variant, architecture="tiny", n_epochs=0, random_state=0).fit(X)
    assert enc.grids_ == [grid] * 3
    x = torch.from_numpy(X)
    views = torch.cat([x, x.flip(-1) * 0.8], dim=0)
    neg = negative_indices(len(X))
    params = [*enc.encoder_.parameters(), *enc.heads_.parameters()]
    got = enc._train_step(views, neg)
    got_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    want = _official_lateral_loss(enc.encoder_(views, detach=True), enc.heads_, grid)
    want.sum().backward()
    torch.testing.assert_close(got, want.detach())
    for g, p in zip(got_grads, params):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-8)
        assert g.abs().sum() > 0       # conv weights, biases and B_l all receive gradient
    # B_l has PyTorch's default nn.Linear initialisation (as the official W_pred), not zero
    for head in enc.heads_:
        assert 0 < head.weight.abs().max() <= 1 / math.sqrt(head.in_features)


def _gratings(n, seed):
    """Sinusoidal gratings of random orientation, frequency, phase and amplitude."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    th, f, ph, amp = (rng.uniform(lo, hi, (n, 1, 1))
                      for lo, hi in [(0, np.pi), (0.15, 0.5), (0, 2 * np.pi), (0.5, 1.5)])
    X = amp * np.sin(np.pi * f * (np.cos(th) * xx + np.sin(th) * yy) + ph)
    return X[:, None].astype(np.float32)


def test_global_pool_lateral_block_learns_only_when_global_statistics_differ():
    # The same lateral, globally pooled path, identical views (so positives are
    # perfectly invariant) and the same settings: on gratings, whose orientation and
    # frequency change the globally pooled conv features, block 0's loss leaves
    # chance (2); on shifted digits it stays there, because a globally pooled 3x3
    # conv + ReLU sees nearly the same statistics for every digit (see the user
    # guide, "Why lateral CLAPP with a global pool does not learn").
    kw = dict(variant="clapp", architecture=[(16,)], augment=None, n_epochs=20,
              batch_size=16, lr=1e-2, random_state=0)
    gratings = CLAPPEncoder(**kw).fit(_gratings(64, 0))
    digits = CLAPPEncoder(**kw).fit(make_shifted_digits(n_samples=64, random_state=0)[0])
    assert gratings.history_[0]["loss_l0"] > 1.9
    assert gratings.history_[-1]["loss_l0"] < 1.5
    assert min(h["loss_l0"] for h in digits.history_) > 1.9


@pytest.mark.parametrize("variant", ["clapp", "clapp++", "clapp2021"])
def test_transform_spatial_pool_override(variant):
    X, _ = make_shifted_digits(n_samples=12, random_state=0)
    enc = CLAPPEncoder(variant=variant, architecture="tiny", n_epochs=0, random_state=0).fit(X)
    np.testing.assert_array_equal(enc.transform(X, spatial_pool=None), enc.transform(X))
    grids = [2, 1, 2]
    F_ = enc.transform(X, spatial_pool=grids)
    widths = [c * g * g for c, g in zip(enc.encoder_.channels, grids)]
    assert F_.shape == (12, sum(widths))
    assert len(enc.get_feature_names_out(spatial_pool=grids)) == sum(widths)
    top = enc.transform(X, layers=-1, spatial_pool=2)
    np.testing.assert_array_equal(top, enc.transform(X, spatial_pool=2)[:, -widths[-1]:])
    if variant != "clapp2021":        # the override pools the same block maps
        maps = enc.encoder_(torch.from_numpy(X))
        want = torch.cat([F.adaptive_avg_pool2d(m, g).flatten(1) for m, g in zip(maps, grids)],
                         dim=1)
        np.testing.assert_allclose(F_, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="larger than"):
        enc.transform(X, spatial_pool=16)
    with pytest.raises((TypeError, ValueError), match="spatial_pool"):
        enc.transform(X, spatial_pool="grid")
