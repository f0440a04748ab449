"""Base class of the convex containers of reflective HMC and its input validation.

Every container is batched over chains: positions and velocities are ``(C, d)``
tensors (``C`` chains, ``d`` dimensions) and the oracles return one value per
chain. The concrete containers live in ``_supports`` (closed-form oracles) and
``_levelset`` (convex level sets by root finding).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, TypeVar, cast, overload

import numpy as np
import torch

from mlpapers._utils import check_real, on_inputs_device, to_numpy, wrap_public_methods
from mlpapers._utils._typing import F

__all__ = ["ConvexContainer", "Hit", "accept_arrays", "check_oracles", "contains_oracle",
           "hit_oracle", "unpack_hit"]

Tensor = torch.Tensor
# the parts of a Hit: tensors, or numpy arrays when the oracle got numpy points
_A = TypeVar("_A", bound=Tensor | np.ndarray)


class Hit(tuple[_A, _A], Generic[_A]):
    """What :meth:`ConvexContainer.hit` returns: the pair ``(t, normal)``, as the
    specification writes ``hit(x, v, t_max) -> (t, normal)``, with the index of the
    face hit as ``.face`` (the sampler excludes it from the next hitting-time search).

    ``t, normal = K.hit(x, v, t_max)`` unpacks it; ``.t``, ``.normal`` and ``.face``
    name the parts: tensors (``Hit[torch.Tensor]``), or numpy arrays
    (``Hit[numpy.ndarray]``) when the oracle was called with numpy points.
    """

    face: _A | None

    def __new__(cls, t: _A, normal: _A, face: _A | None = None) -> Self:
        obj = super().__new__(cls, (t, normal))
        obj.face = face
        return obj

    def __getnewargs__(self):  # pickling and copying keep the face
        return (self[0], self[1], self.face)

    @property
    def t(self) -> _A:
        return self[0]

    @property
    def normal(self) -> _A:
        return self[1]

    def __repr__(self) -> str:
        return f"Hit(t={self[0]!r}, normal={self[1]!r}, face={self.face!r})"


def _as_points(value, name: str) -> Tensor:
    """An array-like of points as a float64 tensor (on the CPU)."""
    check_real(value, name)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a torch tensor or a numeric array-like of points "
                        f"of shape (C, d): {exc}") from None
    return torch.from_numpy(arr.copy())


_ARRAYS_OK = "_rehmc_accepts_arrays"


def _check_tol(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``contains``'s ``tol``: a NaN compared False everywhere, so every point was
    reported outside (or inside), without an error. A numpy array of one value (what
    ``np.asarray``, ``np.median`` of an array or a 0-d slice give) is that number,
    as a one-value tensor is. Several values raise a ``TypeError``: the sets read them
    differently (a torch error for a box or a polytope, one tolerance per point for the
    others). The arguments come back with such a ``tol`` replaced."""
    tol = args[0] if args else kwargs.get("tol", 0.0)
    if isinstance(tol, np.ndarray | Tensor):
        if isinstance(tol, Tensor):
            size, real = tol.numel(), not (tol.is_complex() or tol.dtype == torch.bool)
        else:
            size, real = tol.size, tol.dtype.kind in "iuf"
        if size != 1:
            raise TypeError(f"tol must be one real number (points up to tol outside K count "
                            f"as inside), got an array of shape {tuple(tol.shape)}.")
        if real:  # (else refused below, as any other value that is not a number)
            tol = float(tol.reshape(()))
            if args:
                args = (tol, *args[1:])
            else:
                kwargs = {**kwargs, "tol": tol}
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
        raise TypeError("tol must be a real number (points up to tol outside K count as "
                        f"inside), got {tol!r} of type {type(tol).__name__}.")
    if isinstance(tol, numbers.Real) and math.isnan(tol):
        raise ValueError("tol must be a number (points up to tol outside K count as "
                         "inside), got nan.")
    return args, kwargs


