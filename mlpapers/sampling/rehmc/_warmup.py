"""The start of a :class:`ReflectiveHMC` run: starting points and the warm-up schedule.

:func:`initial_points` validates ``x0`` or draws starting points in the
support. One :class:`Warmup` object holds the tuned quantities and updates them once
per warm-up iteration, in this order:

1. the ChEES trajectory length (``n_leapfrog="auto"``): one Adam step on
   ``log T``, restarted at one step after the initial 15% buffer;
2. the per-chain step sizes (``step_size="auto"``): one dual-averaging step,
   capped so that one drift covers at most the inscribed diameter;
3. the diagonal inverse mass (``mass="diag"``): Welford variances over Stan's
   doubling windows; at the end of each window the step size is found again by
   the doubling heuristic and ``T`` keeps its length in steps;
4. after the last iteration, the averaged step sizes and the averaged ``T``
   are frozen.

The sampling loop only reads :attr:`Warmup.eps`, :attr:`Warmup.step_mean`,
:attr:`Warmup.kernel_inv_mass` and :attr:`Warmup.trajectory_length`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np
import torch

from mlpapers._utils import check_real, to_numpy, user_stacklevel
from mlpapers.sampling.rehmc._adapt import (
    DualAveraging,
    WelfordVariance,
    initial_buffer,
    mass_windows,
)
from mlpapers.sampling.rehmc._chees import ChEESAdaptation, chees_gradient
from mlpapers.sampling.rehmc._container import check_membership
from mlpapers.sampling.rehmc._kernels import ContractError, log_prob_and_grad
from mlpapers.sampling.rehmc._supports import Box, ConvexContainer

__all__ = ["MAX_LEAPFROG", "Warmup", "initial_points", "start_state"]

MAX_LEAPFROG = 1000  # cap of leapfrog steps per transition with n_leapfrog="auto" (as TFP)

# find_step(x, logp, grad, inv_mass, init, max_step, *, replay=False) -> (C,) step sizes
# (doubling heuristic; replay=True draws the same momenta as the previous call)
FindStep = Callable[..., torch.Tensor]


#: random starting points tried per chain where log_prob is not finite (Stan tries 100)
START_ATTEMPTS = 100


#: what the error on starts where log_prob stays non-finite advises ReflectiveHMC's users
START_ADVICE = ("pass x0 (one point per chain where it is finite) or restrict the support "
                "(support=Region(...))")


def start_state(log_prob: Callable, x: torch.Tensor, grad_log_prob: Callable | None, *,
                name: str = "log_prob", redraw: Callable[[], torch.Tensor] | None = None,
                advice: str = START_ADVICE
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The starting points, ``log_prob`` and its gradient there, checked.

    With ``redraw`` (random starting points, no ``x0``), chains where ``log_prob``
    or its gradient is not finite (a density that is ``-inf`` on part of the
    container) move to new points ``redraw()`` draws, up to :data:`START_ATTEMPTS`
    times, as Stan retries its random inits; chains that start finite keep their
    points, so a run that started finite draws nothing more.
    Raises a ``ValueError`` if either is still not finite there, and warns when
    ``log_prob`` varies but autograd cannot differentiate it (its gradient is then
    zero and the sampler random-walks). An exception raised by ``log_prob`` or
    ``grad_log_prob`` propagates with its own type and traceback; a hint is added
    as a note (:pep:`678`) when it is a float dtype mismatch, or when ``log_prob``
    looks like a density of one point (it returns a scalar for ``x[0]``). ``name`` is
    what the non-finite error calls ``log_prob`` (the user's own function's name), and
    ``advice`` what it tells the user to do after the random redraws.
    """
    failed = []  # which user function raised (the first one)

    def tagged(fn, name):
        def call(z):
            try:
                return fn(z)
            except BaseException:
                failed.append(name)
                raise
        return call

    glp = None if grad_log_prob is None else tagged(grad_log_prob, "grad_log_prob")
    try:
        logp, grad, has_graph = log_prob_and_grad(tagged(log_prob, "log_prob"), x, glp,
                                                  report_graph=True)
    except ContractError:  # a broken contract, said in its message (no guess added)
        raise
    except Exception as exc:
        # our own shape checks raise outside the user's functions: no hint (they have one);
        # an autograd backward error belongs to log_prob
        culprit = failed[0] if failed else ("log_prob" if isinstance(exc, RuntimeError)
                                            else None)
        hint = None if culprit is None else _start_hint(exc, culprit, log_prob, x,
                                                         with_grad=grad_log_prob is not None,
                                                         density=name)
        if hint is not None:
            exc.add_note(hint)
        raise
    def not_finite(logp, grad):
        return ~(torch.isfinite(logp) & torch.isfinite(grad).all(dim=-1))

    bad = not_finite(logp, grad)
    for _ in range(START_ATTEMPTS if redraw is not None else 0):
        if not bool(bad.any()):
            break
        assert redraw is not None
        x = torch.where(bad[:, None], redraw().to(x), x)
        new_logp, new_grad = log_prob_and_grad(log_prob, x, grad_log_prob)
        logp = torch.where(bad, new_logp, logp)
        grad = torch.where(bad[:, None], new_grad, grad)
        bad = not_finite(logp, grad)
    if bool(bad.any()):
        where = (f"at {int(bad.sum())} of the {bad.numel()} chains' starting points after "
                 f"{START_ATTEMPTS} random points each; {advice}"
                 if redraw is not None else "at the starting points")
        raise ValueError(f"{name} (or its gradient) is not finite {where}.")
    if not has_graph and _varies(log_prob, x, logp):
        warnings.warn(
            "log_prob's output is not connected to its input by autograd (it leaves "
            "torch, e.g. through numpy or .detach()), but varies with x: its gradient is "
            "taken as zero, so the chain stays exact but mixes like a random walk. Write "
            "log_prob with torch operations, or pass grad_log_prob (for a piecewise "
            "constant density, grad_log_prob=torch.zeros_like silences this warning).",
            UserWarning, stacklevel=user_stacklevel())
    return x, logp, grad


