"""The chain loop of :class:`ReflectiveHMC`: warm-up, then recording and keeping draws.

All chains move in lockstep. During warm-up each transition feeds the adaptation
(:class:`._warmup.Warmup`). Afterwards every ``thin``-th state is recorded; without a
support every recorded state is a draw, with one only the recorded states in ``S`` are
kept, per chain, until every chain holds ``n_samples`` draws (chains that are done keep
moving with the others and their extra states are dropped). :class:`Draws` holds the
kept draws, the chains' final state and the statistics of the sampling phase, with
per-draw statistics (:class:`_DrawStats`) aligned with the kept draws.

The transition itself (step sizes, jitter, trajectory lengths) is built by the sampler
and passed in as a callable, so this module knows nothing of the tuning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mlpapers._utils import ProgressLogger, user_stacklevel
from mlpapers.sampling.rehmc._supports import ConvexContainer, Region
from mlpapers.sampling.rehmc._warmup import Warmup

__all__ = ["MIN_RECORDS", "Draws", "run_chains"]

MIN_RECORDS = 2000  # a chain with no draw in S after this many recorded states is an error

# transition(x, logp, grad) -> (kernel output dict, leapfrog steps of the transition)
Transition = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[dict, int]]


@dataclass
class Draws:
    """Kept draws and statistics of the sampling phase (after warm-up).

    Attributes
    ----------
    samples : torch.Tensor of shape (C, n_samples, d)
        Kept draws of each chain.
    x : torch.Tensor of shape (C, d)
        The chains' final positions (with a support possibly outside ``S``).
    accept_sum : torch.Tensor of shape (C,)
        Sum of the Metropolis acceptance probabilities (float64).
    n_reflections, n_divergent : torch.Tensor of shape (C,)
        Boundary reflections and divergent transitions (int64).
    n_in : torch.Tensor of shape (C,)
        Recorded states inside the support (all of them without a support).
    n_recorded : int
        Recorded (every ``thin``-th) states per chain.
    n_iterations : int
        Sampling transitions run.
    leapfrog_sum : int
        Leapfrog steps per chain summed over the sampling transitions.
    stats : dict of str to numpy.ndarray of shape (C, n_samples), optional
        Per-draw statistics in arviz's names (see :class:`_DrawStats`).
    """

    samples: torch.Tensor
    x: torch.Tensor
    accept_sum: torch.Tensor
    n_reflections: torch.Tensor
    n_divergent: torch.Tensor
    n_in: torch.Tensor
    n_recorded: int
    n_iterations: int
    leapfrog_sum: int
    stats: dict | None = None

    @property
    def accept_rate(self) -> np.ndarray:
        """Mean acceptance probability per chain over the sampling phase, ``(C,)``."""
        return (self.accept_sum / max(self.n_iterations, 1)).cpu().numpy()

    @property
    def mean_leapfrog(self) -> float:
        """Mean leapfrog steps per sampling transition."""
        return self.leapfrog_sum / max(self.n_iterations, 1)

    def kept_fraction(self) -> np.ndarray:
        """Fraction of recorded states in the support per chain, ``(C,)``.

        Warns (``RuntimeWarning``) when it is below 1% on average.
        """
        kept = (self.n_in.double() / max(self.n_recorded, 1)).cpu().numpy()
        if kept.mean() < 0.01:
            warnings.warn(f"only {100 * kept.mean():.2g}% of the draws fall in the support; "
                          "use a tighter container.", RuntimeWarning,
                          stacklevel=user_stacklevel())
        return kept


class _DrawStats:
    """Per-draw statistics, written in the same slot as each kept draw.

    A kept draw's ``energy`` (the Hamiltonian at the kept state) and ``lp`` (its log
    density) are those of the state itself. ``diverging`` (any), ``acceptance_rate``
    (mean), ``n_steps`` and ``reflections`` (sums) cover the transitions of the chain
    since its previous kept draw (since the start of the call for the first), so that
    with ``thin > 1`` or a support no divergence goes unreported; with ``thin=1`` and no
    support they are those of the draw's own transition.
    """

    # running sums per chain since its last kept draw (float64: integers stay exact)
    _RUN = ("acceptance_rate", "diverging", "reflections", "n_steps", "transitions")

    def __init__(self, C: int, n_samples: int, like: torch.Tensor, every_transition: bool):
        opts: dict[str, Any] = {"dtype": torch.float64, "device": like.device}
        self.dtype = like.dtype
        # thin=1 without a support: each draw is one transition, nothing to accumulate
        self.every_transition = every_transition
        self.run = torch.zeros(C, len(self._RUN), **opts)
        self.one = torch.ones(C, **opts)
        # one packed buffer: the running sums, then energy and lp (float32 -> 64 is exact)
        self.buf = torch.zeros(C, n_samples, len(self._RUN) + 2, **opts)

    def _transition(self, out: dict, n_steps: int) -> torch.Tensor:
        return torch.stack((out["accept_prob"].double(), out["divergent"].double(),
                            out["n_reflections"].double(), self.one * n_steps, self.one), 1)

    def add(self, out: dict, n_steps: int) -> None:
        """Accumulate one transition of every chain."""
        if not self.every_transition:
            self.run += self._transition(out, n_steps)

    def write(self, out: dict, rows, cols, n_steps: int) -> None:
        """Store the statistics of chains ``rows`` in draw slots ``cols``, then reset them."""
        run = self._transition(out, n_steps) if self.every_transition else self.run[rows]
        self.buf[rows, cols] = torch.cat(
            (run, torch.stack((out["energy"][rows], out["logp"][rows]), 1).double()), 1)
        if not self.every_transition:
            self.run[rows] = 0.0

    def numpy(self) -> dict:
        """The statistics as numpy arrays of shape (C, n_samples), in arviz's names."""
        b = self.buf.cpu().numpy()
        col = dict(zip((*self._RUN, "energy", "lp"), np.moveaxis(b, -1, 0)))
        state_dtype = torch.empty(0, dtype=self.dtype).numpy().dtype  # the draws' dtype
        return {
            "diverging": col["diverging"] > 0,
            "energy": col["energy"].astype(state_dtype),
            "acceptance_rate": col["acceptance_rate"] / np.maximum(col["transitions"], 1.0),
            "lp": col["lp"].astype(state_dtype),
            "n_steps": col["n_steps"].astype(np.int64),
            "reflections": col["reflections"].astype(np.int64),
        }


