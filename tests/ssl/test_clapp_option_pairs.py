"""Option interactions of CLAPPEncoder / GlobalSSLEncoder: a pairwise covering array.

Every pair of values of the code-path options (variant, loss, augment, spatial_pool,
negatives, architecture, input kind, batch size) appears in at least one configuration;
each configuration must fit and keep the promises each option makes alone: numpy
float32 features of width ``sum(layer_dims_)``, ``layers=`` a slice of ``"all"``,
``spatial_pool=grids_`` the default, batch invariance, and the same features and
fitted attributes after a clone + refit, a pickle and a ``save``/``load`` round trip.
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl.clapp import (
    VARIANTS,
    CLAPPEncoder,
    GlobalSSLEncoder,
    training_step_activation_bytes,
    update_similarity,
)
from tests._pairwise import covering_array, uncovered_pairs


def _flip(x):          # one-argument user augment
    return x.flip(-1)


def _noise(x, generator):  # two-argument user augment drawing from the generator
    return x + 0.01 * torch.randn(x.shape, generator=generator)


_ARCH = {"tiny": "tiny", "two": [(4,), (6, "M")]}
# "light" is DefaultAugment with other settings: the code path of "default"
_AUG = {"default": "default", "none": None, "flip": _flip, "noise": _noise}


def _images(kind, X):
    if kind == "np3f64":
        return X[:, 0].astype(np.float64)
    if kind == "torch":
        return torch.as_tensor(X)
    return X


def _spatial_pool(token, arch):
    if token == "list":
        return [1 + i % 2 for i in range(3 if arch == "tiny" else 2)]
    return token


@pytest.fixture(scope="module")
def images():
    return make_shifted_digits(n_samples=8, random_state=0)[0]


_FITTED = ("grids_", "layer_dims_", "input_shape_", "n_features_in_", "history_",
           "patch_grid_")


def _check_invariants(enc, X, tmp_path):
    F = enc.transform(X)
    assert isinstance(F, np.ndarray) and F.dtype == np.float32
    assert F.shape == (8, sum(enc.layer_dims_)) and np.isfinite(F).all()
    # clone + refit, pickle and save/load: the same features (same random_state) and
    # the same fitted attributes
    np.testing.assert_array_equal(clone(enc).fit(X).transform(X), F)
    enc.save(tmp_path / "enc.pt")
    for copy in (pickle.loads(pickle.dumps(enc)), type(enc).load(tmp_path / "enc.pt")):
        np.testing.assert_array_equal(copy.transform(X), F)
        for name in _FITTED:
            assert getattr(copy, name, None) == getattr(enc, name, None), name
    # layers= is a slice of layers="all", in the order asked
    offs = np.cumsum([0, *enc.layer_dims_])
    np.testing.assert_array_equal(enc.transform(X, layers=[-1, 0]),
                                  np.hstack([F[:, offs[-2]:offs[-1]], F[:, :offs[1]]]))
    # the training grids passed explicitly are the default
    np.testing.assert_array_equal(enc.transform(X, spatial_pool=list(enc.grids_)), F)
    # per-image features (no batch statistics)
    np.testing.assert_allclose(enc.transform(X[:3]), F[:3], rtol=1e-5, atol=1e-6)


_CLAPP_OPTIONS = {"variant": list(VARIANTS), "loss": ["hinge", "softhinge", "linear"],
                  "augment": list(_AUG), "spatial_pool": [None, 1, "list"],
                  "negatives": ["next", "random"], "architecture": list(_ARCH),
                  "input": ["np4", "np3f64", "torch"], "batch_size": [2, 5]}
_CLAPP_CONFIGS = covering_array(_CLAPP_OPTIONS)


def test_covering_arrays_cover_every_pair():
    assert uncovered_pairs(_CLAPP_OPTIONS, _CLAPP_CONFIGS) == []
    assert uncovered_pairs(_GLOBAL_OPTIONS, _GLOBAL_CONFIGS) == []


@pytest.mark.parametrize("cfg", _CLAPP_CONFIGS,
                         ids=["-".join(str(v) for v in c.values()) for c in _CLAPP_CONFIGS])
def test_clapp_option_pairs(images, cfg, tmp_path):
    enc = CLAPPEncoder(variant=cfg["variant"], loss=cfg["loss"], augment=_AUG[cfg["augment"]],
                       spatial_pool=_spatial_pool(cfg["spatial_pool"], cfg["architecture"]),
                       negatives=cfg["negatives"], architecture=_ARCH[cfg["architecture"]],
                       batch_size=cfg["batch_size"], n_epochs=1, random_state=0)
    X = _images(cfg["input"], images)
    _check_invariants(enc.fit(X), X, tmp_path)
    assert len(enc.history_) == 1 and np.isfinite(enc.history_[0]["loss"])


_GLOBAL_OPTIONS = {"loss": ["clapp", "infonce", "infonce-cross", "bp-infonce"],
                   "augment": ["default", "none", "noise"], "spatial_pool": [None, "list"],
                   "negatives": ["next", "random"], "architecture": list(_ARCH)}
_GLOBAL_CONFIGS = covering_array(_GLOBAL_OPTIONS)


@pytest.mark.parametrize("cfg", _GLOBAL_CONFIGS,
                         ids=["-".join(str(v) for v in c.values()) for c in _GLOBAL_CONFIGS])
def test_global_option_pairs(images, cfg, tmp_path):
    enc = GlobalSSLEncoder(loss=cfg["loss"], augment=_AUG[cfg["augment"]],
                           spatial_pool=_spatial_pool(cfg["spatial_pool"], cfg["architecture"]),
                           negatives=cfg["negatives"], architecture=_ARCH[cfg["architecture"]],
                           projection_dim=8, batch_size=4, n_epochs=1, random_state=0)
    _check_invariants(enc.fit(images), images, tmp_path)


# -- regressions ------------------------------------------------------------------------
_PATCH_OPTIONS = {"patch_size": 4, "patch_stride": 1, "prediction_steps": 2}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "clapp2021"])
def test_patch_options_are_ignored_outside_clapp2021(images, variant):
    # documented rule (as SCENT's methods and GlobalSSLEncoder's losses): an option only
    # another variant reads is ignored. They were refused by fit, which broke a grid
    # search over variant with a patch option set.
    kw = dict(variant=variant, architecture="tiny", n_epochs=1, batch_size=4, random_state=0)
    plain = CLAPPEncoder(**kw).fit(images)
    patched = CLAPPEncoder(**kw, **_PATCH_OPTIONS).fit(images)
    np.testing.assert_array_equal(patched.transform(images), plain.transform(images))
    assert patched.history_ == plain.history_ and patched.patch_grid_ is None


def test_patch_options_are_read_by_clapp2021(images):
    kw = dict(variant="clapp2021", architecture="tiny", n_epochs=0, random_state=0)
    assert CLAPPEncoder(**kw, **_PATCH_OPTIONS).fit(images).patch_grid_ == (4, 1, 13, 13, 2)


def test_grid_search_over_variants_with_a_patch_option():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    X, y = make_shifted_digits(n_samples=16, random_state=0)
    y = y % 2                                   # two classes in every fold
    pipe = make_pipeline(CLAPPEncoder(architecture="tiny", patch_size=8, n_epochs=1,
                                      batch_size=8, random_state=0),
                         LogisticRegression(max_iter=50))
    search = GridSearchCV(pipe, {"clappencoder__variant": ["clapp++", "clapp2021"]}, cv=2,
                          error_score="raise").fit(X, y)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


@pytest.mark.parametrize("loss", ["infonce", "infonce-cross", "bp-infonce"])
def test_infonce_fit_does_not_depend_on_negatives(images, loss):
    # InfoNCE never reads the negative indices, but negatives="random" drew them from
    # the training generator and so shifted every later augmentation
    kw = dict(loss=loss, architecture="tiny", projection_dim=8, batch_size=4, n_epochs=2,
              random_state=0)
    nxt = GlobalSSLEncoder(negatives="next", **kw).fit(images)
    rnd = GlobalSSLEncoder(negatives="random", **kw).fit(images)
    np.testing.assert_array_equal(rnd.transform(images), nxt.transform(images))
    assert rnd.history_ == nxt.history_


def test_clapp_loss_still_uses_negatives(images):
    # the hinge loss of BP-CLAPP does read them: the two settings train differently
    kw = dict(loss="clapp", architecture="tiny", batch_size=4, n_epochs=2, random_state=0)
    nxt = GlobalSSLEncoder(negatives="next", **kw).fit(images)
    rnd = GlobalSSLEncoder(negatives="random", **kw).fit(images)
    assert not np.array_equal(rnd.transform(images), nxt.transform(images))


# -- set_params after fit, without a refit ------------------------------------------------
@pytest.mark.parametrize("fitted, changed", [("clapp2021", "clapp++"), ("clapp++", "clapp2021")])
def test_transform_refuses_a_variant_changed_across_the_patch_boundary(images, fitted, changed):
    # clapp2021 -> clapp++ gave whole-image features from the patch network (same width,
    # silently other values); clapp++ -> clapp2021 a TypeError on patch_grid_ = None
    enc = CLAPPEncoder(variant=fitted, architecture="tiny", n_epochs=1, batch_size=4,
                       random_state=0).fit(images)
    want = enc.transform(images)
    enc.set_params(variant=changed)
    with pytest.raises(ValueError, match=re.escape(f"variant='{fitted}' -> '{changed}'")):
        enc.transform(images)
    enc.set_params(variant=fitted)              # set back: the fitted model again
    np.testing.assert_array_equal(enc.transform(images), want)
    enc.set_params(variant=changed).fit(images)  # refit: the new variant
    assert enc.transform(images).shape[0] == 8


@pytest.mark.parametrize("fitted, changed", [("clapp2021", "clapp++"), ("clapp++", "clapp2021")])
def test_transform_checks_the_patch_boundary_without_the_fit_record(images, fitted, changed):
    # an encoder pickled (or saved and loaded, then changed) by a version without the
    # record of the fitted parameters: the check reads the fitted patch_grid_ instead
    # (the old check gave a TypeError on patch_grid_ = None, or silently other features)
    enc = CLAPPEncoder(variant=fitted, architecture="tiny", n_epochs=1, batch_size=4,
                       random_state=0).fit(images)
    want = enc.transform(images)
    del enc._fitted_structure
    enc = pickle.loads(pickle.dumps(enc.set_params(variant=changed)))
    with pytest.raises(ValueError, match=re.escape(f"-> '{changed}', set after fit")):
        enc.transform(images)
    with pytest.raises(ValueError, match="set after fit"):
        enc.get_feature_names_out()
    np.testing.assert_array_equal(enc.set_params(variant=fitted).transform(images), want)


def test_transform_keeps_working_within_the_two_view_variants(images):
    # their transform is the same code: a changed variant still gives the fitted features
    enc = CLAPPEncoder(variant="clapp++dfb", architecture="tiny", n_epochs=1, batch_size=4,
                       random_state=0).fit(images)
    want = enc.transform(images)
    np.testing.assert_array_equal(enc.set_params(variant="clapp++").transform(images), want)
    np.testing.assert_array_equal(enc.set_params(spatial_pool=1).transform(images), want)


@pytest.mark.parametrize("cls, fitted, changed", [
    (CLAPPEncoder, {"variant": "clapp++dfb"}, {"variant": "clapp"}),
    (CLAPPEncoder, {"variant": "clapp"}, {"variant": "clapp++both"}),
    (GlobalSSLEncoder, {"loss": "clapp"}, {"loss": "infonce"}),
    (GlobalSSLEncoder, {"loss": "infonce", "projection_dim": 8}, {"projection_dim": 4}),
])
def test_head_dependent_tools_refuse_changed_heads(images, cls, fitted, changed):
    enc = cls(architecture="tiny", n_epochs=1, batch_size=4, random_state=0,
              **fitted).fit(images)
    enc.set_params(**changed)
    name = next(iter(changed))
    # the losses of the new value on the fitted heads raised shape / indexing errors
    with pytest.raises(ValueError, match=f"{name}=.*set after fit"):
        training_step_activation_bytes(enc, images)
    if cls is CLAPPEncoder:
        with pytest.raises(ValueError, match=f"{name}=.*set after fit"):
            update_similarity(enc, images, n_batches=1)


def test_head_dependent_tools_accept_a_variant_with_the_same_heads(images):
    # "clapp" and "clapp++" have the same heads and loss code (they differ by the default
    # grid only, and these tools use the fitted grids_): the same results, not a refusal
    enc = CLAPPEncoder(variant="clapp", architecture="tiny", n_epochs=1, batch_size=4,
                       random_state=0).fit(images)
    sim = update_similarity(enc, images, n_batches=2, random_state=0)
    nbytes = training_step_activation_bytes(enc, images)
    enc.set_params(variant="clapp++")
    assert update_similarity(enc, images, n_batches=2, random_state=0) == sim
    assert training_step_activation_bytes(enc, images) == nbytes


def test_activation_bytes_accept_the_other_infonce_loss(images):
    # both InfoNCE losses use the same projection head: the step of the loss now set,
    # measured as on an encoder built for it
    kw = dict(architecture="tiny", projection_dim=8, batch_size=4, random_state=0)
    enc = GlobalSSLEncoder(loss="infonce", n_epochs=1, **kw).fit(images)
    enc.set_params(loss="infonce-cross")
    fresh = GlobalSSLEncoder(loss="infonce-cross", n_epochs=0, **kw).fit(images)
    assert (training_step_activation_bytes(enc, images)
            == training_step_activation_bytes(fresh, images))


@pytest.mark.parametrize("cls, fitted, changed", [
    (CLAPPEncoder, {"variant": "clapp2021"}, {"patch_size": 8}),
    (CLAPPEncoder, {"variant": "clapp2021"}, {"patch_size": 100}),   # invalid for 16 px
    (CLAPPEncoder, {"variant": "clapp2021"}, {"variant": "clapp++"}),
    (CLAPPEncoder, {"variant": "clapp"}, {"variant": "clapp++"}),  # its default grid 2, not 1
    (CLAPPEncoder, {"variant": "clapp++"}, {"variant": "clapp++dfb"}),
    (GlobalSSLEncoder, {"loss": "infonce"}, {"projection_dim": 64}),
    (CLAPPEncoder, {"variant": "clapp++"}, {"architecture": [(4,), (6, "M")]}),
    (CLAPPEncoder, {"variant": "clapp2021"}, {"spatial_pool": 2}),
    (GlobalSSLEncoder, {"loss": "clapp"}, {"loss": "infonce"}),
])
def test_save_refuses_parameters_changed_after_fit(images, tmp_path, cls, fitted, changed):
    # load rebuilds the network from the saved parameters: the file loaded as another
    # network (a load_state_dict error, or for clapp2021 silently other features)
    enc = cls(architecture="tiny", n_epochs=1, batch_size=4, random_state=0,
              **fitted).fit(images)
    want = enc.transform(images)
    before = {k: enc.get_params()[k] for k in changed}
    enc.set_params(**changed)
    with pytest.raises(ValueError, match="set after fit.*rebuild another network"):
        enc.save(tmp_path / "m.pt")
    enc.set_params(**before)
    enc.save(tmp_path / "m.pt")                 # the fitted values back: saved and loaded
    np.testing.assert_array_equal(cls.load(tmp_path / "m.pt").transform(images), want)


def test_save_accepts_an_equivalent_spelling(images, tmp_path):
    enc = CLAPPEncoder(variant="clapp", architecture="tiny", n_epochs=1, batch_size=4,
                       random_state=0).fit(images)
    enc.set_params(spatial_pool=[1, 1, 1]).save(tmp_path / "m.pt")   # None means 1
    np.testing.assert_array_equal(CLAPPEncoder.load(tmp_path / "m.pt").transform(images),
                                  enc.transform(images))


_TINY_BLOCKS = [[16], [32, "M"], [64, "M"]]       # architecture="tiny" written out


@pytest.mark.parametrize("cls, fitted, changed", [
    # no projection under the hinge loss: projection_dim builds nothing
    (GlobalSSLEncoder, {"loss": "clapp"}, {"projection_dim": 64}),
    (GlobalSSLEncoder, {"loss": "clapp"}, {"loss": "bp-clapp", "projection_dim": 7}),
    # both InfoNCE losses train the same projection head
    (GlobalSSLEncoder, {"loss": "infonce"}, {"loss": "infonce-cross"}),
    (CLAPPEncoder, {"variant": "clapp++"}, {"architecture": _TINY_BLOCKS}),
    (GlobalSSLEncoder, {"loss": "infonce"}, {"architecture": _TINY_BLOCKS}),
    # the two-view variants ignore the patch options
    (CLAPPEncoder, {"variant": "clapp++"}, {"patch_size": 4, "prediction_steps": 3}),
    # the same heads and grids: a fitted "clapp" with an explicit grid is a "clapp++"
    (CLAPPEncoder, {"variant": "clapp", "spatial_pool": 1}, {"variant": "clapp++"}),
    # the resolved 2021 geometry (below) written out
    (CLAPPEncoder, {"variant": "clapp2021"}, "patch_grid_"),
])
def test_save_accepts_values_that_build_the_fitted_network(images, tmp_path, cls, fitted,
                                                           changed):
    # these were refused although the file loads as the same network
    enc = cls(architecture="tiny", n_epochs=1, batch_size=4, random_state=0,
              **fitted).fit(images)
    if changed == "patch_grid_":
        size, stride, _, _, steps = enc.patch_grid_
        changed = {"patch_size": size, "patch_stride": stride, "prediction_steps": steps}
    want = enc.transform(images)
    enc.set_params(**changed).save(tmp_path / "m.pt")
    loaded = cls.load(tmp_path / "m.pt")
    assert {k: loaded.get_params()[k] for k in changed} == changed
    np.testing.assert_array_equal(loaded.transform(images), want)
    for name in _FITTED:
        assert getattr(loaded, name, None) == getattr(enc, name, None), name


@pytest.mark.parametrize("cls, fitted, changed", [
    (CLAPPEncoder, {"variant": "clapp++"}, {"patch_size": "abc"}),
    (CLAPPEncoder, {"variant": "clapp++"}, {"patch_size": -3}),
    (CLAPPEncoder, {"variant": "clapp2021"}, {"patch_size": 4.0}),
    (CLAPPEncoder, {"variant": "clapp++"}, {"n_epochs": -1}),
    (CLAPPEncoder, {"variant": "clapp++"}, {"negatives": "bogus"}),
    (GlobalSSLEncoder, {"loss": "clapp"}, {"projection_dim": -5}),
])
def test_save_refuses_values_load_would_refuse(images, tmp_path, cls, fitted, changed):
    # values the fitted network ignores were written, and the file then failed to load
    enc = cls(architecture="tiny", n_epochs=1, batch_size=4, random_state=0,
              **fitted).fit(images)
    want = enc.transform(images)
    before = {k: enc.get_params()[k] for k in changed}
    enc.set_params(**changed)
    with pytest.raises((ValueError, TypeError), match=next(iter(changed))):
        enc.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
    np.testing.assert_array_equal(enc.transform(images), want)   # the encoder is intact
    enc.set_params(**before).save(tmp_path / "m.pt")
    np.testing.assert_array_equal(cls.load(tmp_path / "m.pt").transform(images), want)