# the words by which torch's error messages name each floating dtype
_FLOAT_WORDS = {
    torch.float64: ("double", "float64", "doubletensor"),
    torch.float32: ("float", "float32", "floattensor"),
    torch.float16: ("half", "float16", "halftensor"),
    torch.bfloat16: ("bfloat16", "bfloat16tensor"),
}


def _is_float_dtype_mismatch(exc: BaseException, dtype: torch.dtype) -> bool:
    """Whether ``exc`` says two floating dtypes clash, one of them ``dtype`` (e.g. "mat1
    and mat2 must have the same dtype, but got Double and Float"; not "expected scalar
    type Long but found Double")."""
    if not isinstance(exc, RuntimeError) or dtype not in _FLOAT_WORDS:
        return False
    words = set(re.findall(r"[a-z0-9]+", str(exc).lower().replace("torch.", "")))
    named = {dt for dt, w in _FLOAT_WORDS.items() if words.intersection(w)}
    return dtype in named and len(named) >= 2


def _looks_one_point(log_prob: Callable, x: torch.Tensor, with_grad: bool) -> bool:
    """Whether ``log_prob`` returns a scalar (a 0-d tensor) for one point ``x[0]``, called
    as the sampler called it (``with_grad``: under ``no_grad``, else on a point that
    requires grad: an error due to autograd, such as ``x.numpy()``, then recurs, instead
    of passing for a sign of a one-point function)."""
    try:
        if with_grad:
            with torch.no_grad():
                out = log_prob(x[0].clone())
        else:
            with torch.enable_grad():
                out = log_prob(x[0].detach().clone().requires_grad_(True))
    except Exception:
        return False
    return isinstance(out, torch.Tensor) and out.ndim == 0