def run_chains(transition: Transition, warm: Warmup, x: torch.Tensor, logp: torch.Tensor,
               grad: torch.Tensor, *, n_samples: int, warmup: int, thin: int,
               support: Region | ConvexContainer | None, verbose: int,
               label: str = "ReflectiveHMC") -> Draws:
    """Run ``warmup`` adapting transitions, then sample until each chain keeps ``n_samples``.

    Parameters
    ----------
    transition : callable
        ``(x, logp, grad) -> (out, n_leapfrog)`` with ``out`` the dict of
        :func:`._kernels.hmc_transition`; it reads the current tuning from ``warm``.
    warm : Warmup
        Updated after each warm-up transition (then frozen: it is not touched after).
    x, logp, grad : torch.Tensor of shapes (C, d), (C,), (C, d)
        The chains' starting state.
    n_samples, warmup, thin : int
    support : Region, ConvexContainer or None
    verbose : int
        ``> 0`` shows a progress bar over the warm-up iterations (mean acceptance
        probability, leapfrog steps and mean step size of the last one) and one
        over the draws (mean acceptance and divergent transitions so far).
    label : str, default="ReflectiveHMC"
        The bars' label: ``"<label> warmup"`` and ``"<label> sampling"``.

    Returns
    -------
    Draws

    Raises
    ------
    RuntimeError
        With a support: if some chain has no recorded state in it after
        :data:`MIN_RECORDS` records, or fewer than ``n_samples`` draws are kept
        after ``1000 * thin * n_samples + 1000`` transitions.
    """
    C, d = x.shape
    samples = torch.empty(C, n_samples, d, dtype=x.dtype, device=x.device)
    count = torch.zeros(C, dtype=torch.long, device=x.device)
    chain_idx = torch.arange(C, device=x.device)
    acc_sum = torch.zeros(C, dtype=torch.float64, device=x.device)
    ref_sum = torch.zeros(C, dtype=torch.long, device=x.device)
    div_sum = torch.zeros(C, dtype=torch.long, device=x.device)
    n_in, n_rec, n_kept, it, lf_sum = torch.zeros_like(ref_sum), 0, 0, 0, 0
    stats = _DrawStats(C, n_samples, x, every_transition=thin == 1 and support is None)
    max_iter = 1000 * thin * n_samples + 1000
    # ---- warm-up: adapt, then freeze. A bar of its own (NumPyro has one bar whose label
    # switches from "warmup" to "sample"; ProgressLogger's bar has a fixed length)
    if warmup:
        log = ProgressLogger(warmup, verbose, desc=f"{label} warmup")
        for k in log:
            out, n = transition(x, logp, grad)
            warm.update(k, x, out, n)
            x, logp, grad = out["x"], out["logp"], out["grad"]
            if verbose:
                log.log(accept=float(out["accept_prob"].mean()), steps=n,
                        step_size=float(warm.step_mean))
    log = ProgressLogger(n_samples, verbose, desc=f"{label} sampling")
    for k in log:
        while n_kept <= k:  # ---- sampling: one more kept draw per chain
            if it >= max_iter:
                raise RuntimeError(
                    f"only {n_kept} of {n_samples} draws kept after {it} "
                    "iterations: the support holds too little of the container's mass.")
            out, n = transition(x, logp, grad)
            x, logp, grad = out["x"], out["logp"], out["grad"]
            it += 1
            lf_sum += n
            acc_sum += out["accept_prob"]
            ref_sum += out["n_reflections"]
            div_sum += out["divergent"]
            stats.add(out, n)
            if it % thin:
                continue
            n_rec += 1
            if support is None:  # every chain keeps every recorded state
                samples[:, n_rec - 1] = x
                stats.write(out, slice(None), n_rec - 1, n)
                n_kept = n_rec
                continue
            ins = support._holds(x) if isinstance(support, ConvexContainer) else support.contains(x)
            n_in += ins
            keep = ins & (count < n_samples)
            samples[chain_idx[keep], count[keep]] = x[keep]
            stats.write(out, chain_idx[keep], count[keep], n)
            count += keep
            n_kept = int(count.min())
            if n_rec >= MIN_RECORDS and not bool(n_in.all()):
                raise RuntimeError(
                    f"no draw of chain {int((n_in == 0).nonzero()[0, 0])} fell in the "
                    f"support in {n_rec} recorded states (kept fraction < "
                    f"{1 / n_rec:.1g}): the support holds (almost) none of the container's "
                    "mass; use a tighter container or check the support.")
        if verbose:
            log.log(accept=float(acc_sum.mean()) / max(it, 1), divergent=int(div_sum.sum()))
    if support is None:
        n_in = torch.full_like(n_in, n_rec)
    return Draws(samples=samples, x=x, accept_sum=acc_sum, n_reflections=ref_sum,
                 n_divergent=div_sum, n_in=n_in, n_recorded=n_rec, n_iterations=it,
                 leapfrog_sum=lf_sum, stats=stats.numpy())
