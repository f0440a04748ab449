"""Warm-up adaptation: dual averaging of the step size and a diagonal mass matrix.

Both run during warm-up only; afterwards the kernel is frozen so that the
sampling phase is a time-homogeneous Markov chain.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DualAveraging", "WelfordVariance", "initial_buffer", "mass_windows"]


class DualAveraging:
    """Nesterov dual averaging of ``log(step_size)``, one instance per chain.

    Implements the update of Hoffman & Gelman (2014, Alg. 5) with Stan's
    constants ``gamma=0.05``, ``t0=10``, ``kappa=0.75``, vectorised over chains.

    Parameters
    ----------
    step_size : torch.Tensor of shape (C,)
        Initial step sizes; the shrinkage target is ``log(10 * step_size)``.
    target : float
        Target mean acceptance probability.
    """

    def __init__(self, step_size: torch.Tensor, target: float, gamma: float = 0.05,
                 t0: float = 10.0, kappa: float = 0.75):
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(step_size)

    def restart(self, step_size: torch.Tensor) -> None:
        """Reset the averages around a new initial ``step_size``."""
        self.mu = torch.log(10.0 * step_size)
        self.h_bar = torch.zeros_like(step_size)
        self.log_eps = torch.log(step_size)
        self.log_eps_bar = torch.log(step_size)
        self.t = 0

    def update(self, accept_prob: torch.Tensor) -> torch.Tensor:
        """Feed ``(C,)`` acceptance probabilities; return the next ``(C,)`` step sizes."""
        self.t += 1
        t = self.t
        w = 1.0 / (t + self.t0)
        self.h_bar = (1 - w) * self.h_bar + w * (self.target - accept_prob)
        self.log_eps = self.mu - math.sqrt(t) / self.gamma * self.h_bar
        eta = t ** (-self.kappa)
        self.log_eps_bar = eta * self.log_eps + (1 - eta) * self.log_eps_bar
        return torch.exp(self.log_eps)

    def final(self) -> torch.Tensor:
        """The averaged step sizes to freeze after warm-up, ``(C,)``."""
        return torch.exp(self.log_eps_bar)


class WelfordVariance:
    """Running per-coordinate variance of ``(C, d)`` batches pooled over chains."""

    def __init__(self, dim: int, dtype=torch.float64, device="cpu"):
        self.n = 0
        self.mean = torch.zeros(dim, dtype=dtype, device=device)
        self.m2 = torch.zeros(dim, dtype=dtype, device=device)

    def update(self, x: torch.Tensor) -> None:
        """Add the ``(C, d)`` rows of ``x`` (Chan et al. batched update)."""
        nb = x.shape[0]
        mb = x.mean(0)
        m2b = ((x - mb) ** 2).sum(0)
        delta = mb - self.mean
        n = self.n + nb
        self.mean = self.mean + delta * nb / n
        self.m2 = self.m2 + m2b + delta**2 * self.n * nb / n
        self.n = n

    def regularized_variance(self) -> torch.Tensor:
        """Stan's shrunk estimate ``n/(n+5) var + 1e-3 * 5/(n+5)``, shape ``(d,)``."""
        n = self.n
        var = self.m2 / max(n - 1, 1)
        return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))


def initial_buffer(warmup: int) -> int:
    """Length of the initial fast phase of a warm-up of ``warmup`` iterations.

    A 15% buffer in which the chains travel from their starting points to the
    typical set and only the step size adapts (0 when ``warmup < 20``). Stan uses
    15% (and a 10% terminal buffer) only for warm-ups shorter than 150 iterations,
    and 75 (and 50) iterations otherwise; the fractions are used at every length here.
    """
    return int(0.15 * warmup) if warmup >= 20 else 0


def mass_windows(warmup: int) -> list[tuple[int, int]]:
    """Stan-style slow adaptation windows ``[(start, end), ...]`` inside ``warmup``.

    A 15% initial fast buffer and a 10% terminal buffer (step size only), and
    doubling windows in between; empty when ``warmup < 20``.
    """
    if warmup < 20:
        return []
    init = initial_buffer(warmup)
    term = int(0.1 * warmup)
    end = warmup - term
    windows = []
    start, size = init, 25
    while start < end:
        stop = start + size
        if stop + 2 * size > end:  # last window absorbs the remainder
            stop = end
        windows.append((start, stop))
        start, size = stop, 2 * size
    return windows


def find_reasonable_step_size(
    x: torch.Tensor, logp: torch.Tensor, grad: torch.Tensor, log_prob, container,
    inv_mass: torch.Tensor | None, max_reflections: int, gen: torch.Generator,
    init: torch.Tensor, max_step: float = float("inf"), max_iter: int = 30, *,
    grad_log_prob=None,
) -> torch.Tensor:
    """Hoffman & Gelman's heuristic, per chain: double or halve until one step's
    acceptance probability crosses 1/2.

    Parameters
    ----------
    x, grad : torch.Tensor of shape (C, d)
    logp : torch.Tensor of shape (C,)
    init : torch.Tensor of shape (C,)
        Starting step sizes.
    max_step : float
        Upper bound (reflections make a constant density accept every step).
    inv_mass, grad_log_prob
        As in :func:`~mlpapers.sampling.rehmc._kernels.reflective_leapfrog`.

    Returns
    -------
    torch.Tensor of shape (C,)
    """
    from mlpapers.sampling.rehmc._kernels import kinetic_energy, reflective_leapfrog

    eps = init.clone().clamp_max(max_step)
    direction = None
    log_half = math.log(0.5)
    for _ in range(max_iter):
        z = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x)
        p = z if inv_mass is None else z / inv_mass.expand_as(x).sqrt()
        _, p1, lp1, _, _, capped = reflective_leapfrog(
            x, p, logp, grad, eps, 1, log_prob, container, inv_mass, max_reflections,
            grad_log_prob=grad_log_prob)
        dh = (-logp + kinetic_energy(p, inv_mass)) - (-lp1 + kinetic_energy(p1, inv_mass))
        dh = torch.where(capped | torch.isnan(dh), torch.full_like(dh, -float("inf")), dh)
        if direction is None:
            direction = torch.where(dh > log_half, 1.0, -1.0).to(x)
        go = torch.where(direction > 0, dh > log_half, dh < log_half)
        go &= torch.where(direction > 0, eps * 2 <= max_step, eps > 1e-10)
        if not bool(go.any()):
            break
        eps = torch.where(go, eps * 2.0**direction, eps)
    return eps
