"""Supports given by functions: convex level sets and non-convex regions.

:class:`ConvexSet` is a convex container ``{x : g(x) <= 0}`` whose hitting time
is found by bracketed root finding (no closed form); :class:`Region` describes a
non-convex support ``S`` used only for thinning (membership test), never for
reflections.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mlpapers._utils import (
    ArrayLike,
    autograd_enabled,
    check_positive,
    holds_only_zero_one,
    on_cpu_default_device,
    on_inputs_device,
    usable_outside_inference,
    wrap_public_methods,
)
from mlpapers.sampling.rehmc._container import (
    ConvexContainer,
    Hit,
    _as_float_array,
    contains_oracle,
    hit_oracle,
)

__all__ = ["ConvexSet", "Region"]

Tensor = torch.Tensor
# centring steps of ConvexSet.width (each: one batched hit of the 2 d axis rays)
_CENTRING_STEPS = 8


def _autograd_value(raw: Any) -> Tensor:
    """``g``'s value when the normals come from autograd: it must be a tensor."""
    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"g returned a {type(raw).__name__}, not a torch tensor: the "
                        "boundary normals come from autograd. Write g with torch "
                        "operations, or pass grad_g.")
    return raw


class ConvexSet(ConvexContainer):
    """Convex level set ``K = {x : g(x) <= 0}`` with ``g`` convex.

    The hitting time is bracketed on ``[0, t_max]`` (the ray stays in ``K`` on
    an interval, since ``g`` is convex along lines) and refined by bisection
    until an inside point at ``t > 0`` is found, then by Illinois false position
    with a bisection step every third iteration, until the bracket is a few
    ulps wide; the returned time is the inner end of the bracket, so the hit
    point is always inside ``K``. (False position from a start on the boundary,
    where ``g`` is zero up to round-off, would probe the round-off band of ``g``
    around ``t = 0`` and could take a positive value there for the exit.)

    Parameters
    ----------
    g : callable
        ``g(x)`` maps a ``(C, d)`` tensor to ``(C,)`` (a tensor; an array is
        accepted when ``grad_g`` is given, else ``TypeError``). Besides the chains
        (on the sampler's device and dtype), it gets float64 CPU points: at
        construction (the interior point) and from the one-off searches of the
        warm-up (widths, random interior points), so a ``g`` that holds tensors on
        a GPU must move ``x`` to them (``x.to(A.device)``).
    grad_g : callable, optional
        Gradient of ``g`` (``(C, d) -> (C, d)``, a tensor or an array); by
        autograd when omitted.
    interior_point : array-like of shape (d,), optional
        A point with ``g < 0``; it fixes the dimension.
    dim : int, optional
        The dimension ``d``, when no ``interior_point`` is given: the interior
        point is then searched from the origin (the origin itself if ``g(0) < 0``,
        else a descent on ``g``, which is convex).
    n_bisect : int, default=60
        Maximum root-finding iterations, not counting the halvings of ``[0, t_max]``
        made before an inside point at ``t > 0`` is found (a ``t_max`` far above the
        exit time costs more iterations, not a wrong time).

    Attributes
    ----------
    g : callable
        The function given.
    grad_g : callable or None
        The gradient given (``None``: autograd).
    n_bisect : int
        Maximum root-finding iterations.
    dim : int or None
        The dimension ``d`` (``None`` for a set built from ``g`` alone: each
        :meth:`ReflectiveHMC.sample` call then fixes it on a copy).

    Notes
    -----
    ``ConvexSet(g)`` alone, as the specification writes it, is accepted:
    :meth:`contains` and :meth:`hit` work in any dimension, and each
    :meth:`ReflectiveHMC.sample` call fixes ``dim`` and the interior point from its
    ``x0`` (the mean of the starting points, inside ``K`` by convexity, or a
    descent on ``g`` from there) on a copy of the set, leaving this object unbound.
    Without ``x0`` such a set cannot give starting points: ``sample`` raises
    ``ValueError`` asking for ``x0``, ``dim`` or ``interior_point``.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import ConvexSet
    >>> disc = ConvexSet(lambda x: (x ** 2).sum(-1) - 1.0)
    >>> t, n = disc.hit(torch.zeros(1, 2, dtype=torch.float64),
    ...                 torch.tensor([[2.0, 0.0]], dtype=torch.float64), 10.0)
    >>> round(float(t[0]), 12), n[0].tolist()
    (0.5, [1.0, 0.0])
    """

    # both None until an interior point fixes the dimension (ConvexSet(g) alone: see Notes)
    dim: int | None  # type: ignore[assignment]  # wider than the base's int: see Notes
    _x0: np.ndarray | None
    #: hit's bisection needs a finite bracket (checked where a user passes t_max)
    _needs_finite_t_max = True

    @on_cpu_default_device
    def __init__(self, g: Callable[[Tensor], ArrayLike],
                 grad_g: Callable[[Tensor], ArrayLike] | None = None, *,
                 interior_point: ArrayLike | None = None, dim: int | None = None,
                 n_bisect: int = 60) -> None:
        if not callable(g):
            raise TypeError("g must be callable.")
        if grad_g is not None and not callable(grad_g):
            raise TypeError("grad_g must be callable or None.")
        self.g = g
        self.grad_g = grad_g
        self.n_bisect = int(check_positive(n_bisect, "n_bisect", integer=True))
        if dim is not None:
            check_positive(dim, "dim", integer=True)
            dim = int(dim)
        self._x0 = None
        self.dim = dim
        if interior_point is not None:
            x0 = _as_float_array(interior_point, "interior_point", 1).copy()
            if dim is not None and len(x0) != dim:
                raise ValueError(f"interior_point has {len(x0)} coordinates but dim={dim}.")
            self._set_interior(x0, given=True)
        elif dim is not None:
            self._set_interior(self._find_interior(np.zeros(dim)), given=False)

    def _set_interior(self, x0: np.ndarray, *, given: bool) -> None:
        """Fix the dimension and the interior point ``x0`` (checked: ``g(x0) < 0``)."""
        xt = torch.as_tensor(x0)[None]
        with torch.no_grad():
            raw = self.g(xt.clone())
        if self.grad_g is None:
            _autograd_value(raw)
        # g (and grad_g) get copies here too: xt shares x0's memory, and the search's
        # points become the interior point, so a g that works in place on its argument
        # (x -= c) would move them (the interior point then lay outside K)
        g0 = self._g(xt.clone())
        if not g0[0] < 0:
            if given:
                raise ValueError("interior_point must satisfy g(interior_point) < 0.")
            raise ValueError("ConvexSet found no point with g < 0 (searched from the "
                             "origin or the starting points); pass interior_point=.")
        self._x0 = x0
        self.dim = len(x0)

    def _find_interior(self, start: np.ndarray) -> np.ndarray:
        """A point with ``g < 0``: ``start`` itself, else gradient descent on the convex
        ``g`` with a backtracking (Armijo) step, stopped at the first point inside."""
        x = torch.as_tensor(np.asarray(start, dtype=np.float64))[None].clone()
        gx = self._g(x.clone())
        step = 1.0
        for _ in range(500):
            if not bool(torch.isfinite(gx).all()) or gx[0] < 0:
                break
            gr = self._grad(x.clone())
            sq = float((gr * gr).sum())
            if not math.isfinite(sq) or sq == 0.0:
                break  # a minimum of g at or above 0: K has no interior
            while step > 1e-300:
                trial = x - step * gr
                gt = self._g(trial.clone())
                if bool(torch.isfinite(gt).all()) and gt[0] <= gx[0] - 0.5 * step * sq:
                    x, gx, step = trial, gt, 2.0 * step
                    break
                step *= 0.5
            else:
                break
        return x[0].numpy().copy()

    def _bind(self, points) -> None:
        """Fix ``dim`` and the interior point of a set built without either, from
        ``(n, d)`` (or ``(d,)``) points of ``K``: their mean (inside by convexity), or a
        descent on ``g`` from it."""
        if points is None:
            raise ValueError("ConvexSet(g) was built without interior_point or dim and "
                             "sample got no x0: pass x0 (starting points inside the set) "
                             "to sample, or dim= or interior_point= (a point with g < 0) "
                             "to ConvexSet.")
        try:
            pts = points.detach().cpu().double().numpy() if isinstance(points, Tensor) \
                else np.asarray(points, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"x0 must be a numeric array of shape (d,) or (n_chains, d): "
                             f"{exc}") from None
        if pts.ndim not in (1, 2) or pts.size == 0 or not np.all(np.isfinite(pts)):
            raise ValueError(f"x0 must be a finite, non-empty array of shape (d,) or "
                             f"(n_chains, d) (it also fixes the dimension of ConvexSet(g)), "
                             f"got shape {pts.shape}" + ("." if np.all(np.isfinite(pts))
                                                         else " with NaN or inf."))
        pts = pts.reshape(-1, pts.shape[-1])
        self._set_interior(self._find_interior(pts.mean(0)), given=False)

    def __repr__(self) -> str:
        return f"ConvexSet(dim={self.dim})"

    def _g(self, x):
        with torch.no_grad():
            out = self.g(x)
        if not isinstance(out, torch.Tensor):  # a numpy g (allowed with grad_g)
            # torch.tensor copies: as_tensor warns on a read-only (e.g. broadcast) array
            out = torch.tensor(np.asarray(out, dtype=np.float64), device=x.device)
        if out.shape != x.shape[:1]:
            # (every call, the one point of __init__ included: a (C, 1) column for C
            # chains would broadcast into a (C, C, d) torch error inside the root finding)
            raise ValueError(f"g must map (C, d) to (C,), got shape {tuple(out.shape)} for "
                             f"a {tuple(x.shape)} input.")
        # a g that computes elsewhere (e.g. returns a CPU tensor for CUDA points)
        return out.to(device=x.device, dtype=x.dtype)

    @contains_oracle
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Whether each point satisfies ``g(x) <= tol``.

        Parameters
        ----------
        x : torch.Tensor or array-like of shape (C, d) or (d,)
            The points (one point: a 0-d answer); numpy arrays and nested lists are
            converted to float64 tensors (the answer is then a numpy array). ``g``
            gets a copy, always of shape ``(C, d)``.
        tol : float, default=0.0
            Slack on the value of ``g`` (in the units of ``g``, not a distance).

        Returns
        -------
        torch.Tensor of shape (C,), bool
            Membership of each point (a numpy array for a non-tensor ``x``).

        Raises
        ------
        ValueError
            If ``g`` does not map ``(C, d)`` to shape ``(C,)``.
        """
        # g gets a copy of points it may be handed by the sampler (the proposals, the
        # chains): one that changed its input in place moved them (the bisection's trial
        # points are g's own)
        return self._g(x.clone()) <= tol

    def _grad(self, x):
        if self.grad_g is not None:
            with torch.no_grad():
                gr = self.grad_g(x)
            if not isinstance(gr, torch.Tensor):
                gr = torch.tensor(np.asarray(gr, dtype=np.float64), device=x.device)
            if gr.shape != x.shape:  # a (d,) gradient would broadcast into wrong normals
                raise ValueError(f"grad_g must map (C, d) to (C, d), got shape "
                                 f"{tuple(gr.shape)} for a {tuple(x.shape)} input.")
            gr = gr.to(device=x.device, dtype=x.dtype)
        else:
            # autograd on even in a caller's no_grad / inference_mode (the normal would be a
            # torch error there); an inference tensor x cannot require grad outside that mode
            with autograd_enabled():
                xr = usable_outside_inference(x.detach()).requires_grad_(True)
                # (a non-leaf copy: g may change its input in place, as in contains)
                value = _autograd_value(self.g(xr.clone()))
                gr = torch.autograd.grad(value.sum(), xr)[0]
        return gr

    @hit_oracle
    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """First exit time of the rays ``x + t v`` from ``K``, by root finding on ``[0, t_max]``.

        Bisection, then Illinois false position (see the class), until the
        bracket is a few ulps wide; the time returned is the bracket's inner end,
        so ``x + t v`` lies in ``K``.

        Parameters
        ----------
        x, v : torch.Tensor or array-like of shape (C, d) or (d,)
            Start points (inside ``K``) and velocities, or one of each; numpy arrays
            or nested lists are converted to float64 tensors and the answer comes
            back as numpy arrays.
        t_max : torch.Tensor of shape (C,) or float
            The bracket: only exits before ``t_max`` are found. Required
            (``ValueError`` when ``None``).
        exclude : torch.Tensor of shape (C,), optional
            Ignored (a level set has one smooth face; a start on the boundary is
            handled by the bracketing).

        Returns
        -------
        Hit
            The pair ``(t, normal)``: ``t`` of shape ``(C,)`` (``inf`` where the
            ray is still inside at ``t_max``) and the unit outward normal
            ``grad g / |grad g|`` at the exit point, shape ``(C, d)`` (by
            ``grad_g`` or autograd); ``.face`` is all zeros.

        Raises
        ------
        ValueError
            If ``t_max`` is ``None``, or ``g`` or ``grad_g`` return the wrong shape.
        """
        if t_max is None:
            raise ValueError("ConvexSet.hit needs t_max (the bisection bracket).")
        # a number or a (C,) tensor (the other oracles accept both)
        t_max = torch.as_tensor(t_max, dtype=x.dtype, device=x.device).expand(x.shape[0])
        g_hi = self._g(x + t_max[:, None] * v)
        out = g_hi > 0
        lo = torch.zeros_like(t_max)
        hi = t_max.clone()
        g_lo = torch.minimum(self._g(x.clone()), torch.zeros_like(t_max))  # (see contains)
        g_tol = 1e-14 * g_lo.abs()  # lo is a root to ~1e-14 relative once |g(lo)| <= g_tol
        g_lo_true = g_lo
        g_hi = torch.where(out, g_hi, torch.ones_like(g_hi))
        side = torch.zeros_like(t_max)
        tol = 4 * torch.finfo(x.dtype).eps
        # halvings made before a ray has an inside point at t > 0 do not count against
        # n_bisect (up to the exponent range): with t_max = 1e19 and an exit at 1, 60
        # halvings left the bracket at [0, 8.7] and t = 0 was returned, silently
        fi = torch.finfo(x.dtype)
        limit = self.n_bisect
        cap = limit + int(math.log2(fi.max) - math.log2(fi.tiny)) + fi.bits
        i = 0
        while i < limit:
            # Illinois false position (superlinear), every third step a bisection step
            denom = g_hi - g_lo
            fp = lo - g_lo * (hi - lo) / torch.where(denom > 0, denom, torch.ones_like(denom))
            mid = 0.5 * (lo + hi)
            # false position only once an inside point at t > 0 is known: from a start on
            # the boundary (after a reflection) g(lo = 0) ~ 0 puts fp in the round-off
            # band of g around t = 0, where a positive g would pass for the exit
            use_fp = (fp > lo) & (fp < hi) & (lo > 0) & (i % 3 != 2)
            trial = torch.where(use_fp, fp, mid)
            gt = self._g(x + trial[:, None] * v)
            inside = gt <= 0
            lo = torch.where(inside, trial, lo)
            hi = torch.where(inside, hi, trial)
            # halve the stale end's value when the same side moves twice (Illinois)
            g_hi = torch.where(inside, torch.where(side > 0, 0.5 * g_hi, g_hi), gt)
            g_lo = torch.where(inside, gt, torch.where(side < 0, 0.5 * g_lo, g_lo))
            side = torch.where(inside, torch.ones_like(side), -torch.ones_like(side))
            g_lo_true = torch.where(inside, gt, g_lo_true)
            # converged when the bracket is a few ulps wide, or when g(lo) ~ 0 at a point
            # lo > 0 (at lo = 0 a start on the boundary, g = 0, is not a hit yet)
            open_ = ((hi - lo) > tol * hi.abs().clamp_min(1e-300)) & (
                (g_lo_true < -g_tol) | (lo == 0))
            searching = open_ & out
            # (one transfer for both flags: a device sync per iteration, as before)
            any_open, scale_unknown = torch.stack(
                [searching.any(), (searching & (lo == 0) & (hi > 0)).any()]).tolist()
            if not any_open:
                break
            if scale_unknown and limit < cap:
                limit += 1
            i += 1
        t = torch.where(out, lo, torch.full_like(lo, float("inf")))
        gr = self._grad(x + torch.where(out, lo, t_max)[:, None] * v)
        size = gr.norm(dim=-1)
        flat = out & ~((size > 0) & torch.isfinite(size))
        if bool(flat.any()):
            # g is flat at the inner end of the bracket (a g whose minimum plateau lies
            # within rounding of 0, or an underflowing gradient): the normal was zero, the
            # reflection's (n.p)/(n.n) was 0/0, so the momentum, the positions and
            # log_prob turned NaN and every hit was a divergence. Outside K, g > min g,
            # so a convex g has a non-zero gradient at the outer end, a few ulps away.
            gr = torch.where(flat[:, None], self._grad(x + hi[:, None] * v), gr)
            size = gr.norm(dim=-1)
        normal = gr / size[:, None].clamp_min(1e-300)
        return Hit(t, normal, torch.zeros(len(x), dtype=torch.long, device=x.device))

    def interior_point(self) -> np.ndarray:
        """The point with ``g < 0`` given or found at construction.

        Returns
        -------
        numpy.ndarray of shape (d,)
            ``interior_point`` as passed, else the point found from the origin
            (with ``dim``).

        Raises
        ------
        ValueError
            For a set built without ``interior_point`` or ``dim`` (``sample``
            binds a copy from its ``x0``).
        """
        if self._x0 is None:
            raise ValueError("ConvexSet(g) has no interior point yet (built without "
                             "interior_point or dim): pass interior_point= or dim= (ReflectiveHMC."
                             "sample finds one from its x0 on a copy of the set).")
        return self._x0.copy()

    def width(self) -> float:
        """Shortest axis chord through a point centred in ``K`` along the axes.

        From :meth:`interior_point`, up to eight centring steps move the point
        towards the midpoints of its ``d`` axis chords (a step stays in ``K``: the
        average of the ``d`` midpoints is inside by convexity, and a longer step is
        kept only where ``g < 0``); the width is the largest shortest axis chord
        seen. Computed once and cached. The value estimates, and caps the step size
        by, the diameter of the largest inscribed ball; it is not a bound (a set
        elongated along a diagonal has longer axis chords).

        Returns
        -------
        float
            The shortest of the ``d`` axis chords through the centred point (``inf``
            if every axis through it never leaves ``K``).

        Raises
        ------
        ValueError
            For a set that has no interior point yet (see :meth:`interior_point`).
        """
        if "_width" not in self.__dict__:
            # the axis chords through the interior point alone gave the width: a valid
            # interior_point near the boundary (g(x0) < 0 is all that is asked) has a
            # chord of length ~sqrt(distance) along the tangent, so the step size was
            # capped a thousand times too small (the unit disc from (0, 1 - 1e-6):
            # width 0.003 instead of 2, bulk ESS 12 instead of 1700)
            # (a user's interior_point may be a (1, d) row)
            x = torch.as_tensor(self.interior_point()).reshape(-1)
            d = x.shape[0]  # (the set's dim, fixed with its interior point)
            best = 0.0
            for _ in range(_CENTRING_STEPS):
                up, down = self._axis_chords(x)
                short = float((up + down).min())
                best = max(best, short)
                shift = 0.5 * (up - down)  # to the midpoints of the axis chords
                shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
                if not math.isfinite(short) or bool(
                        (shift.abs() <= 1e-3 * (up + down)).all()):
                    break  # (an interior point already centred: one pass, as before)
                # the full step when it stays inside, else shorter ones down to 1 / d,
                # the average of the d chord midpoints, inside K by convexity
                halvings = [0.5 ** k for k in range(int(math.log2(d)) + 1)]
                for alpha in sorted({*halvings, 1.0 / d}, reverse=True):
                    trial = x + alpha * shift
                    if bool(self._g(trial[None].clone())[0] < 0):
                        x = trial
                        break
                else:
                    break
            self._width = best
        return self._width

    def _axis_chords(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Exit times ``(up, down)``, each ``(d,)``, of the rays from ``x`` (a point of
        ``K``) along ``+e_j`` and ``-e_j`` (``inf`` for a ray that never leaves ``K``)."""
        d = x.shape[-1]
        dirs = torch.cat([torch.eye(d, dtype=torch.float64), -torch.eye(d, dtype=torch.float64)])
        xs = x.expand(2 * d, -1)
        t_max = torch.ones(2 * d, dtype=torch.float64)
        t = torch.full_like(t_max, float("inf"))
        for _ in range(64):  # grow the bracket until every ray has left K
            t = self.hit(xs, dirs, t_max)[0]
            if bool(torch.isfinite(t).all()):
                break
            t_max = torch.where(torch.isfinite(t), t_max, 16.0 * t_max)
        return t[:d], t[d:]


