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
import hashlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from mlpapers._utils._typing import F

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

    return cast(F, wrapper)


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


@contextlib.contextmanager
def seeded_global_rng(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run a block with torch's global generators (the CPU's and ``device``'s) seeded
    with ``seed``, in a fork that restores them afterwards, one fork at a time.

    For the user's own code that draws from the global generator (dropout in a user
    module, a user augmentation): its draws become reproducible under the estimator's
    ``random_state`` and the caller's global RNG is left as it was. The lock is the
    library's one lock on process-wide torch state (also held by :func:`default_dtype`),
    so forks in several threads do not interleave.
    """
    device = torch.device(device)
    index: int | None = None
    module: Any = getattr(torch, device.type, None) if device.type != "cpu" else None
    if hasattr(module, "manual_seed"):  # an accelerator with its own generator
        # (torch.mps has one device and no current_device)
        index = device.index if device.index is not None else (
            module.current_device() if hasattr(module, "current_device") else 0)
    with _DEFAULT_DTYPE_LOCK, torch.random.fork_rng(
            devices=[] if index is None else [index],
            device_type="cuda" if index is None else device.type):
        torch.default_generator.manual_seed(seed)
        if index is not None and device.type == "cuda":
            # this device's generator only (fork_rng restores it)
            torch.cuda.default_generators[index].manual_seed(seed)
        elif index is not None:  # (mps and other devices with one generator)
            module.manual_seed(seed)
        yield


def seed_from_generator(generator: torch.Generator) -> int:
    """A 63-bit seed determined by ``generator``'s state, without drawing from it: the
    user's random layers get their own reproducible stream while the draws the library
    makes from ``generator`` stay as they were."""
    state = generator.get_state().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(state, digest_size=8).digest(), "little") >> 1


def usable_outside_inference(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a normal copy of it when it is an inference tensor used outside that mode.

    Tensors made under ``torch.inference_mode()`` cannot be saved for backward, so an
    input created there would make a later fit fail with a torch error.
    """
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return t.clone()
    return t


def without_inference_tensors(value: Any) -> Any:
    """``value`` with the inference tensors it holds replaced by normal copies.

    Unpickling inside ``torch.inference_mode()`` rebuilds every tensor as an inference
    tensor, which autograd can never save: an estimator unpickled there could predict
    but never be trained or differentiated again. Tensors directly in dicts, lists and
    tuples and the parameters and buffers of modules (changed in place) are copied;
    a tensor met twice is copied once (two views of one storage become two copies).
    Tensors inside other objects (and plain tensor attributes of modules) are left.
    """
    copies: dict[int, torch.Tensor] = {}

    def normal(t: torch.Tensor) -> torch.Tensor:
        if torch.nn.parameter.is_lazy(t) or not t.is_inference():  # (lazy: no data yet)
            return t
        if id(t) not in copies:
            copy = t.detach().clone()
            if isinstance(t, torch.nn.Parameter):
                copy = torch.nn.Parameter(copy, requires_grad=t.requires_grad)
            copies[id(t)] = copy
        return copies[id(t)]

    def walk(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return normal(obj)
        if isinstance(obj, torch.nn.Module):
            for module in obj.modules():
                for slots in cast(list[dict[str, Any]], [module._parameters,
                                                         module._buffers]):
                    for key, t in slots.items():
                        if t is not None:
                            slots[key] = normal(t)
            return obj
        if isinstance(obj, dict):
            for key, item in obj.items():
                obj[key] = walk(item)
            return obj
        if isinstance(obj, list):
            obj[:] = [walk(item) for item in obj]
            return obj
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(walk(item) for item in obj)
        return obj

    with torch.inference_mode(False):
        return walk(value)


# torch.get_default_device() misses ``with torch.device(...)`` blocks before torch 2.8 and
# costs microseconds; a default device (either way) is a torch function mode, and without
# any mode the default device is the CPU
_mode_stack_depth = getattr(torch._C, "_len_torch_function_stack",
                            lambda: len(torch.overrides._get_current_function_mode_stack()))


def _default_device_may_differ() -> bool:
    # (under torch.compile the wrappers step aside: the context would break the graph)
    return _mode_stack_depth() > 0 and not torch.compiler.is_compiling()


def _on_default_device(func: F, device_for: Callable[..., torch.device]) -> F:
    # runs ``func`` with the default device ``device_for(*args, **kwargs)`` when the caller
    # may have set another one; otherwise a plain call
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _default_device_may_differ():
            return func(*args, **kwargs)
        with torch.device(device_for(*args, **kwargs)):
            return func(*args, **kwargs)

    return cast(F, wrapper)


_CPU = torch.device("cpu")


def on_cpu_default_device(method: F) -> F:
    """Run ``method`` with torch's default device, the CPU, as the library was written for.

    Under a caller's ``torch.set_default_device("cuda")`` (or a ``with torch.device(...)``
    block) tensors the library creates without an explicit device, and draws from its
    CPU generators, would land elsewhere and fail or mix devices. Free (no torch
    function mode, so no per-op cost) when the caller has set no default device.
    """
    return _on_default_device(method, lambda *args, **kwargs: _CPU)


def _first_tensor_device(*args: Any, **kwargs: Any) -> torch.device:
    return next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)),
                _CPU)


def on_inputs_device(func: F) -> F:
    """Run ``func`` with the default device set to its first tensor argument's device.

    For the public functions and module methods: like torch's own functions they compute
    where their inputs are (the CPU for numpy inputs or none), whatever a caller's
    ``torch.set_default_device``. Free when the caller has set no default device.
    """
    return _on_default_device(func, _first_tensor_device)


_WRAPPED = "_mlpapers_default_device"


def wrap_public_methods(cls: type,
                        decorator: Callable[[Callable[..., Any]], Callable[..., Any]]) -> type:
    """Wrap every public method of ``cls`` (its own and inherited ones, plain and class
    methods; scikit-learn's excepted) in ``decorator``, once; returns ``cls``.

    A method inherited from a class that is not wrapped itself (a mixin) is wrapped
    on ``cls`` under ``cls``'s qualified name, so that it still pickles by reference.
    """
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_"):
                continue
            is_classmethod = isinstance(attr, classmethod)
            func = attr.__func__ if is_classmethod else attr
            # (a function defined by exec() without __name__ has __module__ None)
            if (not inspect.isfunction(func)
                    or (func.__module__ or "").startswith("sklearn.")
                    or getattr(func, _WRAPPED, False)):
                continue
            wrapped = decorator(func)
            setattr(wrapped, _WRAPPED, True)
            wrapped.__qualname__ = f"{cls.__qualname__}.{name}"
            wrapped.__module__ = cls.__module__
            setattr(cls, name, classmethod(wrapped) if is_classmethod else wrapped)
    return cls
