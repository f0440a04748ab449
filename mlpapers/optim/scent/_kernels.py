"""Pure tensor kernels of SCENT and its baselines (no estimator state).

All functions work in log space: the dual variable ``nu`` is stored as a
logarithm and exponentials are only taken of differences ``s - nu`` or of
quantities that were shifted by their maximum first.

Notation: an anchor ``i`` has scores ``s_ij`` for its sampled items ``j``; the
objective is ``(1/n) sum_i log E_j exp(s_ij)``; ``L_i = log mean_j exp(s_ij)``
is the mini-batch log-mean-exp and ``nu_i`` the dual variable whose optimum is
``nu_i* = log E_j exp(s_ij)``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F

from mlpapers._utils import (
    TORCH_INTEGER_DTYPES,
    check_real,
    holds_only_zero_one,
    on_inputs_device,
    requires_tensors,
)

__all__ = [
    "asgd_update",
    "log_mean_exp",
    "softplus_dual_ratio",
    "sox_update",
    "spmd_gamma",
    "spmd_update",
    "umax_update",
]


#: float64's machine epsilon (the reference of the dtype-dependent switch below)
_EPS64 = torch.finfo(torch.float64).eps


def _as_tensor(x: float | torch.Tensor, like: torch.Tensor, name: str,
               *others: torch.Tensor) -> torch.Tensor:
    """A step parameter as a tensor of ``like``'s dtype and device. A tensor must
    broadcast to the shape of ``like`` and ``others`` (``nu`` and ``log_mean_exp``)
    without enlarging it: a ``(B, 1)`` one made the ``(B,)`` update ``(B, B)``,
    silently (its values are the caller's: checking them would synchronise the
    device)."""
    if isinstance(x, torch.Tensor):
        check_real(x, name)
        shape = torch.broadcast_shapes(like.shape, *(t.shape for t in others))
        try:
            fits = torch.broadcast_shapes(x.shape, shape) == shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"{name} of shape {tuple(x.shape)} must broadcast to the "
                             f"update's shape {tuple(shape)}.")
        return x.to(device=like.device, dtype=like.dtype)
    return torch.tensor(float(x), device=like.device, dtype=like.dtype)


def _check_real_dtype(t: torch.Tensor, name: str) -> None:
    """Raise a ``TypeError`` naming ``name`` unless ``t`` holds floating or integer
    numbers: a boolean tensor is a mask, not scores or duals (torch refused its
    subtraction with a message naming no argument, or reduced it as 0/1 silently)."""
    if not (t.is_floating_point() or t.dtype in TORCH_INTEGER_DTYPES):
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}.")


def _check_number(value, name: str, *, low: float, high: float = math.inf,
                  low_open: bool = True, finite: bool = True) -> None:
    """A Python (or numpy) real step parameter in its documented range; tensors are the
    caller's (schedules pass them, and checking them would synchronise the device).
    Out-of-range numbers gave NaN (``gamma <= 0``, a NaN ``log_alpha``), a
    ``math domain error`` (``rho <= 0``) or a silent ascent step (``dual_lr < 0``).
    ``finite=False`` admits the infinite limits (``log_alpha = +-inf``), never NaN."""
    if isinstance(value, torch.Tensor):
        return
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, numbers.Real):  # (None gave "float() argument must be ...")
        raise TypeError(f"{name} must be a real number or a torch.Tensor, "
                        f"got {type(value).__name__}.")
    v = float(value)
    above = v > low if low_open else v >= low
    if not finite:
        if isinstance(value, bool) or math.isnan(v):
            raise ValueError(f"{name} must be a real number (+-inf allowed), got {value!r}.")
        return
    if isinstance(value, bool) or not (above and v <= high and math.isfinite(v)):
        lo = "(" if low_open else "["
        hi = "]" if math.isfinite(high) else ")"
        raise ValueError(f"{name} must be a finite number in {lo}{low:g}, {high:g}{hi}, "
                         f"got {value!r}.")


def _as_float_pair(nu, lme) -> tuple[torch.Tensor, torch.Tensor]:
    """Floating tensors of broadcastable shapes. Integer tensors, and Python numbers and
    lists, take the floating dtype of the tensor arguments (the default dtype if none is
    floating) and their device: an integer ``nu`` or a ``0.1`` beside float64 values is
    not rounded to float32. numpy arrays keep their own floating dtype."""
    args = (("nu", nu), ("log_mean_exp", lme))
    tensors = [x for _, x in args if isinstance(x, torch.Tensor)]
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    for f in floats[1:]:
        dtype = torch.promote_types(dtype, f)
    device = tensors[0].device if tensors else None
    out = []
    for name, x in args:
        if isinstance(x, torch.Tensor):
            t = x
        elif isinstance(x, np.ndarray) and x.dtype.kind == "f":
            t = torch.as_tensor(x, device=device)
        else:
            t = torch.as_tensor(x, device=device)
            if t.is_floating_point() or t.dtype in TORCH_INTEGER_DTYPES:
                # from the Python values themselves (0.1 via float32 is not 0.1)
                t = torch.as_tensor(x, dtype=dtype, device=device)
        _check_real_dtype(t, name)
        out.append(t.detach() if t.is_floating_point() else t.to(dtype))
    try:
        torch.broadcast_shapes(out[0].shape, out[1].shape)
    except RuntimeError as exc:
        raise ValueError(f"nu {tuple(out[0].shape)} and log_mean_exp {tuple(out[1].shape)} "
                         "must have broadcastable shapes.") from exc
    return out[0], out[1]


def item_mask(mask: torch.Tensor, scores: torch.Tensor, owner: str = "") -> torch.Tensor:
    """``mask`` as a bool tensor of the shape of ``scores`` (broadcast).

    A mask selects items, it does not weigh them: integer and floating masks must
    hold only 0 and 1 (0.5 or NaN was read as True). Sums over the result count the
    mask as broadcast (a (B, 1) mask counted one item per row before).
    """
    where = f"{owner}: " if owner else ""
    if mask.dtype != torch.bool:
        check_real(mask, f"{where}mask")
        if not holds_only_zero_one(mask):
            raise ValueError(f"{where}mask must be boolean or hold only 0 and 1 (it selects "
                             "items, it does not weigh them), got other values.")
        mask = mask != 0
    try:
        return mask.expand_as(scores)
    except RuntimeError:
        raise ValueError(f"{where}mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"the scores' shape {tuple(scores.shape)}.") from None


@on_inputs_device
@requires_tensors
def log_mean_exp(
    scores: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Stable :math:`\log \frac{1}{k}\sum_j \exp(s_j)` along ``dim``.

    Parameters
    ----------
    scores : torch.Tensor of shape (..., k, ...)
        Scores; ``dim`` is reduced.
    dim : int, default=-1
        The axis of the items.
    mask : torch.Tensor of bool, optional
        Same shape as ``scores`` (or broadcastable to it, and then counted as
        broadcast); ``False`` entries are left out of both the sum and the count. A
        slice without any valid item (also ``k = 0``) gives ``-inf``. Integer or
        floating masks must hold only 0 and 1 (a mask selects items, it does not
        weigh them; other values raise a ``ValueError``).

    Returns
    -------
    torch.Tensor
        ``scores`` with ``dim`` removed.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import log_mean_exp
    >>> float(log_mean_exp(torch.tensor([0.0, 0.0, 1e4])))  # no overflow
    9998.90...
    """
    _check_real_dtype(scores, "log_mean_exp: scores")
    if scores.dim() == 0:
        raise ValueError("log_mean_exp: scores must have at least one dimension, got a "
                         "0-d tensor")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"log_mean_exp: dim must be an int, got {type(dim).__name__}")
    if not -scores.dim() <= dim < scores.dim():  # (torch's IndexError named no argument)
        raise ValueError(f"log_mean_exp: dim must be in [{-scores.dim()}, {scores.dim()}) for "
                         f"scores of shape {tuple(scores.shape)}, got {dim}.")
    if mask is None:
        # k = 0: the empty sum's logsumexp is -inf, as an all-masked slice gives (log 0
        # failed with "math domain error")
        return torch.logsumexp(scores, dim=dim) - math.log(max(scores.shape[dim], 1))
    mask = item_mask(mask, scores, "log_mean_exp")
    masked = scores.masked_fill(~mask, float("-inf"))
    count = mask.sum(dim=dim).to(scores.dtype)
    # an empty slice: logsumexp = -inf and log(count) = -inf would give NaN; it is -inf
    return torch.logsumexp(masked, dim=dim) - torch.log(count.clamp_min(1))