def _check_hit_args(container, x, args: tuple, kwargs: dict) -> None:
    """``hit``'s ``t_max`` and ``exclude`` when a user passes them as Python numbers or
    numpy arrays: a NaN or negative bracket gave the bisection oracle no interval to
    search, without an error, an infinite one made a bounded ConvexSet "never left", and
    an array of another length than the points failed inside torch; non-finite points
    or velocities are refused. Tensors are the sampler's own, per chain, and pass
    unchecked (no device sync per step)."""
    t_max = args[1] if len(args) > 1 else kwargs.get("t_max")
    exclude = args[2] if len(args) > 2 else kwargs.get("exclude")
    v = args[0] if args else kwargs.get("v")
    for name, a in (("x", x), ("v", v)):
        # (a NaN velocity gave t = inf, "never leaves", and a NaN point t = NaN)
        if a is not None and not isinstance(a, Tensor):
            try:
                finite = bool(np.isfinite(np.asarray(a, dtype=np.float64)).all())
            except (TypeError, ValueError):
                continue  # (named by the conversion that follows)
            if not finite:
                raise ValueError(f"hit: {name} must be finite (no NaN or inf).")
    shape = np.shape(x)
    rows = shape[0] if len(shape) == 2 else 1
    for name, a in (("t_max", t_max), ("exclude", exclude)):
        if isinstance(a, np.ndarray) and a.shape not in ((), (rows,)):
            raise ValueError(f"{name} must be a number or an array of shape ({rows},), one "
                             f"per point, got shape {a.shape}.")
    if exclude is not None and not (isinstance(exclude, Tensor) or (
            isinstance(exclude, np.ndarray) and exclude.dtype.kind in "iu")):
        # (a Python int failed with "'int' object is not subscriptable")
        got = getattr(exclude, "dtype", type(exclude).__name__)
        raise TypeError(f"exclude must be None or an integer tensor or array of shape "
                        f"({rows},) (-1 for no face), got {got}.")
    if t_max is None or isinstance(t_max, Tensor):
        return
    if isinstance(t_max, np.ndarray):
        check_real(t_max, "t_max")
        if t_max.dtype.kind not in "iuf":
            raise TypeError(f"t_max must hold numbers, got dtype {t_max.dtype}.")
        values = t_max.astype(np.float64)
    elif isinstance(t_max, bool) or not isinstance(t_max, numbers.Real):
        raise TypeError(f"t_max must be None, a number or a tensor of shape (C,), got "
                        f"{t_max!r} of type {type(t_max).__name__}.")
    else:
        values = np.asarray(float(t_max))
    if not np.all(values >= 0):  # (NaN too)
        raise ValueError(f"t_max must be >= 0, got {t_max!r}.")
    if getattr(container, "_needs_finite_t_max", False) and not np.all(np.isfinite(values)):
        # g(x + inf v) is NaN: a bounded set "never left"
        raise ValueError(f"{type(container).__name__}.hit needs a finite t_max (the "
                         f"bisection bracket), got {t_max!r}.")


def _check_points(container, x: Tensor, v, shown: tuple | None = None) -> None:
    """``x`` (and the velocities ``v`` of ``hit``) of shape ``(C, dim)``: points of
    another dimension failed with torch broadcasting errors. ``shown`` is the shape the
    caller passed (a single point's, before it became a batch of one)."""
    d = getattr(container, "dim", None)
    if x.ndim != 2 or (d is not None and x.shape[1] != d):
        raise ValueError(f"x must have shape (C, {'d' if d is None else d}), one point per "
                         f"row, or ({'d' if d is None else d},) for one point, got "
                         f"{shown or tuple(x.shape)}.")
    if isinstance(v, Tensor) and v.shape != x.shape:
        raise ValueError(f"v must have the shape of x {tuple(x.shape)}, got {tuple(v.shape)}.")


def _call_on_points(container, method, is_hit: bool, x: Tensor, args: tuple, kwargs: dict):
    """``method(x, ...)`` after the shape checks; a single point ``(d,)`` (with ``(d,)``
    velocities and a scalar ``exclude`` for ``hit``) is answered as a batch of one, and
    the answer comes back without the batch axis. (``contains`` of one point was a
    scalar for the closed-form containers by accident, an error for ConvexSet, and
    ``hit`` failed with an IndexError.)"""
    single, shown = x.ndim == 1, tuple(x.shape)
    if single:
        x = x[None]
        if is_hit:
            def batch(a):
                return a[None] if isinstance(a, Tensor) and a.ndim in (0, 1) else a
            args = tuple(batch(a) if i in (0, 2) else a for i, a in enumerate(args))
            kwargs = {k: batch(a) if k in ("v", "exclude") else a for k, a in kwargs.items()}
    _check_points(container, x, (args[0] if args else kwargs.get("v")) if is_hit else None,
                  shown)
    out = method(container, x, *args, **kwargs)
    if not single:
        return out
    if isinstance(out, Hit):
        return Hit(out[0][0], out[1][0], None if out.face is None else out.face[0])
    if isinstance(out, tuple):  # a user's hit: (t, normal) or (t, normal, face)
        return tuple(o[0] if isinstance(o, Tensor) else o for o in out)
    return out[0]


