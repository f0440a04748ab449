"""The shared ambient-state helpers, the shared base and the dataset generators are
indifferent to the caller's torch state and leave it untouched."""

import threading
import warnings

import numpy as np
import pytest
import torch

from mlpapers._utils import (
    autograd_enabled,
    check_tensor,
    default_dtype,
    usable_outside_inference,
    with_autograd,
)
from mlpapers.datasets import (
    make_extreme_classification,
    make_federated_digits,
    make_federated_linear,
    make_mips_problem,
    make_relevance_problem,
    make_shifted_digits,
    make_texture_anomalies,
)
from tests._ambient import (
    AMBIENT,
    assert_state_unchanged,
    check_ambient,
    check_state_untouched,
    check_thread_safe,
    global_state,
)
from tests._toy import ToyRidge


def _grad_of_square(x):
    w = torch.tensor(3.0, requires_grad=True)
    (w * w * x).backward()
    return w.grad


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_autograd_enabled_trains_inside_the_callers_no_grad_and_inference_mode(mode):
    with mode():
        with autograd_enabled():
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            grad = _grad_of_square(torch.tensor(2.0))
        assert not torch.is_grad_enabled()  # the caller's mode is back
    assert float(grad) == 12.0  # d(2 w^2)/dw at w = 3


def test_with_autograd_keeps_the_method_and_restores_the_mode_on_error():
    class Fitter:
        @with_autograd
        def fit(self, fail=False):
            """Docstring kept."""
            if fail:
                raise RuntimeError("boom")
            return torch.is_grad_enabled()

    assert Fitter.fit.__doc__ == "Docstring kept."
    with torch.no_grad():
        assert Fitter().fit() is True
        with pytest.raises(RuntimeError, match="boom"):
            Fitter().fit(fail=True)
        assert not torch.is_grad_enabled()


def test_default_dtype_builds_float32_modules_and_restores_on_error():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with default_dtype(torch.float32):
            layer = torch.nn.Linear(2, 3)
        assert layer.weight.dtype == torch.float32
        with pytest.raises(RuntimeError, match="boom"), default_dtype(torch.float32):
            raise RuntimeError("boom")
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_default_dtype_is_safe_when_two_threads_enter_it_at_once():
    """Without the lock, the second thread saves the first one's float32 and restores
    it last, leaving the caller with float32 instead of its float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    inside = threading.Barrier(2, timeout=5)
    seen = []

    def work():
        try:
            inside.wait()
        except threading.BrokenBarrierError:
            pass
        with default_dtype(torch.float32):
            seen.append(torch.get_default_dtype())

    try:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [torch.float32, torch.float32]
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_inference_tensors_become_trainable_inputs():
    with torch.inference_mode():
        x = torch.ones(4, 2)
    assert x.is_inference()
    y = check_tensor(x, dtype=None)  # same dtype: no cast would copy it
    assert not y.is_inference() and torch.equal(y, x)
    w = torch.ones(2, requires_grad=True)
    (y @ w).sum().backward()  # an inference tensor here raises "cannot be saved for backward"
    assert torch.equal(w.grad, x.sum(0))
    with torch.inference_mode():  # inside the mode the tensor is kept as it is
        assert usable_outside_inference(x) is x
    plain = torch.ones(2)
    assert usable_outside_inference(plain) is plain


def test_read_only_numpy_input_is_accepted_without_a_warning():
    a = np.arange(6.0).reshape(3, 2)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns on non-writable arrays
        t = check_tensor(a)
    assert torch.equal(t, torch.arange(6.0).reshape(3, 2))


def _toy_fit_predict():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    est = ToyRidge(jitter=0.5, random_state=1).fit(X, y)
    return est.coef_, est.predict(X)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_shared_base_fit_predict_is_indifferent_to_the_ambient_state(context):
    check_ambient(_toy_fit_predict, context)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_save_load_round_trip_under_the_ambient_state(context, tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    est = ToyRidge(jitter=0.5, random_state=1).fit(X, y)
    est.save(tmp_path / "toy.pt")
    with AMBIENT[context]():
        before = global_state()
        back = ToyRidge.load(tmp_path / "toy.pt")
        assert_state_unchanged(before, global_state())
    np.testing.assert_array_equal(back.coef_, est.coef_)
    assert back.coef_.dtype == est.coef_.dtype
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


SMALL = [
    (make_shifted_digits, dict(n_samples=6)),
    (make_extreme_classification, dict(n_samples=60, n_classes=5, n_features=4)),
    (make_mips_problem, dict(n_keys=20, n_features=4, n_queries=3)),
    (make_federated_linear, dict(n_clusters=2, n_clients_per_cluster=2, n_samples=5,
                                 n_features=4)),
    (make_federated_digits, dict(n_clusters=2, n_clients_per_cluster=1, n_samples=5)),
    (make_texture_anomalies, dict(n_train=2, n_test=2, image_size=16)),
    (make_relevance_problem, dict(n_queries=3, n_items=4)),
]


def _generated(make, kw):
    out = make(**kw, random_state=0)
    if make is make_relevance_problem:  # also score with the returned relevance function
        queries, items, relevance = out
        return queries, items, relevance(queries, torch.as_tensor(items))
    if make is make_mips_problem:
        keys, queries, sampler = out
        return keys, queries, sampler(5, np.random.default_rng(1))
    return out


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("make, kw", SMALL, ids=[f.__name__ for f, _ in SMALL])
def test_dataset_generators_are_indifferent_to_the_ambient_state(make, kw, context):
    check_ambient(lambda: _generated(make, kw), context)


@pytest.mark.parametrize("make, kw", SMALL, ids=[f.__name__ for f, _ in SMALL])
def test_dataset_generators_are_thread_safe_and_leave_global_state_alone(make, kw):
    check_state_untouched(lambda: _generated(make, kw))
    check_thread_safe(lambda: _generated(make, kw))
