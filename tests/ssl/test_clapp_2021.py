"""The 2021 patch-prediction CLAPP (variant="clapp2021"): patches, loss, estimator."""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder
from mlpapers.ssl.clapp._kernels import contrastive_loss
from mlpapers.ssl.clapp._patches import (
    PatchPredictor,
    extract_patches,
    patch_grid,
    patch_prediction_loss,
    patch_representations,
)


def test_extract_patches_matches_slicing():
    x = torch.randn(2, 3, 10, 12)
    p, ny, nx = extract_patches(x, 4, 2)
    assert (ny, nx) == patch_grid(10, 12, 4, 2) == (4, 5)
    assert p.shape == (2 * 4 * 5, 3, 4, 4)
    for b in range(2):
        for i in range(ny):
            for j in range(nx):
                torch.testing.assert_close(p[(b * ny + i) * nx + j],
                                           x[b, :, 2 * i:2 * i + 4, 2 * j:2 * j + 4])
    maps = torch.randn(2 * ny * nx, 5, 3, 3)
    reps = patch_representations(maps, 2, ny, nx)
    assert reps.shape == (2, 5, ny, nx)
    torch.testing.assert_close(reps[1, :, 2, 3], maps[(1 * ny + 2) * nx + 3].mean((1, 2)))


@pytest.mark.parametrize("loss", ["hinge", "softhinge", "linear"])
def test_patch_loss_matches_loops(loss):
    g = torch.Generator().manual_seed(0)
    B, D, K, ny, nx, steps = 3, 4, 5, 6, 2, 3
    z = torch.randn(B, D, ny, nx, generator=g)
    c = torch.randn(B, K, ny, nx, generator=g)
    W = torch.randn(steps, D, K, generator=g) * 0.3
    neg = torch.tensor([2, 0, 1])
    per_step = []
    for k in range(1, steps + 1):
        off = k + 1                                    # skip one row (official skip_step)
        terms = []
        for b in range(B):
            for y in range(ny - off):
                for x in range(nx):
                    pred = W[k - 1] @ c[b, :, y, x]
                    up = z[b, :, y + off, x] @ pred
                    un = z[neg[b], :, y + off, x] @ pred
                    terms.append(contrastive_loss(up[None], un[None], loss))
        per_step.append(torch.cat(terms).mean())
    want = torch.stack(per_step).mean()
    torch.testing.assert_close(patch_prediction_loss(z, c, W, neg, loss), want)
    with pytest.raises(ValueError, match="patch rows"):
        patch_prediction_loss(z, c, torch.zeros(5, D, K), neg, loss)


def test_asymmetric_predictor_trains_each_side_with_its_own_matrix():
    pp = PatchPredictor(4, 2, generator=torch.Generator().manual_seed(0))
    h = torch.randn(3, 4, 5, 2, requires_grad=True)
    neg = torch.tensor([1, 2, 0])
    gw, gm, gh = torch.autograd.grad(pp.loss(h, neg), [pp.weight, pp.mirror, h])
    hz = h.detach().clone().requires_grad_(True)        # z-side: through weight
    hc = h.detach().clone().requires_grad_(True)        # c-side: through mirror
    l1 = patch_prediction_loss(hz, h.detach(), pp.weight, neg)
    l2 = patch_prediction_loss(h.detach(), hc, pp.mirror, neg)
    (gz,) = torch.autograd.grad(l1, [hz])
    (gc,) = torch.autograd.grad(l2, [hc])
    torch.testing.assert_close(gh, gz + gc)
    assert gw.abs().sum() > 0 and gm.abs().sum() > 0


@pytest.fixture(scope="module")
def digits():
    return make_shifted_digits(n_samples=96, random_state=0)


def test_estimator_shapes_geometry_and_loss_decreases(digits):
    X, _ = digits
    enc = CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=4, augment="light",
                       lr=3e-3, random_state=0).fit(X)
    assert enc.patch_grid_ == (4, 2, 7, 7, 5)         # 16 px images: 4 px patches, stride 2
    assert enc.grids_ == [1, 1, 1] and enc.layer_dims_ == [16, 32, 64]
    assert enc.transform(X).shape == (len(X), 112)
    assert enc.transform(X, layers=-1).shape == (len(X), 64)
    assert all(h.weight.shape == (5, c, c) for h, c in zip(enc.heads_, [16, 32, 64]))
    losses = [h["loss"] for h in enc.history_]
    assert losses[-1] < losses[0]
    grid = CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=0, spatial_pool=2,
                        patch_size=8, patch_stride=2, random_state=0).fit(X)
    assert grid.patch_grid_ == (8, 2, 5, 5, 3)         # 5 rows: at most 3 steps with skip 1
    assert grid.transform(X).shape == (len(X), 4 * 112)


def test_transform_is_patch_average_and_batch_invariant(digits):
    X, _ = digits
    enc = CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=1,
                       random_state=0).fit(X)
    x = torch.from_numpy(X[:5])
    p, ny, nx = extract_patches(x, 4, 2)
    with torch.no_grad():
        top = enc.encoder_(p)[-1]
    want = patch_representations(top, 5, ny, nx).mean((2, 3)).numpy()
    np.testing.assert_allclose(enc.transform(X[:5], layers=-1), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(enc.transform(X[:1]), enc.transform(X)[:1], rtol=1e-5,
                               atol=1e-6)


def test_determinism(digits):
    X, _ = digits
    kw = dict(variant="clapp2021", architecture="tiny", n_epochs=1, random_state=5)
    np.testing.assert_array_equal(CLAPPEncoder(**kw).fit(X).transform(X),
                                  CLAPPEncoder(**kw).fit(X).transform(X))


@pytest.mark.parametrize("params, shape, match", [
    ({"patch_size": 20}, (4, 1, 16, 16), "too large"),
    ({"patch_size": 8, "patch_stride": 8}, (4, 1, 16, 16), "patch rows"),
    ({"prediction_steps": 6}, (4, 1, 16, 16), "patch rows"),
    ({"patch_size": 2}, (4, 1, 16, 16), "too small for the architecture"),
    ({"patch_size": 0}, (4, 1, 16, 16), "patch_size"),
    ({"spatial_pool": 8}, (4, 1, 16, 16), "patch grid"),
])
def test_bad_geometry(params, shape, match):
    enc = CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=1, **params)
    with pytest.raises(ValueError, match=match):
        enc.fit(np.zeros(shape, dtype=np.float32))


def test_update_similarity_and_save_load(digits, tmp_path):
    from mlpapers.ssl import update_similarity

    X, _ = digits
    enc = CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=1,
                       random_state=0).fit(X[:32])
    sim = update_similarity(enc, X[:32], n_batches=1, random_state=0)
    assert sim[2] == pytest.approx(1.0, abs=1e-5)          # the top block's loss is global
    assert all(-1.0 <= v <= 1.0 + 1e-6 for v in sim.values())
    enc.save(tmp_path / "c21.pt")
    back = CLAPPEncoder.load(tmp_path / "c21.pt")
    assert back.patch_grid_ == enc.patch_grid_
    np.testing.assert_array_equal(back.transform(X), enc.transform(X))
