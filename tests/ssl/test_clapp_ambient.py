"""CLAPP under the caller's ambient torch state: grad/inference mode, default dtype,
deterministic algorithms, anomaly detection; global state, user objects and threads.

Every public entry point (CLAPPEncoder over its variants, GlobalSSLEncoder over its
losses, transform, save/load, update_similarity, training_step_activation_bytes,
DefaultAugment and the public kernels) must give the bitwise same result inside each
context of ``AMBIENT`` as outside it, and leave the process state as it found it.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings

import numpy as np
import pytest
import torch

from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    DefaultAugment,
    GlobalSSLEncoder,
    PatchPredictor,
    clapp_layer_loss,
    contrastive_loss,
    exact_linear_feedback,
    extract_patches,
    infonce_loss,
    patch_prediction_loss,
    three_factor_grad,
    training_step_activation_bytes,
    update_similarity,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    check_ambient,
    check_one_numpy_seed,
    check_state_untouched,
    check_thread_safe,
)

IMAGES = np.random.default_rng(0).random((6, 1, 8, 8)).astype(np.float32)
ARCH = [(3,), (4, "M")]
SMALL = dict(architecture=ARCH, n_epochs=1, batch_size=3, random_state=0)
VARIANTS = {
    "clapp": {}, "clapp++": {}, "clapp++dfb": {"negatives": "random"}, "clapp++both": {},
    "clapp2021": {"patch_size": 2, "patch_stride": 1, "augment": "light"},
}


def _encoder_outputs(enc) -> list:
    return [enc.transform(IMAGES), enc.transform(IMAGES, layers=0, spatial_pool=1),
            [h["loss"] for h in enc.history_], enc.encoder_.state_dict(),
            enc.heads_.state_dict()]


def _fit_clapp(variant: str):
    return lambda: _encoder_outputs(CLAPPEncoder(variant=variant, **VARIANTS[variant],
                                                 **SMALL).fit(IMAGES))


def _fit_global(loss: str):
    return lambda: _encoder_outputs(GlobalSSLEncoder(loss=loss, projection_dim=4,
                                                     **SMALL).fit(IMAGES))


def _fitted() -> CLAPPEncoder:
    return CLAPPEncoder(**SMALL).fit(IMAGES)


def _save_load():
    fitted = _fitted()

    def call() -> list:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "clapp.pt")
            fitted.save(path)
            loaded = CLAPPEncoder.load(path)
        # the loaded modules must still be differentiable (update_similarity)
        return [*_encoder_outputs(loaded),
                update_similarity(loaded, IMAGES, n_batches=1, random_state=0)]

    return call


def _similarity():
    fitted = _fitted()
    return lambda: [update_similarity(fitted, IMAGES, n_batches=2, random_state=0),
                    training_step_activation_bytes(fitted, IMAGES, batch_size=3)]


def _augment() -> list:
    with torch.device("cpu"):  # CPU inputs, whatever the context's default device
        gen = torch.Generator().manual_seed(0)
        gray = torch.as_tensor(IMAGES)
        rgb = torch.rand(3, 3, 10, 10, generator=gen, dtype=torch.float32)
    return [DefaultAugment()(gray, torch.Generator().manual_seed(1)),
            DefaultAugment.light()(gray, torch.Generator().manual_seed(2)),
            DefaultAugment(flip=1.0, gray_p=0.5)(rgb, torch.Generator().manual_seed(3)),
            DefaultAugment()(rgb.double(), torch.Generator().manual_seed(4))]


def _kernels() -> list:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32, device="cpu")

    # CPU inputs (and module), whatever the context's default device
    with torch.device("cpu"):
        x, W, c, B = randn(6, 5), randn(4, 5), randn(6, 3), randn(4, 3)
        neg = torch.tensor([1, 2, 3, 4, 5, 0])
        Ws = [randn(3, 4), randn(2, 3)]
        images, idx = torch.as_tensor(IMAGES), torch.tensor([1, 2, 3, 0])
        pred = [randn(4, 3, 6, 2), randn(4, 3, 6, 2), randn(2, 3, 3)]
        B_top = randn(2, 2)
        predictor = PatchPredictor(3, 2, torch.Generator().manual_seed(0), dtype=torch.float32)
    return [three_factor_grad(x, W, c, B, neg, "softhinge"),
            clapp_layer_loss(torch.relu(x @ W.T), c, B, neg),
            infonce_loss(x), infonce_loss(x.double(), pairs="cross"),
            contrastive_loss(x[:, 0], x[:, 1], "softhinge"),
            extract_patches(images, 4, 2)[0],
            patch_prediction_loss(*pred, idx),
            exact_linear_feedback(Ws, B_top),
            exact_linear_feedback([w.double() for w in Ws], B_top.double(), "lateral"),
            predictor.state_dict()]


#: name -> factory of the call (fitted objects the call needs are made by the factory)
CALLS = {
    **{f"CLAPPEncoder[{v}]": (lambda v=v: _fit_clapp(v)) for v in VARIANTS},
    **{f"GlobalSSLEncoder[{loss}]": (lambda loss=loss: _fit_global(loss))
       for loss in ("clapp", "infonce", "infonce-cross")},
    "save/load": _save_load,
    "update_similarity+activation_bytes": _similarity,
    "DefaultAugment": lambda: _augment,
    "kernels": lambda: _kernels,
}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(CALLS))
def test_entry_points_do_not_depend_on_ambient_state(name, context):
    # fit failed inside no_grad / inference_mode ("element 0 of tensors does not require
    # grad"), crashed under a float64/float16/bfloat16 default ("Input type (float) and
    # bias type (double)"), and its augmentations drew other crops under a float64
    # default; fit and load advanced the global torch RNG
    check_ambient(CALLS[name](), context)


@pytest.mark.parametrize("context", ["inference_mode", "default_float64"])
def test_torchrun_path_does_not_depend_on_ambient_state(context, tmp_path):
    """The data-parallel branch of fit (a one-rank gloo group in this process) runs
    inside the same autograd and dtype guards."""
    import torch.distributed as dist

    from mlpapers.ssl.clapp._distributed import dist_world

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        assert dist_world() == (0, 1)
        check_ambient(_fit_clapp("clapp++dfb"), context)
    finally:
        dist.destroy_process_group()


def test_fit_and_load_leave_the_global_rngs_alone():
    # nn.Conv2d / nn.Linear drew a throwaway initialisation from the global torch RNG
    # before the seeded one, and load re-initialised from it before load_state_dict
    _fitted()   # torch's first optimizer step in a process imports torch._dynamo, whose
    #             sympy import adds a warnings filter once: torch's doing, not the fit's
    fitted = check_state_untouched(_fitted)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clapp.pt")
        fitted.save(path)
        check_state_untouched(lambda: CLAPPEncoder.load(path))
    check_state_untouched(lambda: GlobalSSLEncoder(loss="infonce", **SMALL).fit(IMAGES))


def test_fit_with_random_state_none_does_not_reseed():
    """``None`` draws one seed from numpy's global RandomState (scikit-learn's rule)
    and touches no other generator."""
    check_one_numpy_seed(lambda: CLAPPEncoder(**{**SMALL, "random_state": None}).fit(IMAGES))


@pytest.mark.parametrize("name", ["CLAPPEncoder[clapp++dfb]", "CLAPPEncoder[clapp2021]",
                                  "GlobalSSLEncoder[infonce]",
                                  "update_similarity+activation_bytes"])
def test_thread_safe(name):
    check_thread_safe(CALLS[name]())


def test_tensor_inputs_that_require_grad_or_are_inference_tensors():
    expected = _fitted().transform(IMAGES)
    Xg = torch.tensor(IMAGES, requires_grad=True)
    enc = CLAPPEncoder(**SMALL).fit(Xg)
    np.testing.assert_array_equal(enc.transform(Xg), expected)
    assert Xg.grad is None
    for p in [*enc.encoder_.parameters(), *enc.heads_.parameters()]:
        assert p.grad is None and p.grad_fn is None and not p.is_inference()
    with torch.inference_mode():               # made there, used by a normal fit
        Xi = torch.tensor(IMAGES)
    enc = CLAPPEncoder(**SMALL).fit(Xi)
    np.testing.assert_array_equal(enc.transform(Xi), expected)
    update_similarity(enc, Xi, n_batches=1, random_state=0)


@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
def test_an_encoder_unpickled_in_inference_mode_can_still_be_differentiated(cls):
    """Regression: unpickling inside torch.inference_mode() (a model server) rebuilt the
    parameters as inference tensors, so update_similarity and
    training_step_activation_bytes failed with "Inference tensors cannot be saved for
    backward", as a refit from the same state would."""
    enc = cls(**SMALL).fit(IMAGES)
    blob = pickle.dumps(enc)
    with torch.inference_mode():
        again = pickle.loads(blob)
    for p in [*again.encoder_.parameters(), *again.heads_.parameters()]:
        assert not p.is_inference()
    np.testing.assert_array_equal(again.transform(IMAGES), enc.transform(IMAGES))
    if cls is CLAPPEncoder:  # (a local-learning measure)
        assert (update_similarity(again, IMAGES, n_batches=1, random_state=0)
                == update_similarity(enc, IMAGES, n_batches=1, random_state=0))
    assert (training_step_activation_bytes(again, IMAGES)
            == training_step_activation_bytes(enc, IMAGES))


