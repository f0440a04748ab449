"""MSR multipliers and :class:`BottleneckNodeAssigner` (BTSP-MSR and its baselines)."""

from __future__ import annotations

import math
import numbers
import time
import warnings
from typing import Any, Literal, Self, TypeAlias, get_args, overload

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils import metadata_routing

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    RandomStateLike,
    check_bool,
    check_in_options,
    check_positive,
    to_numpy,
    user_stacklevel,
)
from mlpapers.decentralized.btsp import _search
from mlpapers.decentralized.btsp._bottleneck import (
    Reduce,
    ScalarReduce,
    _edge_matrix,
    _exact_mean,
    _exact_total,
    _round_maxima,
    _theta_bound,
    bottleneck_delay,
    bottleneck_tsp,
)
from mlpapers.decentralized.btsp._topology import (
    TopologyLike,
    check_assignment,
    check_delays,
    circulant_schedule,
    metric_closure,
)

__all__ = ["BottleneckNodeAssigner", "best_multiplier", "multiplier_relabel"]

#: ``BottleneckNodeAssigner(method=...)``; ``METHODS`` lists its values.
AssignMethod: TypeAlias = Literal["btsp_msr", "btsp", "identity", "random", "greedy",
                                  "annealing", "exact"]
METHODS: tuple[str, ...] = get_args(AssignMethod)


def multiplier_relabel(assignment: ArrayLike, c: int) -> np.ndarray:
    """Relabel an assignment by a multiplier: ``pi'(i) = pi(c * i mod n)``.

    For ``c`` coprime with ``n`` this is a bijection of the positions and
    ``BCD(pi'; S) = BCD(pi; c * S)``.

    Parameters
    ----------
    assignment : array-like of shape (n,)
        Permutation (virtual position -> physical node).
    c : int
        Multiplier, coprime with ``n`` (any integer; only ``c mod n`` matters).

    Returns
    -------
    ndarray of shape (n,), int64
        The relabelled permutation ``pi'``.

    Raises
    ------
    ValueError
        If ``c`` is not coprime with ``n`` (the relabelling would not be a
        permutation).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import (
    ...     bottleneck_delay, circulant_schedule, multiplier_relabel, scale_schedule)
    >>> multiplier_relabel(np.arange(8), 3).tolist()
    [0, 3, 6, 1, 4, 7, 2, 5]
    >>> D = np.random.default_rng(0).random((8, 8))
    >>> pi, S = np.random.default_rng(1).permutation(8), circulant_schedule(8, "ring")
    >>> bool(bottleneck_delay(D, multiplier_relabel(pi, 3), S)
    ...      == bottleneck_delay(D, pi, scale_schedule(S, 3, 8)))
    True
    """
    a = to_numpy(assignment)  # (np.asarray refuses grad, bfloat16 and CUDA tensors)
    if a.ndim != 1:
        raise ValueError(f"assignment must be a 1D array, got shape {a.shape}.")
    if a.shape[0] == 0:  # (was reported as "c must be coprime with n=0")
        raise ValueError("assignment must not be empty.")
    perm = check_assignment(a, a.shape[0])
    if isinstance(c, bool) or not isinstance(c, numbers.Integral):
        raise TypeError(f"c must be an integer, got {c!r}.")
    if math.gcd(int(c), perm.shape[0]) != 1:
        raise ValueError(f"c={c} must be coprime with n={perm.shape[0]}.")
    return _search.relabel(perm, int(c))


