"""Node models of :class:`DecentralizedSGD`: building, seeded init and stacked gradients.

All node models share one architecture; their trainable parameters (and a user
module's buffers) are stacked along a leading ``n`` axis. The built-in models
("logistic", "mlp") get explicit batched matmuls and one backward pass for all
nodes; a user :class:`torch.nn.Module` is vectorised over nodes with
:func:`torch.func.vmap`, in train mode, with its own random draws per node
(``randomness="different"``) from a seeded fork of torch's global generator.
Its frozen parameters (``requires_grad=False``) are held once, unbatched, and
never updated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from mlpapers._utils import probe_module, seeded_global_rng
from mlpapers._utils._modules import refusing_layers, without_running_statistics

__all__: list[str] = []

Grads = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
Params = dict[str, torch.Tensor]


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


def _unfittable_layer(layer: nn.Module) -> str | None:
    """Why DecentralizedSGD cannot fit ``layer`` (``None`` if it can)."""
    text = without_running_statistics(layer)
    if text is not None:  # predict runs one row at a time in eval mode
        return f"{text}; build it with track_running_stats=True."
    if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.momentum is None:
        return ("has momentum=None (a cumulative average reads its batch counter with "
                ".item(), which torch.vmap cannot run over the nodes); give it a "
                "momentum, e.g. 0.1.")
    return None


def _check_module_output(module: nn.Module, x: torch.Tensor, n_classes: int) -> None:
    """A user module must map ``(batch, n_features)`` to ``(batch, n_classes)`` logits."""
    want = (1, n_classes)
    with refusing_layers(module, _unfittable_layer, "model's"):
        out = probe_module(module, x)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model must map (batch, n_features) to (batch, n_classes) "
                         f"logits, i.e. {want} here, got {got}.")
    # integer/bool outputs failed in the loss with a torch kernel error
    if not out.is_floating_point():
        raise TypeError(f"model must return floating-point logits, got {out.dtype}.")
    if out.device != x.device:
        raise ValueError(f"model must return its logits on the device of its input "
                         f"({x.device}), got {out.device}.")
    if not bool(torch.isfinite(out).all()):  # else reported later as a divergence
        raise ValueError("model returned non-finite logits (NaN or inf) for the first "
                         "training sample, before any training.")


def split_state(module: nn.Module, n: int) -> tuple[Params, Params, Params]:
    """The node state of ``module`` copied to ``n`` nodes.

    Returns
    -------
    trainable : dict of str to Tensor
        Parameters with ``requires_grad=True``, stacked ``(n, *shape)``.
    frozen : dict of str to Tensor
        Parameters with ``requires_grad=False``, once (the same on every node, never
        trained, gossiped or decayed).
    buffers : dict of str to Tensor
        Buffers (e.g. BatchNorm statistics), stacked ``(n, *shape)``: each node keeps
        its own, as a real node would.
    """
    def stack(t: torch.Tensor) -> torch.Tensor:
        return t.detach().unsqueeze(0).expand(n, *t.shape).clone()

    trainable, frozen = {}, {}
    for k, p in module.named_parameters():
        if p.requires_grad:
            trainable[k] = stack(p)
        else:
            frozen[k] = p.detach().clone()
    buffers = {k: stack(b) for k, b in module.named_buffers()}
    return trainable, frozen, buffers


def average_buffers(module: nn.Module, buffers: Params, has_data: torch.Tensor) -> Params:
    """Buffers of the average model from the nodes' stacked ``buffers``.

    Only nodes with data count (the others never ran a batch). Normalisation statistics
    (a module's ``running_mean`` / ``running_var`` pair, as in BatchNorm) are pooled
    over the nodes by the law of total variance, ``mean_i var_i + var_i mean_i`` with
    equal node weights (every node runs ``batch_size`` samples a round, and the DSGD
    objective weights nodes equally): the statistics of an equal mixture of the nodes'
    data (of all samples only when the nodes hold equal amounts), where a plain mean of
    the variances would miss the spread of the node means under a label-skewed split.
    Other floating buffers are averaged as the parameters are; integer buffers
    (counters such as ``num_batches_tracked``) take their maximum.
    """
    if not buffers:
        return {}
    keep = has_data.bool()
    out = {}
    for k, v in buffers.items():
        v = v[keep]
        out[k] = v.mean(0) if v.is_floating_point() else v.max(0).values
    for name, _ in module.named_modules():
        mean_k = f"{name}.running_mean" if name else "running_mean"
        var_k = f"{name}.running_var" if name else "running_var"
        if mean_k in buffers and var_k in buffers and \
                buffers[mean_k].shape == buffers[var_k].shape:
            means = buffers[mean_k][keep]
            spread = (means - out[mean_k]).pow(2).mean(0)
            out[var_k] = out[var_k] + spread
    return out


def _local_grads_fn(model: Any, base: nn.Module, frozen: Params, buffers: Params) -> Grads:
    """``local_grads(params, X, y)``: per-node mean cross-entropy gradients.

    ``params`` are the stacked ``(n, *shape)`` trainable parameters, ``X`` is
    ``(n, B, n_features)`` and ``y`` is ``(n, B)``; the returned gradients have the
    shapes of ``params``. A user module runs as ``base`` is (train mode), with the
    unbatched ``frozen`` parameters, and updates the stacked ``buffers`` in place
    (BatchNorm statistics of each node's batches).
    """
    if isinstance(model, nn.Module):  # generic module: vmap over nodes
        def node_loss(p, f, b, xb, yb):
            logits = functional_call(base, (p, f, b), (xb,))
            return nn.functional.cross_entropy(logits, yb)

        # "different": each node draws its own dropout masks (the default "error" mode
        # refused any random op)
        vgrad = torch.func.vmap(torch.func.grad(node_loss), in_dims=(0, None, 0, 0, 0),
                                randomness="different")

        def local_grads(p, xb, yb):
            return vgrad(p, frozen, buffers, xb, yb)
    else:  # built-in models: explicit batched matmuls, one backward for all nodes
        def local_grads(p, xb, yb):
            leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
            logits = _stacked_forward(leaves, xb)  # (n, B, C)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum")
            return dict(zip(leaves, torch.autograd.grad(loss / yb.shape[1],
                                                        list(leaves.values()))))
    return local_grads


def user_grads(local_grads: Grads, params: Params, buffers: Params, xb: torch.Tensor,
               yb: torch.Tensor, seed: int, device: torch.device,
               has_data: torch.Tensor | None) -> Params:
    """The local gradients of a user module (``local_grads`` of :func:`_local_grads_fn`).

    Its random layers are seeded with ``seed`` (:func:`seeded_global_rng`); with
    ``has_data`` given, a node without data keeps its buffers (its padded batch is
    another node's samples); a failure of the module in train mode under vmap is
    named.
    """
    old = {k: v.clone() for k, v in buffers.items()} if has_data is not None else None
    try:
        with seeded_global_rng(seed, device):
            grads = local_grads(params, xb, yb)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError) as exc:  # (BatchNorm on one sample: ValueError)
        raise ValueError(
            f"model failed in training: fit runs a copy of it in train mode on "
            f"batches of {xb.shape[1]} samples per node (batch_size), vectorised over "
            f"the nodes with torch.func.vmap: {exc}") from exc
    if old is not None and has_data is not None:  # (one is None when the other is)
        with torch.no_grad():
            for k, v in buffers.items():
                keep = has_data.view(-1, *[1] * (v.ndim - 1)).bool()
                v.copy_(torch.where(keep, v, old[k]))
    return grads
