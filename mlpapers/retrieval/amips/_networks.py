r"""The two amortized-MIPS architectures: SupportNet (input convex) and KeyNet.

Both share one layer stack of ``depth`` hidden layers of width ``w``:

.. math::

    z_1 = \phi(W_{x,0} x + b_1), \quad
    z_l = \phi(W_{z,l} z_{l-1} + [W_{x,l} x] + b_l), \quad
    \text{out} = W_{z,L} z_{L} + W_{x,L} x + b_{L+1},

where the input re-injection ``[W_{x,l} x]`` is present every ``wx_inject`` layers
and always at the (linear) output layer, and
:math:`\phi(t) = a t + (1-a)\,\mathrm{softplus}(\beta t)/\beta` is the
soft-leaky-ReLU (convex, increasing). (The official ott-jax networks also apply
:math:`\phi` after the output layer and re-inject at the output only when ``depth``
is a multiple of ``wx_inject``; see the user guide for why and what it measured.)
SupportNet keeps :math:`W_z \ge 0` through a
softplus rectifier, which makes the scalar output convex in :math:`x`; KeyNet
leaves :math:`W_z` free and outputs a vector in :math:`\mathbb{R}^d`.

Every model exposes ``score_and_key(x, create_graph)`` returning the estimated
support value :math:`\hat\sigma(x)` and key :math:`\hat k(x)`: the gradient for a
scalar potential, the output itself for KeyNet (with the Euler score
:math:`\langle x, \hat k(x)\rangle`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from mlpapers._utils import (
    check_bool,
    check_float32_param,
    check_positive,
    common_float_dtype,
    on_inputs_device,
    requires_tensors,
    row_power_of_two,
    seeded_linear,
    usable_outside_inference,
)

__all__ = [
    "Homogenize",
    "KeyNet",
    "SupportFunction",
    "SupportNet",
    "solve_width",
    "soft_leaky_relu",
]


@on_inputs_device
@requires_tensors
def soft_leaky_relu(x: torch.Tensor, negative_slope: float = 0.1,
                    beta: float = 20.0) -> torch.Tensor:
    r""":math:`a x + (1-a)\,\mathrm{softplus}(\beta x)/\beta`, a smooth convex leaky ReLU.

    Computed with :func:`torch.nn.functional.softplus` (overflow-safe). It is
    convex and increasing for :math:`0 \le a < 1`, tends to ``leaky_relu(x, a)`` as
    :math:`\beta \to \infty`, and is the activation of :class:`SupportNet` and
    :class:`KeyNet`.

    Parameters
    ----------
    x : torch.Tensor of any shape
        Pre-activations.
    negative_slope : float, default=0.1
        Slope :math:`a` far on the negative side (the slope tends to 1 on the positive
        side), in ``[0, 1)``.
    beta : float, default=20.0
        Sharpness :math:`\beta > 0` of the softplus; the kink at 0 is smoothed over a
        width of about :math:`1/\beta`.

    Returns
    -------
    torch.Tensor
        The activation, of the shape and dtype of ``x``.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import soft_leaky_relu
    >>> soft_leaky_relu(torch.tensor([-1.0, 0.0, 1.0]))
    tensor([-0.1000,  0.0312,  1.0000])
    """
    if not isinstance(negative_slope, torch.Tensor) and not isinstance(beta, torch.Tensor):
        check_activation(negative_slope, beta)  # (tensors: the caller's to keep in range)
    # (integer inputs failed in softplus: "not implemented for 'Long'")
    return _soft_leaky_relu(x.to(common_float_dtype(x)), negative_slope, beta)


def check_activation(negative_slope: float, beta: float) -> None:
    """``0 <= negative_slope < 1`` and ``beta > 0``, where :func:`soft_leaky_relu` is
    convex and increasing (SupportNet's convexity rests on it): ``beta <= 0`` gave
    infinite or concave activations and a NaN slope NaN ones, without an error."""
    check_positive(negative_slope, "negative_slope", strict=False)
    if negative_slope >= 1:
        raise ValueError(f"negative_slope must be in [0, 1), got {negative_slope}.")
    # softplus takes beta as a float32 scalar: torch refused a larger one with "value
    # cannot be converted to type float without overflow"
    check_float32_param(beta, "beta")


def _soft_leaky_relu(x: torch.Tensor, negative_slope: float, beta: float) -> torch.Tensor:
    """:func:`soft_leaky_relu` without the checks (the networks check their parameters
    once, when they are built)."""
    # softplus's default threshold=20 switches to the line beta*x above 20, a drop of
    # e^-20/beta that broke monotonicity at the 1e-9 level; e^-40 is below float64's eps
    threshold = 40.0 if x.dtype == torch.float64 else 20.0
    return negative_slope * x + (1.0 - negative_slope) * F.softplus(x, beta=beta,
                                                                   threshold=threshold)


def _inject_layers(depth: int, wx_inject: bool | int) -> list[bool]:
    """Whether layer ``l = 1..depth`` (``depth`` = output layer) re-injects ``x``."""
    # as AmortizedMIPS checks it: the modules took -1 as "every layer" (bool(-1)) and a
    # float 3.0 as 3, where the estimator refuses both
    if not isinstance(wx_inject, numbers.Integral):
        raise TypeError(f"wx_inject must be a bool or an int, got {wx_inject!r}.")
    if wx_inject < 0:
        raise ValueError(f"wx_inject must be >= 0 (0 or False: no re-injection), "
                         f"got {wx_inject!r}.")
    if isinstance(wx_inject, bool) or wx_inject == 0:
        mask = [bool(wx_inject)] * (depth - 1)
    else:
        mask = [(l % wx_inject) == 0 for l in range(1, depth)]
    return [*mask, True]


@on_inputs_device
def solve_width(budget: float, in_features: int, out_features: int, depth: int,
                wx_inject: bool | int = 4, bias: bool = True, multiple: int = 4,
                min_width: int = 16) -> int:
    """Hidden width from a parameter budget, as the official width solver computes it.

    The official solver (``rectangular_dims`` of ``apple/ml-amips``) solves
    ``(depth-1) w^2 + (d + out + bias*depth + n_inj*d) w + bias*(out-1) = budget``
    for ``w``, ``n_inj`` the number of hidden layers after the first that re-inject
    the input. This counts every weight of :class:`SupportNet` / :class:`KeyNet`
    except the output layer's input weights (``d * out``) and one output bias, so
    the network has about ``d * out`` parameters more than ``budget`` (the widths,
    hence the models, are the official ones). ``budget`` is rounded up to an
    integer, the width rounded to a multiple of ``multiple`` and clipped below at
    ``min_width`` (the official code clips at ``multiple``).

    Parameters
    ----------
    budget : float
        Target number of parameters (:class:`AmortizedMIPS` passes
        ``params_fraction * n_keys * n_features``).
    in_features : int
        Input dimension ``d``.
    out_features : int
        Output dimension (``d`` for :class:`KeyNet`, 1 for :class:`SupportNet`).
    depth : int
        Number of hidden layers (all of the solved width).
    wx_inject : bool or int, default=4
        Re-injection period of the input, as in :class:`SupportNet` (it changes the
        count of input weights).
    bias : bool, default=True
        Whether the layers have biases.
    multiple : int, default=4
        The width is rounded to a multiple of this.
    min_width : int, default=16
        Smallest width returned.

    Returns
    -------
    int
        The hidden width ``w``.

    Examples
    --------
    >>> from mlpapers.retrieval.amips import solve_width
    >>> solve_width(0.2 * 1000 * 64, in_features=64, out_features=64, depth=8)
    32
    >>> solve_width(100, in_features=4, out_features=4, depth=2)  # clipped at min_width
    16
    """
    check_bool(bias, "bias")
    # (a negative budget or a zero or negative size returned the minimum width, a zero
    # multiple divided by zero)
    check_positive(budget, "budget", strict=False)
    for value, name in ((in_features, "in_features"), (out_features, "out_features"),
                        (depth, "depth"), (multiple, "multiple"), (min_width, "min_width")):
        check_positive(value, name, integer=True)
    n_inj = sum(_inject_layers(depth, wx_inject)[:-1])
    a = depth - 1
    b = in_features + out_features + int(bias) * depth + n_inj * in_features
    c = int(bias) * (out_features - 1) - math.ceil(budget)
    if a == 0:
        w = -c / b
    else:
        w = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)
    w = max(int(round(w / multiple) * multiple), multiple)
    return max(w, min_width)


class _Stack(nn.Module):
    """The shared layer stack; ``positive`` selects the ICNN constraint on ``W_z``."""

    def __init__(self, in_features: int, hidden_dims: Sequence[int], out_features: int, *,
                 wx_inject: bool | int, negative_slope: float, beta: float, bias: bool,
                 positive: bool, generator: torch.Generator | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        check_positive(in_features, "in_features", integer=True)
        if isinstance(hidden_dims, (str, bytes)) or not isinstance(hidden_dims, Iterable):
            raise TypeError(f"hidden_dims must be a list of ints, got {hidden_dims!r}.")
        hidden_dims = list(hidden_dims)
        if len(hidden_dims) < 1:
            raise ValueError("hidden_dims must contain at least one width.")
        for h in hidden_dims:  # floats, bools and strings were cast, 0 divided by zero
            check_positive(h, "hidden_dims entries", integer=True)
        check_activation(negative_slope, beta)
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.hidden_dims = [int(h) for h in hidden_dims]
        self.negative_slope = float(negative_slope)
        self.beta = float(beta)
        self.positive = positive
        depth = len(hidden_dims)
        self.inject = _inject_layers(depth, wx_inject)
        dims = [*self.hidden_dims, self.out_features]
        # a generator draws on its own device, so the layers are made there (under a
        # CUDA default device a CPU generator was a torch error, or split the module)
        where = contextlib.nullcontext() if generator is None else torch.device(generator.device)
        with where:
            self.wx0 = seeded_linear(in_features, dims[0], bias=bias, generator=generator,
                                     dtype=dtype)
            # z-path weights: raw parameters (softplus-rectified when positive)
            self.wz = nn.ParameterList([nn.Parameter(torch.empty(dims[l + 1], dims[l],
                                                                 dtype=dtype))
                                        for l in range(depth)])
            self.wx = nn.ModuleList(
                [seeded_linear(in_features, dims[l + 1], bias=False, generator=generator,
                               dtype=dtype) if self.inject[l]
                 else nn.Identity() for l in range(depth)]
            )
            self.bias = nn.ParameterList(
                [nn.Parameter(torch.zeros(dims[l + 1], dtype=dtype)) for l in range(depth)]
                if bias else []
            )
            self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw the z-path weights (from ``generator``, else torch's global RNG)."""
        for l, w in enumerate(self.wz):
            fan_in = w.shape[1]
            if self.positive:
                # effective weights |N(0, 1/fan_in)|; rescaled/centred by data_init
                with torch.no_grad():
                    eff = torch.randn(w.shape, generator=generator, dtype=w.dtype,
                                      device=w.device)
                    eff = eff.abs().mul_(1.0 / math.sqrt(fan_in)).clamp_min_(1e-6)
                    w.copy_(_inv_softplus(eff))
            else:
                gain = 1.0 if l == len(self.wz) - 1 else math.sqrt(2.0)
                nn.init.normal_(w, std=gain / math.sqrt(fan_in), generator=generator)

    def effective_wz(self) -> list[torch.Tensor]:
        """The z-path weight matrices actually used (non-negative for SupportNet)."""
        return [F.softplus(w) if self.positive else w for w in self.wz]

    def _layer(self, l: int, z: torch.Tensor, x: torch.Tensor, wz: torch.Tensor) -> torch.Tensor:
        pre = z @ wz.T
        if self.inject[l]:
            pre = pre + self.wx[l](x)
        if len(self.bias):
            pre = pre + self.bias[l]
        return pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self._act
        z = act(self.wx0(x))
        wzs = self.effective_wz()
        last = len(wzs) - 1
        for l, wz in enumerate(wzs):
            pre = self._layer(l, z, x, wz)
            z = pre if l == last else act(pre)
        return z

    def _act(self, t: torch.Tensor) -> torch.Tensor:
        return _soft_leaky_relu(t, self.negative_slope, self.beta)

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> None:
        """Centre and scale each hidden pre-activation on a batch ``x`` (LSUV-style).

        Weights into a unit are multiplied by a positive factor (which keeps
        ``W_z >= 0``) so the unit's pre-activation has unit standard deviation on
        ``x``, and the bias (if any) is set so that its mean is 0. The output layer is
        left alone. This replaces the "principled" ICNN initialisation of the official
        code (a log-normal draw of the weights) by a data-dependent one with the
        same aim (unit-scale pre-activations); the two do not give the same weights.
        """
        pre = x @ self.wx0.weight.T
        s = _unit_spread(pre)
        self.wx0.weight.div_(s[:, None])
        if self.wx0.bias is not None:
            self.wx0.bias.copy_(-(pre / s).mean(0))
        z = self._act(self.wx0(x))
        for l in range(len(self.wz) - 1):
            wz = self.effective_wz()[l]
            pre = z @ wz.T + (self.wx[l](x) if self.inject[l] else 0.0)
            s = _unit_spread(pre)
            if self.positive:
                self.wz[l].copy_(_inv_softplus((wz / s[:, None]).clamp_min(1e-12)))
            else:
                self.wz[l].div_(s[:, None])
            if self.inject[l]:
                cast(nn.Linear, self.wx[l]).weight.div_(s[:, None])
            if len(self.bias):
                mean = (pre / s).mean(0)
                self.bias[l].copy_(-mean)
                z = self._act(pre / s - mean)
            else:  # without biases nothing centres the unit: pass on what forward computes
                z = self._act(pre / s)

    @torch.no_grad()
    def scale_output(self, c: float) -> None:
        """Multiply the (affine) output layer by ``c > 0``: the output becomes ``c * out``."""
        c = float(check_positive(c, "c"))
        wz = self.effective_wz()[-1] * c
        if self.positive:
            # (clamped at the dtype's smallest normal only: a larger floor broke c * out
            # for small c, the input path being scaled exactly)
            self.wz[-1].copy_(_inv_softplus(wz.clamp_min(torch.finfo(wz.dtype).tiny)))
        else:
            self.wz[-1].copy_(wz)
        cast(nn.Linear, self.wx[-1]).weight.mul_(c)  # (the output layer always injects x)
        if len(self.bias):
            self.bias[-1].mul_(c)


def _unit_spread(pre: torch.Tensor) -> torch.Tensor:
    """Per-unit standard deviation of the pre-activations ``pre`` (n, units) on a batch,
    1 where it is round-off or undefined (identical rows, one row): dividing by it
    there multiplied the weights by up to 1e6 and blew the model up."""
    if pre.shape[0] < 2:
        return torch.ones(pre.shape[1], dtype=pre.dtype, device=pre.device)
    s = pre.std(0)
    noise = 64 * torch.finfo(pre.dtype).eps * pre.abs().amax(0)
    return torch.where(s > noise, s, torch.ones_like(s))


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    """Inverse of softplus for y > 0, stable for large and tiny y."""
    return y + torch.log(-torch.expm1(-y))


class SupportNet(nn.Module):
    r"""Input-convex network :math:`h: \mathbb{R}^d \to \mathbb{R}` (the paper's SupportNet).

    Convex in its input because the z-path weights are non-negative (softplus
    rectifier), the activation is convex and increasing and the input enters
    only through affine maps. Wrap it in :class:`Homogenize` to obtain a
    1-homogeneous potential, as the official code does by default.

    Parameters
    ----------
    in_features : int
        Input dimension ``d``.
    hidden_dims : list or tuple of int
        Widths of the ``depth`` hidden layers.
    wx_inject : bool or int, default=4
        Re-inject the input every ``wx_inject`` layers (``True``: every layer).
        The output layer always has an input term.
    negative_slope, beta : float, default=0.1, 20.0
        Soft-leaky-ReLU parameters.
    bias : bool, default=True
        Give every layer (hidden and output) a bias.
    generator : torch.Generator or None, default=None
        Source of the random initialisation; ``None`` draws from torch's global RNG
        (as ``torch.nn`` layers do), a generator leaves the global RNG untouched.
    dtype : torch.dtype or None, default=None
        Dtype of the parameters; ``None`` is torch's default dtype (as for ``torch.nn``
        layers).

    Notes
    -----
    Shapes: ``forward`` maps (n, d) to (n,).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import SupportNet
    >>> net = SupportNet(3, [16, 16], generator=torch.Generator().manual_seed(0))
    >>> a, b = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))
    >>> value, grad = net.score_and_key(a)
    >>> value.shape, grad.shape
    (torch.Size([5]), torch.Size([5, 3]))
    >>> bool((net((a + b) / 2) <= (net(a) + net(b)) / 2 + 1e-6).all())  # convex
    True
    """

    def __init__(self, in_features: int, hidden_dims: Sequence[int], *,
                 wx_inject: bool | int = 4,
                 negative_slope: float = 0.1, beta: float = 20.0, bias: bool = True,
                 generator: torch.Generator | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        check_bool(bias, "bias")
        self.stack = _Stack(in_features, hidden_dims, 1, wx_inject=wx_inject,
                            negative_slope=negative_slope, beta=beta, bias=bias, positive=True,
                            generator=generator, dtype=dtype)

    @on_inputs_device
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The potential :math:`h(x)`.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Inputs, of the parameters' dtype.

        Returns
        -------
        torch.Tensor of shape (n,)
            The values, convex in ``x``.
        """
        return self.stack(x)[..., 0]

    def effective_wz(self) -> list[torch.Tensor]:
        """The z-path weight matrices actually used (softplus of the raw parameters).

        Returns
        -------
        list of torch.Tensor
            One non-negative matrix per layer after the first, of shape
            ``(width_out, width_in)`` (the last one of shape ``(1, hidden_dims[-1])``),
            differentiable in the raw parameters.
        """
        return self.stack.effective_wz()

    def data_init(self, x: torch.Tensor) -> None:
        r"""Data-dependent (LSUV-style) initialisation on a batch of inputs, in place.

        Each hidden unit's incoming weights are multiplied by a positive factor (which
        keeps :math:`W_z \ge 0`) so that its pre-activation has unit standard deviation
        on ``x``, and its bias is set so that the mean is 0; the output layer is left
        alone. It replaces the "principled" ICNN initialisation of the official code.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            A representative batch of inputs; units without spread on it (one
            row, identical rows) are centred but not rescaled.
        """
        self.stack.data_init(x)

    def scale_output(self, c: float) -> None:
        """Scale the output (and hence the gradient) by ``c > 0``, in place; keeps convexity.

        Parameters
        ----------
        c : float
            Positive factor; the model then computes ``c * h(x)``.
        """
        self.stack.scale_output(c)

    @on_inputs_device
    def score_and_key(self, x: torch.Tensor, create_graph: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Value ``h(x)`` of shape (n,) and gradient of shape (n, d).

        ``create_graph=True`` keeps the graph of both (double backprop) when grad mode is
        on; under ``no_grad`` or ``inference_mode`` the results carry no graph.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries.
        create_graph : bool, default=False
            Keep the graph of the value and the gradient, to train on the gradient
            (double backprop); ``False`` returns detached tensors.

        Returns
        -------
        value : torch.Tensor of shape (n,)
            The estimated support value :math:`h(x)`.
        key : torch.Tensor of shape (n, d)
            The estimated argmax key :math:`\nabla h(x)`.
        """
        return _value_and_grad(self, x, create_graph)


def _norm_and_direction(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Row norms (..., 1) and unit directions of ``x`` (..., d), free of under/overflow.

    Each row is divided by ``s``, a power of two within a factor 2 of ``max|x_i|``
    (``row_power_of_two``): an exact rescaling (no rounding), after which the squares
    of the norm neither underflow nor overflow, so ``||x|| = s ||x/s||`` and
    ``x/||x|| = (x/s)/||x/s||`` are the plain formulas' floating-point results
    wherever those do not under- or overflow (bitwise), and correct where they do.
    ``s`` is a constant to autograd (the value does not depend on it), so the gradient
    is that of ``||x|| h(x/||x||)``.
    A clamp at ``eps``, as before, made rows of norm below ``eps`` (1e-12) lose
    homogeneity: ``Homogenize(h)(c x) != c Homogenize(h)(x)`` and wrong keys.
    """
    s = row_power_of_two(x)
    y = x / s
    ny = y.norm(dim=-1, keepdim=True)
    return s * ny, y / ny.clamp_min(eps)


class Homogenize(nn.Module):
    r"""Positively 1-homogeneous wrapper :math:`f(x) = \|x\|\, h(x / \|x\|)`.

    Then :math:`f(cx) = c f(x)` for :math:`c > 0`, the gradient is 0-homogeneous
    and Euler's identity :math:`\langle x, \nabla f(x)\rangle = f(x)` holds, like
    for the true support function. (Homogenization does not preserve convexity
    in general.) This holds for rows of any norm in the dtype's normal range: the
    norm and the direction are computed on the row divided by a power of two near
    its largest entry (an exact rescaling), so tiny rows (:math:`\|x\|` below
    ``eps``, or whose squares underflow) and huge ones (whose squares overflow)
    get the direction of :math:`x`. At :math:`x = 0` the value is 0.

    Parameters
    ----------
    model : nn.Module
        Scalar model ``h``: (n, d) -> (n,).
    eps : float, default=1e-12
        Lower bound on the rescaled norm in the division :math:`x / \|x\|`; it only
        acts at ``x = 0`` (the rescaled norm of any other row is at least 1), whose
        value is then 0, without a NaN.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import Homogenize, SupportNet
    >>> f = Homogenize(SupportNet(3, [16], generator=torch.Generator().manual_seed(0)))
    >>> x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    >>> torch.allclose(f(2.5 * x), 2.5 * f(x))  # positively 1-homogeneous
    True
    >>> value, key = f.score_and_key(x)
    >>> torch.allclose((x * key).sum(-1), value, atol=1e-5)  # Euler's identity
    True
    """

    def __init__(self, model: nn.Module, eps: float = 1e-12):
        super().__init__()
        check_positive(eps, "eps")  # (a NaN gave NaN values, a negative one no floor)
        self.model = model
        self.eps = eps

    @on_inputs_device
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r"""The homogenized value :math:`\|x\|\, h(x / \|x\|)`.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Inputs.

        Returns
        -------
        torch.Tensor of shape (n,)
            The values (0 where ``x = 0``).
        """
        norm, unit = _norm_and_direction(x, self.eps)
        return norm[..., 0] * self.model(unit)

    def data_init(self, x: torch.Tensor) -> None:
        """The wrapped model's ``data_init`` on the normalised inputs ``x / ||x||``.

        Nothing happens if the wrapped model has no ``data_init``.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            A representative batch of inputs.
        """
        model: Any = self.model  # (duck-typed: any scalar model, with or without it)
        if hasattr(model, "data_init"):
            model.data_init(_norm_and_direction(x, self.eps)[1])

    def scale_output(self, c: float) -> None:
        """Scale the output by ``c > 0``, in place (the wrapped model's ``scale_output``).

        Parameters
        ----------
        c : float
            Positive factor; the model then computes ``c * f(x)``.
        """
        model: Any = self.model  # (duck-typed: the wrapped model's own method)
        model.scale_output(check_positive(c, "c"))

    @on_inputs_device
    def score_and_key(self, x: torch.Tensor, create_graph: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Value ``f(x)`` of shape (n,) and gradient of shape (n, d).

        ``create_graph=True`` keeps the graph of both (double backprop) when grad mode is
        on; under ``no_grad`` or ``inference_mode`` the results carry no graph.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries.
        create_graph : bool, default=False
            Keep the graph of the value and the gradient (double backprop); ``False``
            returns detached tensors.

        Returns
        -------
        value : torch.Tensor of shape (n,)
            The estimated support value :math:`f(x)`.
        key : torch.Tensor of shape (n, d)
            The estimated argmax key :math:`\nabla f(x)` (0-homogeneous in ``x``).
        """
        return _value_and_grad(self, x, create_graph)


class KeyNet(nn.Module):
    r"""Unconstrained network :math:`\mathbb{R}^d \to \mathbb{R}^d` predicting the argmax key.

    The support value is estimated by Euler's identity
    :math:`\hat\sigma(x) = \langle x, \mathrm{KeyNet}(x)\rangle`.

    Parameters
    ----------
    in_features : int
        Input (and output) dimension ``d``.
    hidden_dims : list or tuple of int
        Widths of the ``depth`` hidden layers (at least one).
    wx_inject : bool or int, default=4
        Re-inject the input every ``wx_inject`` layers (``True``: every layer, ``0``
        or ``False``: never). The output layer always has an input term.
    negative_slope : float, default=0.1
        Slope :math:`a` of the soft-leaky-ReLU on the negative side, in ``[0, 1)``
        (see :func:`soft_leaky_relu`).
    beta : float, default=20.0
        Sharpness :math:`\beta` of the soft-leaky-ReLU.
    bias : bool, default=True
        Give every layer (hidden and output) a bias.
    resnet : bool, default=False
        Return ``x + F(x)`` instead of ``F(x)``.
    generator : torch.Generator or None, default=None
        Source of the random initialisation; ``None`` draws from torch's global RNG
        (as ``torch.nn`` layers do), a generator leaves the global RNG untouched.
    dtype : torch.dtype or None, default=None
        Dtype of the parameters; ``None`` is torch's default dtype (as for ``torch.nn``
        layers).

    Notes
    -----
    Shapes: ``forward`` maps (n, d) to (n, d).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import KeyNet
    >>> net = KeyNet(3, [16, 16], generator=torch.Generator().manual_seed(0))
    >>> x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    >>> score, key = net.score_and_key(x)
    >>> score.shape, key.shape
    (torch.Size([5]), torch.Size([5, 3]))
    >>> torch.allclose(score, (x * net(x)).sum(-1))  # the Euler score
    True
    """

    def __init__(self, in_features: int, hidden_dims: Sequence[int], *,
                 wx_inject: bool | int = 4,
                 negative_slope: float = 0.1, beta: float = 20.0, bias: bool = True,
                 resnet: bool = False, generator: torch.Generator | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        check_bool(bias, "bias")
        check_bool(resnet, "resnet")
        self.resnet = resnet
        self.stack = _Stack(in_features, hidden_dims, in_features, wx_inject=wx_inject,
                            negative_slope=negative_slope, beta=beta, bias=bias, positive=False,
                            generator=generator, dtype=dtype)

    @on_inputs_device
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted key ``F(x)`` (``x + F(x)`` with ``resnet=True``).

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries.

        Returns
        -------
        torch.Tensor of shape (n, d)
            The predicted argmax keys.
        """
        out = self.stack(x)
        return x + out if self.resnet else out

    def data_init(self, x: torch.Tensor) -> None:
        """Data-dependent (LSUV-style) initialisation on a batch of inputs, in place.

        The weights into each hidden unit are rescaled so that its pre-activation has
        unit standard deviation on ``x``, and its bias is set so that the mean is 0;
        the output layer is left alone.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            A representative batch of queries; units without spread on it (one
            row, identical rows) are centred but not rescaled.
        """
        self.stack.data_init(x)

    def scale_output(self, c: float) -> None:
        """Scale the branch ``F`` (the residual branch with ``resnet=True``) by ``c > 0``.

        Parameters
        ----------
        c : float
            Positive factor, applied in place to the output layer.
        """
        self.stack.scale_output(c)

    @on_inputs_device
    def score_and_key(self, x: torch.Tensor, create_graph: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Euler score ``<x, key>`` of shape (n,) and key of shape (n, d).

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries.
        create_graph : bool, default=False
            Unused (accepted for the common interface of the models): the key is the
            network's output, whose graph follows the caller's grad mode.

        Returns
        -------
        score : torch.Tensor of shape (n,)
            The Euler score :math:`\langle x, \hat k(x)\rangle`.
        key : torch.Tensor of shape (n, d)
            The predicted key :math:`\hat k(x)`.
        """
        key = self(x)
        return (x * key).sum(-1), key


class SupportFunction(nn.Module):
    r"""The exact support function :math:`\sigma_K(x) = \max_i \langle x, k_i\rangle` as a model.

    The oracle the amortized models imitate: convex, 1-homogeneous, with
    gradient equal to the argmax key. Useful to validate losses and metrics.

    Parameters
    ----------
    keys : torch.Tensor of shape (N, d)
        The database of keys (registered as a buffer: it follows ``.to(device)``).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import SupportFunction
    >>> sigma = SupportFunction(torch.eye(2))
    >>> value, key = sigma.score_and_key(torch.tensor([[1.0, 2.0]]))
    >>> value, key
    (tensor([2.]), tensor([[0., 1.]]))
    """

    keys: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, keys: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("keys", keys)

    @on_inputs_device
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r"""The support value :math:`\max_i \langle x, k_i\rangle`.

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries, of the keys' dtype.

        Returns
        -------
        torch.Tensor of shape (n,)
            The largest inner product of each query.
        """
        return (x @ self.keys.T).max(dim=-1).values

    @on_inputs_device
    def score_and_key(self, x: torch.Tensor, create_graph: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Exact support value and argmax key (the gradient of the value).

        Parameters
        ----------
        x : torch.Tensor of shape (n, d)
            Queries.
        create_graph : bool, default=False
            Keep the graph of both results (as for :class:`SupportNet`).

        Returns
        -------
        value : torch.Tensor of shape (n,)
            :math:`\sigma_K(x)`.
        key : torch.Tensor of shape (n, d)
            The maximising key :math:`k_{i^*}` (one of them on exact ties).
        """
        return _value_and_grad(self, x, create_graph)


def _value_and_grad(model: nn.Module, x: torch.Tensor, create_graph: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Value and input gradient of a scalar model; double-backprop ready when asked.

    ``create_graph`` respects the caller's grad mode: under ``torch.no_grad()`` or
    ``torch.inference_mode()`` the results carry no graph (as for :class:`KeyNet`).
    """
    if create_graph and torch.is_grad_enabled():
        with torch.enable_grad():
            if not x.requires_grad:
                # (an inference tensor cannot be made to require grad: a normal copy)
                x = usable_outside_inference(x).detach().requires_grad_(True)
            value = model(x)
            (grad,) = torch.autograd.grad(value.sum(), x, create_graph=True)
        return value, grad
    if any(t.is_inference() for t in itertools.chain(model.parameters(), model.buffers())):
        # a module built under torch.inference_mode(): autograd cannot save its weights
        # for backward, torch.func.grad can use them (it refuses saved-tensor hooks)
        def total(inp):
            v = model(inp)
            return v.sum(), v

        grad, value = torch.func.grad(total, has_aux=True)(x.detach())
        return value.detach(), grad.detach()
    # no graph kept (inference, or the caller's no_grad / inference_mode): plain autograd
    # on a detached copy, the graph dropped afterwards; the same values as torch.func.grad,
    # bitwise, which refused the caller's saved-tensor hooks (autograd.graph.save_on_cpu)
    # and a user's BatchNorm in train mode (its forward updates statistics in place)
    with torch.inference_mode(False), torch.enable_grad():
        xi = usable_outside_inference(x).detach().requires_grad_(True)
        value = model(xi)
        (grad,) = torch.autograd.grad(value.sum(), xi)
    return value.detach(), grad.detach()


#: The networks :class:`AmortizedMIPS` builds (``model_``).
AMIPSNetwork = SupportNet | Homogenize | KeyNet
