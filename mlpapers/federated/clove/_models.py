"""Built-in client models and their per-client losses.

A *model spec* is one of ``"linear"``, ``"logistic"``, ``"mlp"``, ``"autoencoder"``
or a callable ``f(n_features, n_outputs) -> torch.nn.Module``. Losses are per sample,
so that they vectorise over models and clients (the engine masks and averages them per
client).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypeAlias, get_args

import numpy as np
import torch
from torch import nn

from mlpapers._utils import probe_module, seeded_linear
from mlpapers._utils._ambient import default_dtype

__all__ = ["BUILTIN_MODELS", "LOSSES", "activation_elements", "build_module",
           "build_user_module", "check_model_output", "frozen_names",
           "make_sample_loss_fn", "per_sample_loss", "row_elements",
           "tied_aliases"]

#: The built-in client models and training losses (BUILTIN_MODELS, LOSSES list them).
BuiltinModel: TypeAlias = Literal["linear", "logistic", "mlp", "autoencoder"]
ModelLoss: TypeAlias = Literal["mse", "cross_entropy", "reconstruction"]
BUILTIN_MODELS: tuple[str, ...] = get_args(BuiltinModel)
LOSSES: tuple[str, ...] = get_args(ModelLoss)


def _mlp(sizes: Sequence[int], gen: torch.Generator) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(seeded_linear(sizes[i], sizes[i + 1], generator=gen))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def build_user_module(factory: Callable[..., nn.Module], *args,
                      seed: int | None = None) -> nn.Module:
    """A copy of ``factory(*args)``, built in a fork of the global torch RNG (seeded with
    ``seed`` if given) under a float32 default dtype, one build at a time.

    The caller's global RNG state and default dtype are left as they were, and the
    module's initial weights do not depend on them (nor on other threads). The copy
    keeps the library's casts and weight loads off the user's objects: a factory
    returning one module (or modules sharing layers) every time would otherwise make
    the K models share their weights and overwrite the user's module.
    """
    # default_dtype's lock makes the builds one at a time: threads would otherwise reseed
    # each other's fork of the global RNG (so a factory must not wait on another thread's
    # fit). Only the CPU generator is seeded: the fork restores no other device's.
    with default_dtype(torch.float32), torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.default_generator.manual_seed(seed)
        module = factory(*args)
    return copy.deepcopy(module) if isinstance(module, nn.Module) else module


def build_module(
    model: str | Callable[[int, int], nn.Module],
    n_features: int,
    n_outputs: int,
    hidden_layer_sizes: Sequence[int] = (64,),
    seed: int | None = None,
) -> nn.Module:
    """Build one fresh client model, initialised from ``seed``.

    The global torch RNG is never advanced: built-in models draw their weights from a
    generator seeded with ``seed``, a callable runs in a seeded fork of the global RNG
    (:func:`build_user_module`); both give the weights ``torch.manual_seed(seed)``
    followed by the build would give. ``seed=None`` (a template whose weights are
    replaced) uses seed 0 for built-in models and an unseeded fork for a callable.

    Models are float32, the dtype of the clients' data, whatever torch's default dtype:
    built-in models draw their initial weights in float32 (the same draws under any
    default), a callable is called under a float32 default dtype and its module is cast
    with ``module.float()``.

    Parameters
    ----------
    model : str or callable
        ``"linear"`` / ``"logistic"``: one affine layer ``n_features -> n_outputs``;
        ``"mlp"``: ReLU network with ``hidden_layer_sizes``; ``"autoencoder"``:
        encoder ``n_features -> hidden_layer_sizes`` (the last size is the
        bottleneck) and the mirrored decoder back to ``n_features``; a callable
        is called as ``model(n_features, n_outputs)`` and its floating-point
        parameters and buffers are cast to float32.
    n_features : int
        Flattened input size (for built-in models).
    n_outputs : int
        Output size: number of targets or classes (ignored by the autoencoder).
    hidden_layer_sizes : sequence of int
        Hidden widths of ``"mlp"`` and ``"autoencoder"``.
    seed : int or None, default=None
        Seed of the initial weights.

    Returns
    -------
    torch.nn.Module
    """
    if callable(model) and not isinstance(model, str):
        module = build_user_module(model, n_features, n_outputs, seed=seed)
        if not isinstance(module, nn.Module):
            raise TypeError(
                "model must return a torch.nn.Module when called as model(n_features, "
                f"n_outputs), got {type(module).__name__}."
            )
        return module.float()
    hidden = [int(h) for h in hidden_layer_sizes]
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    if model in ("linear", "logistic"):
        return seeded_linear(n_features, n_outputs, generator=gen)
    if model == "mlp":
        return _mlp([n_features, *hidden, n_outputs], gen)
    if model == "autoencoder":
        if not hidden:
            raise ValueError("hidden_layer_sizes must be non-empty for model='autoencoder'.")
        return _mlp([n_features, *hidden, *hidden[-2::-1], n_features], gen)
    # (the estimators check ``model`` first; a guard for other callers of this helper)
    raise ValueError(f"model must be one of {list(BUILTIN_MODELS)} or a callable, got {model!r}.")


def check_trainable(module: torch.nn.Module, name: str = "model") -> None:
    """Refuse a user's module without trainable parameters: local training has nothing
    to train (torch's optimizers fail with "an empty parameter list")."""
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"{name} builds a module without trainable parameters (every "
                         "parameter has requires_grad=False, or it has none): there is "
                         "nothing to train.")


