"""Exact maximum inner product search (the reference) and the shared database shell."""

from __future__ import annotations

from typing import Any, Literal, Self, overload

import numpy as np
import torch
from sklearn.base import BaseEstimator

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    check_bool,
    check_in_options,
    check_positive,
    check_tensor,
    on_inputs_device,
    to_numpy,
)
from mlpapers.retrieval.amips._kernels import METRICS, Metric, _hits, _KeyStats, _mips_topk

__all__ = ["ExactMIPS", "build_faiss_ivf"]


def _check_n_neighbors(n_neighbors: Any, n_keys: int) -> int:
    check_positive(n_neighbors, "n_neighbors", integer=True)
    if n_neighbors > n_keys:
        raise ValueError(
            f"n_neighbors must be <= the number of keys in the database ({n_keys}), "
            f"got {n_neighbors}."
        )
    return int(n_neighbors)


class _MIPSBase(TorchEstimatorMixin, BaseEstimator):
    """Shared database handling."""

    def _keys(self) -> torch.Tensor:
        dev = self._resolved_device
        cached = getattr(self, "_keys_cache", None)
        if cached is None or cached.device != dev or cached.shape != self.database_.shape:
            cached = torch.from_numpy(self.database_).to(dev)
            self._keys_cache = cached
        return cached

    def _key_stats(self) -> _KeyStats:
        """Scale statistics of the keys (:class:`_KeyStats`: the bound ``sqrt(d) max|k_ij|``
        on their norms and, once needed, the smallest nonzero ``|k_ij|``), cached with
        them (a pass over the database per search would double the cost of a single
        query)."""
        keys = self._keys()
        cached = getattr(self, "_key_stats_cache", None)
        if cached is None or cached[0] is not keys:
            cached = (keys, _KeyStats(keys))
            self._key_stats_cache = cached
        return cached[1]

    def _fit_database(self, X: ArrayLike) -> torch.Tensor:
        keys = self._validate_data(X, reset=True, dtype=torch.float32)
        self.database_ = self._to_numpy(keys).astype(np.float32, copy=False)
        self._keys_cache = keys
        self._key_stats_cache = (keys, _KeyStats(keys))  # set here: predict keeps __dict__
        return keys

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_keys_cache", None)
        state.pop("_key_stats_cache", None)
        state.pop("_centred_cache", None)
        return state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        return tags


