"""Issue #8 (ssl.clapp) read literally: names, defaults, the baselines' names, the theorem's
closed form and the torch-only augmentations.

The method's properties (linear-network equivalence, isolation, three-factor rule, shapes,
determinism, bad input, torchrun) are covered in test_clapp_kernels.py,
test_clapp_estimator.py and test_clapp_distributed.py; this file checks what only the issue
text promises.
"""

import inspect
import sys

import numpy as np
import pytest
import torch

import mlpapers.ssl as ssl
import mlpapers.ssl.clapp as clapp
from mlpapers.datasets import make_shifted_digits


@pytest.fixture(scope="module")
def digits():
    X, _ = make_shifted_digits(n_samples=48, random_state=5)
    return X


def test_public_names_and_defaults():
    """"Public API (`mlpapers.ssl.clapp`, re-exported from `mlpapers.ssl`)":
    `CLAPPEncoder(variant="clapp++dfb", ..., loss="hinge", ..., augment="default"|callable,
    n_epochs, batch_size, lr, weight_decay, device, random_state, verbose)`,
    `update_similarity(encoder, X, reference="bp", n_batches=...)`,
    `exact_linear_feedback(weights, B_top, mode="dfb"|"lateral")`."""
    for name in ("CLAPPEncoder", "GlobalSSLEncoder", "update_similarity",
                 "exact_linear_feedback"):
        assert getattr(ssl, name) is getattr(clapp, name)
    params = inspect.signature(ssl.CLAPPEncoder).parameters
    assert (params["variant"].default, params["loss"].default,
            params["augment"].default) == ("clapp++dfb", "hinge", "default")
    assert {"architecture", "spatial_pool", "n_epochs", "batch_size", "lr", "weight_decay",
            "device", "random_state", "verbose"} <= set(params)
    assert "loss" in inspect.signature(ssl.GlobalSSLEncoder).parameters
    params = inspect.signature(ssl.update_similarity).parameters
    assert list(params)[:2] == ["encoder", "X"]
    assert params["reference"].default == "bp" and "n_batches" in params
    params = inspect.signature(ssl.exact_linear_feedback).parameters
    assert list(params) == ["weights", "B_top", "mode"] and params["mode"].default == "dfb"


@pytest.mark.parametrize("alias, loss", [("bp-clapp", "clapp"), ("bp-infonce", "infonce")])
def test_baseline_names_of_the_issue_are_global_losses(digits, alias, loss):
    """"Global baselines: `"bp-clapp"` (same hinge at the top only, end-to-end) and
    `"bp-infonce"`": accepted by GlobalSSLEncoder as its `loss` (they raised a ValueError),
    the same estimator as `loss="clapp"` / `"infonce"`; the parameter is kept verbatim."""
    kw = dict(architecture="tiny", n_epochs=1, projection_dim=8, random_state=0)
    named = ssl.GlobalSSLEncoder(loss=alias, **kw).fit(digits)
    plain = ssl.GlobalSSLEncoder(loss=loss, **kw).fit(digits)
    assert named.get_params()["loss"] == alias
    np.testing.assert_array_equal(named.transform(digits), plain.transform(digits))
    assert named.history_ == plain.history_


def test_baseline_names_as_a_clapp_variant_point_to_the_global_encoder(digits):
    """CLAPPEncoder trains layer-local rules only: a baseline's name as its `variant` is a
    ValueError that says which estimator trains it (not only the list of variants)."""
    with pytest.raises(ValueError, match=r"GlobalSSLEncoder\(loss='bp-clapp'\)"):
        ssl.CLAPPEncoder(variant="bp-clapp", architecture="tiny", n_epochs=1).fit(digits)


