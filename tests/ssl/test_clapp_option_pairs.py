"""Option interactions of CLAPPEncoder / GlobalSSLEncoder: a pairwise covering array.

Every pair of values of the code-path options (variant, loss, augment, spatial_pool,
negatives, architecture, input kind, batch size) appears in at least one configuration;
each configuration must fit and keep the promises each option makes alone: numpy
float32 features of width ``sum(layer_dims_)``, ``layers=`` a slice of ``"all"``,
``spatial_pool=grids_`` the default, batch invariance, and the same features after a
clone + refit and a pickle round trip.
"""

from __future__ import annotations

import itertools
import pickle
import re

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl.clapp import VARIANTS, CLAPPEncoder, GlobalSSLEncoder


def covering_array(options: dict) -> list[dict]:
    """A deterministic greedy pairwise covering array of ``options`` (name -> values)."""
    names = list(options)
    sizes = [len(options[n]) for n in names]
    pairs = list(itertools.combinations(range(len(names)), 2))
    todo = {(a, i, b, j) for a, b in pairs for i in range(sizes[a]) for j in range(sizes[b])}
    rows = []
    while todo:
        a, i, b, j = min(todo)
        row = [0] * len(names)
        row[a], row[b] = i, j
        fixed = {a, b}
        for k in range(len(names)):
            if k in fixed:
                continue
            gains = []
            for v in range(sizes[k]):
                row[k] = v
                gains.append(sum((p, row[p], q, row[q]) in todo for p, q in pairs
                                 if k in (p, q) and (p in fixed or q in fixed)))
            row[k] = int(np.argmax(gains))
            fixed.add(k)
        todo -= {(p, row[p], q, row[q]) for p, q in pairs}
        rows.append({n: options[n][row[k]] for k, n in enumerate(names)})
    return rows


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


def _check_invariants(enc, X):
    F = enc.transform(X)
    assert isinstance(F, np.ndarray) and F.dtype == np.float32
    assert F.shape == (8, sum(enc.layer_dims_)) and np.isfinite(F).all()
    # clone + refit and pickle: the same features (same random_state)
    np.testing.assert_array_equal(clone(enc).fit(X).transform(X), F)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(enc)).transform(X), F)
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


def test_covering_array_covers_every_pair():
    for a, b in itertools.combinations(_CLAPP_OPTIONS, 2):
        seen = {(str(c[a]), str(c[b])) for c in _CLAPP_CONFIGS}
        assert len(seen) == len(_CLAPP_OPTIONS[a]) * len(_CLAPP_OPTIONS[b])


@pytest.mark.parametrize("cfg", _CLAPP_CONFIGS,
                         ids=["-".join(str(v) for v in c.values()) for c in _CLAPP_CONFIGS])
def test_clapp_option_pairs(images, cfg):
    enc = CLAPPEncoder(variant=cfg["variant"], loss=cfg["loss"], augment=_AUG[cfg["augment"]],
                       spatial_pool=_spatial_pool(cfg["spatial_pool"], cfg["architecture"]),
                       negatives=cfg["negatives"], architecture=_ARCH[cfg["architecture"]],
                       batch_size=cfg["batch_size"], n_epochs=1, random_state=0)
    X = _images(cfg["input"], images)
    _check_invariants(enc.fit(X), X)
    assert len(enc.history_) == 1 and np.isfinite(enc.history_[0]["loss"])


_GLOBAL_OPTIONS = {"loss": ["clapp", "infonce", "infonce-cross", "bp-infonce"],
                   "augment": ["default", "none", "noise"], "spatial_pool": [None, "list"],
                   "negatives": ["next", "random"], "architecture": list(_ARCH)}
_GLOBAL_CONFIGS = covering_array(_GLOBAL_OPTIONS)


@pytest.mark.parametrize("cfg", _GLOBAL_CONFIGS,
                         ids=["-".join(str(v) for v in c.values()) for c in _GLOBAL_CONFIGS])
def test_global_option_pairs(images, cfg):
    enc = GlobalSSLEncoder(loss=cfg["loss"], augment=_AUG[cfg["augment"]],
                           spatial_pool=_spatial_pool(cfg["spatial_pool"], cfg["architecture"]),
                           negatives=cfg["negatives"], architecture=_ARCH[cfg["architecture"]],
                           projection_dim=8, batch_size=4, n_epochs=1, random_state=0)
    _check_invariants(enc.fit(images), images)


# -- regressions ------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "clapp2021"])
@pytest.mark.parametrize("param", [{"patch_size": 4}, {"patch_stride": 1},
                                   {"prediction_steps": 2}])
def test_patch_options_are_refused_outside_clapp2021(images, variant, param):
    # they were silently ignored: the fit trained whole views, no patches
    name = next(iter(param))
    with pytest.raises(ValueError, match=f"{name}=.*variant='clapp2021' only"):
        CLAPPEncoder(variant=variant, architecture="tiny", n_epochs=1, **param).fit(images)
    CLAPPEncoder(variant="clapp2021", architecture="tiny", n_epochs=0, **param).fit(images)


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
    from mlpapers.ssl.clapp import training_step_activation_bytes, update_similarity

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


@pytest.mark.parametrize("cls, fitted, changed", [
    (CLAPPEncoder, {"variant": "clapp2021"}, {"patch_size": 8}),
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
