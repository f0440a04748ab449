"""Device names and dtypes at the edges of the shared validation.

Found by the device/dtype review: device types torch parses but this machine cannot use
passed ``resolve_device`` and failed later with torch's own errors (``load`` then called a
valid file damaged); a complex ``x0`` lost its imaginary part; ``polar_factor`` left
tensors unchecked; meta tensors passed as ``y``, ``x0`` or a ``relevance_fn``'s output
failed deep inside a conversion; bool scores reached the SCENT kernels unchecked.
"""

import warnings

import numpy as np
import pytest
import torch

from mlpapers._utils import resolve_device, to_numpy
from mlpapers.optim.scent import log_mean_exp, softplus_dual_ratio
from mlpapers.retrieval.rbe import RelevanceBasedRetriever
from mlpapers.sampling.rehmc import Box, ReflectiveHMC, polar_factor
from tests._toy import ToyRidge

# parsed by torch.device, unusable on a CPU-only build (skipped where one is usable)
_BACKENDS = ["xla", "hpu", "xpu", "ipu", "vulkan", "lazy", "privateuseone", "mtia", "hip",
             "maia"]


def _usable(name):
    try:
        torch.empty(0, device=name)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name", _BACKENDS)
def test_resolve_device_refuses_a_backend_this_machine_lacks(name):
    if _usable(name):
        pytest.skip(f"{name} is usable here")
    with pytest.raises(ValueError, match=f"device='{name}' was requested but the '{name}' "
                                         "device is not available"):
        resolve_device(name)
    with pytest.raises(ValueError, match="not available"):
        resolve_device(torch.device(name))


def test_resolve_device_still_accepts_the_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")


def test_an_estimator_on_an_unusable_device_fails_with_the_device_error():
    if _usable("xla"):
        pytest.skip("xla is usable here")
    X = np.random.default_rng(0).standard_normal((10, 2))
    with pytest.raises(ValueError, match="'xla' device is not available"):
        ToyRidge(device="xla").fit(X, X.sum(1))


@pytest.mark.parametrize("name", ["xla", "xpu", "privateuseone"])
def test_load_names_the_unusable_map_location_not_a_damaged_file(tmp_path, name):
    if _usable(name):
        pytest.skip(f"{name} is usable here")
    X = np.random.default_rng(0).standard_normal((10, 2))
    path = tmp_path / "toy.pt"
    ToyRidge().fit(X, X.sum(1)).save(path)
    with pytest.raises(ValueError, match=f"map_location='{name}' cannot be used") as info:
        ToyRidge.load(path, map_location=name)
    assert "not a valid" not in str(info.value)
    # the file itself is fine
    np.testing.assert_allclose(ToyRidge.load(path).predict(X[:3]),
                               ToyRidge().fit(X, X.sum(1)).predict(X[:3]))


def _hmc():
    return ReflectiveHMC(lambda x: -0.5 * (x * x).sum(-1), Box([-1.0, -1.0], [1.0, 1.0]),
                         n_leapfrog=2, step_size=0.1, random_state=0)


@pytest.mark.parametrize("x0", [np.array([0.1 + 0.5j, 0.2]), torch.tensor([0.1 + 0.5j, 0.2]),
                                [0.1 + 0.5j, 0.2], np.array([0.1 + 0j, 0.2])],
                         ids=["numpy", "tensor", "list", "numpy-zero-imaginary"])
def test_a_complex_x0_is_refused(x0):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no ComplexWarning or torch cast warning)
        with pytest.raises(TypeError, match="x0 must hold real numbers"):
            _hmc().sample(3, x0=x0, n_chains=1, warmup=0)


def test_a_real_x0_of_any_numeric_kind_still_starts_the_chains():
    for x0 in ([0.1, 0.2], np.array([0, 0]), torch.tensor([0.1, 0.2], dtype=torch.float32),
               np.array(["0.1", "0.2"])):
        res = _hmc().sample(2, x0=x0, n_chains=1, warmup=0)
        assert np.isfinite(res.samples).all()
    with pytest.raises(TypeError, match="x0 must be a numeric array-like"):
        _hmc().sample(2, x0=["a", "b"], n_chains=1, warmup=0)


