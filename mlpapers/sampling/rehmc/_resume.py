"""Continuing a finished :class:`ReflectiveHMC` run from its :class:`SampleResult`.

A result stores what a continuation needs besides the adapted step sizes and inverse
mass it already reports: the chains' final positions (``last_state``) and the
sampler's state at the end (``sampler_state``: the torch generator state, the number
of transitions run and the Halton rotation of the ChEES lengths). Restoring them makes
``sample(n1)`` followed by ``sample(n2, resume=result)`` the same chain as one
``sample(n1 + n2)`` call (bit for bit without a ``support``, see the user guide).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mlpapers.sampling.rehmc._result import SampleResult, end_fingerprint
from mlpapers.sampling.rehmc._supports import ConvexContainer

__all__ = ["ResumeStart", "final_sampler_state", "resume_start"]


@dataclass
class ResumeStart:
    """What :meth:`ReflectiveHMC.sample` takes from a result it resumes.

    Attributes
    ----------
    x : torch.Tensor of shape (C, d)
        The chains' final positions (in the container; with a support possibly
        outside it).
    step_size : torch.Tensor of shape (C,)
    inv_mass : torch.Tensor of shape (d,)
    trajectory_length : float or None
    rng_state : torch.Tensor
        The torch generator state at the end of the run (uint8).
    n_transitions : int
        Transitions run so far (warm-up and sampling, over every segment since the
        last warm-up began; a resume with ``warmup > 0`` starts counting afresh).
    halton_shift : float or None
        Rotation of the Halton points of the ChEES lengths.
    fingerprint : str or None
        :func:`._result.end_fingerprint` of the resumed result (stored in the new
        result's ``sampler_state["resumed_from"]``).
    """

    x: torch.Tensor
    step_size: torch.Tensor
    inv_mass: torch.Tensor
    trajectory_length: float | None
    rng_state: torch.Tensor
    n_transitions: int
    halton_shift: float | None
    fingerprint: str | None = None

    def restore(self, warm, auto_length: bool) -> tuple[int, float | None]:
        """Freeze ``warm`` (a :class:`._warmup.Warmup` without warm-up iterations) at the
        result's inverse mass and, with ``auto_length``, its trajectory length.

        Returns
        -------
        n_transitions : int
            Transitions run so far (the index of the next Halton point).
        halton_shift : float or None
            The rotation of the Halton points (``None`` without ``auto_length``).
        """
        warm.set_mass(self.inv_mass, identity=bool((self.inv_mass == 1).all()))
        if not auto_length:
            return self.n_transitions, None
        warm.trajectory_length = self.trajectory_length
        return self.n_transitions, self.halton_shift


def final_sampler_state(gen: torch.Generator, n_transitions: int,
                        halton_shift: float | None, n_recorded: int,
                        start: ResumeStart | None) -> dict:
    """The ``sampler_state`` of a result: plain numpy / Python values (picklable).

    ``n_recorded`` is the number of recorded states per chain (the denominator of
    ``kept_fraction``), ``start`` the resumed result's start (``None`` for a fresh
    run; a resume with ``warmup > 0`` also continues the chains and the random
    stream, so it is fingerprinted too).
    """
    return {
        "rng_state": gen.get_state().numpy().copy(),
        "n_transitions": int(n_transitions),
        "halton_shift": None if halton_shift is None else float(halton_shift),
        "n_recorded": int(n_recorded),
        "resumed_from": None if start is None else start.fingerprint,
    }


def _array(value, name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    arr = np.array(value, dtype=np.float64)  # a copy: a result's arrays may be read-only
    if arr.shape != shape:
        raise ValueError(f"resume: the result's {name} has shape {arr.shape}, expected {shape} "
                         "(a result modified by hand?).")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"resume: the result's {name} is not finite.")
    return torch.as_tensor(arr).to(dtype=dtype, device=device)


def resume_start(result, container: ConvexContainer, x0, n_chains: int | None,
                 dtype: torch.dtype, device) -> ResumeStart:
    """Validate ``resume=result`` against the sampler and return the starting values.

    Raises
    ------
    TypeError
        If ``result`` is not a :class:`SampleResult`.
    ValueError
        If ``x0`` is also given, the dimension or the number of chains differs from
        the sampler's, the result has no final state (built by hand or by an older
        version), its final positions lie outside the container, or the sampler
        adapts the trajectory length (``n_leapfrog="auto"``) but the result has none.
    """
    if not isinstance(result, SampleResult):
        raise TypeError("resume must be a SampleResult returned by ReflectiveHMC.sample, "
                        f"got {type(result).__name__}.")
    if x0 is not None:
        raise ValueError("pass either x0 or resume, not both: resume continues each chain "
                         "from its last state.")
    last, state = getattr(result, "last_state", None), getattr(result, "sampler_state", None)
    if last is None or state is None:
        raise ValueError("resume: this SampleResult has no final chain state (it was built "
                         "by hand or by an older version of mlpapers); pass "
                         "x0=result.samples[:, -1], step_size and warmup=0 instead.")
    last = np.asarray(last)
    d = container.dim
    if last.ndim != 2 or last.shape[1] != d:
        raise ValueError(f"resume: the result has dimension {last.shape[-1]} but the "
                         f"container has dimension {d}.")
    chains = last.shape[0]
    if n_chains is not None and int(n_chains) != chains:
        raise ValueError(f"resume: the result has {chains} chains but n_chains={n_chains}; "
                         "leave n_chains unset to continue every chain.")
    x = _array(last, "last_state", (chains, d), dtype, device)
    if not bool(container._holds(x).all()):  # as the sampler keeps its states
        raise ValueError("resume: the result's last states lie outside the container (a "
                         "different container than the run being resumed?).")
    rng = np.array(state.get("rng_state"), dtype=np.uint8) if isinstance(state, dict) else None
    if rng is None or rng.ndim != 1 or rng.size != torch.Generator().get_state().numel():
        raise ValueError("resume: the result's sampler_state is malformed (its rng_state is "
                         "not the state of a CPU torch.Generator).")
    shift = state.get("halton_shift")
    step = _array(result.step_size, "step_size", (chains,), dtype, device)
    inv_mass = _array(result.inv_mass, "inv_mass", (d,), dtype, device)
    if not bool((step > 0).all() and (inv_mass > 0).all()):
        raise ValueError("resume: the result's step_size and inv_mass must be positive.")
    return ResumeStart(
        x=x,
        step_size=step,
        inv_mass=inv_mass,
        trajectory_length=(None if result.trajectory_length is None
                           else float(result.trajectory_length)),
        rng_state=torch.from_numpy(rng.copy()),
        n_transitions=int(state.get("n_transitions", 0)),
        halton_shift=None if shift is None else float(shift),
        fingerprint=end_fingerprint(result),
    )