def tempered_log_mean_exp(
    values: torch.Tensor, temperature: float, dim: int = -1, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r""":math:`\tau \log \frac1k \sum_j \exp(v_j / \tau)` along ``dim``, accurate at any scale.

    The plain form ``tau * log_mean_exp(v / tau)`` overflows when :math:`v/\tau` does
    (a tiny :math:`\tau`) and loses all relative precision when the result is tiny
    against :math:`\log k` (a large :math:`\tau`: the value tends to the mean of
    ``v``, but ``log(mean(exp(x)))`` of near-zero ``x`` rounds to 0). The plain form
    is kept (same values, same cost) unless some slice overflowed or came out below
    :math:`2\cdot10^{-4}\log k` in absolute value (float64; the bound scales with the
    dtype's machine epsilon); then every slice is taken, with
    :math:`c = \max_j v_j` and :math:`d_j = (v_j - c)/\tau \le 0`, as
    :math:`c + \tau \log \text{mean}_j e^{d_j}`, the logarithm being
    ``log1p(y)`` with :math:`y = \text{mean}_j\,\text{expm1}(d_j)` where
    :math:`y > -1/2` (``mean(exp(d))`` near 1; each ``expm1(d)`` lies in [-1, 0], so
    the mean has no cancellation) and a log-sum-exp elsewhere. Floating inputs
    narrower than float64 are reduced in float64 (where the device has it) and the
    result cast back: the value can be far smaller than the largest ``|v|``, and
    float32 arithmetic then lost up to ~1e-4 of it. Differentiable in ``values``
    (the gradient is the softmax weights).

    Parameters
    ----------
    values : torch.Tensor of shape (..., k, ...)
    temperature : float
        :math:`\tau > 0`.
    dim : int, default=-1
    mask : torch.Tensor of bool, optional
        Valid items (as in :func:`log_mean_exp`); an empty slice gives ``-inf``.

    Returns
    -------
    torch.Tensor
        ``values`` with ``dim`` removed.
    """
    tau = float(temperature)
    k = values.shape[dim]
    if mask is not None:  # broadcast once: the counts and indexing below need every item
        mask = item_mask(mask, values, "tempered_log_mean_exp")
    eps = torch.finfo(values.dtype).eps if values.is_floating_point() else 0.0
    if eps > _EPS64 and values.device.type != "mps":  # (MPS has no float64)
        return tempered_log_mean_exp(values.double(), tau, dim=dim, mask=mask).to(values.dtype)
    plain = log_mean_exp(values / tau, dim=dim, mask=mask)
    # |error| of the plain form ~ eps (|plain| + 2 log k): fine unless |plain| << log k;
    # 2e-4 log k in float64 (relative error <= ~1e4 eps_64), as strict in other dtypes
    p = plain.detach()
    small = 2e-4 * max(eps, _EPS64) / _EPS64 * math.log(max(k, 1))
    if not bool((~torch.isfinite(p) | (p.abs() < small)).any()):
        return tau * plain
    if k == 0:  # no items: -inf, as log_mean_exp gives
        return tau * log_mean_exp(values, dim=dim, mask=mask)
    v = values if mask is None else values.masked_fill(~mask, float("-inf"))
    c = v.detach().amax(dim=dim, keepdim=True)
    # an empty (all -inf) or infinite slice: shift by 0 and let the result be +-inf
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    d = (v - c) / tau
    if mask is None:
        count = torch.full_like(c.squeeze(dim), float(k))
    else:
        count = mask.sum(dim=dim).to(values.dtype)
    out = log_mean_exp(d, dim=dim, mask=mask)
    # log1p(mean(expm1(d))) keeps every digit of a log near 0; chosen per slice on the
    # mean itself (not on every item being near the max: one far item cost ~1e-10)
    dn = d.detach() if mask is None else d.detach().masked_fill(~mask, 0.0)
    near = (torch.expm1(dn).sum(dim=dim) / count.clamp_min(1) > -0.5) & (count > 0)
    if bool(near.any()):
        dn = d.movedim(dim, -1)[near]
        if mask is not None:  # masked items are -inf: expm1 = -1, so zero them
            dn = dn.masked_fill(~mask.movedim(dim, -1)[near], 0.0)
        y = torch.expm1(dn).sum(dim=-1) / count[near]
        out = out.masked_scatter(near, torch.log1p(y.clamp_min(-0.5)))
    return c.squeeze(dim) + tau * out


@on_inputs_device
def spmd_gamma(nu: torch.Tensor, log_alpha: float | torch.Tensor) -> torch.Tensor:
    r"""The effective averaging weight :math:`\gamma = \sigma(\log\alpha + \nu)` of SCENT.

    Always in :math:`(0, 1)`; SCENT is SOX with this anchor-adaptive weight (the
    :math:`\gamma` that :func:`spmd_update` uses).

    Parameters
    ----------
    nu : torch.Tensor of shape (B,)
        Previous dual variables (logarithms) of the anchors in the batch.
    log_alpha : float or torch.Tensor broadcastable to (B,)
        Logarithm of the SPMD step size :math:`\alpha_t`.

    Returns
    -------
    torch.Tensor of shape (B,)
        The weights :math:`\gamma_i = \sigma(\log\alpha + \nu_i)`; they grow with
        ``nu``: an anchor whose dual is large moves faster.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import spmd_gamma
    >>> spmd_gamma(torch.tensor([-1.0, 0.0, 1.0]), log_alpha=0.0)
    tensor([0.2689, 0.5000, 0.7311])
    """
    if not isinstance(nu, torch.Tensor):
        nu = torch.as_tensor(nu)
    check_real(nu, "spmd_gamma: nu")
    if not nu.is_floating_point():
        # an integer nu made log_alpha an integer too (0.5 -> 0: a wrong weight, silently)
        nu = nu.to(torch.get_default_dtype())
    _check_number(log_alpha, "log_alpha", low=-math.inf, finite=False)
    return torch.sigmoid(_as_tensor(log_alpha, nu, "log_alpha") + nu)


@on_inputs_device
def spmd_update(
    nu: torch.Tensor, log_mean_exp: torch.Tensor, log_alpha: float | torch.Tensor
) -> torch.Tensor:
    r"""One stochastic proximal mirror-descent (SPMD) step of SCENT on ``nu``.

    Solves in closed form

    .. math::

        \nu_t = \arg\min_\nu\; \hat g\, e^{-\nu} + \nu
                + \frac{1}{\alpha} D_\phi(\nu, \nu_{t-1}),
        \qquad \phi(\nu) = e^{-\nu},

    with :math:`\hat g = e^{L}` the mini-batch mean of :math:`e^{s_{ij}}`. The
    solution is :math:`e^{\nu_t} = (1-\gamma) e^{\nu_{t-1}} + \gamma \hat g`
    with :math:`\gamma = \sigma(\log\alpha + \nu_{t-1})`, evaluated in log space
    as ``logaddexp(nu - softplus(a), a - softplus(a) + L)``, ``a = log_alpha + nu``.

    Parameters
    ----------
    nu : torch.Tensor of shape (B,)
        Previous dual variables of the anchors in the batch.
    log_mean_exp : torch.Tensor of shape (B,)
        Mini-batch :math:`L_i = \log \frac{1}{k} \sum_j e^{s_{ij}}`.
    log_alpha : float or torch.Tensor broadcastable to (B,)
        Logarithm of the step size :math:`\alpha_t`.

    Returns
    -------
    torch.Tensor of shape (B,)
        The updated ``nu`` (no gradient is tracked).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import spmd_update
    >>> nu = torch.tensor([0.0]); L = torch.tensor([2.0])
    >>> spmd_update(nu, L, log_alpha=30.0)  # alpha -> inf jumps to L
    tensor([2.])
    """
    nu, log_mean_exp = _as_float_pair(nu, log_mean_exp)
    _check_number(log_alpha, "log_alpha", low=-math.inf, finite=False)
    with torch.no_grad():
        la = _as_tensor(log_alpha, nu, "log_alpha", log_mean_exp)
        # alpha = 0 keeps nu and alpha = inf jumps to L, also at nu = -+inf (where
        # log_alpha + nu is NaN)
        inf = torch.full_like(la, math.inf)
        a = torch.where(torch.isneginf(la), -inf, torch.where(torch.isposinf(la), inf, la + nu))
        # log(1 - gamma) + nu = logsigmoid(-a) + nu = logsigmoid(a) - log_alpha: the form
        # without cancellation for the sign of a (nu + logsigmoid(-a) lost nu's digits
        # for nu >> 1, and was inf - inf = NaN at nu = +inf, whose limit is
        # log(1/alpha + g))
        old = torch.where(a > 0, F.logsigmoid(a) - la, nu + F.logsigmoid(-a))
        return torch.logaddexp(old, F.logsigmoid(a) + log_mean_exp)


@on_inputs_device
def sox_update(
    nu: torch.Tensor, log_mean_exp: torch.Tensor, gamma: float | torch.Tensor
) -> torch.Tensor:
    r"""SOX / SCGD moving average in log space.

    Computes :math:`e^{\nu} \leftarrow (1-\gamma)e^{\nu} + \gamma\hat g` as a ``logaddexp``.

    Parameters
    ----------
    nu : torch.Tensor of shape (B,)
        Previous dual variables (logarithms of the running averages) of the anchors
        in the batch.
    log_mean_exp : torch.Tensor of shape (B,)
        Mini-batch :math:`L_i = \log \frac{1}{k} \sum_j e^{s_{ij}}` (see
        :func:`log_mean_exp`).
    gamma : float or torch.Tensor broadcastable to (B,)
        Averaging weight, > 0 (the method's range is (0, 1]); ``gamma >= 1`` everywhere
        returns ``log_mean_exp``.

    Returns
    -------
    torch.Tensor of shape (B,)
        The updated ``nu`` (no gradient is tracked).

    Examples
    --------
    >>> import math, torch
    >>> from mlpapers.optim.scent import sox_update
    >>> nu = torch.tensor([0.0]); L = torch.tensor([math.log(3.0)])
    >>> sox_update(nu, L, gamma=0.5).exp()  # (1 - 0.5) * 1 + 0.5 * 3
    tensor([2.])
    """
    # integer nu made gamma an integer too (0.5 -> 0: silently no update), and lists
    # or arrays failed with a cryptic trace; converted as spmd_update does
    nu, log_mean_exp = _as_float_pair(nu, log_mean_exp)
    # gamma >= 1 is the plain minibatch estimate (documented), also for a Python number
    _check_number(gamma, "gamma", low=0.0)
    with torch.no_grad():
        g = _as_tensor(gamma, nu, "gamma", log_mean_exp)
        if bool((g >= 1).all()):
            # the dtype and shape of the general branch (L alone kept L's: a float32 L
            # with float64 nu came back float32, a scalar L with (B,) nu a scalar)
            shape = torch.broadcast_shapes(nu.shape, log_mean_exp.shape, g.shape)
            dtype = torch.promote_types(nu.dtype, log_mean_exp.dtype)
            return log_mean_exp.to(dtype).expand(shape).clone()
        # element-wise: a tensor gamma with some entries >= 1 gave log1p(-gamma) = NaN
        # there (and -inf + inf at nu = inf for gamma = 1); those take L as documented
        full = g >= 1
        out = torch.logaddexp(torch.log1p(-torch.where(full, 0.0, g)) + nu,
                              torch.log(g) + log_mean_exp)
        return torch.where(full, log_mean_exp.to(out.dtype), out)


@on_inputs_device
def asgd_update(
    nu: torch.Tensor, log_mean_exp: torch.Tensor, dual_lr: float | torch.Tensor
) -> torch.Tensor:
    r"""One SGD step on the dual: :math:`\nu \leftarrow \nu - \alpha'(1 - \hat g e^{-\nu})`.

    The factor :math:`\hat g e^{-\nu} = e^{L - \nu}` can overflow when ``nu`` lags
    far behind ``L``; that instability is the baseline's own (see the paper).

    Parameters
    ----------
    nu : torch.Tensor of shape (B,)
        Previous dual variables of the anchors in the batch.
    log_mean_exp : torch.Tensor of shape (B,)
        Mini-batch :math:`L_i = \log \frac{1}{k} \sum_j e^{s_{ij}}`.
    dual_lr : float or torch.Tensor broadcastable to (B,)
        The dual learning rate :math:`\alpha'`, >= 0 (0 leaves ``nu`` unchanged).

    Returns
    -------
    torch.Tensor of shape (B,)
        The updated ``nu`` (no gradient is tracked).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import asgd_update
    >>> asgd_update(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), dual_lr=0.1)
    tensor([0.0000, 0.9368])
    """
    # (integer nu truncated dual_lr to 0, a silent no-op step; see sox_update)
    nu, log_mean_exp = _as_float_pair(nu, log_mean_exp)
    _check_number(dual_lr, "dual_lr", low=0.0, low_open=False)  # 0: no dual step
    with torch.no_grad():
        step = _as_tensor(dual_lr, nu, "dual_lr", log_mean_exp)
        return nu - step * (1.0 - torch.exp(log_mean_exp - nu))


@on_inputs_device
def umax_update(
    nu: torch.Tensor, log_mean_exp: torch.Tensor, dual_lr: float | torch.Tensor,
    delta: float,
) -> torch.Tensor:
    r"""U-max: reset :math:`\nu := L` wherever :math:`\nu < L - \delta`, then an ASGD step.

    Resetting first (as in Fagan & Iyengar's U-max and the official KL-DRO and
    pAUC code) bounds :math:`e^{L-\nu} \le e^{\delta}`, so the step cannot
    overflow; the official extreme-classification code steps first and resets
    after.

    Parameters
    ----------
    nu : torch.Tensor of shape (B,)
        Previous dual variables of the anchors in the batch.
    log_mean_exp : torch.Tensor of shape (B,)
        Mini-batch :math:`L_i = \log \frac{1}{k} \sum_j e^{s_{ij}}`.
    dual_lr : float or torch.Tensor broadcastable to (B,)
        The dual learning rate :math:`\alpha'` of the ASGD step.
    delta : float
        Reset threshold (>= 0).

    Returns
    -------
    torch.Tensor of shape (B,)
        The updated ``nu`` (no gradient is tracked).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import umax_update
    >>> nu = torch.tensor([-10.0, 0.0]); L = torch.tensor([0.0, 0.0])
    >>> umax_update(nu, L, dual_lr=0.1, delta=1.0)  # the first is reset to L first
    tensor([0., 0.])
    """
    nu, log_mean_exp = _as_float_pair(nu, log_mean_exp)
    _check_number(delta, "delta", low=0.0, low_open=False)
    with torch.no_grad():
        reset = torch.where(nu < log_mean_exp - delta, log_mean_exp, nu)
        return asgd_update(reset, log_mean_exp, dual_lr)


@on_inputs_device
@requires_tensors
def softplus_dual_ratio(
    scores: torch.Tensor, nu: torch.Tensor, rho: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Mean of :math:`\frac{1}{\rho}\sigma(s_{ij} - \nu_i + \log\rho)` over items.

    It is the "safe KL" analogue of :math:`\hat g e^{-\nu}` used by the
    ASGD (Softplus) baseline, whose dual step is
    :math:`\nu \leftarrow \nu - \alpha'(1 - \text{ratio})`.

    Parameters
    ----------
    scores : torch.Tensor of shape (B, k)
        Scores :math:`s_{ij}` of the ``k`` sampled items of each anchor.
    nu : torch.Tensor of shape (B,)
        Dual variables of the anchors.
    rho : float
        The softplus sharpness :math:`\rho > 0`; as :math:`\rho \to 0` the ratio
        tends to :math:`\hat g e^{-\nu}`, and it never exceeds :math:`1/\rho`.
    mask : torch.Tensor of bool of shape (B, k), optional
        Valid items; ``False`` entries are left out of both the sum and the count
        (a row without any valid item has no mean: NaN). 0/1 integers or floats are
        read as bool; other values raise a ``ValueError``.

    Returns
    -------
    torch.Tensor of shape (B,)
        The per-anchor mean ratio (no gradient is tracked).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import softplus_dual_ratio
    >>> s = torch.zeros(1, 4); nu = torch.zeros(1)
    >>> softplus_dual_ratio(s, nu, rho=1.0)  # sigmoid(0) / 1
    tensor([0.5000])
    """
    # checked: 1D scores (B,) broadcast against nu[:, None] to (B, B) and gave a wrong
    # ratio silently; a bad rho or mismatched shapes failed with cryptic errors
    _check_number(rho, "rho", low=0.0)
    _check_real_dtype(scores, "scores")
    _check_real_dtype(nu, "nu")
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape (B, k), got {tuple(scores.shape)}.")
    if nu.shape != scores.shape[:1]:
        raise ValueError(f"nu must have shape ({scores.shape[0]},) to match scores "
                         f"{tuple(scores.shape)}, got {tuple(nu.shape)}.")
    if mask is not None and tuple(mask.shape) != tuple(scores.shape):
        raise ValueError(f"mask must have the shape of scores {tuple(scores.shape)}, got "
                         f"{tuple(mask.shape)}.")
    with torch.no_grad():
        r = torch.sigmoid(scores - nu[:, None] + math.log(rho)) / rho
        if mask is None:
            return r.mean(dim=-1)
        m = item_mask(mask, r, "softplus_dual_ratio").to(r.dtype)
        return (r * m).sum(-1) / m.sum(-1)