class ExactMIPS(_MIPSBase):
    """Exact maximum inner product search by chunked matmul + top-k (the reference).

    Parameters
    ----------
    batch_size : int, default=8192
        Most queries scored per chunk; a chunk also holds at most ``2**26`` scores
        (memory ``min(batch_size, 2**26 / n_keys) x n_keys`` floats, 256 MiB at most,
        see :func:`mips_topk`).
    device : str or torch.device, default="cpu"
        Torch device of the search (``"cpu"``, ``"cuda"``, ...).

    Attributes
    ----------
    database_ : ndarray of shape (n_keys, n_features), float32
        The keys: float32 keys are kept without a copy (as scikit-learn's
        ``NearestNeighbors`` keeps its data), so changing them in place after ``fit``
        changes the database; refit after such a change.
    n_features_in_ : int
        Number of features (the dimension ``d`` of the keys).

    Notes
    -----
    :meth:`kneighbors` returns *similarities* (inner products) in *descending*
    order, unlike scikit-learn's ``NearestNeighbors`` whose distances ascend.
    Exact ties are ordered by index (lowest first), as by a stable sort. Ties are
    those of the computed float32 scores: two copies of a key can score one unit
    in the last place apart (the BLAS rounding depends on the row and on the number
    of queries in a chunk), so which copy comes first may change with the batch;
    deduplicate the database when that matters.

    The search runs in float32 (``database_`` is stored in float32): float64 or
    int64 data are rounded to float32 first, so keys whose inner products differ by
    less than the float32 rounding (about ``1e-7`` relative) can come back as ties,
    lowest index first. The answers do not depend on the scale of the data: rows
    whose products leave the normal float32 range are searched again rescaled
    (see :func:`mips_topk`), so keys and queries of norm ``1e-30`` or ``1e30`` are
    ranked exactly; similarities beyond ``3.4e38`` raise a ``ValueError`` (they
    cannot be returned), and those below ``1.2e-38`` are returned as float32
    subnormals or 0.

    References
    ----------
    .. [1] T. X. Olausson, J. Monteiro, M. Klein, M. Cuturi, "Amortizing Maximum Inner
       Product Search with Learned Support Functions", ICML 2026, arXiv:2603.08001.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval import ExactMIPS
    >>> keys = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    >>> mips = ExactMIPS().fit(keys)
    >>> mips.predict([[1.0, 0.1], [0.1, 1.0]])
    array([0, 1])
    >>> sims, idx = mips.kneighbors([[1.0, 1.0]], n_neighbors=2)
    >>> sims, idx
    (array([[2., 1.]], dtype=float32), array([[1, 0]]))
    """

    _uses_random_state = False  # an exact search draws no random numbers

    def __init__(self, *, batch_size: int = 8192, device: str | torch.device = "cpu") -> None:
        self.batch_size = batch_size
        self.device = device

    @restore_on_failure
    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Store the database of keys.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_keys, n_features)
            The keys (numpy arrays, array-likes or torch tensors), stored in float32.
        y : None
            Ignored.

        Returns
        -------
        self : ExactMIPS
            The fitted estimator.
        """
        check_positive(self.batch_size, "batch_size", integer=True)
        self._init_fit()
        self._fit_database(X)
        return self

    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ...,
                   return_distance: Literal[True] = ...) -> tuple[np.ndarray, np.ndarray]: ...
    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ..., *,
                   return_distance: Literal[False]) -> np.ndarray: ...
    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ..., return_distance: bool = ...
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray: ...
    def kneighbors(self, X: ArrayLike, n_neighbors: int = 10, return_distance: bool = True
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
        """Exact top-``n_neighbors`` keys by inner product.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features)
            Queries (numpy arrays, array-likes or torch tensors), searched in float32.
        n_neighbors : int, default=10
            Number of keys returned per query, in ``[1, n_keys]`` (the default of
            :meth:`AmortizedMIPS.kneighbors` too, so that both rank alike;
            :meth:`predict` is the top 1).
        return_distance : bool, default=True
            Also return the similarities.

        Returns
        -------
        similarities : ndarray of shape (n_queries, n_neighbors), float32
            Inner products, descending (only if ``return_distance``).
        indices : ndarray of shape (n_queries, n_neighbors), int64
            Row indices in ``database_`` of the keys, best first (exact ties: lowest
            index first).
        """
        check_bool(return_distance, "return_distance")
        Q = self._validate_data(X, reset=False, dtype=torch.float32)
        k = _check_n_neighbors(n_neighbors, self.database_.shape[0])
        s, i = self._search(Q, k)
        if return_distance:
            return self._to_numpy(s), self._to_numpy(i)
        return self._to_numpy(i)

    def _search(self, Q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` of validated queries ``Q`` (n, d): ``-> (scores, indices)``.

        :func:`mips_topk` rescales the rows whose products leave the float32 range, so
        tiny products are ranked exactly; products beyond it raise.
        """
        check_positive(self.batch_size, "batch_size", integer=True)
        s, i = _mips_topk(Q, self._keys(), k, self.batch_size, self._key_stats())
        if not bool(torch.isfinite(s).all()):
            raise ValueError("inner products of X with the keys overflow float32 (beyond "
                             "3.4e38); rescale the queries or the keys (MIPS answers do "
                             "not depend on it).")
        return s, i

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Index of the key with the largest inner product.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features)
            Queries (numpy arrays, array-likes or torch tensors), searched in float32.

        Returns
        -------
        ndarray of shape (n_queries,), int64
            Row index in ``database_`` of the maximising key (the lowest on exact ties).
        """
        Q = self._validate_data(X, reset=False, dtype=torch.float32)
        return self._to_numpy(self._search(Q, 1)[1][:, 0])

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Match rate against exact search (1.0 by construction, ties included).

        Kept for the common interface of :class:`AmortizedMIPS` (a sanity check of the
        search).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features)
            Queries (numpy arrays, array-likes or torch tensors), searched in float32.
        y : None
            Ignored: the exact answers are recomputed from the database.

        Returns
        -------
        float
            The fraction of queries whose answer attains the largest inner product
            (1.0): computed in float64, a key ``k_pred`` counts as a tie of the
            maximiser ``k_max`` when its product is within
            ``||q|| * (1e-6 * ||k_max - k_pred|| + (d + 2) * 1.2e-7 * (||k_max|| +
            ||k_pred||))`` of the maximum (the ``rtol`` term of :func:`match_rate`
            plus the float32 rounding of this search, ``1.2e-7`` being float32's
            epsilon), see Notes.
        """
        Q = self._validate_data(X, reset=False, dtype=torch.float32)
        # validated once: a second validation of the tensor would warn about
        # missing feature names after a fit on a DataFrame
        pred = self._search(Q, 1)[1][:, 0]
        # the tie-aware check searches again, in chunks of batch_size like kneighbors;
        # this search ran in float32, so keys within its rounding of the maximum are
        # ties of it (round_eps, see Notes), at any scale of the data
        hits = _hits(None, pred[:, None], Q, self._keys(), 1e-6, self.batch_size,
                     round_eps=torch.finfo(torch.float32).eps)
        return float(hits[:, 0].double().mean())

    @classmethod
    def _estimator_check_instances(cls) -> list:
        return [cls(batch_size=7)]


