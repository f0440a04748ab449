"""``SampleResult``: the draws and diagnostics returned by :meth:`ReflectiveHMC.sample`."""

from __future__ import annotations

import hashlib
import inspect
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from mlpapers._utils import user_stacklevel
from mlpapers.sampling.rehmc._diagnostics import (
    EssKind,
    dim_blocks,
    extreme_value_units,
    split_ess_classic,
    split_rhat_classic,
)
from mlpapers.sampling.rehmc._diagnostics import ess as _ess
from mlpapers.sampling.rehmc._diagnostics import rhat as _rhat
from mlpapers.sampling.rehmc._summary import SampleSummary, check_names

if TYPE_CHECKING:
    import torch

__all__ = ["SampleResult", "attribute_entries", "end_fingerprint"]

def end_fingerprint(result) -> str | None:
    """A hash of where ``result`` ended: its generator state and its chains' final states.

    A run resumed from ``result`` stores it as ``sampler_state["resumed_from"]``, so
    that :meth:`SampleResult.concat` can check that parts follow one another.
    ``None`` when the result has no final state.
    """
    state, last = getattr(result, "sampler_state", None), getattr(result, "last_state", None)
    if not isinstance(state, dict) or state.get("rng_state") is None or last is None:
        return None
    h = hashlib.sha256(np.ascontiguousarray(state["rng_state"], dtype=np.uint8).tobytes())
    last = np.ascontiguousarray(last, dtype=np.float64)
    h.update(repr(last.shape).encode())
    h.update(last.tobytes())
    return h.hexdigest()


def attribute_entries(doc: str) -> dict[str, str]:
    """``{name: entry}`` of the ``Attributes`` section of a numpydoc class docstring
    (each entry its ``name : type`` line and description, as written), so that a
    subclass (:class:`StiefelResult`) documents the fields it inherits in the same words."""
    lines = inspect.cleandoc(doc).split("\n")
    if "Attributes" not in lines:  # (python -OO: dataclasses make a docstring of the fields)
        return {}
    start = lines.index("Attributes") + 2  # after the dashes
    entries: dict[str, list[str]] = {}
    name = None
    for line in lines[start:]:
        if line and not line.startswith(" "):
            if line.startswith("-") or ":" not in line:
                break  # the next section's title (its dashes follow)
            name = line.split(":", 1)[0].strip()
            entries[name] = []
        if name is not None:
            entries[name].append(line)
    return {k: "\n".join(v).rstrip() for k, v in entries.items()}


# per-draw statistics of ``SampleResult.sample_stats``, in arviz's names
STAT_NAMES = ("diverging", "energy", "acceptance_rate", "lp", "n_steps", "reflections")


def _join_stats(parts: list) -> dict | None:
    """Join per-draw statistics on the draws axis; ``None`` unless every part has them."""
    if not all(isinstance(p, dict) for p in parts):
        return None
    keys = [k for k in parts[0] if all(k in p for p in parts)]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts], axis=1) for k in keys}


def _n_recorded(result) -> int:
    """Recorded states per chain (the denominator of ``kept_fraction``); results from
    before it was stored count their iterations (right for ``thin=1``)."""
    state = result.sampler_state
    if isinstance(state, dict) and state.get("n_recorded") is not None:
        return int(state["n_recorded"])
    return int(result.n_iterations)