@pytest.mark.parametrize("seed", [0, 4])
def test_exact_linear_feedback_closed_forms(seed):
    """"the B_l that make local updates equal BP in a deep linear network (B_l = M_lᵀ B_L, or
    M_lᵀ B_L M_l)", with M_l = W_L ... W_{l+1}, written out from the issue."""
    g = torch.Generator().manual_seed(seed)
    dims = (6, 5, 7, 4)
    Ws = [torch.randn(b, a, generator=g, dtype=torch.float64) for a, b in zip(dims, dims[1:])]
    B_top = torch.randn(dims[-1], dims[-1], generator=g, dtype=torch.float64)
    dfb = ssl.exact_linear_feedback(Ws, B_top, "dfb")
    lateral = ssl.exact_linear_feedback(Ws, B_top, "lateral")
    for layer in range(len(Ws)):
        M = torch.eye(dims[layer + 1], dtype=torch.float64)   # M_L = I
        for W in Ws[layer + 1:]:
            M = W @ M                                          # W_L ... W_{l+1}
        torch.testing.assert_close(dfb[layer], M.T @ B_top)
        torch.testing.assert_close(lateral[layer], M.T @ B_top @ M)


def test_augmentations_need_no_torchvision(digits, monkeypatch):
    """"Augmentations in torch alone (random resized crop, flip, intensity jitter, blur): no
    torchvision dependency": fitting with the default augmentation works when torchvision
    cannot be imported."""
    monkeypatch.setitem(sys.modules, "torchvision", None)     # import torchvision fails
    enc = ssl.CLAPPEncoder(architecture="tiny", augment="default", n_epochs=1,
                           random_state=0).fit(digits)
    views = ssl.DefaultAugment()(torch.from_numpy(digits[:4]), torch.Generator().manual_seed(0))
    assert views.shape == (4, 1, 16, 16) and bool(torch.isfinite(views).all())
    assert enc.transform(digits).shape == (len(digits), sum(enc.layer_dims_))


class _Jitter(torch.nn.Module):
    """A user's augmentation module with the usual ``forward(x)``."""

    def forward(self, x):
        return x + 0.05 * torch.randn_like(x)


@pytest.mark.parametrize("one_arg", [lambda x: x + 0.05 * torch.randn_like(x), _Jitter()],
                         ids=["function", "module"])
def test_a_one_argument_augment_callable_is_accepted(digits, one_arg):
    """"`augment="default"|callable`": a callable taking the batch alone (a function, an
    ``nn.Module``) raised "augment must be callable as augment(x, generator)". It draws from
    the global torch RNG, which fit seeds from random_state: the fit equals the one of the
    same augmentation written with the (ignored) generator argument, and leaves the caller's
    RNG as it was."""
    kw = dict(architecture="tiny", n_epochs=1, random_state=3)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    got = ssl.CLAPPEncoder(augment=one_arg, **kw).fit(digits)
    assert torch.equal(torch.get_rng_state(), state)
    two_args = ssl.CLAPPEncoder(augment=lambda x, g: x + 0.05 * torch.randn_like(x),
                                **kw).fit(digits)
    np.testing.assert_array_equal(got.transform(digits), two_args.transform(digits))
    assert got.history_ == two_args.history_
    with pytest.raises(TypeError, match=r"augment\(x, generator\) -> x \(or augment\(x\)"):
        ssl.CLAPPEncoder(augment=lambda: None, **kw).fit(digits)


def test_an_optional_second_parameter_is_not_given_the_generator(digits):
    """An augment ``(x, strength=0.1)`` keeps its own default (the generator was passed as
    ``strength`` and the fit failed); ``(x, generator=None)`` and ``(x, rng=None)`` get it."""
    kw = dict(architecture="tiny", n_epochs=1, random_state=3)

    def knob(x, strength=0.05):
        return x + strength * torch.randn_like(x)

    got = ssl.CLAPPEncoder(augment=knob, **kw).fit(digits)
    one = ssl.CLAPPEncoder(augment=lambda x: x + 0.05 * torch.randn_like(x), **kw).fit(digits)
    np.testing.assert_array_equal(got.transform(digits), one.transform(digits))
    seen = []

    def named(x, rng=None):
        seen.append(rng)
        return x

    ssl.CLAPPEncoder(augment=named, **kw).fit(digits)
    assert seen and all(isinstance(g, torch.Generator) for g in seen)