#: training keys per k-means cell below which faiss warns (its ``min_points_per_centroid``)
_FAISS_KEYS_PER_LIST = 39


@on_inputs_device
def build_faiss_ivf(database: ArrayLike, n_lists: int | None = None,
                    metric: Metric = "ip") -> Any:
    """A faiss ``IndexIVFFlat`` over ``database`` (inner-product or L2 quantizer).

    The approximate index of the paper's main evaluation: search it with the keys
    predicted by :meth:`AmortizedMIPS.transform`. Needs the optional ``faiss-cpu``
    package (the ``bench`` extra); an ``ImportError`` says so otherwise.

    Parameters
    ----------
    database : array-like or torch.Tensor of shape (n_keys, d)
        The keys, finite; copied to a contiguous float32 array (faiss's dtype).
    n_lists : int or None, default=None
        Number of inverted lists (k-means cells), an integer in ``[1, n_keys]``
        (k-means needs at least one key per cell); ``None`` uses ``int(sqrt(n_keys))``
        (the official setting), capped at ``n_keys // 39`` (at least 1): faiss's k-means
        wants 39 training keys per cell and prints a warning to stderr, which Python
        cannot silence, for fewer (except with a single list).
    metric : {"ip", "l2"}, default="ip"
        Inner product (the official setting, with an IP quantizer) or L2.

    Returns
    -------
    faiss.IndexIVFFlat
        Trained and filled; set ``index.nprobe`` before ``index.search(q, k)``
        (``index.nprobe = n_lists`` visits every list: an exact search; the AMIPS
        paper's runs visit about 5% of the lists, ``max(1, round(0.05 * n_lists))``).
        faiss computes in float32: the products of the queries with the keys must
        stay in its range (keys and queries of norm around 1e19, such as the keys
        :meth:`AmortizedMIPS.transform` predicts for such a database, overflow;
        rescale both by a power of two, which changes no ranking), and exact ties
        come out in faiss's order, not lowest index first as in :class:`ExactMIPS`.

    Raises
    ------
    ValueError
        For a database that is not finite, not 2-D or empty, an ``n_lists`` outside
        ``[1, n_keys]``, or keys whose squared norms overflow float32 in faiss's
        k-means (norm above about ``9e18``: faiss aborted the process).

    Examples
    --------
    >>> import importlib.util
    >>> import numpy as np
    >>> from mlpapers.retrieval.amips import ExactMIPS, build_faiss_ivf
    >>> keys = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
    >>> queries = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    >>> exact = ExactMIPS().fit(keys).predict(queries)
    >>> if importlib.util.find_spec("faiss") is not None:  # the optional faiss-cpu
    ...     index = build_faiss_ivf(keys, n_lists=4)
    ...     index.nprobe = 4  # every list: exact
    ...     found = index.search(queries, 1)[1][:, 0]
    ... else:
    ...     found = exact
    >>> bool((found == exact).all())
    True
    """
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ImportError("build_faiss_ivf needs faiss: pip install faiss-cpu "
                          "(the mlpapers[bench] extra).") from exc
    check_in_options(metric, "metric", METRICS)
    # validated here: faiss failed with C++ traces on NaN, empty or 1D databases, and
    # silently built an empty index for n_lists=0 (and truncated 2.5 to 2)
    # (check_tensor: sklearn's check_array named no argument for a 3-D or empty database)
    keys = np.ascontiguousarray(to_numpy(check_tensor(database, name="database", ndim=2,
                                                      dtype=torch.float32)))
    n, d = keys.shape
    largest = float(np.sqrt(np.max(np.einsum("ij,ij->i", keys, keys, dtype=np.float64))))
    if not 4 * largest**2 < float(np.finfo(np.float32).max):
        # (k-means' squared distances, up to (2 max |k|)^2, overflowed float32: faiss
        # threw "invalid cluster assignment" in C++ and the process aborted)
        raise ValueError(f"database has keys of norm up to {largest:.3g}; faiss computes "
                         "squared distances in float32, which overflow above a norm of "
                         "about 9e18: rescale the keys (divide them by a power of two, "
                         "which changes no ranking).")
    if n_lists is None:
        n_lists = max(1, min(int(np.sqrt(n)), n // _FAISS_KEYS_PER_LIST))
    else:
        check_positive(n_lists, "n_lists", integer=True)
        if n_lists > n:
            raise ValueError(f"n_lists must be <= the number of keys ({n}): k-means needs "
                             f"at least one key per list, got n_lists={n_lists}.")
        n_lists = int(n_lists)
    quantizer: faiss.IndexFlat
    if metric == "ip":
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, n_lists, faiss.METRIC_INNER_PRODUCT)
    else:
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quantizer, d, n_lists, faiss.METRIC_L2)
    if n_lists == 1:  # one cell is the whole database: nothing to warn about
        index.cp.min_points_per_centroid = 1
    index.train(keys)
    index.add(keys)
    return index
