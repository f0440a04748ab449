"""Supports for reflective HMC: convex containers with exact boundary oracles.

Every container is batched over chains: positions and velocities are ``(C, d)``
tensors (``C`` chains, ``d`` dimensions) and the oracles return one value per
chain. The hitting time of :meth:`ConvexContainer.hit` is the *first* positive
time at which the ray ``x + t v`` leaves the set, computed in closed form for
boxes, polytopes, balls and ellipsoids (this module) and by bracketed bisection
for a general convex level set. :class:`Region` describes a non-convex support
``S`` used only for thinning (membership test), never for reflections. The base
class lives in ``_container`` and the function-defined supports
(:class:`ConvexSet`, :class:`Region`) in ``_levelset``; all are re-exported here.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mlpapers._utils import ArrayLike, check_positive, to_numpy
from mlpapers._utils._docs import fill_doc
from mlpapers.sampling.rehmc._container import (
    ConvexContainer,
    Hit,
    _as_float_array,
    _container_parameter,
    _read_only,
    contains_oracle,
    hit_oracle,
)
from mlpapers.sampling.rehmc._levelset import ConvexSet, Region
from mlpapers.sampling.rehmc._lp import (
    _chebyshev_lp,
    _extreme_points,
    _is_unbounded,
    _nearest_inner_point,
)

__all__ = ["Ball", "Box", "ConvexContainer", "ConvexSet", "Ellipsoid", "Polytope", "Region"]

Tensor = torch.Tensor
# Faces whose normal speed is below _GRAZE * |v| are treated as parallel to the ray.
_GRAZE = 64 * float(np.finfo(np.float64).eps)
# radii whose square (and a margin for |x - center|^2) is a normal float64
_RADIUS_RANGE = (1e-150, 1e150)



# the parameter entries every closed-form oracle shares (fill_doc puts them in place)
_POINTS = """\
x : torch.Tensor or array-like of shape (C, d)
    The points; numpy arrays and nested lists are converted to float64
    tensors (the answer is then a numpy array)."""
_MEMBERSHIP = """\
Returns
-------
torch.Tensor of shape (C,), bool
    Membership of each point (a numpy array for a non-tensor ``x``)."""
_RAYS = """\
x, v : torch.Tensor or array-like of shape (C, d)
    Start points (inside) and velocities; numpy arrays or nested lists are
    converted to float64 tensors and the answer comes back as numpy arrays.