_X = [[2.0, 1.0], [0.0, 3.0], [1.0, 1.0]]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -float("inf")])
def test_polar_factor_refuses_a_non_finite_tensor(bad):
    X = torch.tensor(_X)
    X[0, 0] = bad
    with pytest.raises(ValueError, match="X must be finite"):
        polar_factor(X)
    with pytest.raises(ValueError, match="X must be finite"):  # (as for arrays)
        polar_factor(X.numpy())


def test_polar_factor_refuses_a_complex_tensor():
    with pytest.raises(TypeError, match="X must be numeric, got dtype torch.complex"):
        polar_factor(torch.tensor(_X, dtype=torch.complex128))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_polar_factor_casts_integer_and_boolean_tensors_to_float64_as_arrays(dtype):
    X = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=dtype)
    Q = polar_factor(X)
    assert Q.dtype == torch.float64
    np.testing.assert_allclose(Q.numpy(), polar_factor(X.numpy()), atol=1e-12)
    np.testing.assert_allclose(Q.T @ Q, np.eye(2), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polar_factor_keeps_a_floating_tensors_dtype(dtype):
    X = torch.tensor(_X, dtype=dtype, requires_grad=True)
    Q = polar_factor(X)
    assert Q.dtype == dtype and Q.requires_grad
    Q.sum().backward()
    assert torch.isfinite(X.grad).all()


def _meta(*shape):
    return torch.empty(*shape, device="meta")


def test_to_numpy_names_the_meta_tensor():
    with pytest.raises(ValueError, match="y is a torch tensor on the meta device"):
        to_numpy(_meta(3), "y")
    with pytest.raises(ValueError, match="on the meta device, which holds no values"):
        to_numpy(_meta(3))


def test_a_meta_y_is_refused_clearly():
    X = torch.randn(6, 2, dtype=torch.float64)
    message = "^y is a torch tensor on the meta device, which holds no values"
    with pytest.raises(ValueError, match=message):
        ToyRidge().fit(X, _meta(6))
    with pytest.raises(ValueError, match=message):
        ToyRidge().fit(X.numpy(), _meta(6))


def test_a_meta_x0_is_refused_naming_x0():
    with pytest.raises(ValueError, match="x0 is a torch tensor on the meta device"):
        _hmc().sample(3, x0=_meta(2), n_chains=1, warmup=0)


def test_a_meta_relevance_fn_output_is_refused_naming_relevance_fn():
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((30, 3)), rng.standard_normal((12, 3))

    def meta_scores(q, i):
        return torch.empty(len(q), len(i), device="meta")

    est = RelevanceBasedRetriever(meta_scores, n_support=3, max_iter=2, random_state=0)
    with pytest.raises(ValueError, match="relevance_fn's output is a torch tensor on the "
                                         "meta device"):
        est.fit(Q, items)


def test_scent_kernels_refuse_boolean_scores():
    b = torch.tensor([[True, False], [False, True]])
    with pytest.raises(TypeError, match="scores must hold real numbers, got dtype torch.bool"):
        softplus_dual_ratio(b, torch.zeros(2), rho=1.0)
    with pytest.raises(TypeError, match="nu must hold real numbers, got dtype torch.bool"):
        softplus_dual_ratio(b.float(), torch.zeros(2, dtype=torch.bool), rho=1.0)
    with pytest.raises(TypeError, match="log_mean_exp: scores must hold real numbers, got "
                                        "dtype torch.bool"):
        log_mean_exp(b)


def test_scent_kernels_still_take_integer_scores():
    s = torch.tensor([[1, 0], [0, 1]])
    torch.testing.assert_close(log_mean_exp(s), log_mean_exp(s.float()))
    torch.testing.assert_close(softplus_dual_ratio(s, torch.zeros(2), rho=1.0),
                               softplus_dual_ratio(s.float(), torch.zeros(2), rho=1.0))
