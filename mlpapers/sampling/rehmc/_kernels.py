"""Reflected leapfrog and the Metropolis step of reflective HMC (pure torch).

Shapes: ``C`` chains, ``d`` dimensions. Positions ``x`` and momenta ``p`` are
``(C, d)``; the inverse mass ``inv_mass`` is a diagonal, ``(d,)`` or ``(C, d)``, or
``None`` for the identity (which skips the multiplications by one: the results
are bit-identical to ``torch.ones(d)``); velocities are ``v = inv_mass * p``.
The Hamiltonian is ``H(x, p) = -log pi(x) + p^T M^{-1} p / 2``.

Gradients come from autograd (one ``log_prob`` + backward call per leapfrog
step), or from a user-supplied ``grad_log_prob``: then intermediate steps call
only the gradient and ``log_prob`` runs once per trajectory, at its end.

The drift follows the exact billiard flow inside the convex container: it is
split at the first boundary hit (global minimum over faces, recomputed after
each reflection) and the momentum is reflected with

.. math:: p' = p - 2 \\frac{n^T M^{-1} p}{n^T M^{-1} n} n,

which keeps ``p^T M^{-1} p`` and negates ``n . v``. A box folds in closed form.
Trajectories that exceed ``max_reflections`` in one drift are flagged
(``capped``) and must be rejected, never truncated.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mlpapers.sampling.rehmc._container import unpack_hit
from mlpapers.sampling.rehmc._supports import ConvexContainer

__all__ = [
    "ContractError",
    "grad_only",
    "hmc_transition",
    "kinetic_energy",
    "log_prob_and_grad",
    "reflect_momentum",
    "reflected_drift",
    "reflective_leapfrog",
    "velocity",
]

Tensor = torch.Tensor
LogProb = Callable[[Tensor], Tensor]
GradLogProb = Callable[[Tensor], Tensor]


def velocity(p: Tensor, inv_mass: Tensor | None) -> Tensor:
    """``M^{-1} p`` of ``(C, d)`` momenta (``p`` itself for the identity, ``None``)."""
    return p if inv_mass is None else inv_mass * p


def kinetic_energy(p: Tensor, inv_mass: Tensor | None) -> Tensor:
    """``p^T M^{-1} p / 2`` of ``(C, d)`` momenta -> ``(C,)``."""
    pp = p * p
    return 0.5 * (pp if inv_mass is None else pp * inv_mass).sum(-1)


def reflect_momentum(p: Tensor, normal: Tensor, inv_mass: Tensor | None) -> Tensor:
    """Reflect ``(C, d)`` momenta about unit ``(C, d)`` normals in the ``M^{-1}`` metric.

    Returns ``p - 2 (n^T M^{-1} p) / (n^T M^{-1} n) n``: the kinetic energy is
    unchanged and the normal velocity ``n . M^{-1} p`` changes sign.
    """
    mn = velocity(normal, inv_mass)
    coef = (p * mn).sum(-1) / (normal * mn).sum(-1)
    return p - 2.0 * coef[:, None] * normal


class ContractError(ValueError):
    """A user function returned what its contract forbids (a shape, a type); the message
    says what was expected, so no guess of the cause is added to it."""


def _shape_error(name: str, expected: tuple, x: Tensor, got) -> ValueError:
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    hint = ""
    if len(expected) == 1:
        hint = (" It gets one row per chain and must return one value per row (a torch "
                "tensor: .squeeze(-1) a column; wrap a one-point function in torch.vmap).")
    return ContractError(f"{name} must return a tensor of shape {expected} for a "
                         f"({x.shape[0]}, {x.shape[1]}) input, got {shape}.{hint}")


def _refuse_non_real(name: str, out: Tensor) -> None:
    # (.to(x) dropped the imaginary part, with only torch's casting warning; and read a
    # boolean mask as the log densities 0 and 1)
    if out.is_complex():
        raise TypeError(f"{name} must return real values, got {out.dtype}.")
    if out.dtype == torch.bool:
        hint = ("; for a density restricted to a region return torch.where(mask, value, "
                "-inf), or pass the region as support" if name == "log_prob" else "")
        raise TypeError(f"{name} must return real values, got torch.bool (a mask?){hint}.")


def grad_only(grad_log_prob: GradLogProb, x: Tensor) -> Tensor:
    """Call a user-supplied ``grad_log_prob`` on ``(C, d)`` points; check its ``(C, d)`` shape.

    Raises
    ------
    ValueError
        If the result is not a tensor of the shape of ``x``.
    """
    # a copy in: a function that modifies its argument in place (x.mul_(-1), or numpy's
    # a -= mu on x.numpy()) would otherwise move the chain's own position silently, and
    # x.requires_grad_() would make every later state carry an autograd graph (about
    # 1.5 us per call: 2% of the cheapest step, a d = 2 box with grad_log_prob, within
    # the timing noise; less for any real density)
    g = grad_log_prob(x.clone())
    if not isinstance(g, torch.Tensor) or g.shape != x.shape:
        raise _shape_error("grad_log_prob", tuple(x.shape), x, g)
    _refuse_non_real("grad_log_prob", g)
    if g.requires_grad:
        g = g.detach()
    if g.dtype != x.dtype or g.device != x.device:
        return g.to(x)  # a copy
    # a copy: a function that returns one reused buffer would overwrite the current
    # state's gradient, which the sampler still holds (the kick would not be reversible)
    return g.clone()


def log_prob_and_grad(log_prob: LogProb, x: Tensor, grad_log_prob: GradLogProb | None = None,
                      *, report_graph: bool = False):
    """Evaluate ``log_prob`` on ``(C, d)`` points and its gradient.

    The gradient comes from ``grad_log_prob`` when given (``log_prob`` then runs
    under :func:`torch.no_grad`), else from one autograd backward pass.

    Returns
    -------
    logp : torch.Tensor of shape (C,)
    grad : torch.Tensor of shape (C, d)
    has_graph : bool
        Only with ``report_graph=True``: whether autograd could differentiate
        ``log_prob`` (``True`` when ``grad_log_prob`` is given).
    """
    lp, grad, has_graph = _log_prob_and_grad(log_prob, x, grad_log_prob)
    return (lp, grad, has_graph) if report_graph else (lp, grad)


def _log_prob_and_grad(log_prob: LogProb, x: Tensor,
                       grad_log_prob: GradLogProb | None) -> tuple[Tensor, Tensor, bool]:
    # log_prob gets a copy of the chains (see grad_only): modifying it in place must not
    # move the chains
    if grad_log_prob is not None:
        with torch.no_grad():
            lp = log_prob(x.clone())
        if not isinstance(lp, torch.Tensor) or lp.shape != x.shape[:1]:
            raise _shape_error("log_prob", (x.shape[0],), x, lp)
        _refuse_non_real("log_prob", lp)
        # detached: a log_prob that switches autograd on inside returns a graph, which
        # the kept log densities would chain from one transition to the next (and the
        # run failed at its very end, converting them to numpy)
        return lp.detach().to(x), grad_only(grad_log_prob, x), True
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        # a non-leaf copy: autograd differentiates through in-place changes of it (a leaf
        # would raise), and changes made outside autograd (no_grad, .data, numpy) do not
        # reach the chains
        lp = log_prob(xr.clone())
        if not isinstance(lp, torch.Tensor) or lp.shape != x.shape[:1]:
            raise _shape_error("log_prob", (x.shape[0],), x, lp)
        _refuse_non_real("log_prob", lp)
        if lp.requires_grad:
            (grad,) = torch.autograd.grad(lp, xr, torch.ones_like(lp))  # no sum node
        else:  # constant density (or one autograd cannot see through)
            grad = torch.zeros_like(x)
    return lp.detach().to(x), grad.detach().to(x), lp.requires_grad


def reflected_drift(
    x: Tensor, p: Tensor, tau: Tensor, container: ConvexContainer, inv_mass: Tensor | None,
    max_reflections: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Exact billiard drift for times ``tau`` inside ``container``.

    Parameters
    ----------
    x, p : torch.Tensor of shape (C, d)
    tau : torch.Tensor of shape (C,)
        Drift time per chain; ``0`` (or less) leaves a chain where it is, except that
        the closed form of a :class:`Box` maps positions to box units and back (a
        rounding-level move) and counts a bounce, flipping the momentum, for a chain
        lying exactly on an upper wall. The sampler uses ``0`` only for capped chains,
        whose proposal is rejected; masking them in the fold would slow every drift
        in a box by 40-70 %.
    container : ConvexContainer
    inv_mass : torch.Tensor of shape (d,) or (C, d), or None (identity)
    max_reflections : int
        Chains needing more reflections stop and are flagged ``capped``.

    Returns
    -------
    x, p : torch.Tensor of shape (C, d)
    n_reflections : torch.Tensor of shape (C,), int64
    capped : torch.Tensor of shape (C,), bool
    """
    fold = getattr(container, "fold", None)
    if fold is not None:  # closed form (a box: independent 1-D bounces; or no boundary)
        # as the loop below: a chain with no time left must not drift backwards
        x_new, flipped, n_ref = fold(x, velocity(p, inv_mass), tau.clamp_min(0.0))
        if flipped is not None:
            p = torch.where(flipped, -p, p)
        return x_new, p, n_ref, n_ref > max_reflections
    inv_mass = None if inv_mass is None else inv_mass.expand_as(p)
    C = x.shape[0]
    n_ref = torch.zeros(C, dtype=torch.long, device=x.device)
    capped = torch.zeros(C, dtype=torch.bool, device=x.device)
    no_face = exclude = torch.full((C,), -1, dtype=torch.long, device=x.device)
    remaining = tau.clamp_min(0.0)  # a chain with no time left must not drift backwards
    active = remaining > 0
    # Masked loop over all chains: a finished chain has remaining time 0, so it drifts
    # for time 0, never bounces and keeps its momentum.
    while bool(active.any()):
        v = velocity(p, inv_mass)
        # (t, normal) with the face as .face; a user's class may answer a plain pair
        # (no face to exclude) or the triple (t, normal, face) of earlier versions
        t, normal, face = unpack_hit(container.hit(x, v, remaining, exclude))
        bounce = active & (t < remaining)
        x = torch.addcmul(x, torch.where(bounce, t, remaining)[:, None], v)
        p = torch.where(bounce[:, None], reflect_momentum(p, normal, inv_mass), p)
        exclude = no_face if face is None else face
        n_ref += bounce
        cap = (bounce & (n_ref > max_reflections)) | (active & torch.isnan(t))
        capped |= cap
        remaining = torch.where(bounce & ~cap, remaining - t, 0.0)
        active = remaining > 0
    return x, p, n_ref, capped


