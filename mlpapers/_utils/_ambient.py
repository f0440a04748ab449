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