def best_multiplier(
    delays: ArrayLike,
    assignment: ArrayLike,
    topology: TopologyLike = "exponential",
    *,
    directed: bool = False,
) -> tuple[int, np.ndarray, float]:
    """The MSR step: the best multiplier relabelling of an assignment.

    Scores ``BCD(pi; c * S)`` for every ``c`` in ``1..n-1`` coprime with ``n`` (one
    batched evaluation, ``O(phi(n) n sum |S_l|)``) and keeps the smallest; ``c = 1``
    is included, so the result is never worse than ``assignment``.

    Parameters
    ----------
    delays : array-like of shape (n, n)
        Non-negative finite delays, ``delays[u, v]`` from physical node ``u`` to
        ``v`` (the diagonal is ignored).
    assignment : array-like of shape (n,)
        Permutation of ``0..n-1`` to relabel: ``assignment[i]`` is the physical node
        at virtual position ``i`` (e.g. a bottleneck-TSP tour).
    topology : str, sequence or ndarray, default="exponential"
        The schedule the BCD is measured on: a topology name or explicit skip sets,
        see :func:`~mlpapers.decentralized.btsp.circulant_schedule`.
    directed : bool, default=False
        As in :func:`~mlpapers.decentralized.btsp.bottleneck_delay`.

    Returns
    -------
    c : int
        The best multiplier (the smallest among ties).
    assignment : ndarray of shape (n,), int64
        ``assignment[(c * i) mod n]``.
    bcd : float
        Its per-round mean BCD.

    References
    ----------
    .. [1] "Bottleneck Communication Delay Minimization for Communication-Efficient
       Decentralized Learning", ICML 2026 (the MSR step of BTSP-MSR).

    Examples
    --------
    Five nodes on a circle, visited every second node: relabelling by ``c = 2``
    walks around the circle instead.

    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import best_multiplier, bottleneck_delay
    >>> d = np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    >>> D = np.minimum(d, 5 - d).astype(float)  # hops around the circle
    >>> bottleneck_delay(D, [0, 2, 4, 1, 3], "ring")
    2.0
    >>> c, pi, bcd = best_multiplier(D, [0, 2, 4, 1, 3], "ring")
    >>> c, pi.tolist(), bcd
    (2, [0, 4, 3, 2, 1], 1.0)
    """
    check_bool(directed, "directed")
    D = check_delays(delays)
    n = D.shape[0]
    perm = check_assignment(assignment, n)
    schedule = circulant_schedule(n, topology)
    c, new, rounds = _search.msr(_edge_matrix(D, bool(directed)), perm, schedule)
    return c, new, _exact_mean(rounds)