def test_read_only_inputs_are_accepted_silently_and_not_mutated():
    Xr = IMAGES.copy()
    Xr.flags.writeable = False
    Xt = torch.tensor(IMAGES)                  # float32 CPU: validated without a copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = CLAPPEncoder(**SMALL).fit(Xr)
        enc.transform(Xr)
        update_similarity(enc, Xr, n_batches=1, random_state=0)
        CLAPPEncoder(**SMALL).fit(Xt).transform(Xt)
        DefaultAugment()(Xt, torch.Generator().manual_seed(0))
    assert np.array_equal(Xr, IMAGES) and np.array_equal(Xt.numpy(), IMAGES)


def test_user_objects_are_left_as_they_were():
    """A user augment module keeps its mode, flags and weights; a fitted encoder given
    to the analysis functions keeps its weights, mode and (absent) gradients."""
    class Noise(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Linear(1, 1)

        def forward(self, x, generator=None):
            return x + 0.01 * torch.rand(x.shape, generator=generator, dtype=x.dtype)

    aug = Noise().train()
    aug.scale.weight.requires_grad_(False)
    weights = aug.state_dict()
    enc = CLAPPEncoder(**{**SMALL, "augment": aug}).fit(IMAGES)
    assert aug.training and not aug.scale.weight.requires_grad and aug.scale.bias.requires_grad
    assert_same_result(weights, aug.state_dict())
    assert not (aug._forward_hooks or aug._forward_pre_hooks or aug._backward_hooks)
    state = {k: v.clone() for k, v in [*enc.encoder_.state_dict().items(),
                                       *enc.heads_.state_dict().items()]}
    update_similarity(enc, IMAGES, n_batches=1, random_state=0)
    training_step_activation_bytes(enc, IMAGES)
    assert not enc.encoder_.training
    assert_same_result(state, {**enc.encoder_.state_dict(), **enc.heads_.state_dict()})
    assert all(p.grad is None for p in [*enc.encoder_.parameters(),
                                        *enc.heads_.parameters()])


def test_public_modules_and_kernels_follow_torch_dtype_conventions():
    """Documented limit: like ``nn.Linear``, ``PatchPredictor()`` without ``dtype`` is
    made in the default dtype, and integer inputs of ``exact_linear_feedback`` become
    floating in it; floating tensors keep their dtype whatever the default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert PatchPredictor(3, 2).weight.dtype == torch.float64
        assert PatchPredictor(3, 2, dtype=torch.float32).weight.dtype == torch.float32
        assert exact_linear_feedback([[[1, 2], [3, 4]]], [[1, 0], [0, 1]])[0].dtype == \
            torch.float64
        ws = [torch.eye(2, dtype=torch.float32)]
        assert exact_linear_feedback(ws, ws[0])[0].dtype == torch.float32
    finally:
        torch.set_default_dtype(previous)
