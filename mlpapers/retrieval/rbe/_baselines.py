"""CUR baselines of relevance-based embeddings: AnnCUR (random anchors) and ADACUR."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, Self, overload

import numpy as np
import torch
from sklearn.base import BaseEstimator

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    RandomStateLike,
    check_bool,
    check_positive,
    power_of_two_unit,
    to_numpy,
)
from mlpapers._utils._blocks import collect_row_blocks
from mlpapers.retrieval.rbe._common import (
    HeavyRankerMixin,
    check_item_indices,
    length,
    take,
    warn_common_offset,
    warn_near_interpolation,
)
from mlpapers.retrieval.rbe._estimator import RelevanceBasedRetriever
from mlpapers.retrieval.rbe._kernels import _cur_query_weights, abs_max, stable_topk
from mlpapers.retrieval.rbe._selection import SupportMethod, quiet_early_stop, select_support
from mlpapers.retrieval.rbe._validation import (
    check_adacur_params,
    check_retriever_params,
    check_solve_params,
)

__all__ = ["AdaCURRetriever", "AnnCURRetriever"]


class AnnCURRetriever(RelevanceBasedRetriever):
    r"""AnnCUR: CUR-based retrieval with random anchor items (baseline of RBE).

    Equivalent to :class:`RelevanceBasedRetriever` with ``support="random"`` and
    ``head="linear"``; by default without standardisation, i.e. the plain CUR
    approximation :math:`R_{q, I_a} R_{Q_a, I_a}^{+} R_{Q_a, :}` of [1]_ with the
    training queries as anchor queries.

    Parameters
    ----------
    relevance_fn : callable
        The heavy ranker ``relevance_fn(queries, items) -> (n_queries, n_items)``.
    n_support : int, default=100
        Number of random anchor items.
    n_rerank : int, default=0
        Candidates re-ranked by the heavy model in :meth:`kneighbors` (``n_rerank``
        extra heavy calls per query; 0: no re-ranking).
    ridge : float, default=0.0
        Ridge penalty of the linear solve (0: pseudo-inverse).
    rcond : float in [0, 1) or None, default=None
        Relative cutoff of the pseudo-inverse when ``ridge == 0``.
    standardize : bool, default=False
        Centre/scale the anchor relevances and fit an item intercept, as in
        :class:`RelevanceBasedRetriever` (whose default is True); ``False`` is the
        plain CUR formula of [1]_.
    batch_size : int, default=1024
        Queries per chunk when calling ``relevance_fn`` and scoring items.
    device : str or torch.device, default="cpu"
        Torch device.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the random anchor items.
    verbose : int, default=0
        Unused (nothing is trained); kept for API uniformity.

    Attributes
    ----------
    support_indices_ : ndarray of shape (n_support,)
        The random anchor items.
    item_embeddings_ : ndarray of shape (n_items, n_support)
        CUR item embeddings, :math:`(R_{:,S}^{+} R)^\top` with ``standardize=False``.
    item_offsets_ : ndarray of shape (n_items,)
        Item intercepts (zero when ``standardize=False``).
    query_mean_, query_scale_ : ndarray of shape (n_support,)
        Standardisation of the anchor relevances (0 and 1 when
        ``standardize=False``).
    items_ : sequence
        The items (not saved by :meth:`save`).
    n_items_ : int
        Number of items.
    n_heavy_calls_ : int
        Heavy-ranker pairs scored by ``fit`` (0 with ``relevance_matrix``).
    n_calls_per_query_ : int
        Online heavy calls per query (``n_support + n_rerank``).
    support_items_ : sequence
        ``items_`` at ``support_indices_``.
    selection_scores_ : ndarray of shape (n_support,)
        All NaN: random anchors have no selection score (kept for the
        :class:`RelevanceBasedRetriever` interface).
    head_, head_units_, head_shift_, best_validation_hit_rate_ : None
        No neural head (``RelevanceBasedRetriever``'s interface).
    history_ : list
        Empty (no neural head is trained).

    References
    ----------
    .. [1] Yadav, Monath, Angell, Zaheer, McCallum, "Efficient Nearest Neighbor Search
       for Cross-Encoder Models using Matrix Factorization", EMNLP 2022, arXiv:2210.12579.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.rbe import AnnCURRetriever
    >>> rng = np.random.default_rng(0)
    >>> Q, I = rng.standard_normal((30, 3)), rng.standard_normal((20, 3))
    >>> cur = AnnCURRetriever(lambda q, i: q @ i.T, n_support=5, random_state=0).fit(Q, I)
    >>> cur.support_indices_.shape
    (5,)
    """

    support = "random"
    head = "linear"

    def __init__(
        self,
        relevance_fn: Callable[[Any, Any], Any] | None = None,
        *,
        n_support: int = 100,
        n_rerank: int = 0,
        ridge: float = 0.0,
        rcond: float | None = None,
        standardize: bool = False,
        batch_size: int = 1024,
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.relevance_fn = relevance_fn
        self.n_support = n_support
        self.n_rerank = n_rerank
        self.ridge = ridge
        self.rcond = rcond
        self.standardize = standardize
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self, n_items: int) -> None:
        check_retriever_params(self, n_items)  # no neural head to check


def round_sizes(n_calls: int, n_rounds: int) -> list[int]:
    """Split ``n_calls`` into ``n_rounds`` near-equal parts (earlier rounds get the rest)."""
    base, extra = divmod(n_calls, n_rounds)
    return [base + (r < extra) for r in range(n_rounds)]


class AdaCURRetriever(HeavyRankerMixin, TorchEstimatorMixin, BaseEstimator):
    r"""ADACUR: adaptive multi-round CUR retrieval with a heavy ranker (baseline of RBE).

    Offline, the heavy relevance :math:`A` of the training ("anchor") queries to all
    items is computed once (the same offline cost as AnnCUR and RBE). Online, a query
    spends its budget of ``n_calls`` heavy calls over ``n_rounds`` rounds:

    1. round 1 scores the query against ``init`` anchor items, shared by all queries
       (uniformly random in [1]_);
    2. after each round, with the items :math:`I` scored so far and their heavy
       scores :math:`u`, the CUR approximation of all scores is
       :math:`\hat s = u^\top A_{:,I}^{+} A` (:func:`cur_query_weights`); the next
       round scores the top unscored items under :math:`\hat s`;
    3. the final ranking puts every scored item at its exact heavy score and the
       others at their approximation with all ``n_calls`` anchors.

    Unlike AnnCUR and RBE, whose query embedding is fixed once the supports are
    scored, the anchors adapt to each query and concentrate on its likely top
    items; the price is a per-query least-squares solve against :math:`A` in every
    round (no fixed item index) and ``n_rounds`` sequential heavy-call rounds.

    Parameters
    ----------
    relevance_fn : callable
        The heavy ranker ``relevance_fn(queries, items) -> (n_queries, n_items)``.
    n_calls : int, default=100
        Online heavy calls per query (the budget :math:`B`, all spent on anchors).
        With ``ridge=0``, keep it away from the number of anchor (training) queries:
        there the last round's solve interpolates them, and ``fit`` warns.
    n_rounds : int, default=5
        Rounds; round :math:`r` scores ``n_calls // n_rounds`` items (the first
        ``n_calls % n_rounds`` rounds one more).
    init : {"greedy", "random", "popular", "kmeans", "farthest"}, default="random"
        How the first round's anchors are chosen from the training relevance, one of
        the :func:`select_support` methods (``"random"`` is ADACUR; ``"greedy"``
        combines RBE's support selection with adaptive rounds), computed with
        ``center=False`` to match the plain CUR approximation.
    ridge : float, default=0.0
        Ridge penalty of the per-query solve (0: pseudo-inverse).
    rcond : float in [0, 1) or None, default=None
        Relative singular-value cutoff of the pseudo-inverse (see
        :func:`cur_query_weights`).
    batch_size : int, default=1024
        Queries per chunk of the shared first-round heavy call; the per-query solves
        run in chunks of at most ``batch_size`` queries and about :math:`2^{24}` floats
        of working set, and :meth:`kneighbors` keeps only each chunk's top items (its
        memory does not grow as ``n_queries x n_items``; :meth:`predict` returns that
        whole matrix).
    device : str or torch.device, default="cpu"
        Torch device.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the first-round anchors (``"random"``, ``"kmeans"``).
    verbose : int, default=0
        Progress bar over query chunks.

    Attributes
    ----------
    anchor_relevance_ : ndarray of shape (n_train_queries, n_items)
        The offline relevance matrix :math:`A` (the index used online), float64, a
        copy stored item-major (Fortran order), so the estimator holds one copy of
        the matrix and none of the caller's.
    initial_anchors_ : ndarray of shape (round_sizes_[0],)
        First-round anchor items, shared by all queries.
    round_sizes_ : ndarray of shape (n_rounds,)
        Heavy calls per query in each round (sum: ``n_calls``).
    items_ : sequence
        The items (not saved by :meth:`save`).
    n_items_ : int
    n_heavy_calls_ : int
        Offline heavy-ranker pairs scored by ``fit`` (0 with ``relevance_matrix``).
    n_calls_per_query_ : int
        Online heavy calls per query (``n_calls``).

    See Also
    --------
    AnnCURRetriever : one round of random anchors, fixed for all queries.
    RelevanceBasedRetriever : fixed, selected support items and a learned item index.

    References
    ----------
    .. [1] Yadav, Monath, Zaheer, McCallum, "Efficient k-NN Search with Cross-Encoders
       using Adaptive Multi-Round CUR Decomposition" (first version: "Adaptive
       Selection of Anchor Items for CUR-based k-NN search with Cross-Encoders"),
       Findings of EMNLP 2023, arXiv:2305.02996.
    .. [2] Yadav, Monath, Zaheer, Fergus, McCallum, "Adaptive Retrieval and Scalable
       Indexing for k-NN Search with Cross-Encoders", ICLR 2024, arXiv:2405.03651.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.rbe import AdaCURRetriever
    >>> rng = np.random.default_rng(0)
    >>> Q, I = rng.standard_normal((60, 4)), rng.standard_normal((40, 4))
    >>> heavy = lambda q, i: np.tanh(np.asarray(q) @ np.asarray(i).T)
    >>> ada = AdaCURRetriever(heavy, n_calls=12, n_rounds=3, random_state=0).fit(Q[:50], I)
    >>> idx = ada.kneighbors(Q[50:], n_neighbors=3, return_distance=False)
    >>> idx.shape, ada.round_sizes_.tolist()
    ((10, 3), [4, 4, 4])
    """

    def __init__(
        self,
        relevance_fn: Callable[[Any, Any], Any] | None = None,
        *,
        n_calls: int = 100,
        n_rounds: int = 5,
        init: SupportMethod = "random",
        ridge: float = 0.0,
        rcond: float | None = None,
        batch_size: int = 1024,
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.relevance_fn = relevance_fn
        self.n_calls = n_calls
        self.n_rounds = n_rounds
        self.init = init
        self.ridge = ridge
        self.rcond = rcond
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self, n_items: int) -> None:
        check_adacur_params(self, n_items)

    @restore_on_failure
    def fit(self, train_queries: Any, items: Any,
            relevance_matrix: ArrayLike | None = None) -> Self:
        """Store the anchor-query relevance and choose the first-round anchors.

        Parameters
        ----------
        train_queries : sequence of length n_queries
            Anchor (training) queries, in any form ``relevance_fn`` accepts (numpy
            array, torch tensor, list, pandas object, ...).
        items : sequence of length n_items
            All items of the catalogue (anything ``relevance_fn`` accepts); kept as
            ``items_`` for the online heavy calls.
            With scikit-learn's model selection (``GridSearchCV(...).fit(queries,
            items=items)``), a catalogue of exactly as many items as training queries
            is split with the queries, as every fit parameter of that length is: each
            fold then fits and scores on part of the catalogue, silently. Pass one
            training query fewer (or more) there.
        relevance_matrix : array-like of shape (n_queries, n_items), optional
            Cached ``relevance_fn(train_queries, items)``; computed when omitted
            (``n_queries * n_items`` heavy calls, in chunks of ``batch_size`` queries).

        Returns
        -------
        self : object
            The fitted retriever.
        """
        self._init_fit()
        length(train_queries, "train_queries")
        N = length(items, "items")
        self._check_params(N)
        R, n_calls = self._offline_relevance(train_queries, items, relevance_matrix)
        warn_common_offset(R, "ADACUR's Gram-matrix solve")
        # the last round's solve has n_calls unknowns per query on the anchor queries
        warn_near_interpolation(int(self.n_calls), R.shape[0], float(self.ridge),
                                "the n_calls anchor items of each query")
        sizes = round_sizes(int(self.n_calls), int(self.n_rounds))
        # greedy may stop early: filled below (a per-thread switch, not catch_warnings,
        # whose process-wide filter swap simultaneous fits could leave at "ignore all")
        with quiet_early_stop():
            first = select_support(R, sizes[0], self.init, center=False,
                                   random_state=self._numpy_gen, device=self._device)
        if first.size < sizes[0]:
            rest = np.setdiff1d(np.arange(N), first)
            fill = self._numpy_gen.choice(rest, size=sizes[0] - first.size, replace=False)
            first = np.concatenate([first, np.sort(fill)])
        # stored item-major (a Fortran-ordered array): the online rounds gather the
        # anchor items' columns, contiguous in this layout, and this one copy is the only
        # one kept (no transposed copy per search, none of the caller's matrix)
        # (a clone, not .contiguous(): with one training query R.T is already
        # contiguous, and the estimator kept the caller's matrix, or relevance_fn's
        # output buffer, instead of its own copy)
        self.anchor_relevance_ = to_numpy(R.T.clone(memory_format=torch.contiguous_format)).T
        self.initial_anchors_ = first.astype(np.int64)
        self.round_sizes_ = np.asarray(sizes, dtype=np.int64)
        self.items_ = items
        self.n_items_ = N
        self.n_heavy_calls_ = n_calls
        self.n_calls_per_query_ = int(self.n_calls)
        self._A_cache: tuple[np.ndarray, torch.Tensor, torch.Tensor] | None = None
        return self

    def _anchor_cache(self) -> tuple[Any, torch.Tensor, torch.Tensor, float]:
        """``(anchor_relevance_, A, A^T, max|A|)``, ``A`` and ``A^T`` on the device,
        ``A^T`` contiguous; the views are cached per fitted matrix.

        Both are views of ``anchor_relevance_`` (item-major after :meth:`fit`); only a
        C-ordered matrix (e.g. set by hand) is copied once. ``max|A|`` is read at every
        call (the views follow in-place changes of the matrix, so a cached maximum
        could go stale), from the contiguous ``A^T`` in one pass: read from the strided
        ``A`` it cost a second per call at 2000 x 10**5.
        """
        cache = getattr(self, "_A_cache", None)
        if cache is None or cache[0] is not self.anchor_relevance_:
            A = torch.as_tensor(self.anchor_relevance_, dtype=torch.float64,
                                device=self._resolved_device)
            At = A.T if A.T.is_contiguous() else A.T.contiguous()
            cache = (self.anchor_relevance_, At.T, At)
            self._A_cache = cache
        return (*cache, abs_max(cache[2]))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_A_cache", None)  # views or a copy of anchor_relevance_
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        check_item_indices(self, "initial_anchors_")
        # files hold the matrix query-major: back to the item-major layout of fit
        self.anchor_relevance_ = np.asfortranarray(self.anchor_relevance_)

    def _search(self, queries: Any, top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Adaptive rounds: ``-> scores (n, N)`` (exact at anchors), ``anchors (n, B)``.

        With ``top``, returns the ``top`` best ``(scores, items)`` of each query instead,
        selected chunk by chunk (memory bounded by the chunk, not ``n x N``).
        """
        self._check_fitted()
        self._check_relevance_fn("predict")
        check_solve_params(self)  # read here (set_params after fit)
        n = length(queries, "queries")
        _, A, At, amax = self._anchor_cache()
        sizes = [int(s) for s in self.round_sizes_]
        first = torch.as_tensor(self.initial_anchors_, device=A.device)
        # per-chunk working set: C (b, B, n_a) and scores (b, N), about 2**24 floats
        chunk = max(1, min(int(self.batch_size),
                           2**24 // max(1, sum(sizes) * A.shape[0] + A.shape[1])))
        starts = list(range(0, n, chunk))
        # The Gram C C^T of the anchor relevance is formed in units of a power of two
        # when |A| is far from 1 (exact; the weights scale back): its squares
        # underflowed for |A| < 1e-154 (every direction dropped, HitRate 0.66 -> 0.31)
        # and overflowed for |A| > 1e154 (a LinAlgError from eigh). With C / s, the
        # weights are s w and the ridge acts as ridge / s**2 on the scaled Gram.
        unit = power_of_two_unit(amax, 60)
        ridge = float(self.ridge) / unit / unit
        if unit != 1.0 and float(self.ridge) > 0.0 and not 2.0**-1022 <= ridge <= 2.0**1023:
            # the scaled ridge overflowed (a cryptic "ridge must be >= 0, got inf") or
            # underflowed to 0 (silently the rcond branch): no float64 ridge acts on
            # the Gram of this relevance as the one given would
            raise ValueError(
                f"ridge={self.ridge!r} is out of range for relevance values of magnitude "
                f"{amax:.3g}: the anchor Gram matrix is formed in units of "
                f"2**{int(math.log2(unit))} of the relevance, where the ridge becomes "
                f"ridge / unit**2 = 2**{math.log2(float(self.ridge)) - 2 * math.log2(unit):.0f}"
                ", beyond the float64 range. Scale ridge with the square of the "
                "relevance (ridge / max|relevance|**2 between about 1e-300 and 1e300), "
                "or use ridge=0.")
        # (after every check: an error must not come after the first round's heavy calls)
        u0 = self._heavy_chunked(queries, take(self.items_, self.initial_anchors_), len(first),
                                 online=True)

        def rounds(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            lo, hi = rows.start, rows.stop
            sub = take(queries, np.arange(lo, hi))
            I = first.expand(hi - lo, -1).clone()
            u, C = u0[lo:hi], At[I]  # (b, m), (b, m, n_a)
            if unit != 1.0:
                C = C / unit
            G = C @ C.mT
            for r in range(1, len(sizes) + 1):
                w = _cur_query_weights(C, u, G, ridge, self.rcond)
                S = (w / unit if unit != 1.0 else w) @ A  # (b, N)
                if r == len(sizes):
                    break
                # the best unscored items: topk, not a full sort of every row
                # (ADACUR spent 90% of its time sorting all items of every query)
                # (in place: S is recomputed in the next round)
                new = stable_topk(S.scatter_(1, I, -torch.inf), sizes[r])[1]
                u_new = self._heavy_per_query(sub, new)
                C_new = At[new] if unit == 1.0 else At[new] / unit
                X = C_new @ C.mT  # (b, s, m)
                G = torch.cat([torch.cat([G, X.mT], dim=2),
                               torch.cat([X, C_new @ C_new.mT], dim=2)], dim=1)
                C, I, u = torch.cat([C, C_new], 1), torch.cat([I, new], 1), torch.cat([u, u_new], 1)
            S = S.scatter(1, I, u)
            if top is not None:  # keep only this chunk's top items (stable: lower index)
                return stable_topk(S, top)
            return S, I

        # each chunk's result written into one preallocated output: a list of small
        # top-k results kept between large transient chunks can grow the resident
        # memory chunk by chunk (see mlpapers._utils._blocks), and for predict the
        # list and its concatenation held the (n, n_items) scores twice
        blocks = (slice(starts[c], min(starts[c] + chunk, n))
                  for c in ProgressLogger(len(starts), self.verbose, desc="ADACUR"))
        return collect_row_blocks(rounds, n, chunk, blocks=blocks)

    @overload
    def predict(self, queries: Any, return_anchors: Literal[False] = ...) -> np.ndarray: ...
    @overload
    def predict(self, queries: Any, return_anchors: Literal[True]
                ) -> tuple[np.ndarray, np.ndarray]: ...
    @overload
    def predict(self, queries: Any, return_anchors: bool = ...
                ) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
    def predict(self, queries: Any, return_anchors: bool = False
                ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Final scores of every item: exact at the query's anchors, CUR elsewhere.

        Makes exactly ``n_calls`` heavy calls per query.

        Parameters
        ----------
        queries : sequence of length n
            Queries in any form ``relevance_fn`` accepts (numpy array, torch tensor,
            list, pandas object, ...); a single query must be wrapped in a list.
        return_anchors : bool, default=False
            Also return each query's anchor items in the order they were scored.

        Returns
        -------
        scores : ndarray of shape (n, n_items), float64
            The heavy score at each of the query's ``n_calls`` anchor items and the
            final CUR approximation (from all of them) elsewhere.
        anchors : ndarray of shape (n, n_calls), int64
            Only when ``return_anchors``: item indices, the ``round_sizes_[0]``
            shared first-round anchors first, then each round's picks.
        """
        check_bool(return_anchors, "return_anchors")
        S, I = self._search(queries)
        scores = to_numpy(S)
        return (scores, to_numpy(I).astype(np.int64)) if return_anchors else scores

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
        """Top items per query: anchors by exact score, the rest by approximation.

        Uses exactly ``n_calls`` heavy calls per query.

        Parameters
        ----------
        queries : sequence of length n
            Queries in any form ``relevance_fn`` accepts (numpy array, torch tensor,
            list, pandas object, ...); a single query must be wrapped in a list.
        n_neighbors : int, default=10
            Items returned per query, a positive integer ``<= n_items``.
        return_distance : bool, default=True
            Also return the scores (named after scikit-learn's ``kneighbors``; they
            are similarities, higher is better, not distances).

        Returns
        -------
        scores : ndarray of shape (n, n_neighbors), float64
            Descending (only if ``return_distance``): heavy scores for anchor items,
            CUR approximations for the others (the scores of :meth:`predict`); ties
            are ordered by item index (lower first).
        indices : ndarray of shape (n, n_neighbors), int64
            Positions in ``items`` of the retrieved items, best first (the only
            output when ``return_distance=False``).
        """
        check_bool(return_distance, "return_distance")
        self._check_fitted()
        check_positive(n_neighbors, "n_neighbors", integer=True)
        if n_neighbors > self.n_items_:
            raise ValueError(f"n_neighbors={n_neighbors} must be <= n_items ({self.n_items_}).")
        s, idx = self._search(queries, top=int(n_neighbors))
        scores, indices = to_numpy(s), to_numpy(idx).astype(np.int64)
        return (scores, indices) if return_distance else indices
