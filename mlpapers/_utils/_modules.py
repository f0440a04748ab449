"""Checks of the user's own torch modules that only apply to the layers that run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["module_behind", "refusing_layers", "without_running_statistics"]


def module_behind(function) -> nn.Module | None:
    """The module behind a user's callable: the callable itself, or the module of a bound
    method such as ``my_net.features`` (``None`` for any other callable)."""
    if isinstance(function, nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


@contextmanager
def refusing_layers(module: nn.Module, reason: Callable[[nn.Module], str | None],
                    owner: str) -> Iterator[None]:
    """Inside the block, a submodule of ``module`` for which ``reason`` gives a text
    raises ``ValueError("{owner} {Layer} {name!r} {text}")`` when it runs; one that never
    runs (an unused head) is fine. Checked by forward pre-hooks, removed on exit (also
    when the block raises), so a module's mere contents are never refused."""
    handles = []

    def refuse(layer: nn.Module, name: str, text: str):
        def hook(_module, _inputs):
            raise ValueError(f"{owner} {type(layer).__name__} {name!r} {text}")
        return hook

    try:
        for name, m in module.named_modules():
            text = reason(m)
            if text:
                handles.append(m.register_forward_pre_hook(
                    refuse(m, name or type(module).__name__, text)))
        yield
    finally:
        for h in handles:
            h.remove()


def without_running_statistics(layer: nn.Module) -> str | None:
    """Why a BatchNorm built with ``track_running_stats=False`` breaks batch independence
    (``None`` for any other layer): it normalises with the statistics of the batch even
    in eval mode, so a row's output would depend on the other rows of its batch."""
    if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.running_mean is None:
        return ("has no running statistics (track_running_stats=False): it normalises "
                "with the statistics of the batch even in eval mode, so a row's output "
                "would depend on the other rows of its batch")
    return None