def accept_arrays(method: F) -> F:
    """Let an oracle (``contains``, ``hit``) take numpy arrays or nested lists.

    The oracles compute on torch tensors; a user checking draws (``result.samples``,
    numpy) with ``K.contains`` got ``TypeError: as_tensor(): argument 'dtype' must be
    torch.dtype`` or ``'numpy.ndarray' object has no attribute 'clone'``. Points that are
    not a tensor are converted to float64 tensors and the answer comes back as numpy
    (numpy in, numpy out); tensors pass through untouched (the sampler's hot path pays
    one ``isinstance`` and the checks of the points' shape and of ``tol``, no pass over
    the data). :func:`contains_oracle` and :func:`hit_oracle` are this decorator with the
    types it gives (for type checkers).
    """
    if getattr(method, _ARRAYS_OK, False):
        return method

    is_hit = method.__name__ == "hit"  # its second argument is the velocities v

    @functools.wraps(method)
    def wrapper(self, x, *args, **kwargs):
        if is_hit:
            _check_hit_args(self, x, args, kwargs)
        else:
            args, kwargs = _check_tol(args, kwargs)
        if isinstance(x, Tensor) and not x.is_floating_point():
            # integer points: the float64 parameters were cast to the points' dtype,
            # so Box([0.5], [1.5]).contains(tensor([[0]])) read the box as [0, 1]
            check_real(x, "x")
            x = x.to(torch.float64)
        if isinstance(x, Tensor):
            if is_hit:  # numpy velocities / t_max with tensor points follow the points
                def follow(a, name):
                    if isinstance(a, Tensor) and name == "v" and not a.is_floating_point():
                        check_real(a, "v")
                        return a.to(x.dtype)  # (integer velocities failed in torch's norm)
                    if a is None or isinstance(a, Tensor):
                        return a
                    if name == "v":
                        return _as_points(a, "v").to(dtype=x.dtype, device=x.device)
                    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=x.dtype,
                                           device=x.device) if name == "t_max" else a
                names = ("v", "t_max", "exclude")
                args = tuple(follow(a, nm) for a, nm in zip(args, names)) + args[3:]
                kwargs = {k: follow(a, k) for k, a in kwargs.items()}
            return _call_on_points(self, method, is_hit, x, args, kwargs)
        xt = _as_points(x, "x")
        if is_hit and args:  # numpy points with numpy or tensor velocities: float64, CPU
            args = (_as_points(args[0], "v") if not isinstance(args[0], Tensor)
                    else args[0].detach().to("cpu", torch.float64), *args[1:])
        elif args and not isinstance(args[0], Tensor):
            args = (_as_points(args[0], "v"), *args[1:])
        if "v" in kwargs and not isinstance(kwargs["v"], Tensor):
            kwargs["v"] = _as_points(kwargs["v"], "v")
        elif isinstance(kwargs.get("v"), Tensor):
            kwargs["v"] = kwargs["v"].detach().to("cpu", torch.float64)
        args = tuple(torch.as_tensor(np.asarray(a)) if isinstance(a, np.ndarray) else a
                     for a in args)
        kwargs = {k: torch.as_tensor(np.asarray(a)) if isinstance(a, np.ndarray) else a
                  for k, a in kwargs.items()}
        out = _call_on_points(self, method, is_hit, xt, args, kwargs)
        if isinstance(out, Tensor):
            return out.numpy()
        if isinstance(out, tuple):
            parts = [o.detach().numpy() if isinstance(o, Tensor) else o for o in out]
            if isinstance(out, Hit):
                face = out.face.numpy() if isinstance(out.face, Tensor) else out.face
                return Hit(parts[0], parts[1], face)
            return type(out)(parts) if type(out) is tuple else tuple(parts)
        return out

    setattr(wrapper, _ARRAYS_OK, True)
    return cast(F, wrapper)  # (the signature kept: numpy points also accepted)


# The oracles' types once accept_arrays wraps them, written once as overloaded templates:
# tensors in, tensors out; numpy arrays or nested lists of points in, numpy out.
_Points = np.ndarray | Sequence[Any]
_F = TypeVar("_F")


class _Oracles:  # (signatures only: type checkers name them in their messages)
    @overload
    def contains(self: Any, x: Tensor, tol: float = 0.0) -> Tensor: ...
    @overload
    def contains(self: Any, x: _Points, tol: float = 0.0) -> np.ndarray: ...
    def contains(self: Any, x: Any, tol: float = 0.0) -> Any:
        raise NotImplementedError

    @overload
    def hit(self: Any, x: Tensor, v: Tensor | _Points,
            t_max: Tensor | np.ndarray | float | None = None,
            exclude: Tensor | None = None) -> Hit[Tensor]: ...
    @overload
    def hit(self: Any, x: _Points, v: Tensor | _Points,
            t_max: Tensor | np.ndarray | float | None = None,
            exclude: Tensor | np.ndarray | None = None) -> Hit[np.ndarray]: ...
    def hit(self: Any, x: Any, v: Any, t_max: Any = None, exclude: Any = None) -> Any:
        raise NotImplementedError