t_max : torch.Tensor of shape (C,) or float, optional
    Ignored (the closed form needs no bracket); accepted for the common
    interface :meth:`ConvexContainer.hit`."""

class Box(ConvexContainer):
    """Axis-aligned box ``{x : lo <= x <= hi}``.

    Reflections split into independent one-dimensional bounces, so
    :meth:`fold` moves a particle for any time in closed form (a triangle wave
    per coordinate) instead of looping over hits.

    Parameters
    ----------
    lo, hi : array-like of shape (d,) or scalar
        Finite lower and upper bounds (``lo < hi``, with a width ``hi - lo`` that is
        finite and has a finite inverse, else ``ValueError``); a scalar is broadcast
        against the other bound (at least one must be a vector, or pass
        ``dim``). For a half-open box use a :class:`Polytope` (with a
        ``log_prob`` integrable on it).
    dim : int, optional
        Dimension, when both bounds are scalars.

    Attributes
    ----------
    lo, hi : numpy.ndarray of shape (d,)
        The bounds, float64 and read-only; assigning new bounds (``box.hi = ...``)
        checks them as the constructor does.
    dim : int
        The dimension ``d``.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import Box
    >>> box = Box([0.0, 0.0], [1.0, 2.0])
    >>> t, n = box.hit(torch.tensor([[0.5, 0.5]], dtype=torch.float64),
    ...                torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    >>> float(t[0]), n[0].tolist()
    (0.5, [1.0, 0.0])
    """

    _exact_in_float64 = True

    def __init__(self, lo: ArrayLike, hi: ArrayLike, *, dim: int | None = None) -> None:
        lo_a = _as_float_array(lo, "lo", None)
        hi_a = _as_float_array(hi, "hi", None)
        if lo_a.ndim == 0 and hi_a.ndim == 0:
            if dim is None:
                raise ValueError("Box needs vector bounds or dim= when lo and hi are scalars.")
            check_positive(dim, "dim", integer=True)
            lo_a, hi_a = np.full(int(dim), float(lo_a)), np.full(int(dim), float(hi_a))
        if lo_a.ndim == hi_a.ndim == 1 and lo_a.shape != hi_a.shape:
            raise ValueError(f"lo and hi must have the same length, got {lo_a.shape[0]} "
                             f"and {hi_a.shape[0]}.")
        if lo_a.ndim <= 1 and hi_a.ndim <= 1:
            lo_a, hi_a = np.broadcast_arrays(lo_a, hi_a)
        if dim is not None and lo_a.ndim == 1 and len(lo_a) != dim:
            # (a dim that contradicts vector bounds was ignored)
            raise ValueError(f"dim={dim!r} contradicts the bounds' length {len(lo_a)}.")
        # read-only: the fold's widths and its inside flag are derived from the bounds
        # here, and an in-place edit left them stale (draws outside the new box, which
        # the sampler does not re-check for a box); rebinding lo or hi re-runs this
        self._lo = _read_only(_as_float_array(lo_a, "lo", 1).copy())
        self._hi = _read_only(_as_float_array(hi_a, "hi", 1).copy())
        if not np.all(self.lo < self.hi):
            j = int(np.flatnonzero(~(self.lo < self.hi))[0])
            raise ValueError(f"Box requires lo < hi in every coordinate, got lo[{j}]="
                             f"{self.lo[j]:g} >= hi[{j}]={self.hi[j]:g} (a flat box has no "
                             "interior: fix that coordinate and sample the others).")
        self.dim = len(self.lo)
        with np.errstate(over="ignore", divide="ignore"):
            self._w = self.hi - self.lo
            self._inv_w = 1.0 / self._w
        bad = ~(np.isfinite(self._w) & np.isfinite(self._inv_w))
        if bad.any():  # the fold works in box units (x - lo) / (hi - lo)
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"Box widths hi - lo must be finite with a finite inverse "
                             f"(about 1e-308 to 1e308), got hi[{j}] - lo[{j}] = "
                             f"{self._w[j]:g} (lo[{j}]={self.lo[j]:g}, "
                             f"hi[{j}]={self.hi[j]:g}); rescale the coordinates.")
        # the fold's end point lo + w y (0 <= y <= 1) is >= lo, and <= lo + w by
        # monotone rounding; lo + w can round 1 ulp above hi (1 coordinate in 8 with random
        # bounds of both signs), else every float64 fold ends in the box
        self._fold_inside = bool(np.all(self.lo + self._w <= self.hi))

    _parameters = ("lo", "hi")
    lo = _container_parameter("lo")
    hi = _container_parameter("hi")

    def __repr__(self) -> str:
        return f"Box(dim={self.dim})"

    @contains_oracle
    @fill_doc(points=_POINTS, membership=_MEMBERSHIP)
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Whether each point satisfies ``lo - tol <= x <= hi + tol`` in every coordinate.

        Parameters
        ----------
        %(points)s
        tol : float, default=0.0
            Slack added to every bound (a distance in the max norm).

        %(membership)s
        """
        lo, hi = self._t(self.lo, x), self._t(self.hi, x)
        if tol:  # (the sampler tests every proposal with tol=0: two operations fewer)
            lo, hi = lo - tol, hi + tol
        return ((x >= lo) & (x <= hi)).all(-1)

    def _keeps_inside(self, dtype):
        # (float32 bounds are rounded to nearest, possibly outside the float64 box)
        return dtype == torch.float64 and getattr(self, "_fold_inside", False)  # old pickles

    @hit_oracle
    @fill_doc(rays=_RAYS)
    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """First exit time of the rays ``x + t v`` through a face of the box.

        In closed form per coordinate: ``(hi_j - x_j) / v_j`` for ``v_j > 0`` and
        ``(lo_j - x_j) / v_j`` for ``v_j < 0``, the smallest over ``j``; a
        coordinate whose speed is below ``64 eps |v|`` counts as parallel to its
        faces (never hit).

        Parameters
        ----------
        %(rays)s
        exclude : torch.Tensor of shape (C,), optional
            Face just hit (``j`` for ``lo_j``, ``d + j`` for ``hi_j``, ``-1`` for
            none), skipped when the particle moves towards it (a round-off hit
            at ``t = 0``).

        Returns
        -------
        Hit
            The pair ``(t, normal)``: ``t`` of shape ``(C,)`` (``inf`` for a zero
            velocity) and the outward normal ``+-e_j`` of the face hit, shape
            ``(C, d)``; ``.face`` of shape ``(C,)`` is ``j`` for ``lo_j`` and
            ``d + j`` for ``hi_j``.
        """
        lo, hi = self._t(self.lo, x), self._t(self.hi, x)
        inf = torch.full_like(x, float("inf"))
        speed = v.abs()
        t = torch.where(v > 0, (hi - x) / v, torch.where(v < 0, (lo - x) / v, inf))
        t = torch.where(speed > _GRAZE * v.norm(dim=-1, keepdim=True), t.clamp_min(0.0), inf)
        if exclude is not None:  # faces: j for lo_j, d + j for hi_j
            j = (exclude % self.dim)[:, None]
            upper = (exclude >= self.dim)[:, None]
            moving_to = (v > 0) == upper  # the excluded face is ahead of the particle
            mask = ((exclude >= 0)[:, None] & (torch.arange(self.dim, device=x.device) == j)
                    & moving_to)
            t = torch.where(mask, inf, t)
        j = t.argmin(dim=-1)  # first index on ties
        tmin = t.gather(1, j[:, None]).squeeze(1)
        sign = torch.sign(v.gather(1, j[:, None]))
        normal = torch.zeros_like(x).scatter_(1, j[:, None], sign)
        face = j + self.dim * (sign[:, 0] > 0).long()
        return Hit(tmin, normal, face)

    def fold(self, x: Tensor, v: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Exact billiard motion for time ``tau`` in closed form.

        In the coordinates ``q = (x - lo) / (hi - lo)`` the unfolded motion is
        ``q + tau v / (hi - lo)``; folding it into ``[0, 1]`` is the triangle
        wave ``min(u, 2 - u)`` with ``u = q mod 2``, and the velocity has
        changed sign exactly when ``u >= 1`` (an odd number of walls crossed).

        Parameters
        ----------
        x, v : torch.Tensor of shape (C, d)
            Start points (inside the box) and velocities, as tensors (no numpy).
        tau : torch.Tensor of shape (C,)
            Time to move each particle for (``>= 0``).

        Returns
        -------
        x_new : torch.Tensor of shape (C, d)
            End position: the box-unit position is clamped to [0, 1] against round-off,
            but ``lo + w y`` can still round one ulp above ``hi`` when ``lo + (hi - lo)``
            does (the sampler then rejects the proposal).
        flipped : torch.Tensor of shape (C, d), bool
            Whether each velocity coordinate changed sign.
        n_reflections : torch.Tensor of shape (C,), int64
            Number of wall hits, as the sequential reflection loop counts them.
        """
        lo, w, inv_w = self._t(self.lo, x), self._t(self._w, x), self._t(self._inv_w, x)
        q = torch.addcmul(x - lo, tau[:, None], v).mul_(inv_w)  # unfolded, in box units
        n_ref = torch.floor(q).abs_().sum(-1)  # walls crossed
        u = torch.remainder(q, 2.0)  # in [0, 2)
        flipped = u >= 1.0
        y = torch.minimum(u, torch.rsub(u, 2.0)).clamp_(0.0, 1.0)
        return torch.addcmul(lo, w, y), flipped, n_ref.long()

    def interior_point(self) -> np.ndarray:
        """The centre of the box.

        Returns
        -------
        numpy.ndarray of shape (d,)
            ``(lo + hi) / 2``, float64.
        """
        return 0.5 * (self.lo + self.hi)

    def width(self) -> float:
        """The shortest side, the diameter of the largest ball inside the box.

        Returns
        -------
        float
            ``min(hi - lo)``.
        """
        return float(np.min(self.hi - self.lo))

    def _coordinate_extents(self) -> tuple[np.ndarray, np.ndarray]:
        """Per coordinate, the box's side and its largest magnitude: what
        :func:`check_resolution` compares with the dtype's spacing there (a rate in
        ``(0, 1e-3)`` beside a count in ``(1e5, 2e5)`` is resolved coordinate by
        coordinate)."""
        return self.hi - self.lo, np.maximum(np.abs(self.lo), np.abs(self.hi))

    def _scaled_width(self, scale):
        return float(np.min(self._w / scale))

    def random_interior(self, n: int, gen: torch.Generator) -> Tensor:
        """``n`` points uniform in the box shrunk by 0.9 about its centre.

        Parameters
        ----------
        n : int
            Number of points.
        gen : torch.Generator
            CPU generator the points are drawn from.

        Returns
        -------
        torch.Tensor of shape (n, d), float64
            ``lo + (0.05 + 0.9 u) (hi - lo)`` with ``u`` uniform on ``[0, 1)^d``.
        """
        u = torch.rand(n, self.dim, generator=gen, dtype=torch.float64)
        lo, hi = torch.tensor(self.lo), torch.tensor(self.hi)  # (copies of read-only arrays)
        return lo + (0.05 + 0.9 * u) * (hi - lo)


class Polytope(ConvexContainer):
    """Convex polyhedron ``{x : A x <= b}`` (need not be bounded).

    Rows are normalised to unit norm at construction (duplicate or redundant
    rows are harmless). The constructor solves the Chebyshev-centre linear
    program (:func:`scipy.optimize.linprog`) and raises if the polytope is
    empty or has no interior. An unbounded polytope is accepted (a half-space
    or an orthant, say): boundedness is then the job of ``log_prob``, which
    must be integrable on it; this is not checked (an improper target shows as
    chains that drift apart: the split R-hat warning of
    :meth:`~mlpapers.sampling.ReflectiveHMC.sample`).
    For an unbounded polytope, :meth:`interior_point` is the point nearest the
    origin (in the max norm) whose ball of radius ``min(1, inradius)`` lies
    inside, and default starting points lie in that ball; pass ``x0`` if the
    target's mass lies far from there.

    Parameters
    ----------
    A : array-like of shape (m, d)
        Finite constraint matrix: row ``a_i`` is the outward normal of face ``i``
        (any non-zero length; an all-zero row raises ``ValueError``).
    b : array-like of shape (m,)
        Finite right-hand sides: ``a_i^T x <= b_i``.

    Attributes
    ----------
    A : numpy.ndarray of shape (m, d)
        The rows scaled to unit norm, read-only.
    b : numpy.ndarray of shape (m,)
        The right-hand sides scaled alike, so ``b_i - a_i^T x`` is the distance
        of ``x`` to face ``i``; read-only. Assigning ``A`` or ``b`` rebuilds the
        polytope as the constructor would from the new one and the other as
        stored (rows rescaled, centre solved again).
    dim : int
        The dimension ``d``.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import Polytope
    >>> triangle = Polytope([[-1, 0], [0, -1], [1, 1]], [0, 0, 1])  # x, y >= 0, x + y <= 1
    >>> triangle.contains(np.array([[0.2, 0.2], [0.8, 0.8]]))
    array([ True, False])
    >>> round(triangle.width(), 4)  # 2 (1 - 1 / sqrt(2)), the incircle's diameter
    0.5858
    >>> t, normal = triangle.hit([[0.2, 0.2]], [[1.0, 0.0]])
    >>> round(float(t[0]), 6), normal.round(4).tolist()
    (0.6, [[0.7071, 0.7071]])
    """

    _exact_in_float64 = True

    def __init__(self, A: ArrayLike, b: ArrayLike) -> None:
        A = _as_float_array(A, "A", 2)
        b = _as_float_array(b, "b", 1)
        if A.shape[0] != b.shape[0]:
            raise ValueError(f"A has {A.shape[0]} rows but b has {b.shape[0]} entries.")
        norms = np.linalg.norm(A, axis=1)
        if np.any(norms == 0):
            raise ValueError("A has an all-zero row; drop it (or the constraint 0 <= b).")
        self._A = _read_only(A / norms[:, None])
        self._b = _read_only(b / norms)
        self._At = np.ascontiguousarray(self.A.T)
        self._faces = np.arange(len(self.b))
        self.dim = A.shape[1]
        self._center, self._radius = self._chebyshev()
        self._ends: np.ndarray | None = None  # of random_interior, solved on first use

    _parameters = ("A", "b")
    A = _container_parameter("A")
    b = _container_parameter("b")

    def __repr__(self) -> str:
        return f"Polytope(n_faces={len(self.b)}, dim={self.dim})"

    def _chebyshev(self) -> tuple[np.ndarray, float]:
        # (capped for unbounded polytopes only: the cap of 1e6 put the square
        # [0, 1e7]^2's centre 1e6 from a corner and its width at 2e6, so its sampling
        # slowed with the scale from 1e7 on)
        self._unbounded = _is_unbounded(self.A)
        res = _chebyshev_lp(self.A, self.b, capped=self._unbounded)
        if res.status == 2:
            raise ValueError("Polytope {A x <= b} is empty (the constraints are infeasible).")
        if res.status != 0:
            raise ValueError(f"Polytope: Chebyshev-centre LP failed ({res.message}).")
        slack = self.b - self.A @ res.x[:self.dim]
        if slack.min() < res.x[-1] * (1 - 1e-6):
            # the LP's tolerances are absolute in units of max|b|: a polytope narrower
            # than 1e-7 of its distance from the origin ([5e7, 5e7 + 1] x [0, 1e-4])
            # got a centre outside it. Solved again about that centre, where max|b| is
            # the polytope's own size (the problem is translation-invariant)
            again = _chebyshev_lp(self.A, slack, capped=self._unbounded)
            if again.status == 0:
                again.x = np.concatenate([res.x[:self.dim] + again.x[:self.dim],
                                          again.x[-1:]])
                res = again
        radius = float(res.x[-1])
        # the LP's tolerances are absolute in its units (b / res.scale, about max|b|);
        # beyond 1 the bound stays absolute, as it was before b was rescaled
        floor = 1e-12 * min(1.0, res.scale)
        if radius <= floor:
            raise ValueError(f"Polytope {{A x <= b}} has an empty interior (it is flat): "
                             f"its inradius {radius:.3g} is at most {floor:.3g} (1e-12 of "
                             "max|b| when that is below 1; a polytope that small next to "
                             "its distance from the origin needs its coordinates shifted "
                             "or rescaled).")
        center = res.x[:self.dim]
        if self._unbounded:
            # the LP's centre of an unbounded polytope can lie anywhere along its
            # unbounded directions (about 1e6 from every face for an orthant), so chains
            # started there spent the whole warm-up walking back (an orthant with an
            # exponential target: R-hat 2.4); start near the origin instead, at the
            # closest point whose ball of radius min(1, inradius) fits inside
            ball = min(1.0, radius * (1 - 1e-9))
            near = _nearest_inner_point(self.A, self.b, ball)
            if near is not None:  # its ball lies inside: random_interior stays in it
                center, self._chord_cap = near, ball
        return center, radius

    def _scaled_width(self, scale):
        A = self.A * scale  # {x = scale * y : A x <= b} = {y : (A scale) y <= b}
        norms = np.linalg.norm(A, axis=1)
        # (a positive scaling keeps the polytope bounded or not)
        unbounded = getattr(self, "_unbounded", None)
        # about the centre (x = centre + scale y): the inradius does not move, and the
        # LP's absolute tolerances are not spent on the polytope's distance from 0
        slack = self.b - self.A @ self._center
        res = _chebyshev_lp(A / norms[:, None], slack / norms,
                            capped=_is_unbounded(self.A) if unbounded is None else unbounded)
        return 2.0 * float(res.x[-1]) if res.status == 0 else None

    @contains_oracle
    @fill_doc(points=_POINTS, membership=_MEMBERSHIP)
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Whether each point satisfies ``A x <= b + tol`` (rows of unit norm).

        Parameters
        ----------
        %(points)s
        tol : float, default=0.0
            Slack: the largest distance a point may lie beyond a face.

        %(membership)s
        """
        A, b = self._t(self.A, x), self._t(self.b, x)
        return (x @ A.T <= b + tol).all(-1)

    @hit_oracle
    @fill_doc(rays=_RAYS)
    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """First exit time of the rays ``x + t v`` through a face of the polytope.

        In closed form: the smallest ``(b_i - a_i^T x) / (a_i^T v)`` over the faces
        the ray approaches (``a_i^T v > 64 eps |v|``); ties go to the lowest row.

        Parameters
        ----------
        %(rays)s
        exclude : torch.Tensor of shape (C,), optional
            Row of the face just hit (``-1`` for none), skipped (a round-off hit
            at ``t = 0``).

        Returns
        -------
        Hit
            The pair ``(t, normal)``: ``t`` of shape ``(C,)`` (``inf`` when the ray
            never leaves an unbounded polytope) and the unit outward normal
            ``A[i]`` of the face hit, shape ``(C, d)``; ``.face`` of shape ``(C,)``
            is the row ``i``.
        """
        A, At, b = self._t(self.A, x), self._t(self._At, x), self._t(self.b, x)
        slack = (b - x @ At).clamp_min_(0.0)  # (C, m)
        rate = v @ At  # (C, m): normal speed towards each face
        ok = rate > _GRAZE * v.norm(dim=-1, keepdim=True)
        if exclude is not None:
            ok &= self._t(self._faces, exclude) != exclude[:, None]
        t = torch.where(ok, slack / rate, float("inf"))  # masked: no 0/0 reaches t
        j = t.argmin(dim=-1)  # ties: lowest index (min(dim=) is slow with threads)
        tmin = t.gather(1, j[:, None]).squeeze(1)
        return Hit(tmin, A[j], j)

    def interior_point(self) -> np.ndarray:
        """The Chebyshev centre (for an unbounded polytope, a point near the origin).

        Returns
        -------
        numpy.ndarray of shape (d,)
            The centre of the largest inscribed ball, from the linear program
            solved at construction; for an unbounded polytope, the point nearest
            the origin (in the max norm) whose ball of radius
            ``min(1, inradius)`` lies inside.
        """
        return self._center.copy()

    def random_interior(self, n: int, gen: torch.Generator) -> Tensor:
        """``n`` random points of the polytope (not uniform), spread along its long axes.

        For a bounded polytope: a uniform fraction in ``[0, 0.9)`` of the segment from
        ``c`` to a random one of eight extreme points, those that maximise and minimise
        four fixed generic linear functions (eight linear programs, solved once per
        polytope). ``c`` is the midpoint of the Chebyshev centre and the extreme points'
        mean, so it is strictly inside. The generic centre-plus-chord points (kept for
        an unbounded polytope) stay near the Chebyshev centre of a long, thin polytope,
        which can be one of its ends: for the slab ``[-1, 1] x [-2e-4, 2e-4]`` every
        chain started within 1e-4 of ``x = 1`` and, with the step size capped by the
        slab's thickness, its samples had mean 0.98 instead of 0.

        Parameters
        ----------
        n : int
            Number of points.
        gen : torch.Generator
            CPU generator the extreme points and fractions are drawn from.

        Returns
        -------
        torch.Tensor of shape (n, d), float64
            Points strictly inside the polytope, on the CPU.
        """
        if self._unbounded:
            return super().random_interior(n, gen)
        if getattr(self, "_ends", None) is None:  # (absent from older pickles)
            self._ends = self._boundary_ends()
        ends = torch.as_tensor(self._ends)
        if len(ends) == 0:
            return super().random_interior(n, gen)
        c = 0.5 * (torch.as_tensor(self._center) + ends.mean(0))
        pick = torch.randint(len(ends), (n,), generator=gen)
        frac = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 0.9
        return c + frac * (ends[pick] - c)

    def _boundary_ends(self) -> np.ndarray:
        """The extreme points, each moved to where the ray from the Chebyshev centre
        towards it leaves the polytope by :meth:`hit` (an LP optimum may lie outside by
        the solver's tolerance, 1e-7 of ``max|b|``, which is more than the width of a
        thin polytope far from the origin), or kept where the ray reaches it first."""
        # (solved about the centre, as the second Chebyshev LP)
        ends = torch.as_tensor(_extreme_points(self.A, self.b - self.A @ self._center)
                               + self._center)
        if len(ends) == 0:  # (every LP failed: random_interior falls back to chords)
            return ends.numpy()
        c = torch.as_tensor(self._center).expand_as(ends)
        t = self.hit(c, ends - c)[0]
        return (c + t.clamp(0.0, 1.0)[:, None] * (ends - c)).numpy()

    def width(self) -> float:
        """Diameter of the largest inscribed ball (twice the Chebyshev radius).

        Returns
        -------
        float
            ``2 * inradius``; for an unbounded polytope (a half-space), whose balls
            grow without end, the linear program caps the radius at ``1e6``, giving
            ``2e6``.
        """
        return 2.0 * self._radius


class Ball(ConvexContainer):
    """Euclidean ball ``{x : |x - center| <= radius}``.

    Parameters
    ----------
    center : array-like of shape (d,)
        Finite centre; its length fixes the dimension ``d``.
    radius : float
        In ``[1e-150, 1e150]`` (the exit time solves a quadratic in
        ``radius**2``), else ``ValueError``: rescale the coordinates.

    Attributes
    ----------
    center : numpy.ndarray of shape (d,)
        The centre, float64 and read-only.
    radius : float
        The radius. Assigning ``center`` or ``radius`` checks the new value as the
        constructor does.
    dim : int
        The dimension ``d``.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import Ball
    >>> ball = Ball([0.0, 0.0], 2.0)
    >>> ball.contains(np.array([[1.0, 1.0], [2.0, 1.0]]))
    array([ True, False])
    >>> t, normal = ball.hit([[0.0, 0.0]], [[0.0, 4.0]])
    >>> float(t[0]), normal.tolist()
    (0.5, [[0.0, 1.0]])
    """

    _exact_in_float64 = True

    def __init__(self, center: ArrayLike, radius: float) -> None:
        self._center = _read_only(_as_float_array(center, "center", 1).copy())
        r = to_numpy(radius) if isinstance(radius, torch.Tensor) else np.asarray(radius)
        if r.ndim != 0 or r.dtype.kind not in "iuf":
            raise TypeError(f"radius must be a real number, got {radius!r}.")
        if not np.isfinite(r) or r <= 0:
            raise ValueError(f"radius must be a finite number > 0, got {radius!r}.")
        # (as a Python float: a float32 radius would cast the bounds to inf and 0)
        if not _RADIUS_RANGE[0] <= float(r) <= _RADIUS_RANGE[1]:
            # the exit time solves a quadratic in radius**2, which overflows (an
            # OverflowError in the first drift) or underflows (every drift was capped)
            raise ValueError(f"radius must lie in [{_RADIUS_RANGE[0]:g}, "
                             f"{_RADIUS_RANGE[1]:g}] (its square must be a normal float64), "
                             f"got {radius!r}; rescale the coordinates.")
        self._radius = float(radius)
        self.dim = len(self.center)

    _parameters = ("center", "radius")
    center = _container_parameter("center")
    radius = _container_parameter("radius")

    def __repr__(self) -> str:
        return f"Ball(dim={self.dim}, radius={self.radius:g})"

    @contains_oracle
    @fill_doc(points=_POINTS, membership=_MEMBERSHIP)
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Whether each point satisfies ``|x - center| <= radius + tol``.

        Parameters
        ----------
        %(points)s
        tol : float, default=0.0
            Slack: the largest distance a point may lie outside the sphere.

        %(membership)s
        """
        y = x - self._t(self.center, x)
        return y.norm(dim=-1) <= self.radius + tol

    @hit_oracle
    @fill_doc(rays=_RAYS)
    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """Exit time of the rays ``x + t v`` through the sphere.

        The positive root of ``|x + t v - center|^2 = radius^2``, in a form free of
        cancellation (a start on the sphere moving inwards gets the far root).

        Parameters
        ----------
        %(rays)s
        exclude : torch.Tensor of shape (C,), optional
            Ignored (a sphere has one smooth face; the root is chosen so that a
            start on it does not hit it again at ``t = 0``).

        Returns
        -------
        Hit
            The pair ``(t, normal)``: ``t`` of shape ``(C,)`` (``inf`` for a zero
            velocity) and the unit outward normal ``(y - center) / radius`` at the
            exit point ``y``, shape ``(C, d)``; ``.face`` is all zeros (one smooth
            face).
        """
        y = x - self._t(self.center, x)
        # in units of powers of two near the radius and each ray's speed (exact: the
        # same bits as unscaled wherever that does not overflow): b^2 = (y.v)^2 overflowed
        # for |y| |v| above 1e154 (t = 0 at radius 1e100 with speeds near it, and biased
        # draws) and underflowed below 1e-154
        r_unit = 2.0 ** math.floor(math.log2(self.radius))
        speed = v.abs().amax(dim=-1)
        v_unit = torch.where(speed > 0, torch.exp2(torch.floor(torch.log2(speed))),
                             torch.ones_like(speed))
        yn, u = y / r_unit, v / v_unit[:, None]
        t = _quadratic_exit((u * u).sum(-1), (yn * u).sum(-1),
                            (yn * yn).sum(-1) - (self.radius / r_unit) ** 2)
        t = t * (r_unit / v_unit)
        ys = yn + torch.nan_to_num(t / r_unit, posinf=0.0)[:, None] * v
        normal = ys / ys.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        return Hit(t, normal, torch.zeros(len(x), dtype=torch.long, device=x.device))

    def interior_point(self) -> np.ndarray:
        """The centre.

        Returns
        -------
        numpy.ndarray of shape (d,)
            A copy of ``center``.
        """
        return self.center.copy()

    def width(self) -> float:
        """The diameter.

        Returns
        -------
        float
            ``2 * radius``.
        """
        return 2.0 * self.radius

    def _scaled_width(self, scale):
        return 2.0 * self.radius / float(np.max(scale))


class Ellipsoid(ConvexContainer):
    """Ellipsoid ``{x : (x - center)^T E (x - center) <= 1}``, ``E`` symmetric positive definite.

    Parameters
    ----------
    center : array-like of shape (d,)
        Finite centre; its length fixes the dimension ``d``.
    E : array-like of shape (d, d)
        Finite, symmetric (to ``rtol=1e-10``, ``atol=1e-12``; symmetrised) and
        positive definite shape matrix, else ``ValueError``: the semi-axes have
        lengths ``1 / sqrt(eigenvalues of E)``.

    Attributes
    ----------
    center : numpy.ndarray of shape (d,)
        The centre, float64 and read-only.
    E : numpy.ndarray of shape (d, d)
        The shape matrix, ``(E + E^T) / 2``, read-only. Assigning ``center`` or
        ``E`` checks the new value as the constructor does.
    dim : int
        The dimension ``d``.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import Ellipsoid
    >>> ell = Ellipsoid([0.0, 0.0], [[4.0, 0.0], [0.0, 1.0]])  # semi-axes 0.5 and 1
    >>> ell.contains(np.array([[0.4, 0.0], [0.6, 0.0]]))
    array([ True, False])
    >>> ell.width()  # the shortest axis
    1.0
    >>> t, normal = ell.hit([[0.0, 0.0]], [[1.0, 0.0]])
    >>> float(t[0]), normal.tolist()
    (0.5, [[1.0, 0.0]])
    """

    _exact_in_float64 = True

    def __init__(self, center: ArrayLike, E: ArrayLike) -> None:
        self._center = _read_only(_as_float_array(center, "center", 1).copy())
        E = _as_float_array(E, "E", 2)
        d = len(self.center)
        if E.shape != (d, d):
            raise ValueError(f"E must have shape ({d}, {d}) to match center, got {E.shape}.")
        if not np.allclose(E, E.T, rtol=1e-10, atol=1e-12):
            raise ValueError("E must be symmetric.")
        if np.linalg.eigvalsh(E).min() <= 0:
            raise ValueError("E must be positive definite.")
        self._E = _read_only(0.5 * (E + E.T))
        self.dim = d

    _parameters = ("center", "E")
    center = _container_parameter("center")
    E = _container_parameter("E")

    def __repr__(self) -> str:
        return f"Ellipsoid(dim={self.dim})"

    @contains_oracle
    @fill_doc(points=_POINTS, membership=_MEMBERSHIP)
    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Whether each point satisfies ``(x - center)^T E (x - center) <= 1 + tol``.

        Parameters
        ----------
        %(points)s
        tol : float, default=0.0
            Slack on the quadratic form (not a distance: ``tol`` admits points up
            to a factor ``sqrt(1 + tol)`` farther from the centre).

        %(membership)s
        """
        y = x - self._t(self.center, x)
        return ((y @ self._t(self.E, x)) * y).sum(-1) <= 1.0 + tol

    @hit_oracle
    @fill_doc(rays=_RAYS)
    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """Exit time of the rays ``x + t v`` through the ellipsoid's surface.

        The positive root of ``(y + t v)^T E (y + t v) = 1`` with
        ``y = x - center``, in a form free of cancellation (a start on the surface
        moving inwards gets the far root).

        Parameters
        ----------
        %(rays)s
        exclude : torch.Tensor of shape (C,), optional
            Ignored (one smooth face; the root is chosen so that a start on it
            does not hit it again at ``t = 0``).

        Returns
        -------
        Hit
            The pair ``(t, normal)``: ``t`` of shape ``(C,)`` (``inf`` for a zero
            velocity) and the unit outward normal, ``E (y - center)`` normalised,
            at the exit point ``y``, shape ``(C, d)``; ``.face`` is all zeros (one
            smooth face).
        """
        E = self._t(self.E, x)
        y = x - self._t(self.center, x)
        Ev = v @ E
        t = _quadratic_exit((v * Ev).sum(-1), (y * Ev).sum(-1), ((y @ E) * y).sum(-1) - 1.0)
        ys = y + torch.nan_to_num(t, posinf=0.0)[:, None] * v
        g = ys @ E
        normal = g / g.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        return Hit(t, normal, torch.zeros(len(x), dtype=torch.long, device=x.device))

    def interior_point(self) -> np.ndarray:
        """The centre.

        Returns
        -------
        numpy.ndarray of shape (d,)
            A copy of ``center``.
        """
        return self.center.copy()

    def width(self) -> float:
        """The length of the shortest axis, the diameter of the largest inscribed ball.

        Returns
        -------
        float
            ``2 / sqrt(largest eigenvalue of E)``.
        """
        return float(2.0 / np.sqrt(np.linalg.eigvalsh(self.E).max()))

    def _scaled_width(self, scale):
        return float(2.0 / np.sqrt(np.linalg.eigvalsh(scale[:, None] * self.E * scale).max()))

    def random_interior(self, n: int, gen: torch.Generator) -> Tensor:
        """``n`` points uniform in the ellipsoid shrunk by 0.9 about its centre.

        The generic centre-plus-chord points cluster at the centre of an elongated
        ellipsoid (a random direction has a short chord), so chains started there
        learn a far too small variance along the long axes during warm-up (with a
        needle of axes 1e-3 and 1e2, ``mass="diag"`` and 500 warm-up iterations:
        R-hat up to 1.4). ``E^{-1/2}`` (by ``eigh``, robust for any positive
        definite ``E``) maps the unit ball onto the ellipsoid.

        Parameters
        ----------
        n : int
            Number of points.
        gen : torch.Generator
            CPU generator the points are drawn from.

        Returns
        -------
        torch.Tensor of shape (n, d), float64
            ``center + 0.9 E^{-1/2} w`` with ``w`` uniform in the unit ball.
        """
        d = self.dim
        w = torch.randn(n, d, generator=gen, dtype=torch.float64)
        r = torch.rand(n, 1, generator=gen, dtype=torch.float64) ** (1.0 / d)
        w = 0.9 * r * w / w.norm(dim=1, keepdim=True).clamp_min(1e-300)
        lam, V = np.linalg.eigh(self.E)
        inv_sqrt = (V / np.sqrt(lam)) @ V.T  # E^{-1/2}, symmetric
        # (a copy: the read-only centre made torch warn of a non-writable array)
        return torch.tensor(self.center, dtype=torch.float64) + w @ torch.as_tensor(inv_sqrt)


def _quadratic_exit(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Positive root of ``a t^2 + 2 b t + c = 0`` for a start inside (``c <= 0``).

    Uses the cancellation-free form of the root for either sign of ``b``.
    """
    c = c.clamp_max(0.0)
    s = torch.sqrt(b * b - a * c)
    t = torch.where(b <= 0, (-b + s) / a.clamp_min(1e-300), -c / (b + s).clamp_min(1e-300))
    return torch.where(a > 0, t, torch.full_like(t, float("inf")))

