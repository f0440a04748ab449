"""CLAPPEncoder / GlobalSSLEncoder: locality, transformer contract, claim, errors."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity
from mlpapers.ssl.clapp import VARIANTS, clapp_layer_loss
from mlpapers.ssl.clapp._kernels import negative_indices, swap_views


@pytest.fixture(scope="module")
def digits():
    X, y = make_shifted_digits(n_samples=96, random_state=0)
    return X, y


def _built(variant="clapp++dfb", **kw):
    """An initialised encoder (0 epochs) and a two-view batch with its negatives."""
    X, _ = make_shifted_digits(n_samples=8, random_state=1)
    enc = CLAPPEncoder(variant=variant, architecture="tiny", n_epochs=0, random_state=0,
                       **kw).fit(X)
    x = torch.from_numpy(X)
    views = torch.cat([x, x.flip(-1)], dim=0)
    return enc, views, negative_indices(len(X))


def _grad_norms(loss, modules):
    params = [list(m.parameters()) for m in modules]
    flat = [p for ps in params for p in ps]
    grads = torch.autograd.grad(loss, flat, allow_unused=True, retain_graph=True)
    out, k = [], 0
    for ps in params:
        gs = grads[k:k + len(ps)]
        out.append(sum(0.0 if g is None else float(g.abs().sum()) for g in gs))
        k += len(ps)
    return out


# -- locality ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_no_gradient_crosses_blocks(variant):
    enc, views, neg = _built(variant)
    losses = enc._layer_losses(views, neg)
    blocks, heads = list(enc.encoder_.blocks), list(enc.heads_)
    for l in range(len(blocks)):
        g_blocks = _grad_norms(losses[l], blocks)
        g_heads = _grad_norms(losses[l], heads)
        assert g_blocks[l] > 0 and g_heads[l] > 0
        assert all(g == 0.0 for m, g in enumerate(g_blocks) if m != l)
        assert all(g == 0.0 for m, g in enumerate(g_heads) if m != l)


@pytest.mark.parametrize("variant", VARIANTS)
def test_blockwise_train_step_equals_summed_losses(variant):
    # fit runs each block's backward right after its forward (one graph alive at a
    # time); the gradients must be exactly those of the summed block losses.
    enc, views, neg = _built(variant)
    params = [*enc.encoder_.parameters(), *enc.heads_.parameters()]
    want = torch.autograd.grad(enc._layer_losses(views, neg).sum(), params)
    got_losses = enc._train_step(views, neg)
    for p, w in zip(params, want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-7)
        p.grad = None
    torch.testing.assert_close(got_losses, enc._layer_losses(views, neg).detach())


def test_local_training_keeps_less_activation_memory_than_bp():
    from mlpapers.ssl.clapp._memory import training_step_activation_bytes

    X, _ = make_shifted_digits(n_samples=32, random_state=0)
    kw = dict(architecture="tiny", n_epochs=0, random_state=0)
    glob = training_step_activation_bytes(GlobalSSLEncoder(**kw).fit(X), X)
    for variant in ["clapp", "clapp++dfb"]:
        local = training_step_activation_bytes(CLAPPEncoder(variant=variant, **kw).fit(X), X)
        assert 0 < local < 0.8 * glob, (variant, local, glob)
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        training_step_activation_bytes(GlobalSSLEncoder(**kw).fit(X), X, batch_size=2.5)


def test_bp_variants_propagate_gradients():
    enc, views, neg = _built()
    top_bp = enc._layer_losses(views, neg, detach=False)[-1]
    assert all(g > 0 for g in _grad_norms(top_bp, enc.encoder_.blocks))
    for loss in ["clapp", "infonce", "infonce-cross"]:
        X, _ = make_shifted_digits(n_samples=8, random_state=1)
        glob = GlobalSSLEncoder(loss=loss, architecture="tiny", n_epochs=0, random_state=0).fit(X)
        total = glob._batch_losses(views, neg).sum()
        assert all(g > 0 for g in _grad_norms(total, glob.encoder_.blocks))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "clapp2021"])
def test_losses_are_swapped_views_with_the_right_context(variant):
    enc, views, neg = _built(variant)
    with torch.no_grad():
        h = enc._pooled(views, detach=True)
        got = enc._layer_losses(views, neg)
    for l, head in enumerate(enc.heads_):
        z = swap_views(h[l])              # row i: view B's z paired with view A's context
        if variant == "clapp++both":      # DFB loss + an extra lateral loss (own predictors)
            want = (clapp_layer_loss(z, h[-1], head[0].weight, neg, "hinge")
                    + clapp_layer_loss(z, h[l], head[1].weight, neg, "hinge"))
        else:
            c = {"clapp": h[l], "clapp++": h[l], "clapp++dfb": h[-1]}[variant]
            want = clapp_layer_loss(z, c, head.weight, neg, "hinge")
        torch.testing.assert_close(got[l], want)
    if variant == "clapp++dfb":           # every predictor reads the top layer
        assert all(hd.in_features == enc.layer_dims_[-1] for hd in enc.heads_)


def test_update_similarity_top_is_one_and_bounded(digits):
    X, _ = digits
    enc = CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X)
    sim = update_similarity(enc, X, n_batches=2, random_state=0)
    assert sorted(sim) == [0, 1, 2]
    assert sim[2] == pytest.approx(1.0, abs=1e-5)
    assert all(-1.0 <= v <= 1.0 + 1e-6 for v in sim.values())
    assert sim == update_similarity(enc, X, n_batches=2, random_state=0)
    with pytest.raises(ValueError, match="reference"):
        update_similarity(enc, X, reference="bogus")
    with pytest.raises(TypeError, match="CLAPPEncoder"):
        update_similarity(GlobalSSLEncoder(), X)


# -- transformer contract -------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(digits):
    X, _ = digits
    return CLAPPEncoder(architecture="tiny", n_epochs=2, random_state=0).fit(X)


def test_transform_shapes_names_and_layers(fitted, digits):
    X, _ = digits
    F_all = fitted.transform(X)
    assert F_all.dtype == np.float32
    assert F_all.shape == (len(X), sum(fitted.layer_dims_))
    assert fitted.layer_dims_ == [16 * 4, 32 * 4, 64 * 4]
    for l, d in enumerate(fitted.layer_dims_):
        assert fitted.transform(X, layers=l).shape == (len(X), d)
    np.testing.assert_array_equal(fitted.transform(X, layers=[0, 2]),
                                  np.hstack([F_all[:, :64], F_all[:, -256:]]))
    np.testing.assert_array_equal(fitted.transform(X, layers=-1), F_all[:, -256:])
    names = fitted.get_feature_names_out()
    assert len(names) == F_all.shape[1] == len(set(names))
    assert names[0] == "clappencoder_layer0_ch0_y0_x0"
    assert len(fitted.get_feature_names_out(layers=1)) == 128
    assert fitted.n_features_in_ == 256 and fitted.input_shape_ == (1, 16, 16)


@pytest.mark.parametrize("layers", [[-1, -1], [2, -1], [0, 1, 0]])
def test_transform_refuses_a_block_named_twice(fitted, digits, layers):
    # the features came twice, under repeated column names (pandas output)
    with pytest.raises(ValueError, match="each block at most once"):
        fitted.transform(digits[0][:4], layers=layers)
    with pytest.raises(ValueError, match="each block at most once"):
        fitted.get_feature_names_out(layers=layers)


def test_transform_grad_free_and_batch_size_invariant(fitted, digits):
    X, _ = digits
    full = fitted.transform(X)
    assert all(p.grad is None for p in fitted.encoder_.parameters())
    parts = np.vstack([fitted.transform(X[i:i + 7]) for i in range(0, len(X), 7)])
    np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fitted.transform(X[:1]), full[:1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(fitted.transform(X[:, 0]), full)          # (n, H, W)
    np.testing.assert_array_equal(fitted.transform(torch.from_numpy(X)), full)


def test_pipeline_clone_and_params(digits):
    X, y = digits
    pipe = make_pipeline(CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0),
                         StandardScaler(), LogisticRegression(max_iter=200))
    pipe.fit(X, y)
    assert 0.0 <= pipe.score(X, y) <= 1.0
    enc = CLAPPEncoder(variant="clapp", lr=0.01)
    c = clone(enc)
    assert c.get_params() == enc.get_params() and c is not enc
    assert pipe.get_params()["clappencoder__n_epochs"] == 1


def test_determinism_and_seed_matters(digits):
    X, _ = digits
    kw = dict(architecture="tiny", n_epochs=1, random_state=3)
    a = CLAPPEncoder(**kw).fit(X).transform(X)
    b = CLAPPEncoder(**kw).fit(X).transform(X)
    np.testing.assert_array_equal(a, b)
    c = CLAPPEncoder(**{**kw, "random_state": 4}).fit(X).transform(X)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("make", [
    lambda **kw: CLAPPEncoder(variant="clapp2021", **kw),
    lambda **kw: CLAPPEncoder(variant="clapp++dfb", **kw),
    lambda **kw: GlobalSSLEncoder(loss="infonce", **kw),
])
def test_untrained_encoder_is_the_initial_state_of_training(make, digits, monkeypatch):
    # The benchmark's per-arm random baseline (n_epochs=0, same seed) must be exactly
    # the encoder that training starts from: initialisation depends on random_state
    # only, not on n_epochs. With the optimiser step disabled, training is a no-op.
    X, _ = digits
    kw = dict(architecture="tiny", batch_size=32, random_state=3)
    init = make(n_epochs=0, **kw).fit(X[:64])
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)
    frozen = make(n_epochs=1, **kw).fit(X[:64])
    for a, b in zip(init.encoder_.state_dict().values(), frozen.encoder_.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(init.transform(X), frozen.transform(X))


@pytest.mark.parametrize("variant", ["clapp++", "clapp++both"])
def test_loss_decreases(variant, digits):
    X, _ = digits
    enc = CLAPPEncoder(variant=variant, architecture="tiny", n_epochs=4, augment="light",
                       random_state=0).fit(X)
    losses = [h["loss"] for h in enc.history_]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert set(enc.history_[0]) == {"epoch", "loss", "loss_l0", "loss_l1", "loss_l2"}


def test_global_infonce_loss_decreases(digits):
    X, _ = digits
    enc = GlobalSSLEncoder(loss="infonce", architecture="tiny", n_epochs=3, augment="light",
                           random_state=0).fit(X)
    losses = [h["loss_top"] for h in enc.history_]
    assert losses[-1] < losses[0]
    assert enc.transform(X).shape == (len(X), sum(enc.layer_dims_))


@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
def test_save_load_and_pickle(cls, digits, tmp_path):
    X, _ = digits
    enc = cls(architecture="tiny", n_epochs=1, random_state=0).fit(X)
    path = tmp_path / "enc.pt"
    enc.save(path)
    back = cls.load(path)
    np.testing.assert_array_equal(back.transform(X), enc.transform(X))
    assert back.history_ == enc.history_
    again = pickle.loads(pickle.dumps(enc))
    np.testing.assert_array_equal(again.transform(X), enc.transform(X))


# -- errors ---------------------------------------------------------------------------------
def test_bad_inputs(digits, fitted):
    X, _ = digits
    enc = CLAPPEncoder(architecture="tiny", n_epochs=1)
    with pytest.raises(ValueError, match=r"reshape flattened images first, e\.g\. X\.reshape"):
        enc.fit(X.reshape(len(X), -1))
    bad = X.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        enc.fit(bad)
    with pytest.raises(ValueError, match="too small"):
        enc.fit(np.zeros((4, 1, 3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="minimum of 2"):
        enc.fit(X[:1])
    with pytest.raises(NotFittedError):
        CLAPPEncoder().transform(X)
    with pytest.raises(ValueError, match="fitted on"):
        fitted.transform(np.zeros((2, 1, 20, 20), dtype=np.float32))
    with pytest.raises(ValueError, match="layers"):
        fitted.transform(X, layers=5)
    with pytest.raises(ValueError, match="layers"):
        fitted.transform(X, layers="top")


@pytest.mark.parametrize("params, match", [
    ({"variant": "bogus"}, "variant"),
    ({"loss": "mse"}, "loss"),
    ({"batch_size": 1}, "batch_size"),
    ({"lr": -1.0}, "lr"),
    ({"negatives": "all"}, "negatives"),
    ({"augment": "strong"}, "augment"),
    ({"architecture": [(0,)]}, "architecture"),
    ({"architecture": [("M",)]}, "at least one convolution"),
    ({"architecture": "huge"}, "architecture"),
    ({"spatial_pool": [1, 2]}, "spatial_pool"),
])
def test_bad_params(params, match, digits):
    X, _ = digits
    with pytest.raises((ValueError, TypeError), match=match):
        CLAPPEncoder(**{"architecture": "tiny", "n_epochs": 1, **params}).fit(X)


def test_global_bad_params(digits):
    X, _ = digits
    with pytest.raises(ValueError, match="loss"):
        GlobalSSLEncoder(loss="hinge").fit(X)
    with pytest.raises(ValueError, match="temperature"):
        GlobalSSLEncoder(temperature=0.0).fit(X)


# -- small-scale claim: local SSL features beat the random-init encoder's -------------------
def _probe(enc, Xtr, ytr, Xte, yte, layers="all"):
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500, C=0.1))
    clf.fit(enc.transform(Xtr, layers=layers), ytr)
    return clf.score(enc.transform(Xte, layers=layers), yte)


def test_dfb_lowers_every_block_loss_on_held_out_images():
    # Replaces a fast linear-probe claim (last-block probe >= untrained + 3 points after
    # 8 epochs) that seed 0 passed by luck: over data/model seeds 1-12 the gain was
    # -3.6 +- 7.2 points and 10 of 12 seeds failed; a short schedule does not move the
    # probe (the probe gain needs 20-40 epochs, see the slow test and the user guide's
    # table). What 4 epochs do robustly is learn the local objective itself, beyond the
    # training images: on 64 held-out images (fixed views and negatives) every block's
    # loss falls below its untrained value (chance, 2). Over seeds 0-19 the smallest
    # drops were 0.04, 0.06 and 0.19 for blocks 0, 1, 2 (means 0.11, 0.27, 0.50).
    X, _ = make_shifted_digits(n_samples=160, random_state=0)
    kw = dict(variant="clapp++dfb", architecture="tiny", augment="light", random_state=0)
    init = CLAPPEncoder(n_epochs=0, **kw).fit(X[:96])
    trained = CLAPPEncoder(n_epochs=4, **kw).fit(X[:96])
    x = torch.from_numpy(X[96:])
    views = init._two_views(init._augment_fn(), x, torch.Generator().manual_seed(123))
    neg = negative_indices(len(x))
    with torch.no_grad():
        before = init._layer_losses(views, neg)
        after = trained._layer_losses(views, neg)
    assert torch.all(before > 1.99), before
    assert torch.all(after < before - 0.02), (before, after)
    assert after[-1] < before[-1] - 0.1, (before, after)


@pytest.mark.slow
def test_claim_local_ssl_vs_random_and_bp():
    # 30 epochs. The former single-seed version also asserted a last-block gain of
    # >= 5 points and an all-block probe >= random init; seed 0 passed them by luck
    # (its untrained encoder is unusually weak): data/model seeds 1-3 gave last-block
    # gains of +12.5, +4.1 and +4.9 points and all-block gains of +1.2, -3.3 and -0.5,
    # and at the same number of updates (20 epochs, batch 16, 600 images) seeds 0-7 gave
    # last-block gains of +7.6 +- 7.7 (two below 0). So the last-block claim is the
    # mean gain over three seeds (> 0), and the all-block one is left to the 40-epoch
    # benchmark table (docs/user_guide/clapp.rst). The BP comparisons held on seeds 0-3.
    gains = []
    for seed in (0, 1, 2):
        X, y = make_shifted_digits(n_samples=1200, random_state=seed)
        Xtr, ytr, Xte, yte = X[:800], y[:800], X[800:], y[800:]
        kw = dict(architecture="tiny", augment="light", random_state=seed, n_epochs=30)
        arms = [("rand", CLAPPEncoder(**{**kw, "n_epochs": 0})), ("dfb", CLAPPEncoder(**kw))]
        if seed == 0:
            arms += [("bp", GlobalSSLEncoder(**kw)),
                     ("infonce", GlobalSSLEncoder(loss="infonce", **kw))]
        acc = {name: (_probe(e.fit(Xtr), Xtr, ytr, Xte, yte), _probe(e, Xtr, ytr, Xte, yte, -1))
               for name, e in arms}
        gains.append(acc["dfb"][1] - acc["rand"][1])                 # last block
        if seed == 0:
            assert acc["dfb"][0] >= acc["bp"][0] - 0.05, acc         # local ~ BP-CLAPP
            assert acc["infonce"][0] >= acc["rand"][0] + 0.1, acc    # BP-SSL works here
    assert np.mean(gains) > 0.0, gains


def test_flattened_images_get_the_reshape_to_apply(digits, fitted):
    X, _ = digits
    flat = X.reshape(len(X), -1)
    n, d = flat.shape
    side = int(np.sqrt(d))
    with pytest.raises(ValueError, match=rf"X\.reshape\({n}, 1, {side}, {side}\)"):
        CLAPPEncoder(architecture="tiny", n_epochs=1).fit(flat)
    with pytest.raises(ValueError, match=r"X\.reshape\(n, C, H, W\)"):
        GlobalSSLEncoder(architecture="tiny", n_epochs=1).fit(flat[:, :10])
    c, h, w = fitted.input_shape_
    with pytest.raises(ValueError, match=rf"X\.reshape\(3, {c}, {h}, {w}\)"):
        fitted.transform(flat[:3])
    with pytest.raises(ValueError, match="reshape flattened images"):
        fitted.transform(flat[:3].tolist())


@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
def test_preserves_dtype_tag_matches_transform(digits, cls):
    # scikit-learn reads the tag as "these input dtypes come back unchanged": the
    # encoders are float32 networks, so float64 must not be listed
    X = digits[0][:32]
    enc = cls(architecture="tiny", n_epochs=1, batch_size=16, random_state=0).fit(X)
    preserved = enc.__sklearn_tags__().transformer_tags.preserves_dtype
    assert preserved
    for dtype in (np.float32, np.float64):
        out = enc.transform(X.astype(dtype))
        assert out.dtype == np.float32
        assert (np.dtype(dtype).name in preserved) == (out.dtype == dtype)
