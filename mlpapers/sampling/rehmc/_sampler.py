"""``ReflectiveHMC``: the sampler shell (validation, the start and tuning of the chains,
the transition, the result).

The chain loop (warm-up iterations, thinning, keeping the draws in the support) lives in
:mod:`._draws`, the warm-up adaptation in :mod:`._warmup`, continuing a run in
:mod:`._resume` and the kernels in :mod:`._kernels`.
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, TypeAlias, cast

import numpy as np
import torch
from sklearn.base import BaseEstimator

from mlpapers._base import TorchEstimatorMixin
from mlpapers._utils import (
    ArrayLike,
    RandomStateLike,
    autograd_enabled,
    check_bool,
    check_in_options,
    check_positive,
    resolve_dtype,
    to_numpy,
    user_stacklevel,
)
from mlpapers.sampling.rehmc._adapt import find_reasonable_step_size
from mlpapers.sampling.rehmc._chees import halton
from mlpapers.sampling.rehmc._container import check_oracles, check_resolution
from mlpapers.sampling.rehmc._draws import run_chains
from mlpapers.sampling.rehmc._kernels import hmc_transition
from mlpapers.sampling.rehmc._result import SampleResult
from mlpapers.sampling.rehmc._resume import final_sampler_state, resume_start
from mlpapers.sampling.rehmc._supports import ConvexContainer, ConvexSet, Region
from mlpapers.sampling.rehmc._user import eval_mode
from mlpapers.sampling.rehmc._warmup import (
    MAX_LEAPFROG,
    START_ADVICE,
    Warmup,
    initial_points,
    start_state,
)

__all__ = ["ReflectiveHMC", "SampleResult"]

FALLBACK_LEAPFROG = 10  # n_leapfrog used by "auto" with a single chain (ChEES needs 2+)

#: What the samplers' ``dtype`` takes: a torch dtype, a numpy floating dtype or type, or
#: a name (``"float64"``, ``"torch.float32"``, ``"double"``); see ``resolve_dtype``.
# (``float`` is numpy's float64, as in ``np.dtype(float)``)
FloatDType: TypeAlias = (torch.dtype | np.dtype[np.floating[Any]] | type[np.floating[Any]]
                         | type[float] | str)


class ReflectiveHMC(TorchEstimatorMixin, BaseEstimator):
    r"""Reflective Hamiltonian Monte Carlo on a bounded (possibly non-convex) support.

    Samples :math:`\pi(x) \propto \exp(\log\pi(x))\, 1_S(x)`. Trajectories run
    in a convex container :math:`K \supseteq S` with an exact boundary oracle:
    each leapfrog drift follows the billiard flow, reflecting the momentum
    about the outward normal at every hit (``p' = p - 2 (n^T M^{-1} p) /
    (n^T M^{-1} n) n``), so the kinetic energy is conserved and the chain is
    exact with a plain Metropolis test. With ``support`` (a :class:`Region` or
    another container) the chain targets the density on ``K`` and only draws
    in ``S`` are kept (*container plus thinning*); ``log_prob`` must then be
    finite on all of ``K``.

    All chains move together as ``(chains, d)`` tensors: one batched
    ``log_prob`` + autograd call (or one ``grad_log_prob`` call) per leapfrog
    step and a masked reflection loop across chains (a closed-form fold for a
    :class:`Box`).

    Parameters
    ----------
    log_prob : callable
        Unnormalised log density ``(chains, d) -> (chains,)``, differentiable
        by autograd (unless ``grad_log_prob`` is given). It gets a copy of the
        chains (changing it in place moves no chain) in the sampler's ``dtype``;
        another real dtype is cast, another shape raises ``ValueError`` (the user
        guide's "Your own log-density" has the whole contract).
    container : ConvexContainer
        :class:`Box`, :class:`Polytope`, :class:`Ball`, :class:`Ellipsoid` or
        :class:`ConvexSet`; trajectories reflect off its boundary.
    grad_log_prob : callable, optional
        Gradient of ``log_prob``, ``(chains, d) -> (chains, d)``, replacing
        autograd: leapfrog steps call only ``grad_log_prob`` and ``log_prob``
        runs once per trajectory, at its end (under :func:`torch.no_grad`).
        This saves the autograd cost, about half of a step on small targets;
        the draws equal autograd's when both gradients agree bit for bit. It
        must return a tensor of the input's shape (else ``ValueError``). It is
        not checked against ``log_prob``: a wrong gradient keeps the chain
        exact (the kicks stay volume-preserving shears and the Metropolis test
        uses ``log_prob``) but lowers the acceptance rate.
    support : Region or ConvexContainer, optional
        The support ``S`` inside ``container``; draws outside are discarded.
    step_size : "auto" or float, default="auto"
        ``"auto"``: a doubling heuristic then dual averaging to
        ``target_accept`` during warm-up, frozen afterwards. A float is used
        as is.
    n_leapfrog : int or "auto", default="auto"
        Leapfrog steps per transition. ``"auto"`` adapts the trajectory
        length ``T`` during warm-up with ChEES [4]_ (Adam on ``log T``
        following the cross-chain ChEES gradient from one step, started
        afresh after the initial 15% of warm-up, iterate-averaged, then
        frozen); each transition then runs ``ceil(u T / mean(step_size))``
        steps (at most 1000) in every chain, with ``u`` a rotated Halton
        point in ``(0, 1]``. ChEES estimates the target mean across chains:
        with ``n_chains=1`` it cannot run, and ``"auto"`` falls back to
        ``n_leapfrog=10`` with a ``UserWarning``. The gradient is noisy with 2
        chains; use 4 or more, 16+ when you can (chains are cheap in a batch).
    mass : {"identity", "diag"}, default="identity"
        ``"diag"`` adapts a diagonal mass matrix (inverse = regularised
        variance of warm-up draws, in doubling windows as Stan's after a 15%
        initial buffer).
    target_accept : float, default=0.8
        Target mean acceptance probability of dual averaging.
    max_reflections : int, optional
        Cap of reflections per leapfrog drift (default ``100 * d``). A capped
        trajectory is rejected and counted as divergent.
    jitter : bool or float, default=True
        Randomise the integration time to break periodic billiard orbits.
        With a fixed ``n_leapfrog`` the step size of every transition is
        multiplied by ``U(1 - j, 1 + j)`` (``True`` means ``j = 0.2``); with
        ``n_leapfrog="auto"`` the length is ``T (1 - j + j u)`` (``True``
        means ``j = 1``, ChEES's uniform jitter on ``(0, T]``). A number must be
        in ``[0, 1)`` with a fixed ``n_leapfrog`` and in ``[0, 1]`` with ``"auto"``.
    dtype : torch.dtype, numpy dtype or str, default=torch.float64
        ``torch.float64`` or ``torch.float32`` (half precision raises ``TypeError``),
        also as a numpy dtype (``np.float32``; ``float`` is float64) or a name
        (``"float32"``).
    device : str or torch.device, default="cpu"
        Device of the chains' tensors (``log_prob`` receives them there).
    random_state : int, RandomState, Generator or None, default=None
        Seeds the sampler's own generator (starting points, momenta, Metropolis
        tests, jitter); the global RNGs are left alone. The random numbers are drawn
        on the CPU in float64, so a seed gives the same stream on every device and
        dtype. ``None`` draws a seed from numpy's global ``RandomState``. Each step
        draws the numbers of all chains as one block, so a chain's draws change
        with ``n_chains`` (the same seed and ``n_chains`` repeat them exactly).
    verbose : int, default=0
        ``> 0`` shows a progress bar over the warm-up (acceptance, leapfrog steps,
        mean step size), then one over the draws (acceptance, divergences).

    Attributes
    ----------
    step_size_ : numpy.ndarray of shape (chains,)
        Frozen step sizes of the last :meth:`sample` call.
    inv_mass_ : numpy.ndarray of shape (d,)
        Inverse diagonal mass of the last :meth:`sample` call.
    trajectory_length_ : float or None
        Frozen ChEES trajectory length of the last call (``None`` with a
        fixed ``n_leapfrog``).
    n_features_in_ : int
        Dimension ``d``.

    Notes
    -----
    The step size is also capped so that one drift travels at most the
    diameter of a ball inscribed in the container (a constant density accepts
    every step, so dual averaging alone would grow it until the reflection cap);
    with ``mass="diag"`` the diameter may be measured in the adapted metric.

    References
    ----------
    .. [1] "Reflective Hamiltonian Monte Carlo on bounded supports: convex
       containers, thinning and Stiefel manifolds", ICML 2026 (full text not
       available to us; see the user guide for the choices made).
    .. [2] H. M. Afshar and J. Domke, "Reflection, refraction, and Hamiltonian
       Monte Carlo", NeurIPS 2015.
    .. [3] A. Chalkis, V. Fisikopoulos, M. Papachristou and E. Tsigaridas,
       "Truncated log-concave sampling for convex bodies with reflective
       Hamiltonian Monte Carlo", ACM TOMS 2023, arXiv:2102.13068.
    .. [4] M. D. Hoffman, A. Radul and P. Sountsov, "An adaptive-MCMC scheme
       for setting trajectory lengths in Hamiltonian Monte Carlo", AISTATS 2021.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import Box, ReflectiveHMC
    >>> hmc = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([0, 0], [1, 2]),
    ...                     n_leapfrog=5, random_state=0)
    >>> res = hmc.sample(200, n_chains=2, warmup=100)
    >>> res.samples.shape
    (2, 200, 2)
    >>> bool((res.samples >= 0).all() and (res.samples[..., 1] <= 2).all())
    True
    """

    _progress_label = "ReflectiveHMC"  # of the verbose bars (StiefelSampler sets its own)
    _density_name = "log_prob"  # what the start's errors call it (StiefelSampler's own)
    _start_advice = START_ADVICE  # what they advise (StiefelSampler takes no x0 nor support)
    # random starts other than the container's: propose(n_chains) -> points (StiefelSampler:
    # well-conditioned matrices; a random point of its Frobenius ball seldom is one)
    _start_proposal: Callable[[int], torch.Tensor] | None = None

    def __init__(self, log_prob: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 container: ConvexContainer | None = None, *,
                 grad_log_prob: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 support: Region | ConvexContainer | None = None,
                 step_size: Literal["auto"] | float = "auto",
                 n_leapfrog: int | Literal["auto"] = "auto",
                 mass: Literal["identity", "diag"] = "identity",
                 target_accept: float = 0.8, max_reflections: int | None = None,
                 jitter: bool | float = True, dtype: FloatDType = torch.float64,
                 device: str | torch.device = "cpu", random_state: RandomStateLike = None,
                 verbose: int = 0) -> None:
        self.log_prob = log_prob
        self.container = container
        self.grad_log_prob = grad_log_prob
        self.support = support
        self.step_size = step_size
        self.n_leapfrog = n_leapfrog
        self.mass = mass
        self.target_accept = target_accept
        self.max_reflections = max_reflections
        self.jitter = jitter
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # A sampler, not a fit(X, y) estimator: scikit-learn's checks do not apply.
        return []

    # -- validation ---------------------------------------------------------
    def _check_params(self) -> None:
        if not callable(self.log_prob):
            raise TypeError(f"log_prob must be callable, got {self.log_prob!r}.")
        if self.grad_log_prob is not None and not callable(self.grad_log_prob):
            raise TypeError(f"grad_log_prob must be callable or None, "
                            f"got {self.grad_log_prob!r}.")
        if not isinstance(self.container, ConvexContainer):
            raise TypeError("container must be a ConvexContainer (Box, Polytope, Ball, "
                            f"Ellipsoid or ConvexSet), got {self.container!r}.")
        if self.support is not None and not isinstance(self.support, Region | ConvexContainer):
            raise TypeError(f"support must be a Region, a ConvexContainer or None, "
                            f"got {self.support!r}.")
        # (a ConvexSet(g) built without dimension gets it from x0 in sample)
        if isinstance(self.support, ConvexContainer) and None not in (
                self.support.dim, self.container.dim) and self.support.dim != self.container.dim:
            raise ValueError(f"support has dimension {self.support.dim} but container has "
                             f"dimension {self.container.dim}.")
        if not (isinstance(self.step_size, str) and self.step_size == "auto"):
            check_positive(self.step_size, "step_size")
        if isinstance(self.n_leapfrog, str):
            check_in_options(self.n_leapfrog, "n_leapfrog", ("auto",))
        else:
            check_positive(self.n_leapfrog, "n_leapfrog", integer=True)
        check_in_options(self.mass, "mass", ("identity", "diag"))
        if isinstance(self.target_accept, bool) or not isinstance(
                self.target_accept, numbers.Real) or not 0 < self.target_accept < 1:
            raise ValueError(f"target_accept must be in (0, 1), got {self.target_accept!r}.")
        if self.max_reflections is not None:
            check_positive(self.max_reflections, "max_reflections", integer=True)
        if not isinstance(self.jitter, (bool, np.bool_)):
            check_positive(self.jitter, "jitter", strict=False)
            # j = 1 (the documented default of "auto": lengths uniform on (0, T]) is
            # valid there; a fixed count's step factor U(1 - j, 1 + j) could reach 0
            if self.n_leapfrog == "auto" and self.jitter > 1:
                raise ValueError(f"jitter must be in [0, 1] with n_leapfrog='auto', got "
                                 f"{self.jitter!r}.")
            if self.n_leapfrog != "auto" and self.jitter >= 1:
                raise ValueError(f"jitter must be in [0, 1) with an integer n_leapfrog (the "
                                 f"step size is multiplied by U(1 - jitter, 1 + jitter)), "
                                 f"got {self.jitter!r}.")
        try:
            sampler_dtype = resolve_dtype(self.dtype) in (torch.float32, torch.float64)
        except TypeError:  # (not a float dtype: its list names dtypes refused below)
            sampler_dtype = False
        if not sampler_dtype:
            # float16 resolves a position near 10 to 0.008 and an energy to 3 digits (2% of
            # the draws landed outside a ball, before proposals were tested), and numpy has
            # no bfloat16 (the run failed at its very end, converting the draws)
            raise TypeError(f"dtype must be torch.float32 or torch.float64 (float64 is "
                            f"advised for sampling), got {self.dtype!r}.")

    # -- sampling ------------------------------------------------------------
    def sample(self, n_samples: int, x0: ArrayLike | None = None, *,
               n_chains: int | None = None,
               warmup: int | None = None, thin: int = 1, return_tensor: bool = False,
               resume: SampleResult | None = None) -> SampleResult:
        """Run warm-up then draw ``n_samples`` kept draws per chain.

        Parameters
        ----------
        n_samples : int
            Kept draws per chain.
        x0 : array-like of shape (d,) or (n_chains, d), optional
            Starting points inside the support (random points of the container
            by default, drawn again, up to 100 times, for chains where
            ``log_prob`` or its gradient is not finite). Shape ``(d,)`` starts
            every chain at that point; a 2-D
            ``x0`` must have ``n_chains`` rows (4 by default: pass ``n_chains``
            with an ``x0`` of another number of rows, ``(1, d)`` included).
        n_chains : int, optional
            Number of chains: 4 by default, the result's with ``resume``.
        warmup : int, optional
            Warm-up iterations (adaptation happens only here): 1000 by default,
            0 with ``resume``.
        thin : int, default=1
            Record every ``thin``-th state (then keep those in ``S``).
        return_tensor : bool, default=False
            Also store the draws as a tensor in ``result.samples_tensor``.
        resume : SampleResult, optional
            Continue a finished (possibly pickled) run from each chain's final
            state ``resume.last_state``, with its inverse mass (whatever ``mass``),
            ChEES length and step sizes (unless ``step_size`` is numeric), and the
            random stream where it stopped: ``sample(n1)`` then
            ``sample(n2, resume=res)`` is the chain of one ``sample(n1 + n2)``
            (bit for bit without a ``support``); ``random_state`` plays no role.
            Other settings (``log_prob``, supports, ``n_leapfrog``, ``jitter``,
            ``thin``) are the sampler's. ``warmup > 0`` re-adapts from there.

        Returns
        -------
        SampleResult

        Raises
        ------
        TypeError
            If ``resume`` is not a :class:`SampleResult`.
        ValueError
            If ``x0`` has the wrong shape (a 2-D ``x0`` whose rows are not
            ``n_chains``, the default 4 included) or lies outside the container or
            the support, if no starting point in the support is found, or if
            ``log_prob`` returns the wrong shape or is not finite at the start.
            With ``resume``: if ``x0`` is also given, the dimension or
            ``n_chains`` differs from the result's, the result has no final
            state, or ``n_leapfrog="auto"`` resumes a fixed-length run without
            warm-up.
        RuntimeError
            With a ``support``: if some chain has no draw in it after 2000
            recorded states (or too few after ``1000 * thin * n_samples``
            iterations), instead of running on and on. An error of ``log_prob``
            at the start keeps its type and gets a note: pass ``dtype`` (a float
            dtype mismatch) or wrap a one-point function in ``torch.vmap``.

        Warns
        -----
        UserWarning
            If ``log_prob`` varies but autograd cannot differentiate it (it
            leaves torch): the gradient is then taken as zero.
        RuntimeWarning
            If less than 1% of the recorded states fall in the support. If the
            chains disagree (classic split R-hat above 1.1 in some dimension), or
            else if some dimension has few effective draws (classic split-chain
            ESS below ``min(100 * n_chains, 400)``: rstan's and PyMC's 100 per
            chain, capped at the 400 of Vehtari et al. so that many short chains
            are judged on their total; not checked below 8 draws per chain or
            below that many draws in all) and below 10% of the transitions (and,
            with ``thin > 1``, 3/4 of the kept draws: slow mixing, not a short run).
            If, with ``n_leapfrog="auto"``, the adapted trajectory length is at
            (within 5% of) the cap of 1000 leapfrog steps (ChEES asked for longer
            trajectories; the analogue of Stan's maximum-treedepth warning; a fixed
            ``n_leapfrog`` never warns):
            both usually mean coordinates of very different scales under the
            identity mass, so use ``mass="diag"`` or rescale them.

        Notes
        -----
        The draws do not depend on the caller's grad mode: ``log_prob`` is differentiated
        with autograd switched on even inside ``torch.no_grad()`` or
        ``torch.inference_mode()``. A tensor that ``log_prob`` uses and that was created
        under ``torch.inference_mode()`` cannot take part in autograd: create it outside
        that block, or ``.clone()`` it there.
        """
        check_bool(return_tensor, "return_tensor")
        # The leapfrog kicks differentiate log_prob by autograd: inside a caller's
        # torch.no_grad() or torch.inference_mode() the gradient would silently be zero (a
        # random walk, other draws), so autograd is switched on for the call, and the draws
        # are the same whatever the caller's grad mode.
        with autograd_enabled(), eval_mode(self.log_prob, self.grad_log_prob):
            return self._sample(n_samples, x0, n_chains=n_chains, warmup=warmup, thin=thin,
                                return_tensor=return_tensor, resume=resume)

    def _sample(self, n_samples, x0, *, n_chains, warmup, thin, return_tensor, resume):
        self._check_params()
        check_positive(n_samples, "n_samples", integer=True)
        if isinstance(x0, numbers.Integral) and not isinstance(x0, bool):
            raise ValueError(f"x0 is a starting point of shape (d,) or (n_chains, d), got "
                             f"{int(x0)}; for the number of chains pass n_chains={int(x0)} "
                             "by keyword.")
        if n_chains is not None:
            check_positive(n_chains, "n_chains", integer=True)
        if warmup is not None:
            check_positive(warmup, "warmup", strict=False, integer=True)
        check_positive(thin, "thin", integer=True)
        # this call's generator and device, held locally: another thread's call on the
        # same sampler replaces the attributes
        gens = self._init_fit()
        assert gens is not None  # (a sampler draws)
        gen = gens[0]
        dtype = resolve_dtype(self.dtype)
        dev = self._device
        # (both checked by _check_params)
        container = cast(ConvexContainer, self.container)
        log_prob = cast(Callable, self.log_prob)
        if isinstance(container, ConvexSet) and container.dim is None:
            # ConvexSet(g) as the specification writes it: the dimension and an interior
            # point come from this call's starting points (or the resumed final states).
            # A copy is bound, not the user's object: each call starts from its own x0,
            # and a failed call leaves nothing behind.
            container = copy.copy(container)
            container._bind(x0 if x0 is not None or resume is None
                            else getattr(resume, "last_state", None))
            if isinstance(self.support, ConvexContainer) and self.support.dim not in (
                    None, container.dim):
                raise ValueError(f"support has dimension {self.support.dim} but x0 gives "
                                 f"the container dimension {container.dim}.")
        # a user's container class: its oracles' types and shapes, before any work
        check_oracles(container, dtype, dev, "container")
        check_resolution(container, dtype)
        d = container.dim
        start = None
        if resume is not None:
            start = resume_start(resume, container, x0, n_chains, dtype, dev)
            n_chains = start.x.shape[0]
            warmup = 0 if warmup is None else warmup
            gen.set_state(start.rng_state)
        default_chains = n_chains is None  # (named in the error on x0's rows)
        n_chains = 4 if n_chains is None else int(n_chains)
        warmup = 1000 if warmup is None else int(warmup)
        # continue with the result's tuning
        frozen_start = start if start is not None and warmup == 0 else None
        frozen = frozen_start is not None
        max_refl = int(self.max_reflections) if self.max_reflections is not None else 100 * d
        n_leapfrog = self.n_leapfrog
        if isinstance(n_leapfrog, str) and n_chains < 2:
            warnings.warn(
                "n_leapfrog='auto' (ChEES) estimates the target mean across chains and needs "
                "n_chains >= 2 (4+ advised); falling back to n_leapfrog=10 for a single chain. "
                "Pass an integer n_leapfrog to choose the length and silence this warning.",
                UserWarning, stacklevel=user_stacklevel())
            n_leapfrog = FALLBACK_LEAPFROG
        auto_len = isinstance(n_leapfrog, str)
        if frozen_start is not None and auto_len and frozen_start.trajectory_length is None:
            raise ValueError("resume: the sampler adapts the trajectory length "
                             "(n_leapfrog='auto') but the result was drawn with a fixed "
                             f"n_leapfrog={resume.n_leapfrog}; set n_leapfrog to an integer, "
                             "or pass warmup > 0 to adapt afresh.")
        # (a numpy True, as from a parameter grid, means the default jitter too, not j = 1)
        default_jitter = isinstance(self.jitter, (bool, np.bool_)) and bool(self.jitter)
        jit = (1.0 if auto_len else 0.2) if default_jitter else float(self.jitter)

        redraw = None
        if start is None:
            x = initial_points(container, self.support, x0, n_chains, dtype, dev, gen,
                               default_chains=default_chains, propose=self._start_proposal)
            if x0 is None:  # random points: chains where log_prob is -inf draw again
                redraw = partial(initial_points, container, self.support, None, n_chains,
                                 dtype, dev, gen, propose=self._start_proposal)
        else:
            x = start.x
        glp = self.grad_log_prob
        x, logp, grad = start_state(log_prob, x, glp, name=self._density_name, redraw=redraw,
                                    advice=self._start_advice)

        last_draws = gen.get_state()

        def find_step(x, logp, grad, inv_mass, init, cap, *, replay=False):
            # doubling heuristic; replay=True draws the previous call's momenta again
            nonlocal last_draws
            if replay:
                gen.set_state(last_draws)
            else:
                last_draws = gen.get_state()
            return find_reasonable_step_size(x, logp, grad, log_prob, container,
                                             inv_mass, max_refl, gen, init, cap,
                                             grad_log_prob=glp)

        ones = torch.ones(d, dtype=dtype, device=dev)
        step_cap = container._step_cap
        adapt = isinstance(self.step_size, str) and not frozen
        if frozen_start is not None and isinstance(self.step_size, str):
            eps = frozen_start.step_size
        elif adapt:
            eps = find_step(x, logp, grad, None, torch.ones(n_chains, dtype=dtype, device=dev),
                            step_cap(ones))
        else:
            eps = torch.full((n_chains,), float(self.step_size), dtype=dtype, device=dev)
        warm = Warmup(warmup, eps, ones, adapt_step=adapt, target_accept=float(self.target_accept),
                      diag_mass=self.mass == "diag", auto_length=auto_len, step_cap=step_cap,
                      find_step=find_step)
        n_calls, shift = (frozen_start.restore(warm, auto_len) if frozen_start is not None
                          else (0, None))
        if auto_len and shift is None:  # rotation of the Halton points of the jittered lengths
            shift = float(torch.rand(1, generator=gen, dtype=torch.float64))

        def transition(x, logp, grad):  # -> (result, leapfrog steps), chains in lockstep
            nonlocal n_calls
            n_calls += 1
            step = warm.eps
            if auto_len:  # one jittered length, in units of the mean step
                # (auto_len: the Warmup adapts a length and the shift was drawn above)
                assert warm.trajectory_length is not None and shift is not None
                length = warm.trajectory_length * (1.0 - jit + jit * halton(n_calls - 1, shift))
                if not warm.step_mean > 0:  # (a ZeroDivisionError)
                    raise FloatingPointError(
                        f"the adapted step size fell to {warm.step_mean} at transition "
                        f"{n_calls}: the density or the container cannot be resolved in "
                        f"{str(dtype).removeprefix('torch.')} (try dtype=torch.float64), or "
                        f"pass a step_size.")
                n = min(max(math.ceil(length / warm.step_mean), 1), MAX_LEAPFROG)
            else:
                n = int(n_leapfrog)
                if jit > 0:
                    u = torch.rand(n_chains, generator=gen, dtype=torch.float64).to(step)
                    step = step * (1 + jit * (2 * u - 1))
            return hmc_transition(x, logp, grad, step, n, log_prob, container,
                                  warm.kernel_inv_mass, max_refl, gen,
                                  grad_log_prob=glp), n

        draws = run_chains(transition, warm, x, logp, grad, n_samples=n_samples, warmup=warmup,
                           thin=thin, support=self.support, verbose=self.verbose,
                           label=self._progress_label)
        eps, inv_mass, traj = warm.eps, warm.inv_mass, warm.trajectory_length
        kept = draws.kept_fraction()
        # the result is built from this call's values, not read back from the attributes
        # (a call on the same sampler in another thread may have replaced them)
        step_size = to_numpy(eps).astype(np.float64)
        inv_mass_np = to_numpy(inv_mass).astype(np.float64)
        trajectory = float(traj) if auto_len and traj is not None else None
        self.step_size_, self.inv_mass_ = step_size, inv_mass_np
        self.trajectory_length_ = trajectory
        self.n_features_in_ = d
        res = SampleResult(
            samples=to_numpy(draws.samples),
            accept_rate=draws.accept_rate,
            n_reflections=draws.n_reflections.cpu().numpy(),
            n_divergent=draws.n_divergent.cpu().numpy(),
            kept_fraction=kept,
            step_size=step_size.copy(),
            inv_mass=inv_mass_np.copy(),
            n_iterations=draws.n_iterations,
            n_leapfrog=n_leapfrog if auto_len else int(n_leapfrog),
            warmup_divergent=warm.n_divergent.cpu().numpy(),
            trajectory_length=trajectory,
            mean_leapfrog=draws.mean_leapfrog,
            last_state=to_numpy(draws.x).copy(),
            sampler_state=final_sampler_state(gen, n_calls, shift, draws.n_recorded, start),
            sample_stats=draws.stats,
        )
        res._warn_if_capped(MAX_LEAPFROG)
        res._warn_if_unconverged()
        if return_tensor:
            res.samples_tensor = draws.samples
        return res