def _start_hint(exc: Exception, name: str, log_prob: Callable, x: torch.Tensor, *,
                with_grad: bool = False, density: str = "log_prob") -> str | None:
    """The note added to an exception of ``name`` (``log_prob`` or ``grad_log_prob``)
    at the starting points, or ``None`` when no hint applies (``with_grad``: a
    ``grad_log_prob`` was given, so ``log_prob`` ran under ``torch.no_grad()``).
    ``density`` is what the user's function is called (``StiefelSampler``'s
    ``log_density``, which has no ``grad_log_prob`` to suggest)."""
    shape = tuple(x.shape)
    own = density == "log_prob"  # ReflectiveHMC's: grad_log_prob is an alternative
    if _is_float_dtype_mismatch(exc, x.dtype):
        if x.dtype == torch.float64:
            fix = ("The sampler's dtype defaults to torch.float64: for a float32 model pass "
                   f"dtype=torch.float32, or make {name} float64 (build the data tensors it "
                   "uses with torch.as_tensor(X, dtype=torch.float64), convert an nn.Module "
                   "with .double()).")
        else:
            fix = (f"For a model of another dtype pass it as the sampler's dtype (float64 "
                   f"is the default), or convert the model to {x.dtype}.")
        return f"{name} failed on the {x.dtype} chains, of shape {shape}. {fix}"
    if name != "log_prob" or isinstance(exc, torch.OutOfMemoryError):
        return None
    if isinstance(exc, RuntimeError) and "inference tensors" in str(exc).lower():
        # autograd runs even in the caller's inference_mode (the draws must not depend
        # on it), and torch refuses tensors made in that mode (e.g. a matrix log_prob
        # multiplies by) in a differentiated computation
        return (f"{density} uses a tensor created under torch.inference_mode(); the sampler "
                f"differentiates {density} with autograd (whatever the caller's grad mode), "
                "which such tensors cannot enter. Create it outside inference_mode or "
                f".clone() it there{', or pass grad_log_prob' if own else ''}.")
    msg = str(exc).lower()
    if with_grad and isinstance(exc, RuntimeError) and "does not require grad" in msg:
        # with grad_log_prob, log_prob only gives the Metropolis test its values and runs
        # without autograd (a model's graph would be built for nothing)
        return ("With grad_log_prob, log_prob runs under torch.no_grad(). A log_prob that "
                "differentiates inside (torch.autograd.grad) must switch autograd on for "
                "that part itself (with torch.enable_grad(): ...), or use torch.func.grad, "
                "which works under no_grad.")
    if isinstance(exc, RuntimeError) and "inplace operation" in msg:
        # (before the one-point test: a batched function modifying its input in place
        # also returns a scalar for one point)
        return (f"{density} changed a tensor in place after using it in a differentiated "
                "computation (autograd needs its old value): write x = x * 2, not "
                f"x.mul_(2). {density} gets a copy of the chains, so it may change its input "
                "in place before using it.")
    if not with_grad and isinstance(exc, RuntimeError) and "numpy()" in msg and (
            "requires grad" in msg):
        return (f"{density} leaves torch (numpy, scipy), so autograd cannot differentiate "
                "it: write it with torch operations" + (
                    ", or pass grad_log_prob (log_prob then runs under torch.no_grad() and "
                    "may call x.cpu().numpy(), and must still return a torch tensor)."
                    if own else "."))
    if _looks_one_point(log_prob, x, with_grad):
        return (f"log_prob failed on the starting points, a tensor of shape {shape} (one "
                "row per chain), but returns a scalar for one point x[0]: it looks written "
                f"for one point ({shape[1]},). log_prob must map a (chains, d) batch to "
                "(chains,); wrap a one-point function in torch.vmap "
                "(log_prob=torch.vmap(f)).")
    return None


def _varies(log_prob: Callable, x: torch.Tensor, logp: torch.Tensor) -> bool:
    """Whether ``log_prob`` varies over ``x`` (one chain: over ``x`` and a point nearby)."""
    if logp.shape[0] < 2:
        with torch.no_grad():
            out = log_prob(torch.cat([x, x + 1e-6 * (x.abs() + 1)]))
        return isinstance(out, torch.Tensor) and not bool((out == out[0]).all())
    return not bool((logp == logp[0]).all())