def reflective_leapfrog(
    x: Tensor, p: Tensor, logp: Tensor, grad: Tensor, step_size: Tensor, n_steps: int,
    log_prob: LogProb, container: ConvexContainer, inv_mass: Tensor | None,
    max_reflections: int, *, grad_log_prob: GradLogProb | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``n_steps`` reflected leapfrog steps (kick, billiard drift, kick).

    Parameters
    ----------
    x, p, grad : torch.Tensor of shape (C, d)
        Start state and ``grad log pi(x)``.
    logp : torch.Tensor of shape (C,)
    step_size : torch.Tensor of shape (C,)
    n_steps : int
    log_prob : callable ``(C, d) -> (C,)``
    container : ConvexContainer
    inv_mass : torch.Tensor of shape (d,) or (C, d), or None (identity)
    max_reflections : int
        Per-drift cap; a capped chain stops moving and is flagged.
    grad_log_prob : callable ``(C, d) -> (C, d)``, optional
        Gradient of ``log_prob``; without it autograd differentiates ``log_prob``
        at every step. With it ``log_prob`` is evaluated (under
        :func:`torch.no_grad`) at the end point only.

    Returns
    -------
    x, p : torch.Tensor of shape (C, d)
    logp : torch.Tensor of shape (C,)
    grad : torch.Tensor of shape (C, d)
    n_reflections : torch.Tensor of shape (C,), int64
    capped : torch.Tensor of shape (C,), bool
    """
    h = step_size[:, None]
    half_h = 0.5 * h
    n_ref = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    capped = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    p = torch.addcmul(p, half_h, grad)  # first half kick
    last = n_steps - 1
    for i in range(n_steps):
        tau = step_size.masked_fill(capped, 0.0)
        x, p, nr, cap = reflected_drift(x, p, tau, container, inv_mass, max_reflections)
        n_ref += nr
        capped |= cap
        if i < last and grad_log_prob is not None:  # the value is needed at the end only
            grad = grad_only(grad_log_prob, x)
        else:
            logp, grad = log_prob_and_grad(log_prob, x, grad_log_prob)
        # the closing half kick of this step and the opening one of the next, fused
        p = torch.addcmul(p, h if i < last else half_h, grad)
    return x, p, logp, grad, n_ref, capped


def hmc_transition(
    x: Tensor, logp: Tensor, grad: Tensor, step_size: Tensor, n_steps: int,
    log_prob: LogProb, container: ConvexContainer, inv_mass: Tensor | None,
    max_reflections: int, gen: torch.Generator, max_energy_error: float = 1000.0, *,
    grad_log_prob: GradLogProb | None = None,
) -> dict[str, Tensor]:
    """One reflective-HMC Metropolis transition for every chain.

    Draws ``p ~ N(0, M)``, integrates ``n_steps`` reflected leapfrog steps and
    accepts with probability ``min(1, exp(H0 - H1))``. Capped trajectories, a
    non-finite energy, an energy error above ``max_energy_error`` or an end point
    that rounding put outside the container count as divergent and are rejected.

    Parameters
    ----------
    x : torch.Tensor of shape (C, d)
    logp : torch.Tensor of shape (C,)
    grad : torch.Tensor of shape (C, d)
    step_size : torch.Tensor of shape (C,)
    n_steps : int
        Leapfrog steps (the same for all chains: they run in lockstep).
    log_prob, container, inv_mass, max_reflections, grad_log_prob
        As in :func:`reflective_leapfrog`.
    gen : torch.Generator
        CPU generator, drawn in this order: the momenta (``randn`` (C, d), float64,
        scaled by the mass), then the Metropolis uniforms (``rand`` (C,), float64).

    Returns
    -------
    dict
        ``x``, ``logp``, ``grad`` (new state), ``accept_prob`` (C,),
        ``accepted`` (C,) bool, ``n_reflections`` (C,), ``divergent`` (C,) bool,
        ``energy`` (C,) (the Hamiltonian ``-log_prob + K`` of the kept state:
        the proposal's if accepted, the starting one's otherwise), and the
        proposal ``proposal`` (C, d) with its final velocity ``velocity =
        M^{-1} p`` (C, d), which trajectory-length adaptation uses.
    """
    C, d = x.shape
    z = torch.randn(C, d, generator=gen, dtype=torch.float64).to(x)
    p0 = z if inv_mass is None else z / inv_mass.expand_as(x).sqrt()
    h0 = kinetic_energy(p0, inv_mass) - logp  # == -logp + K exactly (IEEE), one op less
    x1, p1, lp1, g1, n_ref, capped = reflective_leapfrog(
        x, p0, logp, grad, step_size, n_steps, log_prob, container, inv_mass, max_reflections,
        grad_log_prob=grad_log_prob)
    h1 = kinetic_energy(p1, inv_mass) - lp1
    # a non-finite energy change (NaN, or +-inf) becomes -inf: divergent, never accepted
    dh = (h0 - h1).nan_to_num_(nan=-math.inf, posinf=-math.inf, neginf=-math.inf)
    # (a finite threshold, so that max_energy_error=inf still flags non-finite changes)
    divergent = capped | (dh < -min(float(max_energy_error), torch.finfo(dh.dtype).max))
    # The billiard flow never leaves K, but a drift that ends within rounding of the
    # boundary (x + t v with t at or next to the hitting time) can land an ulp outside:
    # about 1 proposal in 300 in float32 for a radius-0.01 ball centred at 1e3 (none
    # measured at ordinary scales), and in float64 for
    # a set narrow next to its coordinates (a ball of radius 1e-15 centred at 1). Such a
    # proposal is rejected (as divergent): this is the Metropolis test of the target
    # restricted to the floating-point set {x : K.contains(x)}, which holds the current
    # state, so detailed balance is kept and no state ever lies outside K.
    if not container._keeps_inside(x1.dtype):  # (skipped for most float64 boxes: see Box)
        divergent |= ~container._holds(x1)
    accept_prob = torch.exp(dh.clamp_max(0.0)).masked_fill_(divergent, 0.0)
    u = torch.rand(C, generator=gen, dtype=torch.float64).to(x)
    accepted = u < accept_prob
    a = accepted[:, None]
    return {
        "x": torch.where(a, x1, x),
        "logp": torch.where(accepted, lp1, logp),
        "grad": torch.where(a, g1, grad),
        "accept_prob": accept_prob,
        "accepted": accepted,
        "n_reflections": n_ref,
        "divergent": divergent,
        "energy": torch.where(accepted, h1, h0),
        "proposal": x1,
        "velocity": velocity(p1, inv_mass),
    }
