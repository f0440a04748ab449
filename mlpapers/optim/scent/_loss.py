"""The compositional entropic risk as a torch loss holding the per-anchor dual table."""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal, TypeAlias, get_args

import torch
from torch import nn

from mlpapers._utils import (
    check_in_options,
    check_positive,
    check_real,
    on_inputs_device,
    requires_tensors,
)
from mlpapers.optim.scent._kernels import (
    asgd_update,
    item_mask,
    log_mean_exp,
    softplus_dual_ratio,
    sox_update,
    spmd_gamma,
    spmd_update,
    tempered_log_mean_exp,
    umax_update,
)

__all__ = ["METHODS", "EntropicRiskLoss", "objective"]

#: The type of ``method``.
Method: TypeAlias = Literal["scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"]
#: Names accepted by ``method``.
METHODS: tuple[str, ...] = get_args(Method)


@on_inputs_device
@requires_tensors
def objective(
    scores: torch.Tensor, mask: torch.Tensor | None = None, temperature: float = 1.0
) -> torch.Tensor:
    r"""The exact compositional entropic risk of a full score matrix.

    .. math::

        F = \frac{\tau}{n} \sum_{i=1}^n \log \frac{1}{m_i} \sum_{j=1}^{m_i}
            \exp(s_{ij} / \tau).

    Parameters
    ----------
    scores : torch.Tensor of shape (n, m)
        All scores of all anchors (every item, not a sample).
    mask : torch.Tensor of bool of shape (n, m), optional
        Valid items per anchor; ``False`` entries are left out of both the sum and
        the count :math:`m_i` (an anchor without any valid item makes the value
        ``-inf``). Broadcastable shapes count as broadcast; 0/1 integers or floats
        are read as bool, other values raise a ``ValueError``.
    temperature : float, default=1.0
        :math:`\tau > 0` (the KL-DRO :math:`\lambda`).

    Returns
    -------
    torch.Tensor
        A scalar, differentiable in ``scores``.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import objective
    >>> scores = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    >>> round(float(objective(scores)), 4)  # (log 1 + log e) / 2
    0.5
    >>> round(float(objective(scores, temperature=1e-3)), 4)  # tau -> 0: mean of the maxima
    0.5
    """
    # (tau <= 0 gave NaN or -inf silently; a 0-d tensor tau stays accepted)
    if isinstance(temperature, bool) or not (float(temperature) > 0
                                             and math.isfinite(float(temperature))):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}.")
    # not tau * log_mean_exp(scores / tau) alone: it overflows for a tiny tau and, for a
    # large one, log(mean(exp(.))) of near-zero values rounds to 0 (the value -> the mean)
    if isinstance(scores, torch.Tensor):  # (other types: the kernel's TypeError)
        if scores.ndim == 0:
            raise ValueError("objective: scores must have shape (n, m), got a 0-d tensor.")
        if math.prod(scores.shape[:-1]) == 0:  # the mean over no anchors was NaN
            raise ValueError(f"objective: scores must hold at least one anchor (row), "
                             f"got shape {tuple(scores.shape)}.")
    if mask is not None:
        mask = item_mask(mask, scores, "objective")
    return tempered_log_mean_exp(scores, temperature, mask=mask).mean()


def check_dual_params(gamma, dual_lr, delta, rho) -> None:
    """The baselines' parameters in their ranges (the loss's and the estimators' check)."""
    check_positive(gamma, "gamma")
    if gamma > 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}.")
    check_positive(dual_lr, "dual_lr")
    check_positive(delta, "delta", strict=False)  # 0: the official DRO/pAUC default
    check_positive(rho, "rho")