def initial_points(container: ConvexContainer, support, x0, n_chains: int, dtype, device,
                   gen: torch.Generator, *, default_chains: bool = False,
                   propose: Callable[[int], torch.Tensor] | None = None) -> torch.Tensor:
    """Starting points ``(n_chains, d)`` in the container and the support.

    ``x0`` of shape ``(d,)`` (shared) or ``(n_chains, d)`` is validated; without
    it, random points of the container are drawn (and re-drawn for chains that
    fall outside ``support``, up to 400 times: 200 well inside the container, then
    200 covering all of it), or ``propose(n_chains)``'s points where a caller knows
    better starts (StiefelSampler: well-conditioned matrices), drawn again alike.
    ``default_chains`` says that ``n_chains`` is the default (the user passed none),
    for the error on an ``x0`` with another number of rows.

    Raises
    ------
    ValueError
        If ``x0`` has the wrong shape, is not finite, or lies outside the
        container or the support, if no starting point in the support is found, or
        if ``x0`` is a meta-device tensor (no values).
    TypeError
        If ``x0`` is not numeric or holds complex numbers.
    """
    d = container.dim

    def in_support(x):
        if support is None:
            return torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        # a support only answers membership: its contains is checked where it is used
        # (neither dim nor interior_point is needed of it)
        return (check_membership(support, x, "support") if isinstance(support, ConvexContainer)
                else support.contains(x))

    if x0 is None:
        def draw(attempt: int) -> torch.Tensor:
            # first among the container's well-inside points, then among points
            # covering all of K (S may hug the boundary)
            if propose is not None:
                return propose(n_chains)
            return (container.random_interior(n_chains, gen) if attempt < 200
                    else _covering_points(container, n_chains, gen))

        x = draw(0).to(dtype=dtype, device=device)
        for attempt in range(1, 401):  # re-draw the chains that start outside S
            bad = ~(in_support(x) & container._holds(x))
            if not bool(bad.any()):
                return x
            if attempt == 400:
                break
            new = draw(attempt)
            x = torch.where(bad[:, None], new.to(x), x)
        raise ValueError("could not find starting points in the support (400 random points "
                         "of the container missed it); pass x0 or check the support.")
    if isinstance(x0, torch.Tensor):  # (a meta tensor: to_numpy's ValueError)
        x0_np = to_numpy(x0, "x0")
    else:
        try:
            x0_np = np.asarray(x0)
        except (TypeError, ValueError) as exc:  # (a ragged list)
            raise TypeError(f"x0 must be a numeric array-like, got {x0!r}.") from exc
    # a complex x0 lost its imaginary part in the cast to a real dtype (numpy's
    # ComplexWarning or torch's UserWarning the only sign)
    check_real(x0_np, "x0")
    try:
        x0_np = x0_np.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"x0 must be a numeric array-like, got {x0!r}.") from exc
    # a copy: torch warns on a read-only array (and x0 must not alias the chains)
    x = torch.tensor(x0_np).to(dtype=dtype, device=device)
    given = tuple(x.shape)  # (named in the error, not the shape of its expansion)
    if x.ndim == 1:
        x = x.expand(n_chains, -1).clone()
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"x0 must have shape ({d},) or ({n_chains}, {d}) to match the "
                         f"container dimension, got {given}.")
    if x.shape[0] == 0:
        raise ValueError(f"x0 of shape {tuple(x.shape)} has no rows: pass one starting "
                         f"point per chain, shape ({n_chains}, {d}), or one for all, ({d},).")
    if x.shape[0] != n_chains:
        # (n_chains may be the default 4: say so, and how to get either meaning of x0)
        rows = x.shape[0]
        raise ValueError(
            f"x0 of shape {tuple(x.shape)} has {rows} row{'s' if rows != 1 else ''} (one "
            f"starting point per chain) but n_chains={n_chains}"
            + (" (the default)" if default_chains else "")
            + f"; pass n_chains={rows} to run {rows} chain{'s' if rows != 1 else ''} from "
            f"x0, or x0 of shape ({d},) to start all {n_chains} chains at one point.")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x0 must be finite (no NaN or inf).")
    if not bool(container._holds(x).all()):
        raise ValueError("x0 lies outside the container" + (
            f" (after rounding to {dtype})." if bool(container.contains(x).all()) else "."))
    if not bool(in_support(x).all()):
        raise ValueError("x0 lies outside the support.")
    return x


