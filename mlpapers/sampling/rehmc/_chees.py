r"""ChEES adaptation of the HMC trajectory length (warm-up only), vectorised over chains.

ChEES (Hoffman, Radul and Sountsov, AISTATS 2021) picks the integration time
``T`` that maximises the *change in the estimator of the expected square*

.. math:: \mathrm{ChEES}(T) = \tfrac14\, \mathbb{E}\big[(\|x' - \bar x\|^2
          - \|x - \bar x\|^2)^2\big],

with ``x`` the current and ``x'`` the proposed state and ``\bar x`` the mean
of the target, estimated across chains. The proposal of a trajectory run for
time ``t`` moves along its final velocity ``v' = M^{-1} p'``, so
``\partial x' / \partial \log T = t\, v'`` and one transition gives, per chain,

.. math:: g_c = t_c\, (\|x'_c - \bar x'\|^2 - \|x_c - \bar x\|^2)\,
          (x'_c - \bar x') \cdot v'_c .

This stays valid with reflections: between hits the billiard flow moves the
end point along its (reflected) velocity, and hits occur on a set of
measure zero. The per-chain gradients are averaged with the acceptance
probabilities as weights, and ``\log T`` takes an Adam step with
``beta1 = 0`` (bias-corrected RMSProp), clipped to ``+-0.35``; the value kept
after warm-up is the iterate average with weights ``k^{-1/2}``. This follows
TensorFlow Probability's ``GradientBasedTrajectoryLengthAdaptation``; the
averaging makes the estimate usable with few chains, though noisy (the paper
uses hundreds of chains; at least 2 are required).

Two choices guard against the start of the warm-up (see the user guide):

* ``T`` starts at one step (as BlackJAX's ``chees_adaptation`` and TFP's
  example with ``num_leapfrog_steps=1``) and grows by ascent: the criterion
  is unimodal up to its first peak but flat with local maxima beyond it, so
  a start past the peak is never recovered.
* :meth:`ChEESAdaptation.restart` forgets the squared-gradient average and
  the iterate average and sets ``T`` back to one step once the chains have
  left their starting points (the sampler calls it at the end of the initial
  step-size phase, the first 15% of warm-up). Gradients of chains spread across the
  container are orders of magnitude larger than at stationarity: left in the
  average (``beta2 = 0.95``) they would shrink every later step for hundreds
  of iterations, and they push ``T`` past the first peak within a few
  iterations. The long trajectories they ask for do help the chains converge,
  so ``T`` is adapted during the transient too, then started afresh.
* When the mass matrix changes, :meth:`ChEESAdaptation.rescale` keeps ``T``
  in units of the (re-found) step size.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ChEESAdaptation", "chees_gradient", "halton"]


def halton(k: int, shift: float = 0.0, bits: int = 10) -> float:
    """Base-2 van der Corput (Halton) point ``k >= 0`` in ``(0, 1]``, rotated by ``shift``.

    The first ``2**bits`` points are evenly spread, which makes the jittered
    trajectory lengths (and so the ChEES gradient) less noisy than uniform
    draws (as in TFP). ``shift`` (a Cranley-Patterson rotation) comes from the
    sampler's random generator.
    """
    n, u, base = k % (1 << bits), 0.0, 0.5
    while n:
        u += base * (n & 1)
        n >>= 1
        base *= 0.5
    u = (u + shift) % 1.0
    return 1.0 - u  # (0, 1]: never a zero-length trajectory


def chees_gradient(x0: torch.Tensor, x1: torch.Tensor, v1: torch.Tensor, t: torch.Tensor,
                   accept_prob: torch.Tensor, divergent: torch.Tensor) -> float:
    r"""Acceptance-weighted ChEES gradient with respect to ``log T``.

    Parameters
    ----------
    x0 : torch.Tensor of shape (C, d)
        States before the transition.
    x1, v1 : torch.Tensor of shape (C, d)
        Proposals and their final velocities ``M^{-1} p'``.
    t : torch.Tensor of shape (C,)
        Integration time of each chain's trajectory (leapfrog steps x step size).
    accept_prob : torch.Tensor of shape (C,)
    divergent : torch.Tensor of shape (C,), bool

    Returns
    -------
    float
        :math:`\sum_c a_c g_c / \sum_c a_c` over non-divergent chains with
        ``a_c > 1e-4`` and a finite ``g_c`` (0 when none is left). The proposal
        mean :math:`\bar x'` is weighted by ``a_c`` as in TFP.
    """
    bad_x = ~(torch.isfinite(x1).all(-1) & torch.isfinite(v1).all(-1))
    a = accept_prob.to(x1.dtype).masked_fill(divergent | bad_x, 0.0)
    x1s = x1.masked_fill(bad_x[:, None], 0.0)
    c1 = (a[:, None] * x1s).sum(0) / (a.sum() + 1e-20)
    c0 = x0.mean(0)
    d1, d0 = x1s - c1, x0 - c0
    g = t * ((d1 * d1).sum(-1) - (d0 * d0).sum(-1)) * (
        d1 * v1.masked_fill(bad_x[:, None], 0.0)).sum(-1)
    skip = ~((a > 1e-4) & torch.isfinite(g))
    g = g.masked_fill(skip, 0.0)
    w = a.masked_fill(skip, 0.0)
    return float((w * g).sum() / (w.sum() + 1e-20))


class ChEESAdaptation:
    """Warm-up optimiser of the trajectory length ``T`` (a scalar shared by all chains).

    Parameters
    ----------
    init : float
        Initial trajectory length.
    learning_rate : float, default=0.025
        Adam learning rate on ``log T`` (the paper's and TFP's value).
    beta2 : float, default=0.95
        Decay of the squared-gradient average (``beta1 = 0``).
    clip : float, default=0.35
        Largest change of ``log T`` per iteration (about ``log(2) / 2``).
    """

    def __init__(self, init: float, learning_rate: float = 0.025, beta2: float = 0.95,
                 clip: float = 0.35):
        self.log_t = math.log(init)
        self.log_t_bar = math.log(init)
        self.lr, self.beta2, self.clip = learning_rate, beta2, clip
        self.sq_grad = 0.0
        self.k = 0  # iterations since the last restart (iterate-average weights)
        self.k_sq = 0  # terms in the squared-gradient average (bias correction)

    def restart(self, init: float) -> float:
        """Start the optimisation afresh from ``T = init``; returns ``init``.

        Called once the transient of the first warm-up iterations is over: its
        gradients are orders of magnitude larger than at stationarity (they
        would scale down the Adam steps for hundreds of iterations) and push
        ``T`` past the first peak of the criterion, where ascent cannot come back.
        """
        self.log_t = self.log_t_bar = math.log(init)
        self.sq_grad = 0.0
        self.k = self.k_sq = 0
        return self.trajectory_length

    def rescale(self, factor: float) -> None:
        """Multiply ``T`` and its average by ``factor`` and forget the squared gradients.

        Used when the mass matrix changes: the step size is found again and ``T``
        keeps its length in steps; the gradient scale changes with the metric.
        """
        self.log_t += math.log(factor)
        self.log_t_bar += math.log(factor)
        self.sq_grad = 0.0
        self.k_sq = 0

    @property
    def trajectory_length(self) -> float:
        """The current (not averaged) trajectory length, used during warm-up."""
        return math.exp(self.log_t)

    def update(self, grad: float, t_min: float, t_max: float) -> float:
        """One Adam step on ``log T`` given the ChEES gradient; returns the new ``T``.

        A step does not take ``T`` across ``t_min`` or ``t_max`` (one step and the
        leapfrog cap), but a bound that has moved past ``T`` does not move it.
        """
        self.k += 1
        self.k_sq += 1
        self.sq_grad = self.beta2 * self.sq_grad + (1 - self.beta2) * grad * grad
        denom = math.sqrt(self.sq_grad / (1 - self.beta2**self.k_sq) + 1e-20)
        step = max(-self.clip, min(self.clip, self.lr * grad / denom))
        log_t = self.log_t + step
        if math.isfinite(log_t):
            # The bounds stop T from stepping out of [t_min, t_max] but never drag it: after
            # a mass window, dual averaging restarts with trial steps up to 10x the found
            # one, and a floor of one such step lifted T past the criterion's first peak,
            # from where ascent does not come back (T of 14 for a standard normal).
            lo, hi = math.log(t_min), math.log(t_max)
            self.log_t = min(max(log_t, min(self.log_t, lo)), max(self.log_t, hi))
        w = self.k ** -0.5
        self.log_t_bar = w * self.log_t + (1 - w) * self.log_t_bar
        return self.trajectory_length

    def final(self, t_min: float, t_max: float) -> float:
        """The iterate-averaged ``T`` to freeze after warm-up, within ``[t_min, t_max]``."""
        return min(max(math.exp(self.log_t_bar), t_min), t_max)