@dataclass(repr=False, eq=False)  # (identity ==: fields are arrays; hashable)
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
        Rejected divergent transitions (reflection cap hit, non-finite energy,
        energy error above 1000, or an end point that rounding put outside the
        container) during sampling.
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
        transitions run, the rotation of the ChEES lengths), the number of
        recorded states and, for a resumed run, a hash of where the resumed
        result ended (checked by :meth:`concat`). Plain numpy and Python values,
        so a result survives pickling.
    sample_stats : dict of str to numpy.ndarray of shape (chains, draws) or None
        Per-draw sampler statistics, aligned with ``samples``, in arviz's names
        (:meth:`to_inference_data` puts them into ``sample_stats``): ``lp``
        (float, ``log_prob`` of the draw) and ``energy`` (float, the
        Hamiltonian ``-log_prob + K(p)`` at the draw, for ``az.bfmi`` and
        ``az.plot_energy``) of the kept state itself; ``diverging`` (bool, some
        transition diverged), ``acceptance_rate`` (float, mean Metropolis
        acceptance probability), ``n_steps`` (int, leapfrog steps) and
        ``reflections`` (int, boundary reflections) over the transitions of the
        chain since its previous kept draw (in the same ``sample`` call). With
        ``thin=1`` and no support these are the draw's own transition; with
        ``thin > 1`` or a support a draw covers the states skipped before it, so
        no divergence is lost: ``diverging`` marks a draw if any transition since
        the previous kept draw diverged. ``energy`` is sampled at the kept draws
        only, so ``az.bfmi`` is meaningful with ``thin=1`` and no support (with
        thinning its energy differences span several transitions and read too
        high). ``None`` for results built by hand or by a version of mlpapers
        before these statistics.

    Notes
    -----
    ``repr(result)`` is one line (shapes and sampler-level figures); the
    per-dimension table is :meth:`summary`, and ``print(result.summary())``
    prints it.

    Examples
    --------
    >>> from mlpapers.sampling import Box, ReflectiveHMC
    >>> hmc = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([-1, -1], [1, 1]),
    ...                     n_leapfrog=5, random_state=0)
    >>> res = hmc.sample(100, n_chains=2, warmup=100)
    >>> res.samples.shape, res.rhat().shape, res.ess().shape
    ((2, 100, 2), (2,), (2,))
    >>> more = hmc.sample(50, resume=res)  # the same chains, 50 draws further
    >>> res.concat(more).samples.shape
    (2, 150, 2)
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
    sample_stats: dict | None = field(default=None, repr=False)
    if TYPE_CHECKING:  # not a field: set by ReflectiveHMC.sample(return_tensor=True) only
        samples_tensor: torch.Tensor = field(init=False)

    @property
    def reflections_per_step(self) -> float:
        """Mean number of reflections per leapfrog step, over chains and iterations."""
        per_iter = self.mean_leapfrog if np.isfinite(self.mean_leapfrog) else self.n_leapfrog
        if isinstance(per_iter, str):  # "auto" on a result built without mean_leapfrog
            return float("nan")
        steps = max(self.n_iterations * float(per_iter) * len(self.n_reflections), 1.0)
        return float(self.n_reflections.sum() / steps)

    def _warn_if_unconverged(self, threshold: float = 1.1, min_ess_per_chain: float = 100.0,
                             min_ess: float = 400.0, min_ratio: float = 0.1) -> None:
        """Warn when the chains disagree (classic split R-hat above ``threshold`` in some
        dimension; the rank-normalised :meth:`rhat` costs seconds for hundreds of chains),
        or else when some dimension has fewer effective draws than
        ``min(min_ess_per_chain * chains, min_ess)`` (classic split-chain ESS, one FFT
        pass: rstan's and PyMC's 100 per chain, capped at the 400 that Vehtari et al.
        2021 ask of a run, so that many short chains are judged on their total; runs
        with fewer draws than that in all are not judged) while the ESS is also below
        ``min_ratio`` of the transitions (bayesplot's concern threshold for
        ``n_eff / N``; with ``thin > 1`` also below 3/4 of the kept draws): slow mixing,
        not a short run."""
        x = self.samples
        if x.ndim != 3 or x.shape[0] < 1:
            return
        # block by block: a mask of all the draws is 1/8 of their size (they reach GBs)
        if not all(np.isfinite(x[:, :, dims]).all() for dims in dim_blocks(x.shape)):
            return
        if x.shape[0] >= 2:
            worst = np.nanmax(split_rhat_classic(x), initial=1.0)
            if worst > threshold:
                # (enough digits to show it above the threshold: "1.1 > 1.1" for 1.1004)
                shown = next(f"{worst:.{p}g}" for p in range(3, 18)
                             if float(f"{worst:.{p}g}") > threshold or p == 17)
                warnings.warn(f"the chains disagree (split R-hat {shown} > {threshold} in "
                              "some dimension): the draws are not reliable. Run a longer "
                              "warm-up, use mass='diag' for badly scaled targets or "
                              "containers, or check result.rhat() and the trace.",
                              RuntimeWarning, stacklevel=user_stacklevel())
                return  # the ESS warning would say the same again
        need, n = min(min_ess_per_chain * x.shape[0], min_ess), x.shape[0] * x.shape[1]
        if n < need:
            return  # a run shorter than that asked for few draws: no news (R-hat still ran)
        low = np.nanmin(split_ess_classic(x), initial=np.inf)
        # and only a slowly mixing chain (ESS below bayesplot's 0.1 of the transitions):
        # a short run of a healthy sampler (0.3 to 1) is the user's choice of length.
        # Per transition, not per kept draw: thin=5 kept the same ESS of the same
        # transitions at 5 times the ratio and hid the pathology; but a thinned healthy
        # chain's ESS is capped by its kept draws (0.97 to 1.13 of them measured), hence
        # also below 3/4 of those (half let thin=20 hide it again: 0.52 of them)
        transitions = x.shape[0] * max(int(self.n_iterations), x.shape[1])
        if low < need and low < min_ratio * transitions and low < 0.75 * n:
            warnings.warn(f"few effective draws (classic split-chain ESS {low:.3g} < "
                          f"{need:.3g} in some dimension, {100 * low / transitions:.2g}% of "
                          f"the {transitions} transitions): the chains mix slowly and means "
                          "and quantiles are imprecise. Use mass='diag' for badly scaled "
                          "targets or containers, rescale or reparametrise, or draw more "
                          "(in one call, or resume and join: result.concat(more), then "
                          "check .ess()); check result.ess() and the trace.",
                          RuntimeWarning, stacklevel=user_stacklevel())

    def _warn_if_capped(self, max_leapfrog: int) -> None:
        """Warn when the ChEES-adapted trajectory length sits at the cap of
        ``max_leapfrog`` steps (``n_leapfrog="auto"`` only; a fixed count is the user's)."""
        if self.n_leapfrog != "auto" or self.trajectory_length is None:
            return
        step = float(np.mean(self.step_size)) if np.size(self.step_size) else float("nan")
        # ChEES clamps T at max_leapfrog running step sizes and freezes an iterate average
        # (clamped at the frozen step): pinned at the cap, the average lands just under it
        # (999.87 steps in the thin box [0, 1e-3] x [-10, 10]); 5% leaves room for the early
        # iterates in the average and dual averaging's moves of the step size
        if not self.trajectory_length >= 0.95 * max_leapfrog * step:
            return
        warnings.warn(
            f"n_leapfrog='auto': the adapted trajectory length is at the cap of {max_leapfrog} "
            f"leapfrog steps per transition (step size {step:.3g}, mean "
            f"{self.mean_leapfrog:.4g} steps per transition): ChEES asked for longer "
            "trajectories, so the target is far wider in some direction than the step size "
            "(set by the narrowest one) travels, and the chains may mix poorly. Use "
            "mass='diag', rescale or reparametrise the coordinates, or run a longer warm-up; "
            "check result.ess().", RuntimeWarning, stacklevel=user_stacklevel())

    def ess(self, kind: EssKind = "bulk") -> np.ndarray:
        """Rank-normalised bulk or tail effective sample size per dimension.

        :func:`~mlpapers.sampling.ess` of ``samples``.

        Parameters
        ----------
        kind : {"bulk", "tail"}, default="bulk"
            ``"bulk"``: the ESS of the rank-normalised draws; ``"tail"``: the
            smaller ESS of the indicators of the 5% and 95% quantiles.

        Returns
        -------
        numpy.ndarray of shape (d,)
            One ESS per dimension (NaN where undefined: fewer than 8 draws per
            chain, non-finite or constant draws, and for ``"tail"`` a constant
            tail indicator, see :func:`mlpapers.sampling.ess`).
        """
        return np.asarray(_ess(self.samples, kind=kind))

    def rhat(self) -> np.ndarray:
        """Rank-normalised split R-hat per dimension.

        :func:`~mlpapers.sampling.rhat` of ``samples`` (the larger of the bulk
        and folded R-hat; below 1.01 when the chains agree).

        Returns
        -------
        numpy.ndarray of shape (d,)
            One R-hat per dimension (NaN where undefined: fewer than 4 draws per
            chain, non-finite or constant draws).
        """
        return np.asarray(_rhat(self.samples))

    def _default_names(self) -> list[str]:
        return [f"x[{i}]" for i in range(self.samples.shape[-1])]

    def summary(self, names: Iterable[str] | None = None) -> SampleSummary:
        """Per-dimension mean, sd, quantiles, bulk/tail ESS and R-hat, and sampler figures.

        Parameters
        ----------
        names : iterable of str, optional
            One label per dimension (e.g. ``["intercept", *feature_names]``) for
            the printed table and :meth:`SampleSummary.to_frame`; ``x[0]``, ``x[1]``, ...
            by default.

        Returns
        -------
        SampleSummary
            A ``dict``: ``mean``, ``sd``, ``q5``, ``median``, ``q95`` (an
            equal-tailed 90% interval), ``ess_bulk``, ``ess_tail`` and ``rhat``
            (arrays of shape ``(d,)``), and ``accept_rate``, ``n_divergent``,
            ``reflections_per_step``, ``kept_fraction`` and ``mean_leapfrog``
            (numbers). It prints as a table, one row per dimension
            (``print(result.summary())``), and ``.to_frame()`` gives a pandas
            ``DataFrame`` like ``arviz.summary``'s.
        """
        d = self.samples.shape[-1]
        names = check_names(names, d, self._default_names())
        flat = self.samples.reshape(-1, d)
        dtype = flat.dtype if np.issubdtype(flat.dtype, np.floating) else np.float64
        # float64 accumulators: numpy sums float32 draws row by row in float32, which lost
        # the mean's third digit over 64 x 10^4 draws of 1000 + N(0, 1)
        mean = (flat.mean(0, dtype=np.float64).astype(dtype, copy=False) if len(flat)
                else np.full(d, np.nan))
        sd = np.full(d, np.nan, dtype=dtype)
        q5, med, q95 = (np.full(d, np.nan) for _ in range(3))  # np.quantile's float64
        # blocks of dimensions: the quantiles (a partitioned copy) and the sd (the
        # deviations) of all draws at once held two temporaries the size of the draws
        # (the sd of a block may differ from the whole array's in the last bit: numpy
        # sums the columns of a strided block in another order)
        for dims in (dim_blocks(flat.shape) if len(flat) else []):
            block = flat[:, dims]
            q5[dims], med[dims], q95[dims] = np.quantile(block, [0.05, 0.5, 0.95], axis=0)
            if len(flat) > 1:
                unit = extreme_value_units(block, 0)
                sd[dims] = (block.std(0, ddof=1, dtype=np.float64) if (unit == 1.0).all()
                            else (block / unit).std(0, ddof=1, dtype=np.float64) * unit)
        return SampleSummary({
            "mean": mean,
            "sd": sd,
            "q5": q5,
            "median": med,
            "q95": q95,
            "ess_bulk": self.ess("bulk"),
            "ess_tail": self.ess("tail"),
            "rhat": self.rhat(),
            "accept_rate": float(self.accept_rate.mean()),
            "n_divergent": int(self.n_divergent.sum()),
            "reflections_per_step": self.reflections_per_step,
            "kept_fraction": float(self.kept_fraction.mean()),
            "mean_leapfrog": float(self.mean_leapfrog),
        }, names)

    def _shape_text(self) -> str:
        """The shape part of :meth:`__repr__` (subclasses name their own dimensions)."""
        chains, draws = self.samples.shape[:2]
        return f"chains={chains}, draws={draws}, d={self.samples.shape[-1]}"

    def __repr__(self) -> str:
        shape = self._shape_text()
        step = np.asarray(self.step_size, dtype=float)
        traj = "None" if self.trajectory_length is None else f"{self.trajectory_length:.4g}"
        return (f"{type(self).__name__}({shape}, "
                f"accept_rate={float(np.mean(self.accept_rate)):.3g}, "
                f"n_divergent={int(np.sum(self.n_divergent))}, "
                f"kept_fraction={float(np.mean(self.kept_fraction)):.3g}, "
                f"step_size={float(step.mean()) if step.size else float('nan'):.3g}, "
                f"n_leapfrog={self.n_leapfrog!r}, trajectory_length={traj}, "
                f"mean_leapfrog={float(self.mean_leapfrog):.3g})")

    def concat(self, *others: SampleResult) -> SampleResult:
        """Join this run and its continuations along the draws.

        Meant for ``more = sampler.sample(n, resume=result)``:
        ``result.concat(more)`` holds the draws of both calls per chain (the
        same Markov chain), its diagnostics cover all of them, and it can be
        resumed again (the final state and tuning are those of the last result).

        Parameters
        ----------
        *others : SampleResult
            Results of the same type, number of chains and dimension, in the
            order they were drawn.

        Returns
        -------
        SampleResult
            ``samples`` (and ``Q``, ``X`` for a :class:`StiefelResult`) joined on
            axis 1; ``n_reflections``, ``n_divergent``, ``warmup_divergent`` (a
            continuation resumed with ``warmup > 0`` has its own) and
            ``n_iterations`` summed; ``accept_rate`` and ``mean_leapfrog``
            averaged with the iterations as weights, ``kept_fraction`` with the
            recorded states (``n_iterations // thin``) as weights; ``step_size``,
            ``inv_mass``, ``n_leapfrog``, ``trajectory_length``, ``last_state``
            and ``sampler_state`` of the last; ``sample_stats`` joined on the
            draws (``None`` unless every part has them).

        Raises
        ------
        TypeError
            If some argument is not a result of this type.
        ValueError
            If the numbers of chains or the dimensions differ, or if a part is
            not the continuation of the part before it (``sample(...,
            resume=previous)``, with or without warm-up): a fresh run, the same
            result twice, the wrong order or another run's continuation. Parts
            that cannot be checked (results built by hand, or resumed by a
            version of mlpapers before this check) are joined unchecked.
        """
        parts = (self, *others)
        for r in others:
            if type(r) is not type(self):
                raise TypeError(f"concat joins results of the same type: a {type(self).__name__} "
                                f"and a {type(r).__name__}.")
            if r.samples.shape[0] != self.samples.shape[0] \
                    or r.samples.shape[2:] != self.samples.shape[2:]:
                raise ValueError(f"concat: shapes {self.samples.shape} and {r.samples.shape} "
                                 "differ in the number of chains or the dimension.")
        for i, (prev, r) in enumerate(zip(parts, others), start=1):
            state = r.sampler_state
            if isinstance(state, dict) and "resumed_from" in state \
                    and state["resumed_from"] != end_fingerprint(prev):
                raise ValueError(
                    f"concat: part {i} does not continue part {i - 1} (it was not drawn with "
                    "resume= that result): pass a run and its continuations in the order "
                    "they were drawn, each once.")

        def weights(counts):
            w = np.array([max(c, 0) for c in counts], dtype=float)
            return w / w.sum() if w.sum() > 0 else np.full(len(parts), 1.0 / len(parts))

        def avg(name, w):
            return sum(wi * np.asarray(getattr(r, name), dtype=float) for wi, r in zip(w, parts))

        w_iter = weights([r.n_iterations for r in parts])
        n_rec = [_n_recorded(r) for r in parts]

        last = parts[-1]
        fields = {f: getattr(last, f) for f in self.__dataclass_fields__}
        for f in self._draw_fields:
            fields[f] = np.concatenate([np.asarray(getattr(r, f)) for r in parts], axis=1)
        if isinstance(last.sampler_state, dict):  # the joined run's counts and origin
            state = dict(last.sampler_state, n_recorded=int(sum(n_rec)))
            first = self.sampler_state if isinstance(self.sampler_state, dict) else {}
            state.pop("resumed_from", None)
            if "resumed_from" in first:
                state["resumed_from"] = first["resumed_from"]
            fields["sampler_state"] = state
        fields.update(
            accept_rate=avg("accept_rate", w_iter),
            kept_fraction=avg("kept_fraction", weights(n_rec)),
            n_reflections=sum(np.asarray(r.n_reflections) for r in parts),
            n_divergent=sum(np.asarray(r.n_divergent) for r in parts),
            n_iterations=int(sum(r.n_iterations for r in parts)),
            mean_leapfrog=float(avg("mean_leapfrog", w_iter)),
            warmup_divergent=sum(np.asarray(r.warmup_divergent) for r in parts),
            sample_stats=_join_stats([getattr(r, "sample_stats", None) for r in parts]),
        )
        return type(self)(**fields)

    # fields with a draw axis (axis 1), joined by ``concat`` (annotated for the checker
    # only: a ClassVar annotation would enter __dataclass_fields__, which concat reads)
    if TYPE_CHECKING:
        _draw_fields: ClassVar[tuple[str, ...]]
    _draw_fields = ("samples",)

    def to_inference_data(self, names: Iterable[str] | None = None) -> Any:
        """The draws as an ``arviz.InferenceData`` (needs the optional ``arviz``).

        The posterior holds one variable ``x`` of shape ``(chain, draw, d)``, and
        ``sample_stats`` the step size of every draw (``step_size``, the frozen
        one of the chain) and, when the result has them (``sample_stats``),
        ``diverging``, ``energy``, ``acceptance_rate``, ``lp``, ``n_steps`` and
        ``reflections``, each of shape ``(chain, draw)``: ``az.bfmi``,
        ``az.plot_energy`` and ``az.plot_pair(..., divergences=True)`` work on it.
        With ``thin > 1`` or a support, ``diverging`` marks a draw if any
        transition since the chain's previous kept draw diverged.

        Parameters
        ----------
        names : iterable of str, optional
            One label per dimension, used as the coordinates of ``x``'s last
            dimension (``az.summary`` then shows ``x[intercept]``, ...).

        Returns
        -------
        arviz.InferenceData
            With groups ``posterior`` (variable ``x``) and ``sample_stats``.

        Raises
        ------
        ImportError
            If arviz is not installed (``pip install arviz``).
        TypeError, ValueError
            If ``names`` is not one distinct label per dimension.
        """
        try:
            import arviz as az
        except ImportError as exc:  # pragma: no cover - optional
            raise ImportError("to_inference_data needs arviz: pip install arviz") from exc
        shape = self.samples.shape[:2]
        stats = {"step_size": np.broadcast_to(np.asarray(self.step_size)[:, None],
                                              shape).copy()}
        extra = getattr(self, "sample_stats", None)
        if isinstance(extra, dict):
            for key in STAT_NAMES:
                if key in extra and np.shape(extra[key]) == shape:
                    stats[key] = np.asarray(extra[key])
        kw: dict[str, Any] = {}
        if names is not None:
            labels = check_names(names, self.samples.shape[-1], [])
            kw = {"coords": {"x_dim_0": labels}, "dims": {"x": ["x_dim_0"]}}
        return az.from_dict(posterior={"x": self.samples}, sample_stats=stats, **kw)
