"""``SampleResult``: the draws and diagnostics returned by :meth:`ReflectiveHMC.sample`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from mlpapers._utils import user_stacklevel
from mlpapers.sampling.rehmc._diagnostics import ess as _ess
from mlpapers.sampling.rehmc._diagnostics import rhat as _rhat
from mlpapers.sampling.rehmc._diagnostics import split_rhat_classic

__all__ = ["SampleResult"]


@dataclass
class SampleResult:
    """Draws and diagnostics of :meth:`ReflectiveHMC.sample`.

    Attributes
    ----------
    samples : numpy.ndarray of shape (chains, draws, d)
        Kept draws: every ``thin``-th state that lies in the support ``S``.
    accept_rate : numpy.ndarray of shape (chains,)
        Mean Metropolis acceptance probability over the sampling iterations.
    n_reflections : numpy.ndarray of shape (chains,)
        Total boundary reflections over the sampling iterations.
    n_divergent : numpy.ndarray of shape (chains,)
        Rejected divergent transitions (reflection cap hit, non-finite energy or
        energy error above 1000) during sampling.
    kept_fraction : numpy.ndarray of shape (chains,)
        Fraction of recorded states lying in ``S`` (1 without a ``support``).
    step_size : numpy.ndarray of shape (chains,)
        Frozen step sizes used after warm-up (before jitter).
    inv_mass : numpy.ndarray of shape (d,)
        Diagonal inverse mass matrix used after warm-up.
    n_iterations : int
        Sampling iterations (transitions) run after warm-up.
    n_leapfrog : int or "auto"
        The ``n_leapfrog`` used: a fixed count per transition, or ``"auto"``
        (ChEES-adapted trajectory length; 10 when ``"auto"`` fell back for a
        single chain).
    warmup_divergent : numpy.ndarray of shape (chains,)
        Divergent transitions during warm-up.
    trajectory_length : float or None
        Frozen ChEES trajectory length ``T`` (integration time; each
        transition runs for a jittered fraction of it); ``None`` with a fixed
        ``n_leapfrog``.
    mean_leapfrog : float
        Mean leapfrog steps per transition and chain during sampling (equals
        ``n_leapfrog`` when it is fixed; ``nan`` if unknown).
    last_state : numpy.ndarray of shape (chains, d) or None
        Final position of each chain, where ``sample(..., resume=result)``
        continues. It equals ``samples[:, -1]`` without a ``support``; with one it
        may differ (chains that already had their draws kept moving) and may lie
        outside ``S`` (inside the container).
    sampler_state : dict or None
        Opaque state for ``resume`` (the random generator state, the number of
        transitions run, the rotation of the ChEES lengths). Plain numpy and
        Python values, so a result survives pickling.
    """

    samples: np.ndarray
    accept_rate: np.ndarray
    n_reflections: np.ndarray
    n_divergent: np.ndarray
    kept_fraction: np.ndarray
    step_size: np.ndarray
    inv_mass: np.ndarray
    n_iterations: int
    n_leapfrog: int | str
    warmup_divergent: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trajectory_length: float | None = None
    mean_leapfrog: float = float("nan")
    last_state: np.ndarray | None = None
    sampler_state: dict | None = field(default=None, repr=False)

    @property
    def reflections_per_step(self) -> float:
        """Mean number of reflections per leapfrog step, over chains and iterations."""
        per_iter = self.mean_leapfrog if np.isfinite(self.mean_leapfrog) else self.n_leapfrog
        steps = max(self.n_iterations * float(per_iter) * len(self.n_reflections), 1.0)
        return float(self.n_reflections.sum() / steps)

    def _warn_if_unconverged(self, threshold: float = 1.1) -> None:
        """Warn when the chains disagree (classic split R-hat above ``threshold`` in some
        dimension; the rank-normalised :meth:`rhat` costs seconds for hundreds of chains)."""
        x = self.samples
        if x.ndim != 3 or x.shape[0] < 2 or not np.isfinite(x).all():
            return
        worst = np.nanmax(split_rhat_classic(x), initial=1.0)
        if worst > threshold:
            warnings.warn(f"the chains disagree (split R-hat {worst:.3g} > {threshold} in "
                          "some dimension): the draws are not reliable. Run a longer warm-up, "
                          "use mass='diag' for badly scaled targets or containers, or check "
                          "result.rhat() and the trace.", RuntimeWarning,
                          stacklevel=user_stacklevel())

    def ess(self, kind: str = "bulk") -> np.ndarray:
        """Rank-normalised bulk or tail effective sample size per dimension, ``(d,)``."""
        return np.asarray(_ess(self.samples, kind=kind))

    def rhat(self) -> np.ndarray:
        """Rank-normalised split R-hat per dimension, ``(d,)``."""
        return np.asarray(_rhat(self.samples))

    def summary(self) -> dict[str, np.ndarray | float]:
        """Per-dimension mean, sd, bulk/tail ESS and R-hat, plus sampler-level figures."""
        flat = self.samples.reshape(-1, self.samples.shape[-1])
        return {
            "mean": flat.mean(0),
            "sd": flat.std(0, ddof=1) if len(flat) > 1 else np.full(flat.shape[1], np.nan),
            "ess_bulk": self.ess("bulk"),
            "ess_tail": self.ess("tail"),
            "rhat": self.rhat(),
            "accept_rate": float(self.accept_rate.mean()),
            "n_divergent": int(self.n_divergent.sum()),
            "reflections_per_step": self.reflections_per_step,
            "kept_fraction": float(self.kept_fraction.mean()),
            "mean_leapfrog": float(self.mean_leapfrog),
        }

    def to_inference_data(self):
        """The draws as an ``arviz.InferenceData`` (needs the optional ``arviz``)."""
        try:
            import arviz as az
        except ImportError as exc:  # pragma: no cover - optional
            raise ImportError("to_inference_data needs arviz: pip install arviz") from exc
        stats = {"step_size": np.broadcast_to(self.step_size[:, None],
                                              self.samples.shape[:2]).copy()}
        return az.from_dict(posterior={"x": self.samples}, sample_stats=stats)