class EntropicRiskLoss(nn.Module):
    r"""Stochastic surrogate of the compositional entropic risk, one dual variable per anchor.

    Minimises :math:`F(w) = \frac{\tau}{n}\sum_i \log \mathbb{E}_j \exp(s_{ij}(w)/\tau)`
    through the dual :math:`\log m = \min_\nu m e^{-\nu} + \nu - 1`. Each call
    in training mode (the default) updates the dual variables ``nu`` of the
    anchors in the batch (with the rule chosen by ``method``) and returns a
    scalar whose gradient in ``w`` is the method's primal direction, so any
    :mod:`torch.optim` optimizer can take the step. The returned value is the
    mini-batch estimate of the dual objective
    :math:`\tau\,\text{mean}_i[\text{mean}_j e^{s_{ij}/\tau-\nu_i} + \nu_i - 1]`
    (by the dual identity at least the batch's plug-in value
    :math:`\tau\,\text{mean}_i \log \text{mean}_j e^{s_{ij}/\tau}`, except for
    ``"asgd_softplus"``'s smoothed surrogate, with equality where a first visit sets
    :math:`\nu_i` to it; not a bound on :math:`F` itself, which the plug-in
    underestimates; ``"bsgd"`` returns the plug-in).
    In eval mode (``loss_fn.eval()``, or ``.eval()`` of a model holding it) the
    dual table is neither read nor written, as BatchNorm's running statistics,
    and every method returns the plug-in value
    :math:`\tau\,\text{mean}_i \log \text{mean}_j e^{s_{ij}/\tau}` of the batch (a
    validation loss whose indices may be those of another dataset).
    float16 and bfloat16 scores (autocast, ``model.half()``) are computed in
    float32 and the loss is returned in float32, as torch's losses are under
    autocast (a float16 loss would overflow to ``inf`` above 65504, and so would
    ``GradScaler``'s default scale of its gradient).

    Parameters
    ----------
    n_anchors : int
        Size of the dual table (the number of anchors :math:`n`).
    method : {"scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"}, default="scent"
        ``"scent"``: the SPMD closed form of [1]_; ``"sox"``: moving average
        with fixed ``gamma``; ``"bsgd"``: the biased plug-in
        :math:`\text{mean}_i L_i` (no state); ``"asgd"``: SGD on the dual with
        step ``dual_lr`` (primal weights use the *old* ``nu``); ``"umax"``: ASGD
        plus the reset :math:`\nu := L` when :math:`\nu < L - \delta` (primal weights
        use the new ``nu``, after the reset and the step);
        ``"asgd_softplus"``: ASGD on the "safe KL" surrogate with
        :math:`e^x \to \rho^{-1}\log(1+\rho e^x)`.
    log_alpha : float or torch.Tensor, default=0.0
        :math:`\log\alpha` of SCENT. The effective weight
        :math:`\gamma = \sigma(\log\alpha + \nu)` depends on the level of
        ``nu``: choose ``log_alpha`` near :math:`-\nu^*`. May be reassigned
        between steps (schedules); a tensor must broadcast to ``(B,)``.
    temperature : float, default=1.0
        :math:`\tau`; scores are divided by it and the loss multiplied by it.
        ``scores / temperature`` must stay finite in the scores' dtype (float32
        for float16/bfloat16 scores; a ``ValueError`` otherwise, raised before the
        dual table changes).
    gamma : float, default=0.9
        SOX weight in (0, 1].
    dual_lr : float, default=0.1
        Dual step size of ``"asgd"``, ``"umax"``, ``"asgd_softplus"``.
    delta : float, default=1.0
        U-max reset threshold (>= 0; the official KL-DRO and pAUC code use 0,
        its extreme-classification README 1).
    rho : float, default=1e-3
        Softplus smoothing of ``"asgd_softplus"``.
    nu_init : float or None, default=None
        ``None`` sets :math:`\nu_i := L_i` (scaled scores) at an anchor's first
        visit, as the official code does; a float starts every anchor there and
        applies the regular update from the first visit on.

    Attributes
    ----------
    nu : torch.Tensor of shape (n_anchors,), float64
        Dual variables (a buffer; saved in ``state_dict``). It stays float64 when
        the module (or a model holding it) is cast with ``.to(dtype)``,
        ``.float()`` or ``.half()``; device moves apply.
        Anchors never visited hold 0, whatever ``nu_init`` is (``nu_init``
        is applied at the first visit); ``initialized`` tells them apart.
    initialized : torch.Tensor of shape (n_anchors,), bool
        Which anchors were visited (a separate mask, never ``nu == 0``).
    last_stats : dict
        Diagnostics of the last call: ``estimate`` (mean :math:`\tau L_i`),
        and for SCENT ``gamma_mean``/``gamma_min``/``gamma_max`` over the
        ``gamma_count`` anchors that took a SCENT step (absent when every anchor
        of the batch was on its first visit, which sets :math:`\nu := L`).

    References
    ----------
    .. [1] X. Wei, L. Zhou, B. Wang, C.-J. Lin, T. Yang, "A Geometry-Aware
       Efficient Algorithm for Compositional Entropic Risk Minimization",
       ICML 2026, arXiv:2602.02877.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.optim.scent import EntropicRiskLoss
    >>> loss_fn = EntropicRiskLoss(n_anchors=4, log_alpha=0.0)
    >>> w = torch.zeros(3, requires_grad=True)
    >>> feats = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    >>> loss = loss_fn(feats @ w, torch.tensor([0, 3]))
    >>> loss.backward()
    >>> loss_fn.initialized.tolist()
    [True, False, False, True]
    """

    # buffers (registered in __init__)
    nu: torch.Tensor
    initialized: torch.Tensor

    def __init__(
        self,
        n_anchors: int,
        method: Method = "scent",
        log_alpha: float | torch.Tensor = 0.0,
        temperature: float = 1.0,
        gamma: float = 0.9,
        dual_lr: float = 0.1,
        delta: float = 1.0,
        rho: float = 1e-3,
        nu_init: float | None = None,
    ) -> None:
        super().__init__()
        check_positive(n_anchors, "n_anchors", integer=True)
        check_in_options(method, "method", METHODS)
        check_positive(temperature, "temperature")
        check_dual_params(gamma, dual_lr, delta, rho)
        if nu_init is not None and (isinstance(nu_init, bool)
                                    or not isinstance(nu_init, numbers.Real)
                                    or not math.isfinite(nu_init)):
            raise ValueError(f"nu_init must be a finite float or None, got {nu_init!r}.")
        if getattr(log_alpha, "shape", None) == () and not isinstance(log_alpha, torch.Tensor):
            scalar: Any = log_alpha  # 0-d numpy array or numpy scalar
            log_alpha = scalar.item()
        if not isinstance(log_alpha, torch.Tensor) and (
                isinstance(log_alpha, bool) or not isinstance(log_alpha, numbers.Real)
                or not math.isfinite(log_alpha)):
            raise ValueError(f"log_alpha must be a finite real number or a tensor, "
                             f"got {log_alpha!r}.")
        if isinstance(log_alpha, torch.Tensor):
            # (a NaN one filled the dual table with NaN for good; checked once, here)
            check_real(log_alpha, "log_alpha")
            if not bool(torch.isfinite(log_alpha).all()):
                raise ValueError("log_alpha must hold finite values, got a tensor with NaN "
                                 "or inf.")
        self.n_anchors = int(n_anchors)
        self.method = method
        self.log_alpha = log_alpha
        self.temperature = float(temperature)
        self.gamma = gamma
        self.dual_lr = dual_lr
        self.delta = float(delta)
        self.rho = float(rho)
        self.nu_init = nu_init
        self.register_buffer("nu", torch.zeros(self.n_anchors, dtype=torch.float64))
        self.register_buffer("initialized", torch.zeros(self.n_anchors, dtype=torch.bool))
        self.last_stats: dict[str, float] = {}

    def _apply(self, fn, recurse=True):
        # ``.float()``/``.half()``/``.to(dtype)`` (often of an enclosing model) cast every
        # floating buffer: keep the dual table in float64, losslessly (its updates are
        # small against its level), and let only its device follow.
        nu = self.nu
        super()._apply(fn, recurse)
        if self.nu.dtype != torch.float64:
            self.nu = nu.to(device=self.nu.device, dtype=torch.float64)
        return self

    def extra_repr(self) -> str:
        """The summary shown inside ``repr(loss_fn)`` (as :class:`torch.nn.Module` asks).

        Returns
        -------
        str
            ``"n_anchors=..., method=..."``.
        """
        return f"n_anchors={self.n_anchors}, method={self.method!r}"

    def _check_inputs(self, scores, index, mask):
        if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
            raise TypeError("scores must be a floating point torch.Tensor of shape (B, k).")
        if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
            raise ValueError(f"scores must have shape (B, k) with B, k >= 1, got "
                             f"{tuple(scores.shape)}.")
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index)
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise TypeError(f"index must hold integers, got dtype {index.dtype}.")
        if index.ndim != 1 or index.shape[0] != scores.shape[0]:
            raise ValueError(f"index must have shape ({scores.shape[0]},) to match scores, "
                             f"got {tuple(index.shape)}.")
        index = index.to(device=self.nu.device, dtype=torch.long)
        # eval mode never touches the dual table: a validation set's indices need not
        # be anchors of the training set (nor distinct)
        if self.training and (bool((index < 0).any())
                              or bool((index >= self.n_anchors).any())):
            raise ValueError(f"index values must lie in [0, {self.n_anchors}).")
        if (self.training and index.numel() > 1
                and torch.unique(index).numel() != index.numel()):
            raise ValueError("index must not repeat an anchor within one batch.")
        if mask is not None:
            mask = torch.as_tensor(mask, device=scores.device)
            if mask.shape != scores.shape:
                raise ValueError(f"mask must have the shape of scores {tuple(scores.shape)}, "
                                 f"got {tuple(mask.shape)}.")
            mask = item_mask(mask, scores)
            if not bool(mask.any(dim=1).all()):
                raise ValueError("mask must keep at least one item per anchor.")
        return index, mask

    def _check_scaled(self, scores: torch.Tensor, s_det: torch.Tensor) -> None:
        """Finite ``scores / temperature`` (checked once, on the scaled scores)."""
        # finite scores can still overflow once divided by a small temperature, and a
        # temperature beyond the dtype's range turns the returned tau * (...) into inf * 0:
        # both left NaN in the loss and inf in the dual table
        if self.temperature <= torch.finfo(s_det.dtype).max and bool(
                torch.isfinite(s_det).all()):
            return
        if not bool(torch.isfinite(scores.detach()).all()):
            raise ValueError("scores contain NaN or infinity.")
        raise ValueError(
            f"scores / temperature overflow {s_det.dtype} (temperature={self.temperature!r}, "
            f"|scores| up to {float(scores.detach().abs().max()):.3g}): use a temperature in "
            "the units of the scores, or float64 scores.")

    @on_inputs_device
    def forward(
        self, scores: torch.Tensor, index: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Update the anchors' dual variables and return the surrogate loss.

        Parameters
        ----------
        scores : torch.Tensor of shape (B, k)
            Scores :math:`s_{ij}(w)` of the ``B`` anchors in the batch on their
            ``k`` sampled items (differentiable in the model's parameters).
        index : torch.Tensor of int of shape (B,)
            Global dataset indices of the anchors (distinct).
        mask : torch.Tensor of bool of shape (B, k), optional
            Valid items (``False`` entries are ignored); 0/1 integers or floats are
            read as bool, other values raise a ``ValueError``.

        Returns
        -------
        torch.Tensor
            Scalar surrogate; its gradient is the method's primal direction.
        """
        index, mask = self._check_inputs(scores, index, mask)
        if mask is not None:
            # masked items are ignored, whatever they hold: the official code fills them
            # with -inf, padding may hold NaN or huge values. Without this a masked -inf
            # or NaN raised "scores contain NaN or infinity" (and a masked NaN would reach
            # the softplus ratio as NaN * 0); masked_fill gives them a zero gradient.
            scores = scores.masked_fill(~mask, 0.0)
        # a loss built (or moved) inside torch.inference_mode() holds inference buffers,
        # which the in-place dual update below cannot change outside that mode
        if not torch.is_inference_mode_enabled() and (
                self.nu.is_inference() or self.initialized.is_inference()):
            self.nu, self.initialized = self.nu.clone(), self.initialized.clone()
        # attributes set after construction, checked as the constructor does (an unknown
        # method ran asgd_softplus; a negative temperature corrupted the dual table)
        check_in_options(self.method, "method", METHODS)
        check_positive(self.temperature, "temperature")
        check_dual_params(self.gamma, self.dual_lr, self.delta, self.rho)
        tau = self.temperature
        # half-precision scores (autocast, model.half()) are computed and returned in
        # float32, as torch's own losses are under autocast: in float16, exp(s - nu)
        # overflowed once a dual lagged its scores by 11 (an inf loss and gradient where
        # float32 gave 2.6e5; a float16 loss of 1.6e5 is inf too), and bfloat16's 8 bits
        # rounded L, hence the dual update, by ~3e-2 and the gradient by ~3%
        narrow = scores.dtype in (torch.float16, torch.bfloat16)
        s = (scores.float() if narrow else scores) / tau
        s_det = s.detach()
        self._check_scaled(scores, s_det)   # before any change to the dual table
        # L = m + log mean exp(s - m) with m each row's largest valid score, summed in
        # float64 (the dual table's dtype): rounded to float32, whose step near 3e7 is 2,
        # L of [0, 3e7] was 3e7, not 3e7 - log 2, and the gradient of the large score
        # came out 0.5, not 1. The shifted part is exact in the scores' dtype (s - m is
        # exact where it matters, within a factor 2 of m), so no float64 copy of s
        work = torch.float64
        shift = (s_det if mask is None else s_det.masked_fill(~mask, -math.inf)).amax(dim=1)
        L = shift.to(work) + log_mean_exp(s_det - shift[:, None], mask=mask).to(work)  # (B,)
        self.last_stats = {"estimate": float(tau * L.mean())}
        if self.method == "bsgd" or not self.training:
            # eval mode (``loss_fn.eval()``, or ``model.eval()`` of a model holding it),
            # as BatchNorm's running statistics: the dual table is neither read nor
            # written, and the value is the exact mini-batch risk tau * mean_i L_i (the
            # dual objective at its minimum over nu). A validation pass in eval mode
            # overwrote the training duals of its indices.
            # (shifted as L: the softmax weights of the gradient come from s - m exactly)
            out = tau * (shift.to(work)
                         + log_mean_exp(s - shift[:, None], mask=mask).to(work)).mean()
            return out.to(s.dtype)

        L64 = L.to(device=self.nu.device)
        old = self.nu[index]
        first = ~self.initialized[index]
        if self.nu_init is not None:
            old = torch.where(first, torch.full_like(old, float(self.nu_init)), old)
            fresh = torch.zeros_like(first)
        else:
            old = torch.where(first, L64, old)
            fresh = first
        m = self.method
        if m == "scent":
            log_alpha = self.log_alpha
            if isinstance(log_alpha, torch.Tensor):
                log_alpha = log_alpha.to(device=old.device, dtype=work)
            new = spmd_update(old, L64, log_alpha)
            # only anchors that took a SCENT step: a first visit sets nu := L whatever
            # gamma is, so its gamma would report a step that did not happen
            stepped = ~fresh
            g = spmd_gamma(old, log_alpha).expand_as(old)[stepped]
            if g.numel():
                self.last_stats.update(gamma_mean=float(g.mean()), gamma_min=float(g.min()),
                                       gamma_max=float(g.max()), gamma_count=int(g.numel()))
            for_grad = new
        elif m == "sox":
            new = sox_update(old, L64, self.gamma)
            for_grad = new
        elif m == "asgd":
            new = asgd_update(old, L64, self.dual_lr)
            for_grad = old
        elif m == "umax":
            new = umax_update(old, L64, self.dual_lr, self.delta)
            for_grad = new
        else:  # asgd_softplus
            ratio = softplus_dual_ratio(s_det.to(work), old.to(s.device), self.rho, mask)
            new = old - self.dual_lr * (1.0 - ratio.to(old.device))
            for_grad = old
        new = torch.where(fresh, L64, new)
        for_grad = torch.where(fresh, L64, for_grad)
        self.nu[index] = new
        self.initialized[index] = True

        # s - nu from the float64 nu split into the scores' dtype as hi + lo: rounding
        # nu to that dtype moved the weights e^{s - nu} by a factor e^{ulp} (s - hi is
        # exact for s near nu, the terms that matter); the loss in s's dtype
        nu_g = for_grad.to(device=s.device)
        if s.dtype == work:
            diff = s - nu_g[:, None]
        else:
            hi = nu_g.to(s.dtype)
            lo = torch.where(torch.isfinite(hi), nu_g - hi.to(work), 0.0).to(s.dtype)
            diff = (s - hi[:, None]) - lo[:, None]
        if mask is not None:  # padded items may hold any value: exp(big) * 0 would be NaN
            diff = diff.masked_fill(~mask, float("-inf"))
        if m == "asgd_softplus":
            # not F.softplus: its default threshold=20 returns x itself above 20, off
            # by e^-20 (2e-9 relative in the float64 gradient); logaddexp is exact
            z = diff + math.log(self.rho)
            terms = torch.logaddexp(z, torch.zeros_like(z)) / self.rho
        else:
            terms = torch.exp(diff)
        if mask is None:
            inner = terms.mean(dim=1)
        else:
            mf = mask.to(terms.dtype)
            inner = (terms * mf).sum(1) / mf.sum(1)
        out = tau * (inner.to(work) + nu_g - 1.0).mean()
        return out.to(s.dtype)

