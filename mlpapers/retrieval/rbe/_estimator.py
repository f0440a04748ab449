"""Relevance-based embeddings: the retriever shell (fit / transform / kneighbors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Self, overload

import numpy as np
import torch
from sklearn.base import BaseEstimator

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    RandomStateLike,
    autograd_enabled,
    check_bool,
    check_positive,
    power_of_two_unit,
    to_numpy,
    usable_outside_inference,
)
from mlpapers._utils._blocks import block_rows_for, collect_row_blocks
from mlpapers.retrieval.rbe._common import (
    HeavyRankerMixin,
    check_item_indices,
    length,
    take,
    warn_common_offset,
    warn_near_interpolation,
)
from mlpapers.retrieval.rbe._heads import (
    NeuralRBEHead,
    build_head,
    head_from_state,
    head_state,
    train_head,
)
from mlpapers.retrieval.rbe._kernels import (
    CHUNK_SCORES,
    _fit_linear_embeddings,
    topk_scores,
)
from mlpapers.retrieval.rbe._selection import (
    SupportIndices,
    SupportMethod,
    check_support_indices,
    select_support,
)
from mlpapers.retrieval.rbe._validation import (
    Head,
    Loss,
    check_head_params,
    check_retriever_params,
)

__all__ = ["RelevanceBasedRetriever"]


class RelevanceBasedRetriever(HeavyRankerMixin, TorchEstimatorMixin, BaseEstimator):
    r"""Candidate retrieval with relevance-based embeddings (RBE).

    A query is described by its heavy-ranker relevance to ``k`` support items,
    :math:`u_q = f(q, S)` (exactly ``k`` heavy calls per query), and every item by
    an embedding learned offline from the relevance matrix of training queries to
    all items, :math:`R \in \mathbb{R}^{n_q \times N}`. Linear RBE uses the closed
    form :math:`e_i = R_{:,S}^{+} R_{:, i}` and scores :math:`\langle u_q, e_i\rangle`;
    items are retrieved by maximum inner product, optionally re-ranked by the heavy
    model. With random supports this is AnnCUR [2]_; RBE's contribution is the
    choice of supports (greedy reconstruction-error selection by default) and an
    optional neural head [1]_.

    Parameters
    ----------
    relevance_fn : callable
        The heavy ranker, ``relevance_fn(queries, items) -> array (n_queries, n_items)``
        scoring every query against every item of the given subsequences. Queries and
        items may be anything indexable (arrays, tensors, lists of strings). Each call
        gets a new container of the queries and of the support items (the catalogue
        itself is passed as given), and its result is cast to float64 and copied
        where it is kept; see the user guide for the exact call budget.
    n_support : int, default=100
        Number of support items ``k`` (online heavy calls per query). With
        ``ridge=0``, keep ``k`` (plus the intercept) away from the number of training
        queries: there the linear fit interpolates them and held-out rankings can
        collapse, and ``fit`` warns. Not used when ``support`` is an array of
        indices (``k`` is then its length).
    support : str or array-like of int, default="greedy"
        Support selection method, one of ``"greedy"``, ``"random"``, ``"popular"``,
        ``"kmeans"``, ``"farthest"`` (see :func:`select_support`), or explicit item
        indices.
    head : {"linear", "mlp"}, default="linear"
        Closed-form linear RBE, or the neural head (:class:`NeuralRBEHead`)
        trained on top of it.
    n_rerank : int, default=0
        If positive, :meth:`kneighbors` re-scores this many top candidates per query
        with the heavy model (``n_rerank`` extra calls per query) and returns the best
        of them by heavy score (ties broken by the lower item index, so
        ``n_rerank=n_items`` is exact search).
    ridge : float, default=0.0
        Ridge penalty of the linear solve (0: pseudo-inverse).
    rcond : float in [0, 1) or None, default=None
        Relative cutoff of the pseudo-inverse when ``ridge == 0``.
    standardize : bool, default=True
        Centre/scale the support relevances and fit an item intercept (an affine
        least-squares fit per item); ``False`` is the plain CUR formula. It also sets
        ``center`` in the support selection, so the greedy objective matches the fit.
    mlp_hidden : int, default=100
        Width of the neural head's towers (0 keeps only bilinear, popularity and
        bias terms).
    loss : {"softmax_signed", "mse"}, default="softmax_signed"
        Training loss of the neural head.
    top_quantile : float, default=0.99
        Positives of ``softmax_signed``: sampled items at or above this quantile of the
        query's sampled relevances.
    item_batch : int, default=128
        Items sampled (with replacement) per training step; all training queries are
        used in every step.
    max_iter : int, default=2000
        Training steps of the neural head (the authors used 1e5 on GPU).
    lr : float, default=5e-4
        Adam learning rate.
    eval_every : int, default=100
        Steps between validation evaluations (best checkpoint is kept; step 0, i.e.
        linear RBE, is a candidate, so the neural head never validates worse).
    validation_fraction : float, default=0.1
        Fraction of training queries held out for checkpoint selection of the neural
        head (0 trains on all and keeps the last step); the supports are selected,
        and the linear part fitted, without them. None are held out when
        ``max_iter=0``: the untrained head then equals linear RBE on all queries.
    batch_size : int, default=1024
        Queries per chunk when calling ``relevance_fn`` and scoring items; the
        scoring chunks of :meth:`predict` and :meth:`kneighbors` also hold at most
        ``2**22`` scores (``2**22 // n_items`` queries when fewer), so their memory
        beyond the item side (the neural head's item tower, computed once per call)
        does not grow with the catalogue.
    device : str or torch.device, default="cpu"
        Torch device.
    random_state : int, RandomState, Generator or None, default=None
        Seed of random/k-means supports, the validation split and training.
    verbose : int, default=0
        Progress bar while training the neural head.

    Attributes
    ----------
    support_indices_ : ndarray of shape (k,)
        Support item indices (``k`` may be below ``n_support`` when greedy stops early
        because the training relevance is reproduced exactly).
    selection_scores_ : ndarray of shape (k,)
        Per-pick score of the selection (training-MSE decrease for greedy).
    item_embeddings_ : ndarray of shape (n_items, k)
        Linear RBE item embeddings.
    item_offsets_ : ndarray of shape (n_items,)
        Item intercepts (zero when ``standardize=False``).
    query_mean_, query_scale_ : ndarray of shape (k,)
        Standardisation of support relevances.
    items_ : sequence
        The items (needed for online heavy calls; not saved by :meth:`save`).
    support_items_ : sequence
        ``items_`` at ``support_indices_``.
    n_items_ : int
    n_heavy_calls_ : int
        Heavy-ranker pair evaluations made by ``fit`` (0 with ``relevance_matrix``).
    n_calls_per_query_ : int
        Online heavy calls per query of :meth:`kneighbors` (``k + n_rerank``, with the
        ``n_rerank`` of ``fit``; :meth:`kneighbors` reads ``n_rerank`` when called, so
        after ``set_params(n_rerank=...)`` it spends ``k`` plus the new value).
    head_ : NeuralRBEHead or None
        The trained neural head (``head="mlp"``), in eval mode with ``requires_grad``
        off (``head_.requires_grad_(True)`` to fine-tune it).
    head_units_ : ndarray of shape (2,) or None
        Units of the neural head's query input and scores (``head="mlp"``): the power
        of two at or below the training relevance's standard deviation (1 for the query
        input when standardised), so that training does not depend on the
        relevance's unit. ``None`` without a neural head (``head="linear"``, or no
        support items: relevance constant over the queries), as ``head_``.
    head_shift_ : ndarray of shape (2,) or None
        Shifts of the neural head's query input and of its training relevance: the
        relevance's mean when that exceeds its standard deviation in magnitude, else
        0 (float32 cannot resolve relevance of 1e8 +- 1); the query input is shifted
        too with ``standardize=False`` (raw relevance), else 0. Scores are returned
        with the shift added back. ``None`` without a neural head.
    history_ : list of dict
        Training log of the neural head (loss, validation hit rate).
    best_validation_hit_rate_ : float or None
        Validation HitRate of the neural head's kept checkpoint; ``None`` when no
        validation ran (``head="linear"``, ``max_iter=0``, ``validation_fraction=0``
        or a single training query).

    See Also
    --------
    AnnCURRetriever : random supports, the plain CUR formula.
    AdaCURRetriever : per-query adaptive anchors over several rounds.

    Notes
    -----
    ``relevance_fn`` is an arbitrary callable and the items arbitrary objects, so
    :meth:`save` stores only the fitted numbers (embeddings, supports, the neural
    head's weights); :meth:`load` needs ``relevance_fn`` and ``items`` again.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).
    .. [2] Yadav, Monath, Angell, Zaheer, McCallum, "Efficient Nearest Neighbor Search
       for Cross-Encoder Models using Matrix Factorization", EMNLP 2022, arXiv:2210.12579.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.rbe import RelevanceBasedRetriever
    >>> rng = np.random.default_rng(0)
    >>> Q, I = rng.standard_normal((60, 4)), rng.standard_normal((40, 4))
    >>> heavy = lambda q, i: np.tanh(np.asarray(q) @ np.asarray(i).T)
    >>> rbe = RelevanceBasedRetriever(heavy, n_support=8).fit(Q[:50], I)
    >>> scores, idx = rbe.kneighbors(Q[50:], n_neighbors=3)
    >>> idx.shape, rbe.n_calls_per_query_
    ((10, 3), 8)
    """

    def __init__(
        self,
        relevance_fn: Callable[[Any, Any], Any] | None = None,
        *,
        n_support: int = 100,
        support: SupportMethod | SupportIndices = "greedy",
        head: Head = "linear",
        n_rerank: int = 0,
        ridge: float = 0.0,
        rcond: float | None = None,
        standardize: bool = True,
        mlp_hidden: int = 100,
        loss: Loss = "softmax_signed",
        top_quantile: float = 0.99,
        item_batch: int = 128,
        max_iter: int = 2000,
        lr: float = 5e-4,
        eval_every: int = 100,
        validation_fraction: float = 0.1,
        batch_size: int = 1024,
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.relevance_fn = relevance_fn
        self.n_support = n_support
        self.support = support
        self.head = head
        self.n_rerank = n_rerank
        self.ridge = ridge
        self.rcond = rcond
        self.standardize = standardize
        self.mlp_hidden = mlp_hidden
        self.loss = loss
        self.top_quantile = top_quantile
        self.item_batch = item_batch
        self.max_iter = max_iter
        self.lr = lr
        self.eval_every = eval_every
        self.validation_fraction = validation_fraction
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # -- validation --------------------------------------------------------------
    def _check_params(self, n_items: int) -> None:
        check_retriever_params(self, n_items)
        check_head_params(self)

    # -- fitting -------------------------------------------------------------------
    @restore_on_failure
    def fit(self, train_queries: Any, items: Any,
            relevance_matrix: ArrayLike | None = None) -> Self:
        """Select supports and learn item embeddings from training relevances.

        Parameters
        ----------
        train_queries : sequence of length n_queries
            Training queries (anything ``relevance_fn`` accepts).
        items : sequence of length n_items
            All items of the catalogue.
            With scikit-learn's model selection (``GridSearchCV(...).fit(queries,
            items=items)``), a catalogue of exactly as many items as training queries
            is split with the queries, as every fit parameter of that length is: each
            fold then fits and scores on part of the catalogue, silently. Pass one
            training query fewer (or more) there.
        relevance_matrix : array-like of shape (n_queries, n_items), optional
            Cached ``relevance_fn(train_queries, items)``; if omitted it is computed
            (``n_queries * n_items`` heavy calls, in chunks of ``batch_size`` queries).

        Returns
        -------
        self : object
            The fitted retriever.
        """
        self._init_fit()
        n_q = length(train_queries, "train_queries")
        N = length(items, "items")
        self._check_params(N)
        R, n_calls = self._offline_relevance(train_queries, items, relevance_matrix)
        if not self.standardize:
            warn_common_offset(R, "the uncentred pseudo-inverse (standardize=False)")
        fit_rows = np.arange(n_q)
        val_rows = np.arange(0)
        # Queries are held out only to select a training checkpoint: with max_iter=0
        # (the MLP head disabled) there is none to select, and holding them out fitted
        # the linear part on fewer queries, so the untrained head was not linear RBE.
        if (self.head == "mlp" and self.validation_fraction > 0 and n_q >= 2
                and self.max_iter > 0):
            perm = self._numpy_gen.permutation(n_q)
            n_val = min(n_q - 1, max(1, round(self.validation_fraction * n_q)))
            val_rows, fit_rows = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        # no copy of the (n_queries, n_items) matrix when every query is used
        R_fit = R if len(fit_rows) == n_q else R[torch.as_tensor(fit_rows, device=self._device)]
        # the supports too are chosen without the held-out queries: selected on them,
        # the validation hit rate that picks the checkpoint would be optimistic
        if isinstance(self.support, str):
            S, scores = select_support(
                R_fit, self.n_support, self.support, center=self.standardize,
                random_state=self._numpy_gen, device=self._device, return_scores=True)
        else:
            S = check_support_indices(self.support, N)
            scores = np.full(S.size, np.nan)
        Sg = torch.as_tensor(S, device=self._device)
        lin = _fit_linear_embeddings(R_fit[:, Sg], R_fit, float(self.ridge), self.rcond,
                                     bool(self.standardize))
        self._warn_near_interpolation(S.size, int(lin["rank"]), len(fit_rows), len(val_rows))
        self.support_indices_ = S
        self.selection_scores_ = scores
        self.item_embeddings_ = to_numpy(lin["embeddings"])
        self.item_offsets_ = to_numpy(lin["offsets"])
        self.query_mean_ = to_numpy(lin["mean"])
        self.query_scale_ = to_numpy(lin["scale"])
        self.items_ = items
        self.support_items_ = take(items, S)
        self.n_items_ = N
        self.n_heavy_calls_ = n_calls
        self.n_calls_per_query_ = int(S.size + self.n_rerank)
        self.head_: NeuralRBEHead | None = None
        # None without a neural head, as head_: a linear refit after an "mlp" fit kept
        # the previous head's units (describing a head that no longer exists)
        self.head_units_: np.ndarray | None = None
        self.head_shift_: np.ndarray | None = None
        self.history_: list[dict[str, Any]] = []
        # None unless a neural head's validation runs (it was absent after a fit with a
        # linear head, max_iter=0 or validation_fraction=0 and present after others, and
        # a refit without validation kept the previous fit's value)
        self.best_validation_hit_rate_: float | None = None
        # (no supports: relevance constant over the queries, which the item offsets of
        # the linear model reproduce; a neural head has no input then)
        if self.head == "mlp" and S.size > 0:
            R_val = R[torch.as_tensor(val_rows, device=self._device)]
            self._fit_mlp(R_fit, R_val, Sg, R_fit.mean(dim=0))
        return self

    def _warn_near_interpolation(self, n_support: int, rank: int, n_fit: int,
                                 held_out: int) -> None:
        """Warn when the linear fit sits at its interpolation threshold (see
        :func:`warn_near_interpolation`): both the supports and the directions the solve
        keeps (plus the intercept when standardised) are within 10% of the fitting
        queries. Far more supports than queries is past the peak (the minimum-norm
        solution), and duplicate or low-rank supports keep fewer directions. Greedy
        selection cannot get past the peak on its own: it stops at the rank of the
        training relevance, at most ``n_fit - 1`` once centred."""
        icpt = int(bool(self.standardize))
        if not 0.9 * n_fit <= n_support + icpt <= 1.1 * n_fit:
            return
        what = f"{n_support} supports" + (", rank " + str(rank) if rank < n_support else "")
        what += " and an intercept per item" if icpt else " per item"
        warn_near_interpolation(rank + icpt, n_fit, float(self.ridge), what, held_out)

    def _standardize(self, R_sup: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.query_mean_, device=R_sup.device, dtype=R_sup.dtype)
        scale = torch.as_tensor(self.query_scale_, device=R_sup.device, dtype=R_sup.dtype)
        return (R_sup - mean) / scale

    def _fit_mlp(self, R_fit, R_val, S, popularity) -> None:
        # training needs autograd, also inside the caller's no_grad / inference_mode
        # block; switched on here only, so relevance_fn runs in the caller's grad mode.
        # Inputs made under inference mode are copied: the head's training saves them
        with autograd_enabled():
            R_fit, R_val, popularity = (usable_outside_inference(t)
                                        for t in (R_fit, R_val, popularity))
            self._train_mlp(R_fit, R_val, S, popularity)

    def _train_mlp(self, R_fit, R_val, S, popularity) -> None:
        f32 = torch.float32
        # The float32 head trains on the relevance minus its mean when the mean is larger
        # than the spread: a common offset of 1e8 left float32 a resolution of 8 in the
        # targets and offsets (HitRate 0.1 against 0.89 for the linear head, even
        # untrained). A constant shift changes neither loss (both are invariant to one
        # constant per query) nor the ranking; the scores get it back in float64.
        # (in units of a power of two beyond 2**+-500: a spread of 1e290 squared
        # overflowed the variance, std = inf, and the shift was dropped)
        lo, hi = (float(t) for t in torch.aminmax(R_fit))
        big = power_of_two_unit(max(-lo, hi), 500)
        std, mean = (float(t) * big for t in torch.std_mean(
            R_fit if big == 1.0 else R_fit / big, correction=0))
        shift = mean if abs(mean) > std else 0.0
        # It works in units of the power of two at or below the relevance's spread (its
        # scores scale back in float64), so training does not depend on the relevance's
        # unit: Adam's step is absolute, and loss="mse" diverged on relevance of spread
        # 1e-4 (HitRate@10 0.15 against 0.69 at spread 1); relevance of 1e40 overflowed
        # float32 (NaN scores) and of 1e-60 flushed to 0. At least the smallest normal
        # float64 (a subnormal unit's inverse overflowed: NaN scores). The scores are
        # <u, e> + offsets, with u scale-free and e in the relevance's units when
        # standardised, the other way round otherwise.
        unit = max(power_of_two_unit(std, 0), 2.0 ** -1022)
        q_unit = 1.0 if bool(self.standardize) else unit
        # raw (unstandardised) query inputs carry the offset too: shifted as the targets,
        # which moves <shift 1, e_i> into the item offsets
        q_shift = 0.0 if bool(self.standardize) else shift
        self.head_units_ = np.array([q_unit, unit])
        self.head_shift_ = np.array([q_shift, shift])
        offsets = self.item_offsets_ + q_shift * self.item_embeddings_.sum(axis=1) - shift
        U_fit = ((self._standardize(R_fit[:, S]) - q_shift) / q_unit).to(f32)
        head = build_head(self.item_embeddings_ * (q_unit / unit), offsets / unit,
                          (popularity - shift) / unit, U_fit, int(self.mlp_hidden),
                          seed=int(self._numpy_gen.integers(2**31 - 1)), device=self._device)
        U_val = ((self._standardize(R_val[:, S]) - q_shift) / q_unit).to(f32)
        # (no float64 copy of the (n_fit, n_items) matrix: 1.4 GB at 1800 x 10**5,
        # besides the float32 one the head trains on)
        if unit == 1.0 and shift == 0.0:
            T_fit = R_fit.to(f32)
        else:
            rows = block_rows_for(R_fit.shape[1], CHUNK_SCORES)
            T_fit = collect_row_blocks(lambda r: ((R_fit[r] - shift) / unit).to(f32),
                                       R_fit.shape[0], rows)
        history, best = train_head(
            head, U_fit, T_fit, U_val, R_val, loss=self.loss,
            top_quantile=float(self.top_quantile), item_batch=int(self.item_batch),
            max_iter=int(self.max_iter), lr=float(self.lr), eval_every=int(self.eval_every),
            batch_size=int(self.batch_size), generator=self._torch_gen, verbose=self.verbose)
        if best is not None:
            self.best_validation_hit_rate_ = best
        # fitted state, as AmortizedMIPS's model_: no gradients kept from the last step
        # (a copy of every parameter) and none recorded at inference
        head.zero_grad(set_to_none=True)
        head.eval().requires_grad_(False)
        self.head_ = head
        self.history_ = history

    # -- inference -----------------------------------------------------------------
    def transform_items(self) -> np.ndarray:
        """Linear RBE item embeddings, shape (n_items, k) (``item_embeddings_``).

        The linear head scores ``transform_queries(Q) @ transform_items().T +
        item_offsets_`` (:meth:`predict`); the offsets are zero with
        ``standardize=False``, where the score is exactly ``<u_q, e_i>``.
        For a maximum-inner-product index (``ExactMIPS``, faiss) append the offsets
        as a last column here and a column of ones to the query embeddings.
        Makes no heavy call. With ``head="mlp"`` these are the linear embeddings the
        neural head starts from, not its scores.

        Returns
        -------
        ndarray of shape (n_items, k), float64
            A copy of ``item_embeddings_``, ``k = len(support_indices_)``.
        """
        self._check_fitted()
        return self.item_embeddings_.copy()

    def _query_support(self, queries: Any) -> torch.Tensor:
        self._check_fitted()
        self._check_relevance_fn("predict")
        length(queries, "queries")
        # a copy of the support items per heavy call: a relevance_fn that modified its
        # items in place changed support_items_, and with it every later prediction
        return self._heavy_chunked(queries, self.support_items_, len(self.support_indices_),
                                   online=True)

    def transform_queries(self, queries: Any) -> np.ndarray:
        """Query embeddings: standardised heavy relevance to the support items.

        Makes exactly ``k = len(support_indices_)`` heavy calls per query.

        Parameters
        ----------
        queries : sequence of length n
            Queries in any form ``relevance_fn`` accepts (numpy array, torch tensor,
            list, pandas object, ...); a single query must be wrapped in a list.

        Returns
        -------
        ndarray of shape (n, k), float64
            ``(f(q, S) - query_mean_) / query_scale_``: the raw heavy scores with
            ``standardize=False`` (see :meth:`transform_items` for the score).
        """
        return to_numpy(self._standardize(self._query_support(queries)))

    def _score_fn(self, U: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
        if self.head_ is not None:
            # (None: pickles from before head_units_; load gives files (1, 1))
            units = getattr(self, "head_units_", None)
            q_unit, unit = (1.0, 1.0) if units is None else units
            # (the fitted shifts, not set_params(standardize=...) after fit; (0, 0):
            # pickles and files from before head_shift_)
            shifts = getattr(self, "head_shift_", None)
            q_shift, shift = (0.0, 0.0) if shifts is None else (float(v) for v in shifts)
            score_all = self.head_.all_items_scorer()
            if unit == 1.0 and shift == 0.0:
                U32 = U.to(torch.float32)
                # (float64 as the other heads and units: the dtype varied with the data)
                return lambda a, b: score_all(U32[a:b]).double()
            U32 = ((U - q_shift) / float(q_unit)).to(torch.float32)
            return lambda a, b: score_all(U32[a:b]).double().mul_(float(unit)).add_(shift)
        E = torch.as_tensor(self.item_embeddings_, device=U.device)
        c = torch.as_tensor(self.item_offsets_, device=U.device)
        # in place: a second (chunk, n_items) block for the sum pinned memory per chunk
        return lambda a, b: (U[a:b] @ E.T).add_(c)

    def predict(self, queries: Any) -> np.ndarray:
        """Approximate relevance of every item to each query.

        Makes ``k = len(support_indices_)`` heavy calls per query (no re-ranking:
        ``n_rerank`` applies to :meth:`kneighbors` only). The scores are computed in
        chunks of queries, but the result holds ``n_queries * n_items`` floats; use
        :meth:`kneighbors` for the top items of a large catalogue.

        Parameters
        ----------
        queries : sequence of length n_queries
            Queries in any form ``relevance_fn`` accepts (numpy array, torch tensor,
            list, pandas object, ...); a single query must be wrapped in a list.

        Returns
        -------
        ndarray of shape (n_queries, n_items), float64
            Approximate scores: ``transform_queries(queries) @ transform_items().T +
            item_offsets_`` with the linear head, the neural head's scores with
            ``head="mlp"``. Higher means more relevant.
        """
        U = self._standardize(self._query_support(queries))
        rows = block_rows_for(self.n_items_, CHUNK_SCORES, cap=self.batch_size)
        with torch.no_grad():
            fn = self._score_fn(U)
            # into one preallocated output: a list of chunks and their concatenation
            # held the (n_queries, n_items) result twice
            out = collect_row_blocks(lambda r: fn(r.start, r.stop), U.shape[0], rows)
        return to_numpy(out)

    @overload
    def kneighbors(self, queries: Any, n_neighbors: int = ...,
                   return_distance: Literal[True] = ...) -> tuple[np.ndarray, np.ndarray]: ...
    @overload
    def kneighbors(self, queries: Any, n_neighbors: int = ..., *,
                   return_distance: Literal[False]) -> np.ndarray: ...
    @overload
    def kneighbors(self, queries: Any, n_neighbors: int = ..., return_distance: bool = ...
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray: ...
    def kneighbors(self, queries: Any, n_neighbors: int = 10, return_distance: bool = True
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
        """Top items per query by approximate score, re-ranked by the heavy model if set.

        Uses ``k + n_rerank`` heavy calls per query (``n_calls_per_query_``).

        Parameters
        ----------
        queries : sequence of length n
            Queries in any form ``relevance_fn`` accepts (numpy array, torch tensor,
            list, pandas object, ...); a single query must be wrapped in a list.
        n_neighbors : int, default=10
            Items returned per query, a positive integer. Must be ``<= n_items`` and,
            when re-ranking, ``<= n_rerank``.
        return_distance : bool, default=True
            Also return the scores (named after scikit-learn's ``kneighbors``; they
            are similarities, higher is better, not distances).

        Returns
        -------
        scores : ndarray of shape (n, n_neighbors)
            Descending; heavy-ranker scores when re-ranking, else approximate scores
            (only if ``return_distance``). Ties are ordered by item index (lower first).
        indices : ndarray of shape (n, n_neighbors), int64
            Positions in ``items`` of the retrieved items, best first (the only
            output when ``return_distance=False``).
        """
        check_bool(return_distance, "return_distance")
        self._check_fitted()
        check_positive(n_neighbors, "n_neighbors", integer=True)
        # read at inference (set_params after fit): a negative value must not silently
        # switch re-ranking off
        check_positive(self.n_rerank, "n_rerank", strict=False, integer=True)
        check_positive(self.batch_size, "batch_size", integer=True)
        if n_neighbors > self.n_items_:
            raise ValueError(f"n_neighbors={n_neighbors} must be <= n_items ({self.n_items_}).")
        if 0 < self.n_rerank < n_neighbors:
            raise ValueError(f"n_neighbors={n_neighbors} must be <= n_rerank={self.n_rerank} "
                             "when re-ranking.")
        if self.n_rerank > self.n_items_:  # (as fit: set_params after fit was clamped)
            raise ValueError(f"n_rerank={self.n_rerank} must be <= the number of items "
                             f"({self.n_items_}).")
        U = self._standardize(self._query_support(queries))
        m = self.n_rerank if self.n_rerank > 0 else n_neighbors
        with torch.no_grad():
            s, idx = topk_scores(self._score_fn(U), U.shape[0], m,
                                 batch_size=int(self.batch_size), n_items=self.n_items_)
        s, idx = s.double().cpu(), idx.cpu()
        if self.n_rerank > 0:
            # Each query has its own candidates: one heavy call per query (1 x n_rerank).
            heavy = self._heavy_per_query(queries, idx).cpu()
            # ties in heavy score go to the lower item index, as in the exact top-k of
            # hit_rate: re-ranking every item is then exactly brute-force search (in the
            # predicted order, graded relevance with ties scored below 1.0)
            by_item = torch.argsort(idx, dim=1)
            idx, heavy = torch.gather(idx, 1, by_item), torch.gather(heavy, 1, by_item)
            order = torch.argsort(heavy, dim=1, descending=True, stable=True)[:, :n_neighbors]
            s, idx = torch.gather(heavy, 1, order), torch.gather(idx, 1, order)
        scores, indices = to_numpy(s), to_numpy(idx).astype(np.int64)
        return (scores, indices) if return_distance else indices

    # -- persistence -----------------------------------------------------------------
    _NOT_SAVED = ("items_", "support_items_", "head_")

    def _attach_items(self, items: Any) -> None:
        self.items_ = items
        self.support_items_ = take(items, self.support_indices_)

    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        state["head_"] = head_state(self.head_)
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        head = state.pop("head_", None)
        state.setdefault("best_validation_hit_rate_", None)  # files saved before it was set
        # files saved before head_units_ existed: a neural head in the relevance's units
        # (1); none without a head (also for files whose linear refit kept the units of
        # an earlier neural head)
        state["head_units_"] = (None if head is None
                                else state.get("head_units_", np.array([1.0, 1.0])))
        state["head_shift_"] = (None if head is None
                                else state.get("head_shift_", np.zeros(2)))
        super()._set_state(state)
        check_item_indices(self, "support_indices_")
        self.head_ = head_from_state(head, self._resolved_device)


def __getattr__(name: str):
    # Files saved before the baselines moved to ``_baselines`` name this module.
    if name == "AnnCURRetriever":
        from mlpapers.retrieval.rbe._baselines import AnnCURRetriever

        return AnnCURRetriever
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
