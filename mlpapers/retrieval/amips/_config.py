"""Hyper-parameter validation and network construction of :class:`AmortizedMIPS`."""

from __future__ import annotations

import numbers
from typing import Literal, TypeAlias, get_args

import torch

from mlpapers._utils import (
    check_bool,
    check_float32_param,
    check_in_options,
    check_learning_rate,
    check_positive,
)
from mlpapers.retrieval.amips._kernels import METRICS
from mlpapers.retrieval.amips._networks import (
    AMIPSNetwork,
    Homogenize,
    KeyNet,
    SupportNet,
    check_activation,
    solve_width,
)

__all__ = ["build_amips_model", "check_amips_params"]

#: ``AmortizedMIPS(arch=...)``; ``ARCHS`` lists its values (``retrieval=`` takes a
#: :data:`~mlpapers.retrieval.amips._kernels.Metric`).
Arch: TypeAlias = Literal["keynet", "supportnet"]
ARCHS: tuple[str, ...] = get_args(Arch)


def check_amips_params(est) -> None:
    """Validate the hyper-parameters of an :class:`AmortizedMIPS` ``est`` (raises
    ``ValueError``/``TypeError`` naming the parameter)."""
    check_in_options(est.arch, "arch", ARCHS)
    check_positive(est.depth, "depth", integer=True)
    if est.hidden_dim is not None:
        check_positive(est.hidden_dim, "hidden_dim", integer=True)
    check_positive(est.params_fraction, "params_fraction")
    if not isinstance(est.wx_inject, numbers.Integral):
        raise TypeError(f"wx_inject must be a bool or an int, got {est.wx_inject!r}.")
    if est.wx_inject < 0:
        raise ValueError(f"wx_inject must be >= 0 (0 or False: no re-injection), "
                         f"got {est.wx_inject!r}.")
    check_activation(est.negative_slope, est.beta)
    check_float32_param(est.score_weight, "score_weight", strict=False)
    check_float32_param(est.target_weight, "target_weight", strict=False)
    if est.score_weight == 0 and est.target_weight == 0:
        raise ValueError("score_weight and target_weight cannot both be 0.")
    check_positive(est.n_steps, "n_steps", integer=True)
    check_positive(est.batch_size, "batch_size", integer=True)
    check_learning_rate(est.lr, adam=True)  # trains with Adam
    check_positive(est.warmup, "warmup", strict=False)
    if est.warmup >= 1:
        raise ValueError(f"warmup must be a fraction in [0, 1), got {est.warmup}.")
    check_positive(est.end_lr_ratio, "end_lr_ratio", strict=False)
    if est.end_lr_ratio > 1:  # the schedule rises to lr * end_lr_ratio: bound that step too
        check_learning_rate(est.lr * est.end_lr_ratio, "lr * end_lr_ratio", adam=True)
    check_positive(est.ema_decay, "ema_decay", strict=False)
    if est.ema_decay >= 1:
        raise ValueError(f"ema_decay must be in [0, 1), got {est.ema_decay}.")
    if est.grad_clip is not None:
        check_positive(est.grad_clip, "grad_clip")
    check_positive(est.noise_std, "noise_std", strict=False)
    check_positive(est.n_noise, "n_noise", strict=False, integer=True)
    check_positive(est.search_batch_size, "search_batch_size", integer=True)
    check_in_options(est.retrieval, "retrieval", METRICS)
    check_positive(est.n_candidates, "n_candidates", integer=True)
    # (pickles and files from before center_keys get its default: __setstate__, load)
    for name in ("center_keys", "homogenize", "resnet"):  # each arch reads one of the two
        check_bool(getattr(est, name), name)


def build_amips_model(est, n_keys: int, d: int,
                      hidden_dims: tuple[int, ...] | None = None, *,
                      seed: int = 0) -> tuple[AMIPSNetwork, tuple[int, ...]]:
    """Build the untrained float32 network of ``est`` for ``n_keys`` keys of dimension ``d``.

    The width is ``est.hidden_dim`` or solved from the budget
    ``params_fraction * n_keys * d`` (:func:`solve_width`); ``hidden_dims`` (from a
    fitted estimator) overrides both. The initialisation is drawn from a generator
    seeded with ``seed`` (the values of a build after ``torch.manual_seed(seed)``)
    and the parameters are float32 whatever the caller's default dtype: the global
    RNG, shared by all threads, is neither read nor advanced, and a default of float64
    or float16 neither breaks the float32 fit nor changes its initial values.
    Returns the model and its hidden widths.
    """
    if hidden_dims is None:
        out = d if est.arch == "keynet" else 1
        width = est.hidden_dim if est.hidden_dim is not None else solve_width(
            n_keys * d * est.params_fraction, d, out, est.depth, est.wx_inject)
        hidden_dims = (int(width),) * est.depth
    # explicit dtype and generator: no global state is switched, even for a moment
    kw = dict(wx_inject=est.wx_inject, negative_slope=est.negative_slope, beta=est.beta,
              generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float32)
    model: AMIPSNetwork
    if est.arch == "keynet":
        model = KeyNet(d, list(hidden_dims), resnet=est.resnet, **kw)
    else:
        model = SupportNet(d, list(hidden_dims), **kw)
        if est.homogenize:
            model = Homogenize(model)
    return model, tuple(hidden_dims)