def _typed_as(template: _F) -> Callable[[Callable[..., Any]], _F]:
    """:func:`accept_arrays`, which type checkers see turn a method into ``template``."""
    return cast(Callable[[Callable[..., Any]], _F], accept_arrays)


# @contains_oracle def contains(self, x: Tensor, tol: float = 0.0) -> Tensor: ... (and hit)
contains_oracle = _typed_as(_Oracles.contains)
hit_oracle = _typed_as(_Oracles.hit)


def unpack_hit(out) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(t, normal, face)`` of a ``hit`` answer: a :class:`Hit`, a plain pair
    ``(t, normal)`` (face unknown: ``None``) or, from a user's class written for
    earlier versions, a triple ``(t, normal, face)``."""
    if len(out) == 3:
        return out[0], out[1], out[2]
    return out[0], out[1], getattr(out, "face", None)


def _as_float_array(value, name: str, ndim: int | None) -> np.ndarray:
    """``value`` as a finite, non-empty float64 array with ``ndim`` dimensions (any if None)."""
    try:
        arr = to_numpy(value) if isinstance(value, torch.Tensor) else np.asarray(value)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} must be a rectangular numeric array: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}.")
    arr = arr.astype(np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}D, got a {arr.ndim}D array of shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN or inf).")
    return arr


def _read_only(arr: np.ndarray) -> np.ndarray:
    """``arr`` with its writeable flag cleared (a container's own copy of a parameter)."""
    arr.flags.writeable = False
    return arr


def _container_parameter(name: str) -> Any:
    """A built-in container's constructor argument, kept as a read-only attribute.

    The value lives in ``_<name>`` (numpy arrays read-only); assigning the attribute
    rebuilds the container with the constructor's checks, all or nothing. In-place
    edits used to leave what the constructor derived (a polytope's transposed rows and
    Chebyshev centre, a box's widths, the cached tensor copies) stale, so ``contains``
    and ``hit`` disagreed. (Typed ``Any``: a ``property`` built here reads as one to
    type checkers.)
    """
    slot = "_" + name

    def get(self: ConvexContainer) -> Any:
        return self.__dict__[slot]

    def set_(self: ConvexContainer, value: Any) -> None:
        self._rebuild(**{name: value})

    return property(get, set_)


def _not_implemented(container: Any, method: str) -> NotImplementedError:
    """The error of an oracle a user's container subclass left out."""
    return NotImplementedError(f"{type(container).__name__} must implement {method} (a "
                               "ConvexContainer subclass implements contains, hit and "
                               "interior_point).")


class ConvexContainer:
    """Base class of the convex containers ``K`` that trajectories reflect off.

    Subclasses implement :meth:`contains`, :meth:`hit` and
    :meth:`interior_point`; ``dim`` is the dimension ``d``. The sampler checks
    the types and shapes of a user subclass's answers once, before sampling
    (``ValueError``/``TypeError`` naming the method). A subclass's ``contains`` and
    ``hit`` also accept numpy arrays or nested lists of points (converted to float64
    tensors; the answers then come back as numpy arrays), like the built-in
    containers'.

    Attributes
    ----------
    dim : int
        The dimension ``d`` (set by the subclass).

    See Also
    --------
    Box, Polytope, Ball, Ellipsoid, ConvexSet : the built-in containers.

    Examples
    --------
    A container written by hand, the unit disc (the exit time solves a quadratic):

    >>> import numpy as np
    >>> import torch
    >>> from mlpapers.sampling import ConvexContainer, ReflectiveHMC
    >>> class UnitDisc(ConvexContainer):
    ...     dim = 2
    ...     def contains(self, x, tol=0.0):
    ...         return x.norm(dim=-1) <= 1.0 + tol
    ...     def hit(self, x, v, t_max=None, exclude=None):
    ...         a, b = (v * v).sum(-1), (x * v).sum(-1)
    ...         c = (x * x).sum(-1) - 1.0
    ...         t = (-b + torch.sqrt(b * b - a * c)) / a
    ...         y = x + t[:, None] * v
    ...         return t, y / y.norm(dim=-1, keepdim=True)
    ...     def interior_point(self):
    ...         return np.zeros(2)
    >>> disc = UnitDisc()
    >>> disc.contains(np.array([[0.5, 0.5], [1.0, 1.0]]))
    array([ True, False])
    >>> res = ReflectiveHMC(lambda x: -(x ** 2).sum(-1), disc, n_leapfrog=5,
    ...                     random_state=0).sample(50, n_chains=2, warmup=50)
    >>> res.samples.shape, bool((np.linalg.norm(res.samples, axis=-1) <= 1.0).all())
    ((2, 50, 2), True)
    """

    def __init_subclass__(cls, **kwargs) -> None:
        # the public methods compute where their inputs are (the CPU for numpy ones),
        # whatever a caller's torch.set_default_device
        super().__init_subclass__(**kwargs)
        # numpy points in, numpy answers out (the built-in classes decorate their oracles
        # with contains_oracle/hit_oracle, for type checkers; a user's class gets it here)
        for name in ("contains", "hit"):
            if name in cls.__dict__:
                setattr(cls, name, accept_arrays(cls.__dict__[name]))
        wrap_public_methods(cls, on_inputs_device)

    dim: int
    # longest chord used by random_interior (an unbounded polytope caps it at 1)
    _chord_cap: float = float("inf")

    # the constructor arguments that _container_parameter exposes (the built-in classes)
    _parameters: tuple[str, ...] = ()

    def _rebuild(self, **changes: Any) -> None:
        """Re-run the constructor with ``changes`` and the other parameters as they are."""
        args = {name: changes[name] if name in changes else getattr(self, name)
                for name in self._parameters}
        fresh = type(self)(**args)  # (raises before anything here changes)
        self.__dict__.update(fresh.__dict__)

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        # pickled before the parameters were read-only attributes: stored by public name
        legacy = {name: state.pop(name) for name in self._parameters if name in state}
        self.__dict__.update(state)
        if legacy:
            self._rebuild(**legacy)
        for name in self._parameters:  # (unpickled arrays come back writeable)
            value = self.__dict__.get("_" + name)
            if isinstance(value, np.ndarray):
                _read_only(value)

    def __getstate__(self) -> dict:
        # without the tensor copies of the parameters: they live on the devices of
        # earlier runs (a pickle with CUDA tensors does not load without a GPU) and are
        # rebuilt on first use
        state = dict(self.__dict__)
        state.pop("_tensor_cache", None)
        return state

    def _t(self, arr: np.ndarray, like: Tensor) -> Tensor:
        cache = self.__dict__.setdefault("_tensor_cache", {})
        key = (id(arr), like.dtype, like.device)
        hit = cache.get(key)
        if hit is None or hit[0] is not arr:
            # (a copy: torch warns on sharing a read-only array, as a Box's bounds are)
            hit = cache[key] = (arr, torch.tensor(arr, dtype=like.dtype, device=like.device))
        return hit[1]

    # whether contains() may be evaluated on float64 copies of lower-precision points (a
    # closed form on the float64 parameters; a ConvexSet's g is the user's and keeps the
    # chains' dtype)
    _exact_in_float64: bool = False

    def contains(self, x: Tensor, tol: float = 0.0) -> Tensor:
        """Membership test ``x in K`` (to within ``tol``) of a batch of points.

        Parameters
        ----------
        x : torch.Tensor or array-like of shape (C, d) or (d,)
            The points, one per row, or one point (answered as a batch of one, the
            answer without the batch axis). A subclass computes on ``(C, d)``
            tensors; numpy arrays and nested lists are converted to float64 tensors
            first.
        tol : float, default=0.0
            Slack: points up to ``tol`` outside ``K`` count as inside (measured as
            each container documents). The sampler tests points with ``tol=0``.

        Returns
        -------
        torch.Tensor of shape (C,), bool
            Whether each point lies in ``K`` (a 0-d answer for one point); a numpy
            array of bool when ``x`` is not a tensor. A user's subclass must return a
            bool tensor of shape ``(C,)`` (checked before sampling).
        """
        raise _not_implemented(self, "contains(...)")

    def _keeps_inside(self, dtype: torch.dtype) -> bool:
        """Whether every drift of this container provably ends in it (in ``dtype``), so
        that the sampler can skip testing each proposal (:meth:`_holds`)."""
        return False

    def _holds(self, x: Tensor) -> Tensor:
        """Exact membership of ``(C, d)`` points -> ``(C,)`` bool, as the sampler keeps it.

        A float32 point is a float64 number: closed-form containers test it against
        their float64 parameters (bounds rounded to float32 can lie outside them, and a
        user's ``(samples >= lo).all()`` in numpy compares in float64).
        """
        if self._exact_in_float64 and x.dtype != torch.float64:
            x = x.double()
        return self.contains(x)

    def hit(self, x: Tensor, v: Tensor, t_max: Tensor | float | None = None,
            exclude: Tensor | None = None) -> Hit:
        """First exit time of the rays ``x + t v`` (``t > 0``): ``(t, normal)``.

        Parameters
        ----------
        x, v : torch.Tensor or array-like of shape (C, d) or (d,)
            Start points (inside ``K``) and velocities, or one point and velocity
            (answered as a batch of one: ``t`` 0-d, ``normal`` ``(d,)``). Numpy arrays
            and nested lists are converted to float64 tensors, and the parts of the
            answer then come back as numpy arrays.
        t_max : torch.Tensor of shape (C,) or float, optional
            The caller only needs hits before ``t_max``; the bisection oracle
            (:class:`ConvexSet`) uses it as its bracket and requires it,
            closed-form oracles ignore it.
        exclude : torch.Tensor of shape (C,), optional
            Index of the face just hit (``-1`` for none), skipped to avoid a
            spurious round-off hit at ``t = 0``.

        Returns
        -------
        Hit
            The pair ``(t, normal)``:

            t : torch.Tensor of shape (C,)
                Hitting time (``inf`` when the ray never leaves ``K``, or for the
                bisection oracle when it does not leave before ``t_max``).
            normal : torch.Tensor of shape (C, d)
                Unit outward normal at the hit point (arbitrary where ``t = inf``).

            and ``.face``, a torch.Tensor of shape (C,), int64: the index of the face
            hit (``0`` for smooth sets), which the sampler passes back as ``exclude``.
            A user's subclass may return a plain pair ``(t, normal)`` (no face
            exclusion), a ``Hit`` or, as earlier versions required, a triple
            ``(t, normal, face)``.
        """
        raise _not_implemented(self, "hit(...)")

    def interior_point(self) -> np.ndarray:
        """A point of the interior of ``K``.

        The sampler starts chains near it (:meth:`random_interior`) and a user's
        class is checked on it before sampling.

        Returns
        -------
        numpy.ndarray of shape (d,)
            A point strictly inside ``K`` (a copy: changing it changes nothing).
        """
        raise _not_implemented(self, "interior_point()")

    def width(self) -> float:
        """Diameter of a ball inscribed in ``K``, which caps the step size.

        The base class does not know it and returns ``inf`` (no cap); a subclass
        may override it.

        Returns
        -------
        float
            The diameter of some ball inside ``K`` (``inf`` if unknown).
        """
        return float("inf")

    def _step_cap(self, inv_mass: Tensor) -> float:
        """Largest step size whose drift, at the typical speed, spans the width.

        Velocities are ``N(0, M^{-1})`` for the ``(d,)`` inverse diagonal mass
        ``inv_mass`` (dual averaging alone would grow the step size of a constant
        density until the reflection cap). The cap is the larger of :meth:`width`
        over the typical speed ``sqrt(sum(inv_mass))`` and, where the container
        knows it, the width of ``K`` in the coordinates ``x_i / sqrt(inv_mass_i)``
        (where the velocity is standard normal) over ``sqrt(d)``; both equal
        ``width / sqrt(d)`` for the identity. The second keeps a mass adapted to a
        container much longer in some directions than others from being held at
        the narrowest direction's step size.
        """
        cap = self.width() / math.sqrt(float(inv_mass.sum()))
        scale = np.sqrt(to_numpy(inv_mass).astype(np.float64))
        if np.all(scale == scale[0]):  # isotropic: the two caps agree
            return cap
        scaled = self._scaled_width(scale)
        return cap if scaled is None else max(cap, scaled / math.sqrt(self.dim))

    def _scaled_width(self, scale: np.ndarray) -> float | None:
        """Inscribed diameter of ``{x / scale : x in K}`` (``None``: unknown)."""
        return None

    def random_interior(self, n: int, gen: torch.Generator) -> Tensor:
        """``n`` random points of ``K`` (not uniform): centre plus a random fraction of a chord.

        The default starting points of the chains: from :meth:`interior_point`, a
        uniformly random direction and a uniform fraction in ``[0, 0.9)`` of the
        chord to the boundary along it (found by :meth:`hit` with ``t_max=1e3``; a
        chord that never leaves ``K`` counts as length 1).

        Parameters
        ----------
        n : int
            Number of points.
        gen : torch.Generator
            CPU generator the directions and fractions are drawn from.

        Returns
        -------
        torch.Tensor of shape (n, d), float64
            Points of ``K``, on the CPU.
        """
        c = torch.as_tensor(self.interior_point(), dtype=torch.float64).expand(n, -1).clone()
        u = torch.randn(n, self.dim, generator=gen, dtype=torch.float64)
        u = u / u.norm(dim=1, keepdim=True)
        t = self.hit(c, u, torch.full((n,), 1e3, dtype=torch.float64),
                     torch.full((n,), -1, dtype=torch.long))[0]
        t = torch.where(torch.isfinite(t), t, torch.ones_like(t)).clamp_max(self._chord_cap)
        frac = torch.rand(n, generator=gen, dtype=torch.float64) * 0.9
        return c + (frac * t)[:, None] * u


wrap_public_methods(ConvexContainer, on_inputs_device)

_BUILT_IN = "mlpapers.sampling.rehmc."


def check_membership(container: ConvexContainer, x: Tensor, name: str) -> Tensor:
    """``container._holds(x)``, checked to be a bool tensor of shape ``(C,)`` for a user's
    class (a ``(C, 1)`` answer broadcast into ``(C, C)`` masks deep in a transition)."""
    inside = container._holds(x)
    if type(container).__module__.startswith(_BUILT_IN):
        return inside
    if not isinstance(inside, Tensor) or inside.shape != x.shape[:1] or (
            inside.dtype != torch.bool):
        got = (f"a {inside.dtype} tensor of shape {tuple(inside.shape)}"
               if isinstance(inside, Tensor) else f"a {type(inside).__name__}")
        raise ValueError(f"{name} ({type(container).__name__}).contains must return a bool "
                         f"tensor of shape ({x.shape[0]},) for ({x.shape[0]}, "
                         f"{x.shape[1]}) points (one row per point), got {got}.")
    return inside


def check_oracles(container: ConvexContainer, dtype: torch.dtype, device, name: str) -> None:
    """Check a user's container class once, before sampling: ``dim``, ``interior_point``,
    and the types and shapes that ``contains`` and ``hit`` return for two points.
    Built-in classes are skipped (their oracles are tested). A ``support`` is checked
    where it is used, by :func:`check_membership` (it only answers membership).

    A ``contains`` of shape ``(C, 1)`` broadcast against ``(C,)`` masks into ``(C, C)``
    (a torch error deep in a transition), and a normal of shape ``(C, 1)`` broadcast
    silently: every reflection used a wrong normal and the chain left its target.

    Raises
    ------
    TypeError, ValueError
        Naming ``name`` and the method, and what was expected.
    """
    if type(container).__module__.startswith(_BUILT_IN):
        return
    cls = f"{name} ({type(container).__name__})"
    d = getattr(container, "dim", None)
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
        raise TypeError(f"{cls} must set dim to the dimension d, an int >= 1, got {d!r}.")
    d = int(d)
    try:
        c = np.asarray(to_numpy(p) if isinstance(p := container.interior_point(), Tensor)
                       else p, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{cls}.interior_point() must return a numeric array of shape "
                        f"({d},): {exc}") from None
    if c.size == d:  # (d,), or a (1, d) row, which the sampler itself accepts
        c = c.reshape(d)
    if c.shape != (d,) or not np.all(np.isfinite(c)):
        raise ValueError(f"{cls}.interior_point() must return a finite array of shape "
                         f"({d},), got shape {c.shape}.")
    x = torch.as_tensor(c, dtype=dtype, device=device).expand(2, d).clone()

    def bad(method, what, got):
        desc = (f"a {got.dtype} tensor of shape {tuple(got.shape)}"
                if isinstance(got, Tensor) else f"a {type(got).__name__}")
        return ValueError(f"{cls}.{method} must return {what} for (2, {d}) points (one "
                          f"row per point), got {desc}.")

    inside = container.contains(x)
    if not isinstance(inside, Tensor) or inside.shape != (2,) or inside.dtype != torch.bool:
        raise bad("contains", "a bool tensor of shape (2,)", inside)
    v = torch.zeros_like(x)
    v[0, 0], v[1, 0] = 1.0, -1.0
    out = container.hit(x, v, torch.full((2,), 1e3, dtype=dtype, device=device),
                        torch.full((2,), -1, dtype=torch.long, device=device))
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise ValueError(f"{cls}.hit must return a tuple (t, normal) (or (t, normal, face)), "
                         f"got {type(out).__name__}" + (f" of length {len(out)}."
                                                        if isinstance(out, tuple) else "."))
    t, normal, face = unpack_hit(out)
    if not isinstance(t, Tensor) or t.shape != (2,) or not t.is_floating_point():
        raise bad("hit", "hitting times t, a float tensor of shape (2,),", t)
    if not isinstance(normal, Tensor) or normal.shape != (2, d) or not normal.is_floating_point():
        raise bad("hit", f"normals, a float tensor of shape (2, {d}),", normal)
    if isinstance(face, Tensor) and face.shape != (2,):  # (None is passed back as is)
        raise bad("hit", "face indices, a tensor of shape (2,),", face)
    if face is None:
        _check_pair_needs_no_exclusion(container, x, v, t, normal, cls)


def _check_pair_needs_no_exclusion(container, x, v, t, normal, cls) -> None:
    """A ``hit`` answering the pair ``(t, normal)`` gives the sampler no face to exclude
    after a reflection, so it must itself ignore the face a ray starts on. One that
    reports that face again at ``t ~ 0`` would bounce in place until the reflection cap:
    every such trajectory rejected as divergent (a chain that barely moves), with only an
    R-hat warning. Probed on the two rays above: reflect at the hit point, ask again."""
    ok = torch.isfinite(t) & (t > 0)
    if not bool(ok.any()):
        return
    x, v, t, normal = x[ok], v[ok], t[ok], normal[ok]
    n = normal / normal.norm(dim=1, keepdim=True).clamp_min(1e-300)
    at = x + t[:, None] * v
    back = v - 2.0 * (v * n).sum(1, keepdim=True) * n
    none = torch.full((len(x),), -1, dtype=torch.long, device=x.device)
    again, n_again, _ = unpack_hit(container.hit(at, back, 2.0 * t + 1.0, none))
    n_again = n_again / n_again.norm(dim=1, keepdim=True).clamp_min(1e-300)
    # the same face again at t ~ 0 (a ray ending on a vertex may meet the next face at
    # t = 0: a valid answer, with another normal)
    same = (n_again * n).sum(1) > 1.0 - 1e-6
    if bool(((again <= 1e-9 * t) & same).any()):
        raise ValueError(
            f"{cls}.hit returns (t, normal) without the face index, and from a point on "
            "the boundary, moving inwards, it reports that same face at t ~ 0: the "
            "sampler would bounce in place. Return the triple (t, normal, face) and skip "
            "the face given as exclude, or ignore faces the ray moves away from.")


def check_resolution(container: ConvexContainer, dtype: torch.dtype) -> None:
    """Refuse a container narrower than the spacing of ``dtype``'s values at its
    interior point's largest coordinate: ``dtype`` cannot hold two of its points apart
    there. A float32 box ``[1e8, 1e8 + 1]`` (float32 values are 8 apart there: both
    walls round to ``1e8``) held every draw at one point, with acceptance 1 and no
    warning, and a polytope of that width failed with a ``ZeroDivisionError`` when its
    step size adapted to 0. Coarsely resolved containers that still hold distinct
    values run (their draws are quantised; the R-hat warning reports frozen
    coordinates). A container of unknown (infinite) width is not checked."""
    as_numpy = np.float32 if dtype == torch.float32 else np.float64
    advice = "use dtype=torch.float64, or " if dtype != torch.float64 else ""
    extents = getattr(container, "_coordinate_extents", None)
    if extents is not None:
        # coordinate by coordinate where the container knows its sides (a Box): the
        # smallest side against the spacing at the largest coordinate refused a rate in
        # (0, 1e-3) beside a count in (1e5, 2e5), each resolved on its own
        sides, magnitudes = extents()
        spacings = np.spacing(magnitudes.astype(as_numpy)).astype(np.float64)
        bad = np.flatnonzero(sides < spacings)
        if bad.size:
            j = int(bad[0])
            raise ValueError(
                f"the container is too narrow for {str(dtype).removeprefix('torch.')} "
                f"along coordinate {j}: width {sides[j]:.3g} at values up to "
                f"{magnitudes[j]:.3g}, where they are {spacings[j]:.3g} apart; {advice}shift "
                "that coordinate so that the container lies near its origin.")
        return
    width = float(container.width())
    if not math.isfinite(width):
        return
    centre = float(np.abs(np.asarray(to_numpy(container.interior_point()),
                                     dtype=np.float64)).max(initial=0.0))
    spacing = float(np.spacing(as_numpy(centre)))
    if width < spacing:
        raise ValueError(
            f"the container is too narrow for {str(dtype).removeprefix('torch.')} where it "
            f"lies: width {width:.3g} at coordinates up to {centre:.3g}, where its values "
            f"are {spacing:.3g} apart; {advice}shift the coordinates so that the container "
            f"lies near the origin.")
