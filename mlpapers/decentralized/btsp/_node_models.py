"""Node models of :class:`DecentralizedSGD`: building, seeded init and stacked gradients.

All node models share one architecture; their parameters are stacked along a
leading ``n`` axis (:func:`torch.func.stack_module_state`). The built-in models
("logistic", "mlp") get explicit batched matmuls and one backward pass for all
nodes; a user :class:`torch.nn.Module` is vectorised over nodes with
:func:`torch.func.vmap`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from mlpapers._utils import probe_module

__all__: list[str] = []

Grads = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


def _build_module(model: Any, n_features: int, n_classes: int, hidden: int) -> nn.Module:
    """A float32 copy of a user module, or a built-in model with uninitialised weights.

    The built-in layers are built without their default init (:func:`_init_params` sets
    the weights from the estimator's generator), so the global torch RNG is never
    advanced, and in float32 whatever torch's default dtype: the node models run on
    float32 data.
    """
    if isinstance(model, nn.Module):
        module = copy.deepcopy(model)
        # cast only a module that would fail on float32 data: float64 buffers of a
        # float32 module (which work) keep their precision
        if any(p.is_floating_point() and p.dtype != torch.float32 for p in module.parameters()):
            module = module.float()
        return module

    def linear(n_in: int, n_out: int) -> nn.Linear:
        return nn.utils.skip_init(nn.Linear, n_in, n_out, dtype=torch.float32)

    if model == "logistic":
        return linear(n_features, n_classes)
    return nn.Sequential(linear(n_features, hidden), nn.ReLU(), linear(hidden, n_classes))


def _stacked_forward(params: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
    """Logits of the built-in models for stacked parameters.

    ``params`` holds ``weight``/``bias`` (logistic) or ``0.*``/``2.*`` (MLP) tensors of
    shape ``(n, out, in)`` / ``(n, out)``; ``X`` is ``(n, B, in)``; returns ``(n, B, out)``.
    """
    if "weight" in params:
        return torch.baddbmm(params["bias"][:, None, :], X, params["weight"].transpose(1, 2))
    h = torch.relu(torch.baddbmm(params["0.bias"][:, None, :], X,
                                 params["0.weight"].transpose(1, 2)))
    return torch.baddbmm(params["2.bias"][:, None, :], h, params["2.weight"].transpose(1, 2))


def _init_params(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded init (no global RNG): uniform(+-1/sqrt(fan_in)) weights, zero biases."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                bound = 1.0 / np.sqrt(p.shape[1])
                p.copy_((torch.rand(p.shape, generator=gen, dtype=p.dtype) * 2 - 1) * bound)
            else:
                p.zero_()


def _check_module_output(module: nn.Module, x: torch.Tensor, n_classes: int) -> None:
    """A user module must map ``(batch, n_features)`` to ``(batch, n_classes)`` logits."""
    want = (1, n_classes)
    out = probe_module(module, x)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model must map (batch, n_features) to (batch, n_classes) "
                         f"logits, i.e. {want} here, got {got}.")


def _local_grads_fn(model: Any, base: nn.Module, buffers: dict[str, torch.Tensor]) -> Grads:
    """``local_grads(params, X, y)``: per-node mean cross-entropy gradients.

    ``params`` are stacked ``(n, *shape)``, ``X`` is ``(n, B, n_features)`` and
    ``y`` is ``(n, B)``; the returned gradients have the shapes of ``params``.
    """
    if isinstance(model, nn.Module):  # generic module: vmap over nodes
        def node_loss(p, b, xb, yb):
            logits = functional_call(base, (p, b), (xb,))
            return nn.functional.cross_entropy(logits, yb)

        vgrad = torch.func.vmap(torch.func.grad(node_loss))

        def local_grads(p, xb, yb):
            return vgrad(p, buffers, xb, yb)
    else:  # built-in models: explicit batched matmuls, one backward for all nodes
        def local_grads(p, xb, yb):
            leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
            logits = _stacked_forward(leaves, xb)  # (n, B, C)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum")
            return dict(zip(leaves, torch.autograd.grad(loss / yb.shape[1],
                                                        list(leaves.values()))))
    return local_grads