class BottleneckNodeAssigner(TorchEstimatorMixin, BaseEstimator):
    r"""Assign physical nodes to the positions of a circulant topology (BTSP-MSR).

    Minimises the bottleneck communication delay
    :math:`\mathrm{BCD}(\pi; S) = \sum_l \max_{i, s \in S_l} D[\pi(i), \pi(i+s)]`
    of a decentralized-learning topology whose rounds wait for their slowest link.
    BTSP-MSR [1]_ first orders the nodes along a bottleneck travelling-salesman
    cycle (a 2-approximation; :func:`~mlpapers.decentralized.btsp.bottleneck_tsp`),
    then relabels positions by the multiplier ``c`` coprime with ``n`` that
    minimises the BCD of the actual schedule (MSR step, never worse).

    Parameters
    ----------
    topology : str, sequence or ndarray, default="exponential"
        ``"ring"``, ``"exponential"``, ``"one_peer_exponential"``,
        ``"sparse_exponential"`` or explicit skip sets: a sequence or array of
        rounds, each a sequence of integer skips, or one flat round of skips (see
        :func:`~mlpapers.decentralized.btsp.circulant_schedule`).
    method : str, default="btsp_msr"
        The solver: ``"btsp_msr"``, ``"btsp"`` (ring tour only),
        ``"identity"`` (the given node order, the paper's ``no_opt``), ``"random"``,
        ``"greedy"``, ``"annealing"`` or ``"exact"`` (``n <= 16`` for rings,
        ``n <= 10`` otherwise).
    msr : bool or None, default=None
        Apply the multiplier step: ``None`` for ``"btsp_msr"`` only, ``True`` after
        any method, ``False`` never.
    directed : bool, default=False
        Use ``delays[u, v]`` for a message ``u -> v`` exactly (asymmetric delays).
        Otherwise links count ``max(D[u, v], D[v, u])``.
    metric_closure : bool, default=False
        Replace the delays by their shortest-path closure before solving (the
        ``2 theta*`` guarantee needs the triangle inequality). BCDs are then
        reported on the closed delays, and ``inf`` in ``delays`` marks a missing
        link (every pair must be joined by a path).
    n_random : int, default=5
        Random assignments averaged into ``random_bcd_``.
    n_iter : int or None, default=None
        Iterations of ``"annealing"`` (default ``20 * n``).
    refine_iter : int, default=0
        Extension beyond the paper: after the method (and MSR), run this many
        low-temperature annealing iterations started from the assignment (``T0`` one
        hundredth of ``"annealing"``'s); the best assignment seen is kept, so the
        result is never worse. ``0`` reproduces the paper's method.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the random, greedy, annealing and cycle searches.
    verbose : int, default=0
        Unused (the solvers are not iterative); kept for API uniformity, and checked
        in ``fit`` (a bool or an integer >= 0) as elsewhere.

    Attributes
    ----------
    assignment_ : ndarray of shape (n,)
        ``assignment_[i]`` is the physical node at virtual position ``i``.
    bcd_ : float
        Per-round mean BCD of ``assignment_`` (what the paper reports).
    bcd_total_ : float
        Per-period sum of the round bottlenecks.
    bcd_per_round_ : ndarray of shape (tau,)
        Bottleneck of each round.
    base_assignment_ : ndarray of shape (n,)
        The assignment before the multiplier step (the BTSP tour for ``"btsp*"``).
    ring_tour_ : ndarray of shape (n,) or None
        The bottleneck-TSP tour of :func:`bottleneck_tsp` (physical nodes in ring
        order, open) for ``method="btsp"`` and ``"btsp_msr"``; ``None`` for the other
        methods, which compute no tour.
    multiplier_ : int
        The MSR multiplier (1 when not applied).
    theta_ : float
        :math:`\theta^*`, a lower bound on any ring's bottleneck.
    lower_bound_ : float
        A lower bound on the per-round mean BCD of any assignment: per round, the
        largest nearest-neighbour delay (every node sends and receives in every
        round; with ``directed=True`` the larger of the largest cheapest-outgoing
        and the largest cheapest-incoming delay), raised to ``theta_`` for rounds
        with a skip coprime with ``n``.
    random_bcd_ : float
        Mean ``bcd_`` of ``n_random`` uniformly random assignments.
    schedule_ : list of list of int
        The skip sets.
    edges_ : ndarray of shape (m, 3)
        Physical links ``(round, u, v)`` used by the schedule under ``assignment_``.
    n_nodes_ : int
    fit_time_ : float
        Seconds spent by the solver (excluding the random baseline).

    References
    ----------
    .. [1] "Bottleneck Communication Delay Minimization for Communication-Efficient
       Decentralized Learning", ICML 2026 (BTSP-MSR).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.decentralized.btsp import BottleneckNodeAssigner
    >>> pts = np.random.default_rng(0).random((32, 2))
    >>> D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    >>> est = BottleneckNodeAssigner(topology="exponential", random_state=0).fit(D)
    >>> bool(est.bcd_ < est.random_bcd_)
    True
    >>> sorted(est.assignment_.tolist()) == list(range(32))
    True
    """

    # fit takes one square delay matrix, not (X, y) plus routable metadata: no set_fit_request.
    __metadata_request__fit = {"delays": metadata_routing.UNUSED}

    def __init__(self, *, topology: TopologyLike = "exponential",
                 method: AssignMethod = "btsp_msr",
                 msr: bool | None = None, directed: bool = False, metric_closure: bool = False,
                 n_random: int = 5, n_iter: int | None = None, refine_iter: int = 0,
                 random_state: RandomStateLike = None, verbose: int = 0) -> None:
        self.topology = topology
        self.method = method
        self.msr = msr
        self.directed = directed
        self.metric_closure = metric_closure
        self.n_random = n_random
        self.n_iter = n_iter
        self.refine_iter = refine_iter
        self.random_state = random_state
        self.verbose = verbose

    @restore_on_failure
    def fit(self, delays: ArrayLike, y: None = None) -> Self:
        """Find the assignment.

        Parameters
        ----------
        delays : array-like or Tensor of shape (n, n)
            Non-negative delays between physical nodes, ``delays[u, v]`` from ``u``
            to ``v`` (numpy array, torch tensor or nested lists; ``n >= 2``); the
            diagonal is ignored.
        y : None
            Ignored.

        Returns
        -------
        self : object
            The fitted assigner.

        Raises
        ------
        ValueError
            If ``delays`` holds NaN or negative values off the diagonal, ``inf``
            (allowed with ``metric_closure=True`` as a missing link, if the network
            stays connected) or values above ``1e300`` (rescale them: every result
            is proportional to the delays' unit).

        Warns
        -----
        UserWarning
            With ``method="btsp"`` or ``"btsp_msr"`` and ``refine_iter=0``, when
            ``bcd_`` exceeds ``random_bcd_`` by more than 5 % and by more than two
            standard errors of that mean of ``n_random`` draws (never with
            ``n_random < 3``); possible with the static exponential graph on delays
            without spatial structure. The message suggests ``refine_iter`` or
            ``method="annealing"``.
        """
        check_in_options(self.method, "method", METHODS)
        if self.msr is not None and not isinstance(self.msr, (bool, np.bool_)):
            raise TypeError(f"msr must be None, True or False, got {self.msr!r}.")
        check_positive(self.n_random, "n_random", integer=True)
        if self.n_iter is not None:
            check_positive(self.n_iter, "n_iter", integer=True)
        check_positive(self.refine_iter, "refine_iter", strict=False, integer=True)
        check_bool(self.directed, "directed")
        check_bool(self.metric_closure, "metric_closure")
        # with metric_closure, inf marks a missing link: the closure fills it in
        D = check_delays(delays, allow_inf=bool(self.metric_closure), closure_param=True)
        n = D.shape[0]
        schedule = circulant_schedule(n, self.topology)
        self._init_fit()
        rng = self._numpy_gen
        if self.metric_closure:
            D = metric_closure(D)
        directed = bool(self.directed)
        E = _edge_matrix(D, directed)

        start = time.perf_counter()
        tour = None
        if self.method in ("btsp", "btsp_msr"):
            tour, _, _ = bottleneck_tsp(D, directed=directed, random_state=rng)
            base = tour
        elif self.method == "identity":
            base = np.arange(n)
        elif self.method == "random":
            base = rng.permutation(n)
        elif self.method == "greedy":
            base = _search.greedy(E, schedule, rng)
        elif self.method == "annealing":
            n_iter = 20 * n if self.n_iter is None else int(self.n_iter)
            base = _search.anneal(E, schedule, rng, n_iter)
        else:
            base = _search.exact(E, schedule)
        apply_msr = self.method == "btsp_msr" if self.msr is None else bool(self.msr)
        if apply_msr:
            c, perm, rounds = _search.msr(E, base, schedule)
        else:
            c, perm = 1, base
            rounds = _round_maxima(E, base[None], schedule)[0]
        if self.refine_iter:
            perm = _search.anneal(E, schedule, rng, int(self.refine_iter), init=perm,
                                  t0_frac=1e-3)
            rounds = _round_maxima(E, perm[None], schedule)[0]
        self.fit_time_ = time.perf_counter() - start

        self.n_nodes_ = n
        self.schedule_ = schedule
        self._fitted_settings = self._settings()
        self.base_assignment_ = np.asarray(base, dtype=np.int64)
        # the paper note's name for the 2-approximation's tour (None: no tour computed)
        self.ring_tour_ = None if tour is None else self.base_assignment_.copy()
        self.assignment_ = np.asarray(perm, dtype=np.int64)
        self.multiplier_ = int(c)
        self.bcd_per_round_ = rounds
        self.bcd_total_ = _exact_total(rounds)
        self.bcd_ = _exact_mean(rounds)
        theta = _theta_bound(D, directed, E)  # (E is max(D, D^T) when undirected)
        self.theta_ = theta
        self.lower_bound_ = self._lower_bound(E, theta, schedule)
        # the random baseline draws from the torch stream, so it is the same for every method
        randoms = np.stack([torch.randperm(n, generator=self._torch_gen).numpy()
                            for _ in range(int(self.n_random))])
        maxima = _round_maxima(E, randoms, schedule)
        random_bcds = maxima.mean(axis=1)
        # correctly rounded as bcd_ is: a float mean sat 1 ulp below bcd_ when every
        # assignment ties (a ring of 3 nodes)
        self.random_bcd_ = _exact_mean(maxima.ravel())
        self.edges_ = self._edges(perm, schedule)
        if self.method in ("btsp", "btsp_msr") and not self.refine_iter:
            self._warn_if_worse_than_random(random_bcds, n)
        return self

    def _warn_if_worse_than_random(self, random_bcds: np.ndarray, n: int) -> None:
        """Warn when the paper's method clearly loses to random assignments.

        It optimises the ring and one multiplier only: with the static exponential graph
        or delays with little spatial structure it can lose to a random order, and the
        user would otherwise keep the worse assignment. "Clearly": above the random mean
        by more than 5 % and by more than two standard errors of that mean (a mean of
        a few draws is noisy); never with fewer than 3 draws.
        """
        k = len(random_bcds)
        if k < 3:
            return
        mean = float(random_bcds.mean())
        if not mean > 0:  # all delays zero: nothing to lose
            return
        # the spread relative to the mean: squared deviations of delays in a tiny or huge
        # unit would underflow or overflow, making the warning depend on the unit
        rel_std = float((random_bcds / mean).std(ddof=1))
        margin = max(0.05, 2.0 * rel_std / np.sqrt(k)) * mean
        if self.bcd_ <= mean + margin:
            return
        msr = self.method == "btsp_msr" if self.msr is None else bool(self.msr)
        name = "BTSP-MSR" if msr else "BTSP"
        warnings.warn(
            f"{name}'s assignment has a larger BCD ({self.bcd_:.4g}) than the mean of {k} "
            f"random assignments ({mean:.4g}) on these delays. Pass refine_iter={20 * n} "
            "(annealing started from it, never worse than it) or use method='annealing'"
            + (" or method='exact'" if n <= 10 else "") + ".",
            UserWarning, stacklevel=user_stacklevel())

    @staticmethod
    def _lower_bound(E, theta, schedule) -> float:
        n = E.shape[0]
        off = E + np.diag(np.full(n, np.inf))
        # every node sends one message and receives one in each round: the round's
        # bottleneck is at least every node's cheapest outgoing and incoming delay
        nearest = float(max(off.min(axis=1).max(), off.min(axis=0).max()))
        # theta (on min(D, D^T) when directed) can be below the directed nearest
        # bound, and both bound every round, so a coprime round takes the larger
        lbs = [max(theta, nearest) if any(math.gcd(s, n) == 1 for s in r) else nearest
               for r in schedule]
        # rounded as bcd_ is (correctly), so that lower_bound_ <= bcd_ holds to the bit
        return _exact_mean(np.asarray(lbs))

    @staticmethod
    def _edges(perm, schedule) -> np.ndarray:
        n = perm.shape[0]
        out = []
        for l, skips in enumerate(schedule):
            for s in skips:
                out.append(np.stack([np.full(n, l), perm, perm[(np.arange(n) + s) % n]], 1))
        return np.concatenate(out).astype(np.int64)

    @overload
    def bcd(self, delays: ArrayLike, *, reduce: ScalarReduce = ...) -> float: ...
    @overload
    def bcd(self, delays: ArrayLike, *, reduce: Literal["none"]) -> np.ndarray: ...
    @overload
    def bcd(self, delays: ArrayLike, *, reduce: Reduce = ...) -> float | np.ndarray: ...
    def bcd(self, delays: ArrayLike, *, reduce: Reduce = "mean") -> float | np.ndarray:
        """BCD of the fitted assignment under other delays (same ``n``).

        E.g. a new measurement of the network; see
        :func:`~mlpapers.decentralized.btsp.bottleneck_delay`. The delays are treated
        as in :meth:`fit` (the ``directed`` and ``metric_closure`` it used, even if
        changed by ``set_params`` since, and ``schedule_``): when fitted with
        ``metric_closure=True`` they are replaced by their shortest-path closure
        first, so ``bcd(D)`` on the fitted ``D`` equals ``bcd_``.

        Parameters
        ----------
        delays : array-like of shape (n, n)
            Non-negative delays between the same physical nodes (``inf`` marks a
            missing link only when fitted with ``metric_closure=True``).
        reduce : {"mean", "sum", "none"}, default="mean"
            Per-round mean (as ``bcd_``), per-period sum (as ``bcd_total_``), or the
            bottleneck of each round (as ``bcd_per_round_``).

        Returns
        -------
        float or ndarray of shape (tau,)
            The BCD of ``assignment_`` on ``schedule_`` under ``delays``.
        """
        self._check_fitted()
        # values set after fit are still checked, but the delays are treated as fit
        # treated them: set_params(directed=True) without a refit made bcd(D) != bcd_
        check_bool(self.directed, "directed")
        check_bool(self.metric_closure, "metric_closure")
        fitted = self._fitted_settings
        D = check_delays(delays, allow_inf=fitted["metric_closure"])
        if D.shape[0] != self.n_nodes_:
            raise ValueError(f"delays has {D.shape[0]} nodes, but {type(self).__name__} was "
                             f"fitted on {self.n_nodes_}.")
        if fitted["metric_closure"]:  # the fitted BCDs are on the closed delays
            D = metric_closure(D)
        return bottleneck_delay(D, self.assignment_, self.schedule_, reduce=reduce,
                                directed=fitted["directed"])

    # -- persistence -------------------------------------------------------------
    # how fit treated the delays, which bcd repeats whatever set_params changed since
    _PRIVATE_STATE = ("_fitted_settings",)

    def _settings(self) -> dict[str, bool]:
        return {"directed": bool(self.directed), "metric_closure": bool(self.metric_closure)}

    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        state["_fitted_settings"] = dict(self._fitted_settings)
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        # files saved before the record: the parameters saved with them, which bcd read
        settings = state.setdefault("_fitted_settings", self._settings())
        if (not isinstance(settings, dict) or set(settings) != {"directed", "metric_closure"}
                or not all(isinstance(v, bool) for v in settings.values())):
            raise ValueError(f"_fitted_settings must map directed and metric_closure to "
                             f"bools, got {settings!r}.")
        super()._set_state(state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "n_nodes_" in state and "_fitted_settings" not in state:
            self._fitted_settings = self._settings()  # pickled before the record

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # fit takes one square (n, n) delay matrix between nodes, not a samples x features
        # matrix with targets, and has no predict/transform: scikit-learn's estimator checks
        # (which fit on rectangular X and compare predictions) do not apply.
        return []