def check_model_output(module: torch.nn.Module, x: torch.Tensor, kind: str,
                        n_out: int) -> None:
    """A user model must map a batch ``x`` to ``(batch, n_outputs)`` (or to ``x``'s size
    for the reconstruction loss); checked on one sample, in eval mode (no side effects)."""
    out = probe_module(module, x.clone())  # (it may modify its input in place)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model must return a tensor, got {type(out).__name__}.")
    # integer/bool outputs failed later with "element 0 of tensors does not require grad"
    if not out.is_floating_point():
        raise TypeError(f"model must return a floating-point tensor, got {out.dtype}.")
    if out.device != x.device:
        raise ValueError(f"model must return its output on the device of its input "
                         f"({x.device}), got {out.device}.")
    if not bool(torch.isfinite(out).all()):  # else reported as a divergence in round 0
        raise ValueError("model returned a non-finite output (NaN or inf) for the first "
                         "sample of the first client, before any training.")
    ok = (out.numel() == x.numel() if kind == "reconstruction"
          else tuple(out.shape) == (x.shape[0], n_out))
    if not ok:
        want = (f"{x.numel()} values per sample (the input size)" if kind == "reconstruction"
                else f"shape (batch, {n_out})")
        raise ValueError(f"model(n_features, n_outputs) must build a module whose output has "
                         f"{want} for loss={kind!r}, got {tuple(out.shape)} for a batch of 1.")


def activation_elements(module: nn.Module, x: torch.Tensor) -> int:
    """Elements of the intermediate outputs of ``module`` for one sample ``x[:1]``.

    The sum of the output sizes of its leaf modules (an upper bound on what a forward
    pass without gradients holds at once), found by running a copy of it once in eval
    mode (:func:`probe_module`): hooks on the module itself would also count, and be
    counted by, the forward passes another thread runs on it at the same time, and
    the block sizes derived from the count would then vary between identical calls.
    """
    module = copy.deepcopy(module)
    total = 0

    def count(_mod, _inp, out):
        nonlocal total
        outs = out if isinstance(out, (tuple, list)) else (out,)
        total += sum(o[:1].numel() for o in outs if isinstance(o, torch.Tensor) and o.ndim)

    leaves = [m for m in module.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        probe_module(module, x[:1])
    finally:
        for h in hooks:
            h.remove()
    return int(total)


def row_elements(template: nn.Module, input_shape: Sequence[int],
                 dtype: torch.dtype = torch.float32) -> int:
    """Values one sample holds through ``template``: its input plus the outputs of the
    leaf modules (:func:`activation_elements` on one zero sample of ``dtype``, the
    data's)."""
    shape = tuple(int(v) for v in input_shape)
    param = next(template.parameters(), None)
    x = torch.zeros((1, *shape), dtype=dtype,
                    device=None if param is None else param.device)
    return int(np.prod(shape, dtype=np.int64)) + activation_elements(template, x)


def per_sample_loss(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    kind: str) -> torch.Tensor:
    """Per-sample loss, shape ``m``.

    Parameters
    ----------
    out : Tensor of shape (m, ...)
        Model output.
    x : Tensor of shape (m, ...)
        Inputs (targets of the reconstruction loss).
    y : Tensor of shape (m, n_outputs) (float) or (m,) (long)
        Targets; ignored by ``"reconstruction"``.
    kind : {"mse", "cross_entropy", "reconstruction"}
    """
    if kind == "cross_entropy":
        return nn.functional.cross_entropy(out, y, reduction="none")
    if kind == "mse":
        return (out - y).pow(2).reshape(out.shape[0], -1).mean(1)
    return (out.reshape(x.shape) - x).pow(2).reshape(x.shape[0], -1).mean(1)


def make_sample_loss_fn(module: nn.Module, kind: str, aliases: Iterable[str] = (),
                        copy_input: bool = False) -> Callable[..., torch.Tensor]:
    """Functional per-sample loss ``f(params, x, y) -> (m,)`` of ``module``.

    ``params`` is a dict of the module's parameters (and buffers) for *one* model;
    the function is meant to be wrapped by :func:`torch.func.vmap`/``grad``. The
    ``aliases`` (second names of tied parameters, :func:`tied_aliases`) are dropped
    from ``params``: ``functional_call`` refuses two values for one tied parameter.
    ``copy_input`` gives the module a copy of ``x`` (a user model may modify its input
    in place: ``x`` is a view of the clients' data, and the reconstruction target).
    """
    drop = frozenset(aliases)

    def sample_loss_fn(params, x, y):
        if drop:
            params = {k: v for k, v in params.items() if k not in drop}
        out = torch.func.functional_call(module, params, (x.clone() if copy_input else x,))
        return per_sample_loss(out, x, y, kind)

    return sample_loss_fn


def tied_aliases(module: nn.Module) -> dict[str, str]:
    """Second names of tied (shared) parameters and buffers, mapped to their first name:
    a state dict lists a shared tensor under each of its names."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]
    for name, t in named:
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


def frozen_names(module: nn.Module) -> frozenset[str]:
    """State-dict names of the parameters with ``requires_grad=False`` (all their names)."""
    return frozenset(k for k, p in module.named_parameters(remove_duplicate=False)
                     if not p.requires_grad)


