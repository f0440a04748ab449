"""Shared checks for the ambient-state tests (``tests/<domain>/test_<algo>_ambient.py``).

A library call must give the same result whatever the caller's ambient torch state (grad
mode, inference mode, default dtype, deterministic algorithms, anomaly detection), must
leave that state and the global random generators as it found them, and must give the
same result when several calls run at once in threads.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from mlpapers._utils import default_dtype


def _warm_up_torch() -> None:
    """Take one optimizer step before any snapshot: torch's first step in a process
    imports ``torch._dynamo`` (and sympy), which adds a warnings filter once; that is
    torch's lazy import, not a change made by the library call under test."""
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.Adam([weight])
    weight.sum().backward()
    optimizer.step()


_warm_up_torch()


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@contextlib.contextmanager
def _anomaly() -> Iterator[None]:
    with torch.autograd.set_detect_anomaly(True), warnings.catch_warnings():
        # anomaly mode warns once that it slows autograd down; that is the caller's choice
        warnings.filterwarnings("ignore", message=".*[Aa]nomaly.*")
        yield


@contextlib.contextmanager
def _default_device_meta() -> Iterator[None]:
    # stands for a caller's torch.set_default_device("cuda") on a machine without one:
    # a tensor the library made on the default device would have no data
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


#: The caller's contexts a library call must be indifferent to, by name.
AMBIENT: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "default_float64": lambda: default_dtype(torch.float64),
    "default_float16": lambda: default_dtype(torch.float16),
    "default_bfloat16": lambda: default_dtype(torch.bfloat16),
    "deterministic": _deterministic,
    "anomaly": _anomaly,
    "default_device_meta": _default_device_meta,
}


def global_state() -> dict[str, Any]:
    """A snapshot of the process state a library call must not change."""
    root = logging.getLogger()
    return {
        "torch_rng": torch.random.get_rng_state(),
        # the key array changes only every 624 draws: the position catches each draw
        "numpy_rng": np.random.get_state()[1].copy(),
        "numpy_rng_position": np.random.get_state()[2:],
        "python_rng": random.getstate(),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "num_threads": torch.get_num_threads(),
        "default_device": torch.get_default_device(),
        "warning_filters": list(warnings.filters),
        "root_logger": (root.level, list(root.handlers)),
    }


def assert_state_unchanged(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Fail naming every entry of :func:`global_state` that differs."""
    changed = []
    for key, old in before.items():
        new = after[key]
        same = torch.equal(old, new) if isinstance(old, torch.Tensor) else (
            np.array_equal(old, new) if isinstance(old, np.ndarray) else old == new)
        if not same:
            changed.append(key)
    assert not changed, f"the call changed the global state: {changed}"


def as_arrays(result: Any) -> list[np.ndarray]:
    """Flatten a result (arrays, tensors, numbers, tuples, lists, dicts) to numpy arrays."""
    if isinstance(result, torch.Tensor):
        result = result.detach().cpu()
        if result.dtype == torch.bfloat16:  # numpy has none: its bits, as int16
            result = result.view(torch.int16)
        return [result.numpy()]
    if isinstance(result, Mapping):
        return [a for key in sorted(result, key=str) for a in as_arrays(result[key])]
    if isinstance(result, (list, tuple)):
        return [a for item in result for a in as_arrays(item)]
    return [np.asarray(result)]


def assert_same_result(expected: Any, actual: Any) -> None:
    """Bitwise equality (NaN equal to NaN) of two results of the same call."""
    left, right = as_arrays(expected), as_arrays(actual)
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b)


_NOT_GIVEN = object()


def check_ambient(call: Callable[[], Any], context: str, expected: Any = _NOT_GIVEN) -> None:
    """``call()`` under the named ambient context equals ``call()`` outside it, bitwise,
    and leaves the global state as it was (checked inside the context too).

    ``expected``, when given, is the result of ``call()`` outside any context (computed
    once for all contexts by the caller, to keep the tests fast).
    """
    if expected is _NOT_GIVEN:
        expected = call()
    with AMBIENT[context]():
        before = global_state()
        actual = call()
        assert_state_unchanged(before, global_state())
    assert_same_result(expected, actual)


def check_state_untouched(call: Callable[[], Any]) -> Any:
    """Run ``call()`` and fail if it changed :func:`global_state`; returns the result."""
    before = global_state()
    result = call()
    assert_state_unchanged(before, global_state())
    return result


def check_one_numpy_seed(call: Callable[[], Any]) -> Any:
    """``call()`` (a fit with ``random_state=None``) draws exactly one seed from numpy's
    global RandomState (scikit-learn's convention), never reseeds it, and touches no
    other generator or state. Returns the result."""
    np.random.seed(123)
    expected = np.random.RandomState(123)
    expected.randint(0, 2**31 - 1)  # the one draw of make_generators(None)
    before = global_state()
    result = call()
    after = global_state()
    want = expected.get_state()
    np.testing.assert_array_equal(after["numpy_rng"], want[1])
    assert after["numpy_rng_position"] == want[2:]
    before.update(numpy_rng=after["numpy_rng"], numpy_rng_position=after["numpy_rng_position"])
    assert_state_unchanged(before, after)
    return result


def run_in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls at the same time, one thread each; re-raise the first error."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(calls))

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def check_thread_safe(call: Callable[[], Any], n_threads: int = 3) -> None:
    """``n_threads`` simultaneous ``call()`` equal one sequential ``call()``, bitwise."""
    expected = call()
    for actual in run_in_threads([call] * n_threads):
        assert_same_result(expected, actual)
