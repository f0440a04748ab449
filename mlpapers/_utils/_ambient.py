"""The library's own autograd and dtype state, whatever the caller's ambient torch state.

A user may call ``fit`` inside ``torch.no_grad()`` or ``torch.inference_mode()`` (common
in evaluation code), or after ``torch.set_default_dtype(torch.float64)``. Training needs
autograd, and modules built under another default dtype would silently change precision
or fail on float32 inputs, so fits switch these on locally and leave the caller's state
as it was.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

# torch's default dtype is process-wide, not per thread: two fits in two threads would
# otherwise restore each other's value and leave the caller with the wrong default
_DEFAULT_DTYPE_LOCK = threading.RLock()


@contextlib.contextmanager
def autograd_enabled() -> Iterator[None]:
    """Enable autograd inside the caller's ``no_grad`` or ``inference_mode`` block, and
    switch off the caller's ``torch.autocast``: fits train in their stated precision."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for device_type in _autocast_devices():
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _autocast_devices() -> list[str]:
    # only devices whose autocast is on: naming an absent one (cuda here) warns
    return [d for d in ("cpu", "cuda", "mps") if _autocast_on(d)]


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type this build does not know
        return False


def with_autograd(method: F) -> F:
    """Run ``method`` under :func:`autograd_enabled` (for ``fit`` and ``partial_fit``)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with autograd_enabled():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Build modules and factory tensors in ``dtype``, whatever the caller's default.

    Hold it only around construction: the default dtype is global to the process.
    """
    with _DEFAULT_DTYPE_LOCK:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)


def usable_outside_inference(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a normal copy of it when it is an inference tensor used outside that mode.

    Tensors made under ``torch.inference_mode()`` cannot be saved for backward, so an
    input created there would make a later fit fail with a torch error.
    """
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return t.clone()
    return t


@contextlib.contextmanager
def cpu_default_device() -> Iterator[None]:
    """Run the library's code with torch's default device, the CPU, as it was written for.

    Under a caller's ``torch.set_default_device("cuda")`` (or a ``with torch.device(...)``
    block) tensors the library creates without an explicit device, and draws from its
    CPU generators, would land elsewhere and fail or mix devices. A no-op (no torch
    function mode, so no per-op cost) when the default device is already the CPU.
    """
    if torch.get_default_device().type == "cpu":
        yield
    else:
        with torch.device("cpu"):
            yield


def on_cpu_default_device(method: F) -> F:
    """Run ``method`` under :func:`cpu_default_device`."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with cpu_default_device():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def on_inputs_device(func: F) -> F:
    """Run ``func`` with the default device set to its first tensor argument's device.

    For the public functions and module methods: like torch's own functions they compute
    where their inputs are (the CPU for numpy inputs), whatever a caller's
    ``torch.set_default_device``. A no-op when the default device is the CPU.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.get_default_device().type == "cpu":
            return func(*args, **kwargs)
        device = next((a.device for a in (*args, *kwargs.values())
                       if isinstance(a, torch.Tensor)), torch.device("cpu"))
        with torch.device(device):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
