"""Baselines for the demo and the benchmark (not public API).

- plain HMC that rejects any trajectory leaving the support (hard rejection);
- HMC on an unconstrained transform (logit for a box, softmax for the simplex);
- random-walk Metropolis that rejects out-of-support proposals;
- exact rejection sampling from the untruncated law.

The HMC baselines reuse :class:`ReflectiveHMC` with an unbounded "container"
that never reflects, so adaptation and diagnostics are identical.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mlpapers.sampling.rehmc._adapt import DualAveraging
from mlpapers.sampling.rehmc._container import Hit
from mlpapers.sampling.rehmc._sampler import ReflectiveHMC, SampleResult
from mlpapers.sampling.rehmc._supports import Box, ConvexContainer

__all__ = ["Unbounded", "hard_rejection_hmc", "random_walk_metropolis", "transform_hmc"]


class Unbounded(ConvexContainer):
    """``R^d``: no boundary, so the reflected leapfrog is the plain leapfrog."""

    def __init__(self, dim: int, point=None):
        self.dim = int(dim)
        self._x0 = np.zeros(self.dim) if point is None else np.asarray(point, dtype=float)

    def contains(self, x, tol=0.0):
        return torch.ones(x.shape[0], dtype=torch.bool, device=x.device)

    def _keeps_inside(self, dtype):
        return True

    def hit(self, x, v, t_max=None, exclude=None):
        C = x.shape[0]
        return Hit(torch.full((C,), float("inf"), dtype=x.dtype, device=x.device),
                   torch.zeros_like(x), torch.zeros(C, dtype=torch.long, device=x.device))

    def fold(self, x, v, tau):
        """Free drift ``x + tau v`` (the same fast path a :class:`Box` gets)."""
        zeros = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return torch.addcmul(x, tau[:, None], v), None, zeros

    def interior_point(self):
        return self._x0.copy()

    def random_interior(self, n, gen):
        return torch.as_tensor(self._x0).expand(n, -1).clone()


def hard_rejection_hmc(log_prob, container: ConvexContainer, n_samples: int, *, x0,
                       n_chains: int = 4, warmup: int = 500, **kw) -> SampleResult:
    """Plain HMC on ``R^d`` with ``log_prob = -inf`` outside the container.

    A trajectory that leaves the support ends with a non-finite energy and is
    rejected (this is the common "just reject" practice).
    """

    def masked(x):
        lp = log_prob(x)
        return torch.where(container._holds(x), lp, torch.full_like(lp, -float("inf")))

    hmc = ReflectiveHMC(masked, Unbounded(container.dim, container.interior_point()), **kw)
    return hmc.sample(n_samples, x0=x0, n_chains=n_chains, warmup=warmup)


def transform_hmc(log_prob, box: Box, n_samples: int, *, x0, n_chains: int = 4,
                  warmup: int = 500, **kw) -> SampleResult:
    """HMC on ``y = logit((x - lo) / (hi - lo))`` with the log-Jacobian, mapped back to ``x``."""
    lo = torch.tensor(box.lo, dtype=torch.float64)
    w = torch.tensor(box.hi - box.lo, dtype=torch.float64)
    hi = torch.tensor(box.hi, dtype=torch.float64)

    def to_x(y):
        # (a saturated sigmoid can round lo + w above hi for bounds of both signs)
        return torch.minimum(lo.to(y) + w.to(y) * torch.sigmoid(y), hi.to(y))

    def lp_y(y):  # log |dx/dy| = sum log w + log sigma(y) + log sigma(-y)
        jac = (torch.nn.functional.logsigmoid(y) + torch.nn.functional.logsigmoid(-y)).sum(-1)
        return log_prob(to_x(y)) + jac

    x0 = torch.as_tensor(np.asarray(x0, dtype=float))
    u = ((x0 - lo) / w).clamp(1e-6, 1 - 1e-6)
    y0 = torch.log(u) - torch.log1p(-u)
    hmc = ReflectiveHMC(lp_y, Unbounded(box.dim), **kw)
    res = hmc.sample(n_samples, x0=y0.numpy(), n_chains=n_chains, warmup=warmup)
    res.samples = to_x(torch.from_numpy(res.samples)).numpy()
    return res


def random_walk_metropolis(log_prob, container: ConvexContainer, n_samples: int, *, x0,
                           n_chains: int = 4, warmup: int = 500, thin: int = 1,
                           random_state: int = 0, target: float = 0.234) -> np.ndarray:
    """Gaussian random-walk Metropolis, vectorised over chains; proposals outside
    the container are rejected. The scale is tuned in warm-up to ``target`` acceptance.

    Returns
    -------
    numpy.ndarray of shape (n_chains, n_samples, d)
    """
    gen = torch.Generator().manual_seed(random_state)
    d = container.dim
    x = torch.as_tensor(np.asarray(x0, dtype=float)).expand(n_chains, d).clone()
    with torch.no_grad():
        lp = log_prob(x)
    scale = torch.full((n_chains,), 2.38 / math.sqrt(d) * 0.1, dtype=torch.float64)
    da = DualAveraging(scale, target)
    out = np.empty((n_chains, n_samples, d))
    for i in range(warmup + n_samples * thin):
        prop = x + scale[:, None] * torch.randn(n_chains, d, generator=gen, dtype=torch.float64)
        inside = container._holds(prop)
        with torch.no_grad():
            lp_prop = torch.where(inside, log_prob(prop), torch.full_like(lp, -float("inf")))
        acc_p = torch.exp((lp_prop - lp).clamp_max(0.0))
        acc = torch.rand(n_chains, generator=gen, dtype=torch.float64) < acc_p
        x = torch.where(acc[:, None], prop, x)
        lp = torch.where(acc, lp_prop, lp)
        if i < warmup:
            scale = da.update(acc_p)
            if i == warmup - 1:
                scale = da.final()
        elif (i - warmup + 1) % thin == 0:
            out[:, (i - warmup) // thin] = x.numpy()
    return out


def rejection_truncated_normal(mu, sd, box: Box, n: int, seed: int = 0) -> tuple[np.ndarray, float]:
    """Exact draws of ``N(mu, diag(sd^2))`` truncated to ``box``; returns (draws, acceptance)."""
    rng = np.random.default_rng(seed)
    kept, tried = [], 0
    total = 0
    while total < n:
        z = rng.normal(mu, sd, size=(max(4 * n, 1000), len(mu)))
        tried += len(z)
        ok = np.all((z >= box.lo) & (z <= box.hi), axis=1)
        kept.append(z[ok])
        total += int(ok.sum())
        if tried > 10**8:
            raise RuntimeError("rejection sampling acceptance is too small")
    draws = np.concatenate(kept)[:n]
    return draws, total / tried
