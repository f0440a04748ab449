"""Shared machinery of the heavy-ranker retrievers: checked heavy calls and persistence.

Every retriever of this package (:class:`RelevanceBasedRetriever`,
:class:`AnnCURRetriever`, :class:`AdaCURRetriever`) calls a user-supplied heavy
ranker ``relevance_fn(queries, items) -> (n_queries, n_items)`` on arbitrary
sequences and cannot store that callable nor the items in a ``weights_only`` file;
the mixin below holds the code they share for both.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any, Self, TypeGuard, cast

import numpy as np
import torch

from mlpapers._base import save as _save
from mlpapers._utils import (
    ArrayLike,
    check_positive,
    meta_tensor_error,
    to_numpy,
    torch_compatible_array,
    user_stacklevel,
)
from mlpapers.retrieval.rbe._kernels import check_matrix, hit_counts
from mlpapers.retrieval.rbe._selection import check_support_indices

if TYPE_CHECKING:  # the estimator base every retriever mixes this in with
    from mlpapers._base import TorchEstimatorMixin as _EstimatorBase
else:
    _EstimatorBase = object

__all__ = ["HeavyRankerMixin", "fresh", "length", "take", "warn_common_offset",
           "warn_near_interpolation"]


def warn_near_interpolation(n_unknowns: int, n_fit: int, ridge: float, unknowns: str,
                            held_out: int = 0) -> None:
    """Warn when a least-squares fit on the training queries sits at its interpolation
    threshold.

    With ``ridge=0`` and as many unknowns as training queries (within 10%), the fit
    interpolates the training queries and its held-out error peaks (double descent),
    whatever chose the unknowns: on an RBF kernel of digits with 80 training queries,
    HitRate@10 was 0.005 with greedy's 79 supports and an intercept, 0.39 with 80 random
    ones, against 0.71 with 60 and 0.81 with 150; ADACUR with 100 calls per query on
    100 anchor queries 0.10, against 0.88 on 90.
    """
    if float(ridge) > 0 or not 0.9 * n_fit <= n_unknowns <= 1.1 * n_fit:
        return
    warnings.warn(
        f"the least squares has {n_unknowns} unknowns ({unknowns}) for {n_fit} training "
        "queries" + (f" (after holding out {held_out} for validation)" if held_out else "")
        + " and ridge=0: it interpolates the training queries and held-out rankings "
        "can collapse. Use well fewer unknowns than training queries (about half) or well "
        "more, ridge > 0, or more training queries.", UserWarning, stacklevel=user_stacklevel())


def warn_common_offset(R: torch.Tensor, solve: str, limit: float = 1e6) -> None:
    """Warn when the training relevance shares an offset over ``limit`` times its spread.

    The plain (uncentred) CUR solves then lose digits to the offset: relevances
    ``q . i + c`` with a spread of about 2.4 (80 training queries, 60 items) kept the
    exact top-1 item for every test query up to ``c = 1e6``, but at ``c = 1e7`` ADACUR
    (whose Gram form squares the condition number) found it for 55% of them, and at
    ``c = 1e8`` AnnCUR for 35% (the centred RBE fit: 100%). Mean and spread are taken
    on at most about a million entries, in float64.
    """
    flat = R.reshape(-1)
    sample = flat[::max(1, flat.numel() // 2**20)].double()
    if sample.numel() < 2:
        return
    spread = float(sample.std())
    offset = abs(float(sample.mean()))
    if spread > 0 and offset > limit * spread:
        warnings.warn(
            f"the training relevance has a common offset {offset / spread:.2g} times its "
            f"spread (mean {offset:.4g}, standard deviation {spread:.4g}): {solve} "
            "loses digits to it and its rankings can come out wrong. Subtract a "
            "constant from relevance_fn's output (or the relevance matrix) first, or use "
            "a centred fit (RelevanceBasedRetriever, or standardize=True).", UserWarning,
            stacklevel=user_stacklevel())


def length(seq: Any, name: str) -> int:
    """``len(seq)``, with clear errors for unsized, empty or single-string inputs."""
    if isinstance(seq, (str, bytes)):
        # a lone query string would otherwise be iterated character by character and
        # reach relevance_fn as one-letter "queries"
        raise TypeError(f"{name} must be a sequence (list, array, tensor), got a single "
                        f"{type(seq).__name__}; wrap a single element in a list, e.g. [query].")
    try:
        n = len(seq)
    except TypeError as exc:
        raise TypeError(f"{name} must be a sized sequence (list, array, tensor), "
                        f"got {type(seq).__name__}.") from exc
    if (isinstance(seq, (Set, Mapping)) or not hasattr(type(seq), "__getitem__")):
        # (a set has no order nor positions: its elements were taken by index after the
        # heavy calls, which failed only then, with "'set' object is not subscriptable")
        raise TypeError(f"{name} must be an indexable sequence (list, tuple, array, "
                        f"tensor, pandas object), got {type(seq).__name__}; pass a list "
                        f"of its elements"
                        + (" in the order you want (a set's is arbitrary)."
                           if isinstance(seq, Set) else "."))
    if n == 0:
        raise ValueError(f"{name} is empty; at least one element is required.")
    return n


def take(seq: Any, idx: np.ndarray) -> Any:
    """``seq[idx]`` for arrays/tensors, positional rows of pandas objects, a list
    comprehension for other sequences."""
    if hasattr(seq, "iloc"):  # pandas DataFrame / Series: rows by position, not label
        return seq.iloc[np.asarray(idx, dtype=np.int64)]
    if isinstance(seq, np.ndarray):
        return seq[idx]
    if isinstance(seq, torch.Tensor):
        # detached: the retrievers never differentiate through relevance_fn, and a slice
        # of a tensor that requires grad kept a graph in ``support_items_``
        return seq.detach()[torch.as_tensor(idx, dtype=torch.long, device=seq.device)]
    return [seq[int(i)] for i in idx]


def check_item_indices(est: Any, name: str) -> None:
    """Refuse a loaded ``est.<name>`` that is not a 1-D array of distinct item indices
    in ``[0, n_items_)`` (a damaged file failed later, at :meth:`load`'s ``take`` or
    at the first query, with an ``IndexError``)."""
    try:
        check_support_indices(getattr(est, name), int(est.n_items_))
    except ValueError as exc:
        raise ValueError(f"{name} must hold distinct item indices in "
                         f"[0, {int(est.n_items_)}): {exc}") from None


def fresh(seq: Any) -> Any:
    """A new container holding the elements of ``seq`` (arrays, tensors, pandas objects
    and lists, whose type ``take`` keeps); other sequences are returned as given.

    What the retrievers hand ``relevance_fn`` besides the catalogue: a heavy ranker
    that modifies its arguments in place (in-place normalisation, scratch space) then
    never changes the estimator's ``support_items_`` nor the queries a later heavy call
    of the same search reads (the rerank, the next ADACUR round), whatever
    ``batch_size``. Elements of a list are the same objects (not deep-copied).
    """
    if hasattr(seq, "iloc") or isinstance(seq, (np.ndarray, torch.Tensor, list)):
        return take(seq, np.arange(len(seq)))
    return seq


def _matrix_shape(a: np.ndarray | torch.Tensor, name: str) -> tuple[int, ...]:
    """The shape of a real-dtype numpy array or strided real torch tensor, read without
    a pass over its values (a ``ValueError`` naming ``name`` unless it is 2-D); the
    values (NaN, inf) are left to :func:`check_matrix`."""
    shape = tuple(int(n) for n in a.shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D (n_queries, n_items), got shape {shape}.")
    return shape


def _is_real_array(a: Any) -> TypeGuard[np.ndarray | torch.Tensor]:
    """Whether ``a`` is a numpy array of a real dtype or a dense real torch tensor: the
    inputs whose shape can be checked before the values are read (anything else,
    object or string arrays, nullable pandas columns, nested lists, needs the full
    conversion of :func:`check_matrix` anyway, and gets its messages)."""
    if isinstance(a, np.ndarray):
        return a.dtype.kind in "biuf"
    return (isinstance(a, torch.Tensor) and a.layout == torch.strided
            and not a.is_complex())


class HeavyRankerMixin(_EstimatorBase):
    """Checked calls of ``relevance_fn`` and save/load without the callable and items.

    Subclasses define ``relevance_fn``, ``batch_size``, ``items_``, ``n_items_`` and
    may override :meth:`_attach_items` (re-derive item-dependent attributes after
    :meth:`load`).
    """

    _NOT_SAVED: tuple[str, ...] = ("items_",)

    # set by the estimator that mixes this in
    relevance_fn: Callable[[Any, Any], Any] | None
    batch_size: int
    items_: Any
    n_items_: int

    if TYPE_CHECKING:
        def kneighbors(self, queries: Any, n_neighbors: int = 10,
                       return_distance: bool = True) -> Any: ...

    # -- heavy calls -----------------------------------------------------------
    def _check_relevance_fn(self, when: str = "fit") -> None:
        if not callable(self.relevance_fn):
            if when == "fit":
                raise TypeError("relevance_fn must be a callable relevance_fn(queries, items) "
                                f"-> scores, got {type(self.relevance_fn).__name__}.")
            raise TypeError("relevance_fn must be set (a callable) to score queries; "
                            "pass it to load() or set_params().")

    def _heavy(self, queries: Any, items: Any, n_q: int, n_i: int) -> torch.Tensor:
        """One call of ``relevance_fn``, checked: ``-> float64 Tensor (n_q, n_i)``."""
        # callable: fit and every search check it (_check_relevance_fn) before a heavy call
        relevance_fn = cast(Callable[[Any, Any], Any], self.relevance_fn)
        out = relevance_fn(queries, items)
        if isinstance(out, torch.Tensor) and out.is_meta:
            # (to_numpy's ValueError, read below as "not a numeric array", named no cause)
            raise meta_tensor_error("relevance_fn's output",
                                    "it must return scores with data")
        try:
            arr = to_numpy(out)
            if arr.dtype.kind not in "biuf":  # complex, strings, objects (None)
                raise TypeError("not real numbers")
            # float64, writable (pandas' copy-on-write and cached read-only arrays would
            # make torch warn), copied at most once
            t = torch.from_numpy(torch_compatible_array(np.asarray(arr, dtype=np.float64)))
        except (TypeError, ValueError) as exc:
            dtype = getattr(out, "dtype", None)
            raise TypeError("relevance_fn must return a real numeric array of shape "
                            f"(n_queries, n_items), got {type(out).__name__}"
                            f"{'' if dtype is None else f' of dtype {dtype}'}.") from exc
        if tuple(t.shape) != (n_q, n_i):
            hint = (" (transposed? rows must be queries, columns items)"
                    if tuple(t.shape) == (n_i, n_q) else "")
            raise ValueError(f"relevance_fn returned shape {tuple(t.shape)}, expected "
                             f"(n_queries, n_items) = ({n_q}, {n_i}){hint}.")
        if not bool(torch.isfinite(t).all()):
            raise ValueError("relevance_fn returned NaN or infinite scores.")
        return t.to(self._resolved_device)

    def _heavy_chunked(self, queries: Any, items: Any, n_i: int, *,
                       online: bool = False) -> torch.Tensor:
        """All queries against the same items, in chunks of ``batch_size`` queries.

        Every call gets its own copy of the queries (:func:`fresh`): a relevance_fn
        that modifies its arguments in place must not change what the next chunk or a
        later heavy call of the same search reads. ``online`` (the estimator's own
        support/anchor items, never the catalogue) also copies the items per call and
        returns scores the estimator owns: a relevance_fn may return the same buffer at
        every call (CUDA-graph replays, I/O-binding runtimes), and the next heavy call of
        the search overwrote the scores kept from this one.
        """
        # read at every call (set_params after fit): a negative value made the chunk loop
        # empty, returning an unfilled buffer as scores
        n, bs = len(queries), int(check_positive(self.batch_size, "batch_size", integer=True))
        if n_i == 0:  # no support item (greedy found nothing to explain): no heavy call
            return torch.zeros((n, 0), dtype=torch.float64, device=self._resolved_device)

        def items_for_call() -> Any:
            return fresh(items) if online else items

        if n <= bs:
            # (offline, fit uses the matrix as returned, without a copy of its size:
            # no other heavy call is made while it is in use)
            t = self._heavy(fresh(queries), items_for_call(), n, n_i)
            return t.clone() if online else t
        # filled in place: the chunks and their concatenation are never held together
        out = torch.empty((n, n_i), dtype=torch.float64, device=self._resolved_device)
        for s in range(0, n, bs):
            e = min(s + bs, n)
            out[s:e] = self._heavy(take(queries, np.arange(s, e)), items_for_call(), e - s, n_i)
        return out

    def _offline_relevance(self, train_queries: Any, items: Any,
                           relevance_matrix: Any) -> tuple[torch.Tensor, int]:
        """Training relevance ``(n_queries, n_items)`` and the heavy pairs it cost.

        Computed with ``relevance_fn`` when ``relevance_matrix`` is None, else checked.
        """
        n_q, N = len(train_queries), len(items)
        if relevance_matrix is None:
            return self._heavy_chunked(train_queries, items, N), n_q * N
        R = check_matrix(relevance_matrix, "relevance_matrix", self._device)
        if tuple(R.shape) != (n_q, N):
            raise ValueError(f"relevance_matrix must have shape (n_queries, n_items) = "
                             f"({n_q}, {N}), got {tuple(R.shape)}.")
        return R, 0

    def _heavy_per_query(self, queries: Any, idx: torch.Tensor) -> torch.Tensor:
        """Each query against its own items: ``idx (n, m) -> scores (n, m)``.

        One ``relevance_fn`` call of shape ``(1, m)`` per query: exactly ``m`` pairs.
        """
        n, m = idx.shape
        # each row copied out at once: a list of the returned rows stacked at the end
        # held views of one buffer when relevance_fn reuses its output buffer (every
        # row then read the last query's scores)
        out = torch.empty((n, m), dtype=torch.float64, device=self._resolved_device)
        for q in range(n):
            out[q] = self._heavy(take(queries, np.array([q])),
                                 take(self.items_, to_numpy(idx[q]).astype(np.int64)), 1, m)[0]
        return out

    # -- evaluation ------------------------------------------------------------------
    def score(self, queries: Any, relevance: ArrayLike | None = None,
              n_neighbors: int = 10) -> float:
        """HitRate@``n_neighbors`` against the true relevance of ``queries`` to all items.

        The retrieved items are those of :meth:`kneighbors` (its online heavy calls
        are made); the true top items use a stable sort of the relevance (ties go to
        the lower item index), as in :func:`~mlpapers.retrieval.rbe.hit_rate`.

        Parameters
        ----------
        queries : sequence of length n
            Evaluation queries, in any form ``relevance_fn`` accepts (numpy array,
            torch tensor, list, pandas object, ...); a single query must be wrapped in
            a list.
        relevance : array-like of shape (n, n_items) or None, default=None
            Heavy-ranker relevance (ground truth). ``None`` computes it with
            ``relevance_fn`` (``n * n_items`` heavy calls, in chunks of ``batch_size``
            queries), which is what scikit-learn's model selection does when it calls
            ``score(X_test)``, e.g.
            ``GridSearchCV(est, {"n_support": [...]}).fit(train_queries, items=items)``
            (with as many items as training queries, scikit-learn splits ``items``
            too: see ``fit``).
            A relevance of another shape (or without a 2-D shape) raises a
            ``ValueError``, a sparse or non-real one a ``TypeError``, before any heavy
            call. NaN or infinite values raise a ``ValueError``: once the items are
            retrieved for a numpy array of a real dtype or a torch tensor (its values
            are read once, by the check :func:`~mlpapers.retrieval.rbe.hit_rate` also uses), before
            any heavy call for other array-likes (object arrays, lists, pandas
            objects), which are converted up front.
        n_neighbors : int, default=10
            The cut-off ``k`` of HitRate@k: items retrieved per query, compared with
            the true top ``k``. A positive integer ``<= n_items`` (and, for
            :class:`RelevanceBasedRetriever` with re-ranking, ``<= n_rerank``).

        Returns
        -------
        float
            HitRate@k in ``[0, 1]``: the fraction of each query's true top ``k``
            items that were retrieved, averaged over the queries.
        """
        self._check_fitted()
        if relevance is not None:
            # checked before kneighbors spends its online heavy calls: a relevance of
            # another catalogue (more columns) was scored without an error, and a wrong
            # number of rows raised about ``pred_indices`` afterwards
            # A real numpy array or tensor: only its shape here (no pass over the
            # values, no float64 copy held while kneighbors runs); hit_counts validates
            # it fully, once. Anything else (object, Decimal or numeric-string arrays,
            # nullable pandas columns, lists, sparse) is converted, and so validated,
            # now: a conversion is needed anyway, and check_matrix knows those types
            shape = (length(queries, "queries"), self.n_items_)
            if _is_real_array(relevance):
                got = _matrix_shape(relevance, "relevance")
            else:
                relevance = check_matrix(relevance, "relevance")
                got = tuple(relevance.shape)
            if got != shape:
                raise ValueError(f"relevance must have shape (n_queries, n_items) = {shape}, "
                                 f"got {got}.")
        idx = self.kneighbors(queries, n_neighbors, return_distance=False)
        if relevance is not None:
            # hit_rate's value, with errors naming this method's parameter
            given_hits, k = hit_counts(relevance, idx, n_neighbors, name="relevance")
            return int(given_hits.sum()) / (len(given_hits) * k)
        # the heavy ranker as ground truth, chunk by chunk (one chunk of batch_size x
        # n_items scores alive at a time); integer hits summed, so the value is exactly
        # that of hit_rate on the whole matrix
        n, bs, hits = len(idx), int(check_positive(self.batch_size, "batch_size",
                                                   integer=True)), 0
        for s in range(0, n, bs):
            rows = np.arange(s, min(s + bs, n))
            R = self._heavy(take(queries, rows), self.items_, len(rows), self.n_items_)
            chunk_hits, k = hit_counts(R, idx[rows], n_neighbors)
            hits += int(chunk_hits.sum())
            del R, chunk_hits
        return hits / (n * k)

    # -- persistence -------------------------------------------------------------
    def _attach_items(self, items: Any) -> None:
        """Set ``items_`` (and what derives from it) after :meth:`load`."""
        self.items_ = items

    def _get_state(self) -> dict[str, Any]:
        return {k: v for k, v in super()._get_state().items() if k not in self._NOT_SAVED}

    def save(self, path: str | os.PathLike) -> None:
        """Save parameters and fitted numbers; not ``relevance_fn`` nor ``items``.

        A callable cannot be stored safely (loading it would need unpickling), so the
        file holds the other parameters and the fitted numbers; :meth:`load` takes
        ``relevance_fn`` and ``items`` again.

        Parameters
        ----------
        path : str or path-like
            Destination file (written with ``torch.save``; overwritten if it exists).
        """
        # a shallow copy without the callable is saved: setting ``relevance_fn = None`` on
        # the estimator itself for the duration made a kneighbors running at the same time
        # in another thread fail ("relevance_fn must be set")
        clone = copy.copy(self)
        clone.relevance_fn = None
        _save(clone, path)

    @classmethod
    def load(  # type: ignore[override]  # also takes relevance_fn and items (required)
        cls, path: str | os.PathLike, relevance_fn: Callable[[Any, Any], Any] | None = None,
        items: Any = None, map_location: Any = "cpu",
    ) -> Self:
        """Load a retriever written by :meth:`save` (``weights_only=True``).

        Parameters
        ----------
        path : str or path-like
            File written by :meth:`save`.
        relevance_fn : callable
            The heavy ranker (not stored in the file); required.
        items : sequence of length n_items
            The catalogue used in ``fit`` (not stored in the file); required, with
            the fitted number of items in the same order (the file stores item
            indices, not items).
        map_location : str or torch.device, default="cpu"
            Where the file's tensors are read to (``torch.load``'s
            ``map_location``); the loaded retriever then computes on the device of
            its ``device`` parameter (a neural head is moved there; a saved device
            this machine does not have becomes this one, with a warning).

        Returns
        -------
        estimator
            A fitted instance of this class, ready for :meth:`kneighbors`.

        Raises
        ------
        TypeError
            If ``relevance_fn`` is not callable or ``items`` is missing.
        ValueError
            If ``items`` does not have the fitted number of items.
        """
        if not callable(relevance_fn):
            raise TypeError("load() needs relevance_fn=<callable>: the heavy ranker is not "
                            "stored in the file.")
        if items is None:
            raise TypeError("load() needs items=<the catalogue passed to fit>: items are "
                            "not stored in the file.")
        est = super().load(path, map_location=map_location)
        if length(items, "items") != est.n_items_:
            raise ValueError(f"items has {len(items)} elements, the saved retriever was "
                             f"fitted on {est.n_items_}.")
        est.relevance_fn = relevance_fn
        est._attach_items(items)
        return est

    # -- scikit-learn integration ----------------------------------------------------
    @classmethod
    def _estimator_check_instances(cls) -> list:
        # fit(train_queries, items, relevance_matrix) with a heavy-ranker callable is
        # outside scikit-learn's fit(X, y) contract, so the generic checks do not apply.
        return []