def _covering_points(container: ConvexContainer, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random points whose law charges every open subset of ``K`` (not uniform).

    Uniform in a :class:`Box`; otherwise the centre plus ``U^{1/d}`` times a random
    chord (uniform for a ball centred on the interior point).
    """
    if isinstance(container, Box):
        u = torch.rand(n, container.dim, generator=gen, dtype=torch.float64)
        lo, hi = torch.tensor(container.lo), torch.tensor(container.hi)  # (read-only arrays)
        return lo + u * (hi - lo)
    c = torch.as_tensor(container.interior_point(), dtype=torch.float64).expand(n, -1).clone()
    u = torch.randn(n, container.dim, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=1, keepdim=True)
    t = container.hit(c, u, torch.full((n,), 1e3, dtype=torch.float64))[0]
    t = torch.where(torch.isfinite(t), t, torch.full_like(t, 1e3))
    r = torch.rand(n, generator=gen, dtype=torch.float64) ** (1.0 / container.dim)
    return c + (r * t)[:, None] * u


class Warmup:
    """Adaptation state of one :meth:`ReflectiveHMC.sample` call.

    Parameters
    ----------
    n_warmup : int
        Warm-up iterations.
    eps : torch.Tensor of shape (C,)
        Initial step sizes (found by the doubling heuristic, or the fixed value).
    inv_mass : torch.Tensor of shape (d,)
        Initial inverse mass: ones (the identity).
    adapt_step : bool
        Tune the step sizes by dual averaging to ``target_accept``.
    target_accept : float
    diag_mass : bool
        Adapt a diagonal mass matrix in Stan's windows.
    auto_length : bool
        Adapt the trajectory length with ChEES.
    step_cap : callable
        ``step_cap(inv_mass) -> float``, the largest step size for an inverse
        mass (the container's ``_step_cap``).
    find_step : callable
        ``find_step(x, logp, grad, inv_mass, init, max_step, *, replay=False) -> eps``,
        the doubling heuristic run when the mass matrix changes; ``replay=True``
        draws the momenta of the previous call again.

    Attributes
    ----------
    eps : torch.Tensor of shape (C,)
        Step sizes of the next transition.
    step_mean : float
        ``float(eps.mean())``, kept in sync with :attr:`eps`.
    inv_mass : torch.Tensor of shape (d,)
        Inverse diagonal mass (ones until the first mass window closes).
    kernel_inv_mass : torch.Tensor of shape (d,) or None
        What the kernels get: ``None`` while the mass is the identity (bit-identical,
        fewer operations).
    trajectory_length : float or None
        ChEES length ``T`` of the next transition (``None`` without ChEES).
    n_divergent : torch.Tensor of shape (C,), int64
        Divergent warm-up transitions per chain.
    """

    def __init__(self, n_warmup: int, eps: torch.Tensor, inv_mass: torch.Tensor, *,
                 adapt_step: bool, target_accept: float, diag_mass: bool, auto_length: bool,
                 step_cap: Callable[[torch.Tensor], float], find_step: FindStep):
        self.n_warmup = n_warmup
        self.step_cap = step_cap
        self.find_step = find_step
        self.windows = mass_windows(n_warmup) if diag_mass else []
        self.welford = WelfordVariance(inv_mass.shape[0], inv_mass.dtype, inv_mass.device)
        self.set_mass(inv_mass, identity=True)
        self.da = DualAveraging(eps, target_accept) if adapt_step else None
        self._set_eps(eps)
        self.n_divergent = torch.zeros(eps.shape[0], dtype=torch.long, device=eps.device)
        self.chees = ChEESAdaptation(self.step_mean) if auto_length else None
        self.chees_restart = initial_buffer(n_warmup)
        self.trajectory_length = self.chees.trajectory_length if self.chees is not None else None

    def set_mass(self, inv_mass: torch.Tensor, identity: bool) -> None:
        """Set the inverse mass and the step-size cap it implies (one drift covers at
        most the container's width, ``ConvexContainer._step_cap``)."""
        self.inv_mass = inv_mass
        self.kernel_inv_mass = None if identity else inv_mass
        self.max_step = self.step_cap(inv_mass)

    def _set_eps(self, eps: torch.Tensor) -> None:
        self.eps = eps
        self.step_mean = float(eps.mean())

    def update(self, k: int, x_prev: torch.Tensor, out: dict, n_steps: int) -> None:
        """Adapt after warm-up iteration ``k`` (0-based).

        Parameters
        ----------
        k : int
        x_prev : torch.Tensor of shape (C, d)
            States before the transition.
        out : dict
            The transition's result (:func:`hmc_transition`).
        n_steps : int
            Leapfrog steps of the transition (its integration time is
            ``n_steps * eps``).
        """
        if self.chees is not None:
            e = self.step_mean
            grad = chees_gradient(x_prev, out["proposal"], out["velocity"], n_steps * self.eps,
                                  out["accept_prob"], out["divergent"])
            self.trajectory_length = self.chees.update(grad, e, MAX_LEAPFROG * e)
            if k + 1 == self.chees_restart:  # transient over: start again at one step
                self.trajectory_length = self.chees.restart(e)
        self.n_divergent += out["divergent"]
        if self.da is not None:
            self._set_eps(self.da.update(out["accept_prob"]).clamp_max(self.max_step))
        for start, end in self.windows:
            if start <= k < end:
                self.welford.update(out["x"])
            if k == end - 1:
                self._end_window(out)
        if k == self.n_warmup - 1:
            self._freeze()

    def _end_window(self, out: dict) -> None:
        old_kernel_inv_mass, old_max_step = self.kernel_inv_mass, self.max_step
        inv_mass = self.welford.regularized_variance()
        self.set_mass(inv_mass, identity=False)
        self.welford = WelfordVariance(inv_mass.shape[0], inv_mass.dtype, inv_mass.device)
        if self.da is not None:
            eps_old = self.step_mean
            if self.chees is not None:
                # Compare like with like: the doubling heuristic under the old metric, from
                # the same states. The dual-averaged step is systematically smaller than the
                # heuristic's (about 3x at target_accept=0.8), so dividing the new heuristic
                # step by it grew T about 3x at every window (T = 45 for a standard normal).
                # Both runs draw the same momenta: with fresh draws each lands on its own
                # power of 2, and their ratio alone moved T by up to 4x at a window
                # where the metric had not changed.
                eps_old = float(self.find_step(out["x"], out["logp"], out["grad"],
                                               old_kernel_inv_mass, self.eps,
                                               old_max_step).mean())
            self._set_eps(self.find_step(out["x"], out["logp"], out["grad"], inv_mass,
                                         self.eps, self.max_step,
                                         replay=self.chees is not None))
            self.da.restart(self.eps)
            if self.chees is not None:  # keep T in steps under the new metric
                self.chees.rescale(self.step_mean / eps_old)
                self.trajectory_length = self.chees.trajectory_length

    def _freeze(self) -> None:
        if self.da is not None:
            self._set_eps(self.da.final().clamp_max(self.max_step))
        if self.chees is not None:  # iterate average
            e = self.step_mean
            self.trajectory_length = self.chees.final(e, MAX_LEAPFROG * e)
