"""A model fitted on a GPU loads on a machine without one.

Found by the device-path review (session 26): ``load`` rebuilt the estimator with its
saved ``device`` (e.g. ``"cuda"``), and the estimators that move their models to
their device while loading (CLoVE/IFCA/FedAvg, the CLAPP encoders) then failed on a
CPU-only machine with "is not a valid mlpapers estimator file: device='cuda' was
requested but CUDA is not available", whatever ``map_location`` said; the others
loaded but failed at their first ``predict``. A file written with a device name this
machine lacks is made here by editing a CPU fit's file (no GPU is needed): ``cuda:63``
names a device no test machine has.
"""

import pickle
import warnings

import numpy as np
import pytest
import torch

from mlpapers._utils import resolve_device
from mlpapers.datasets import make_federated_linear, make_shifted_digits
from mlpapers.federated import CLoVE
from mlpapers.ssl import CLAPPEncoder
from tests._toy import ToyRidge

ABSENT = "cuda:63"


def _as_if_saved_on(path, device):
    payload = torch.load(path, weights_only=True)
    payload["params"]["device"] = device
    torch.save(payload, path)


def _toy():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    return ToyRidge().fit(X, X.sum(1)), (X,), "predict"


def _clove():
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=20,
                                          n_features=3, random_state=0)
    est = CLoVE(n_clusters=2, model="linear", n_rounds=2, random_state=0).fit(clients)
    return est, (clients[0][0],), "predict"


def _clapp():
    X, _ = make_shifted_digits(n_samples=24, random_state=0)
    est = CLAPPEncoder(architecture="tiny", augment="light", n_epochs=1, batch_size=8,
                       random_state=0).fit(X)
    return est, (X[:5],), "transform"


@pytest.mark.parametrize("make", [_toy, _clove, _clapp], ids=["toy", "clove", "clapp"])
def test_a_file_saved_with_an_absent_device_loads_on_the_cpu_with_a_warning(tmp_path, make):
    est, args, method = make()
    path = tmp_path / "m.pt"
    est.save(path)
    _as_if_saved_on(path, ABSENT)
    with pytest.warns(UserWarning, match=r"device='cuda:63'.*loaded with device='cpu'"):
        back = type(est).load(path)
    assert back.device == "cpu"
    kw = {"client": 0} if isinstance(est, CLoVE) else {}
    np.testing.assert_array_equal(getattr(back, method)(*args, **kw),
                                  getattr(est, method)(*args, **kw))


def test_map_location_names_the_device_used_instead(tmp_path):
    est, args, _ = _toy()
    path = tmp_path / "m.pt"
    est.save(path)
    _as_if_saved_on(path, ABSENT)
    with pytest.warns(UserWarning, match="loaded with device='cpu'"):
        back = ToyRidge.load(path, map_location=torch.device("cpu"))
    assert back.device == "cpu"
    # a map_location that is not a device (a torch.load mapping) falls back to the CPU
    with pytest.warns(UserWarning, match="loaded with device='cpu'"):
        assert ToyRidge.load(path, map_location=lambda storage, loc: storage).device == "cpu"


@pytest.mark.parametrize("saved", ["cpu", torch.device("cpu"), "auto"])
def test_an_available_device_is_kept_without_a_warning(tmp_path, saved):
    est, _, _ = _toy()
    path = tmp_path / "m.pt"
    est.save(path)
    _as_if_saved_on(path, saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = ToyRidge.load(path)
    assert back.device == saved or torch.device(back.device) == torch.device(saved)


def test_a_value_that_names_no_device_is_not_replaced(tmp_path):
    est, _, _ = _toy()
    path = tmp_path / "m.pt"
    est.save(path)
    _as_if_saved_on(path, "gpu please")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = ToyRidge.load(path)  # loads (the toy moves nothing while loading) ...
    assert back.device == "gpu please"
    with pytest.raises(ValueError, match="device must be"):  # ... and fit reports it
        back.fit(np.ones((4, 2)), np.arange(4.0))


@pytest.mark.parametrize("param", [ABSENT, "auto"])
def test_a_pickle_of_a_gpu_fit_unpickles_on_the_cpu_with_a_warning(param):
    """Estimators whose fitted state is numpy or CPU tensors unpickle anywhere; the
    device they were fitted on is pickled with them and was used by every later call
    (torch's "Found no NVIDIA driver" at the first predict, and set_params(device=)
    could not redirect it)."""
    est, (X,), _ = _toy()
    want = est.predict(X)
    est.device, est._device = param, torch.device(ABSENT)  # as a GPU fit leaves them
    here = "cpu" if param == ABSENT else str(resolve_device("auto"))  # (a GPU if one)
    with pytest.warns(UserWarning, match=rf"fitted on device='cuda:63'.*computes on '{here}'"):
        back = pickle.loads(pickle.dumps(est))
    assert back.device == ("cpu" if param == ABSENT else "auto")
    np.testing.assert_allclose(back.predict(X), want, rtol=1e-12)


def test_a_pickle_of_a_cpu_fit_unpickles_without_a_warning():
    est, (X,), _ = _toy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_a_container_pickles_without_its_tensor_copies():
    """A support caches tensor copies of its parameters per dtype and device; pickled,
    those of a GPU run made the pickle (of the support, or of a sampler holding it)
    unloadable without a GPU. They are rebuilt on first use."""
    from mlpapers.sampling import Box, Polytope

    x = torch.tensor([[0.5, -0.2, 0.1], [2.0, 0.0, 0.0]], dtype=torch.float64)
    for support in (Box(-np.ones(3), np.ones(3)), Polytope(np.eye(3), np.ones(3))):
        want = support.contains(x)
        assert "_tensor_cache" in vars(support)  # the copies exist after use ...
        back = pickle.loads(pickle.dumps(support))
        assert "_tensor_cache" not in vars(back)  # ... and are not pickled
        assert torch.equal(back.contains(x), want)
        assert "_tensor_cache" in vars(support)  # pickling left the original intact


def test_an_old_pickle_with_an_unindexed_cuda_device_is_pinned(monkeypatch):
    """Pickles made before devices were pinned hold ``torch.device("cuda")``, which no
    tensor's ``cuda:N`` equals (ExactMIPS's key cache missed on every call); unpickled,
    it is the current CUDA device. Simulated: no GPU is needed to build device objects
    and this estimator's state is numpy."""
    est, _, _ = _toy()
    est.device, est._device = "cuda", torch.device("cuda")
    data = pickle.dumps(est)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = pickle.loads(data)
    assert back._device == torch.device("cuda", 1) and back.device == "cuda"