class Region:
    """A (possibly non-convex) support ``S`` given by a membership test.

    Used with a convex container ``K`` that contains ``S``: the chain runs on
    ``K`` and only draws in ``S`` are kept (thinning).

    Parameters
    ----------
    contains : callable
        ``contains(x)`` maps a ``(C, d)`` tensor to a ``(C,)`` boolean tensor (or
        array; 0/1 numbers are accepted as booleans).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import Region
    >>> annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)
    >>> annulus.contains(torch.tensor([[0.5, 0.0], [1.5, 0.0]])).tolist()
    [False, True]
    """

    def __init__(self, contains: Callable[[Tensor], ArrayLike]) -> None:
        if not callable(contains):
            raise TypeError("contains must be callable.")
        self._contains = contains

    def __repr__(self) -> str:
        return "Region(...)"

    @contains_oracle  # numpy points in, numpy answers out
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Membership of points in ``S``, by the function given at construction.

        Parameters
        ----------
        x : torch.Tensor or array-like of shape (C, d)
            The points; numpy arrays and nested lists are converted to float64
            tensors (the answer is then a numpy array). The function gets a copy.
        tol : float, default=0.0
            Ignored (the membership function has no tolerance); accepted for the
            interface of :meth:`ConvexContainer.contains`.

        Returns
        -------
        torch.Tensor of shape (C,), bool
            The function's answer as booleans (0/1 numbers are accepted); a numpy
            array for a non-tensor ``x``.

        Raises
        ------
        ValueError
            If the function returns another shape than ``(C,)``, or numbers
            other than 0 and 1 (a score, not a membership).
        """
        with torch.no_grad():
            # a copy: the sampler hands it its chains, which a function that changes its
            # input in place would move
            out = self._contains(x.clone())
            # torch.tensor copies a numpy answer: as_tensor warns on a read-only one
            out = out if isinstance(out, torch.Tensor) else torch.tensor(np.asarray(out))
            out = out.to(x.device)  # (an array, or a tensor computed elsewhere)
        if out.shape != x.shape[:1]:
            raise ValueError(
                f"Region.contains must return shape ({x.shape[0]},), got {tuple(out.shape)}.")
        if out.dtype != torch.bool:
            # .bool() of a score (a norm, a density) is True almost everywhere: every
            # draw was kept, silently; 0/1 numbers (a mask cast to float) are accepted
            if not holds_only_zero_one(out):
                raise ValueError("Region.contains must return booleans (or 0/1), one per "
                                 f"row, got {out.dtype} values other than 0 and 1.")
        return out.bool()


# membership computes where the points are, whatever a caller's default device
wrap_public_methods(Region, on_inputs_device)
