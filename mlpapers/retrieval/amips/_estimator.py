"""Amortized MIPS (SupportNet / KeyNet) as a scikit-learn style estimator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Self, overload

import numpy as np
import torch
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from torch import nn

from mlpapers._base import restore_on_failure
from mlpapers._utils import ArrayLike, RandomStateLike, check_bool, with_autograd
from mlpapers._utils._docs import fill_doc
from mlpapers.retrieval.amips._config import Arch, build_amips_model, check_amips_params
from mlpapers.retrieval.amips._exact import (
    _check_n_neighbors,
    _MIPSBase,
    build_faiss_ivf,
)
from mlpapers.retrieval.amips._kernels import Metric, _KeyStats, match_rate
from mlpapers.retrieval.amips._networks import AMIPSNetwork
from mlpapers.retrieval.amips._retrieve import (
    check_predicted_keys,
    float32_similarities,
    predict_top1,
    retrieve,
    score_and_key,
    uncentre,
)
from mlpapers.retrieval.amips._training import QuerySource, centre, fit_amips

__all__ = ["AmortizedMIPS"]


# the ``X`` entry of every query-taking method (fill_doc puts it in place)
_QUERIES_X = """\
X : array-like or torch.Tensor of shape (n_queries, n_features)
    Queries (numpy arrays, array-likes or torch tensors), in float32; none
    may be zero."""

def _ndim(value) -> int:
    """Number of dimensions of an array-like; 2 for anything ``np.asarray`` rejects (a
    ragged nested list, e.g. ``[[1], 2, 3]``), which :meth:`AmortizedMIPS.fit` thus
    refuses as ``y`` with its ``TypeError`` (rows of queries, not labels)."""
    if isinstance(value, torch.Tensor):
        return value.ndim
    try:
        return np.asarray(value).ndim
    except (TypeError, ValueError):
        return 2


class AmortizedMIPS(ClassNamePrefixFeaturesOutMixin, TransformerMixin, _MIPSBase):
    r"""Amortized maximum inner product search with a learned support function [1]_.

    Learns a map :math:`x \mapsto \hat k(x)` from a query to the key with the
    largest inner product, by regressing the support function
    :math:`\sigma_K(x) = \max_i\langle x, k_i\rangle` (convex, 1-homogeneous) and its
    gradient, the argmax key :math:`k^*(x) = \nabla\sigma_K(x)`:

    * ``arch="supportnet"``: an input-convex network :math:`f` (optionally
      homogenized, :math:`f(x) = \|x\| h(x/\|x\|)`), key :math:`\nabla f(x)` by
      autograd; training matches the score and the gradient (double backprop).
    * ``arch="keynet"``: an unconstrained network predicting the key, with the
      Euler score :math:`\langle x, \hat k(x)\rangle`.

    The loss is ``score_weight * MSE(score, sigma_K(x)) + target_weight * MSE(key, k*)``,
    with exact labels computed on the fly by chunked search over the database.
    Training uses Adam with NaN-zeroing and global-norm gradient clipping, a
    warmup-cosine learning rate and an exponential moving average (EMA) of the
    weights, which is the model kept for inference.

    Parameters
    ----------
    arch : {"keynet", "supportnet"}, default="keynet"
        The model: :class:`KeyNet` (predicts the key) or :class:`SupportNet`
        (predicts the support value; the key is its gradient).
    depth : int, default=8
        Number of hidden layers.
    hidden_dim : int or None, default=None
        Hidden width. ``None`` solves it from the parameter budget
        ``params_fraction * n_keys * n_features`` (rounded to a multiple of 4, at
        least 16).
    params_fraction : float, default=0.2
        Parameter budget of the network as a fraction (> 0) of the database's size
        ``n_keys * n_features`` (the paper's 20%); used when ``hidden_dim`` is
        ``None`` (see :func:`solve_width`).
    wx_inject : int or bool, default=4
        Re-inject the input every ``wx_inject`` layers (and at the output layer).
    negative_slope, beta : float, default=0.1, 20.0
        Soft-leaky-ReLU :math:`a t + (1-a)\,\mathrm{softplus}(\beta t)/\beta`.
    homogenize : bool, default=True
        Wrap SupportNet in the 1-homogeneous wrapper (ignored by KeyNet).
    resnet : bool, default=False
        KeyNet returns ``x + F(x)`` (ignored by SupportNet); the output layer of
        ``F`` is scaled by 0.01 at initialisation (as in the official code), so the
        model starts near the identity map.
    score_weight, target_weight : float, default=0.01, 1.0
        Loss weights of the score and the key terms.
    n_steps : int, default=2000
        Optimisation steps (each on a fresh batch of queries).
    batch_size : int, default=1024
        Training batch size; also the chunk size at inference. On a CPU budget,
        more steps of a smaller batch (e.g. 256, with ``lr=1e-2``) train faster
        per CPU second (see the user guide's learning curve).
    lr : float, default=3e-3
        Peak learning rate of Adam (the official FIQA config uses 2.83e-3).
    warmup : float, default=0.05
        Fraction of ``n_steps`` of linear warm-up from 0.
    end_lr_ratio : float, default=0.125
        Final learning rate as a fraction of ``lr`` (the official ratio).
    ema_decay : float, default=0.97
        EMA decay of the weights in [0, 1); 0 keeps the raw weights.
    grad_clip : float or None, default=1.0
        Global gradient-norm clipping.
    noise_std : float, default=0.02
        Noise augmentation: a drawn query ``q`` is replaced by
        ``||q|| * normalize(q + noise_std * ||q|| * eps)`` ...
    n_noise : int, default=10
        ... with probability ``n_noise / (n_noise + 1)``, which reproduces the
        paper's dataset of each query plus ``n_noise`` noisy copies.
    search_batch_size : int, default=8192
        Most queries per chunk of the exact label search in training, of the ranking
        with the predicted keys and of the exact search of :meth:`score`; a chunk also
        holds at most ``2**26`` scores (memory ``min(search_batch_size, 2**26 / n_keys)
        x n_keys``, see :func:`mips_topk`).
    retrieval : {"ip", "l2"}, default="ip"
        How the predicted key is turned into an index: ``"ip"`` ranks keys by
        :math:`\langle \hat k(x), k_j\rangle` (the paper's rule); ``"l2"`` ranks them
        by :math:`-\|\hat k(x) - k_j\|^2`. Both agree when all keys have the same
        norm (the paper's normalised embeddings); with varied norms ``"ip"`` can
        return a longer key than the predicted one (see the user guide).
    n_candidates : int, default=1
        :meth:`predict` (and :meth:`score`) re-rank the first ``n_candidates`` keys
        retrieved with the predicted key by their true inner product with the
        query (``n_candidates`` extra dot products per query, in float64 from the
        stored float32 keys, also with ``center_keys``, so that keys of a large norm
        or a large common offset are told apart; ``n_candidates = n_keys`` is exact
        search).
        ``1`` is the paper's rule; the match rate then equals the recall at
        ``n_candidates``.
        :meth:`kneighbors` with ``n_candidates > 1`` likewise returns the best
        ``n_neighbors`` of the first ``max(n_candidates, n_neighbors)`` keys by
        true inner product, in descending order (so its first column is
        :meth:`predict` when ``n_neighbors <= n_candidates``).
    center_keys : bool, default=False
        Train on the centred keys :math:`k_i - m`, :math:`m` their mean (stored as
        ``key_mean_``). The answers are the same in exact arithmetic,
        :math:`\arg\max_i\langle x, k_i - m\rangle = \arg\max_i\langle x, k_i\rangle`,
        and :math:`\sigma_{K-m}(x) = \sigma_K(x) - \langle x, m\rangle` is still
        convex and 1-homogeneous; but keys sharing a large common offset (raw
        features far from zero) otherwise differ by a tiny fraction of the units the
        network trains in (``key_scale_``) and it learns to answer every query with
        the same key. The methods answer in the original space: indices into
        ``database_``, similarities and :meth:`value` the original inner products,
        :meth:`predict_key` with ``key_mean_`` added back. The ranking
        (``retrieval``) compares the network's key in the centred space,
        :meth:`transform`, with the centred keys (for ``"ip"`` the same ranking as
        :meth:`transform` against the original keys), not :meth:`predict_key`
        (whose inner product with key :math:`k_j` adds :math:`\langle m, k_j\rangle`,
        which differs from key to key and can reorder them). Costs a centred copy
        of the database. ``False`` (the paper's setting, for normalised embeddings)
        trains on the keys as given.
    device : str or torch.device, default="cpu"
        Torch device of the training and the search (``"cpu"``, ``"cuda"``, ...).
    random_state : int, RandomState, Generator or None, default=None
        Seed of the initialisation, the training queries and the noise augmentation;
        an int gives reproducible fits.
    verbose : int, default=0
        Show a progress bar with the loss.

    Attributes
    ----------
    database_ : ndarray of shape (n_keys, n_features), float32
        The keys, without a copy when given in float32 (no second copy of a large
        database): changing them in place after ``fit`` changes the database but not
        the network trained on them (nor, with ``center_keys``, the centred copy
        that ranks them), so refit after such a change.
    model_ : torch.nn.Module
        The (EMA) trained network, in eval mode. It works in scaled units: it takes
        ``x / query_scale_`` and predicts keys ``k / key_scale_`` (``(k - key_mean_) /
        key_scale_`` with ``center_keys``; the estimator's methods convert).
    key_scale_, query_scale_ : float
        Units of the training: the powers of two nearest the root-mean-square norm of
        the keys (centred with ``center_keys``) and of the training queries (1.0 for
        unit-norm data). MIPS answers do not depend on the scale of the data, and
        neither does training.
    key_mean_ : ndarray of shape (n_features,), float32, or None
        The mean of the keys, subtracted from them in training and in the ranking
        when ``center_keys=True``; ``None`` otherwise.
    hidden_dims_ : tuple of int
        Widths of the hidden layers of ``model_``.
    n_params_ : int
        Number of trainable parameters of ``model_``.
    history_ : list of dict
        ``step``, ``loss``, ``score_loss``, ``key_loss``, ``lr`` every
        ``max(1, n_steps // 200)`` steps (losses in the scaled units).
    n_features_in_ : int
        Number of features (the dimension ``d`` of the keys).

    Notes
    -----
    * :meth:`fit` takes the *database* as ``X``; training queries come from
      ``queries``: ``None`` (uniform on the unit sphere), an array (sampled with
      replacement) or a callable ``sampler(n, rng) -> (n, d)`` with ``rng`` a
      :class:`numpy.random.Generator`.
    * Choices where the paper/code is silent or unavailable are documented in the
      user guide: softplus rectifier for :math:`W_z \ge 0` (the official configs
      use the identity, i.e. no constraint); a data-dependent centring
      initialisation instead of the ICNN "principled" one; the output layer
      always has an input term.
    * :meth:`kneighbors` returns similarities ``<q, k_j>`` of the keys ranked by
      the predicted key (not sorted by similarity, unlike :class:`ExactMIPS`).

    References
    ----------
    .. [1] T. X. Olausson, J. Monteiro, M. Klein, M. Cuturi, "Amortizing Maximum Inner
       Product Search with Learned Support Functions", ICML 2026, arXiv:2603.08001.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval import AmortizedMIPS
    >>> angles = np.pi / 2 * np.arange(4)
    >>> keys = np.c_[np.cos(angles), np.sin(angles)]
    >>> amips = AmortizedMIPS(depth=2, hidden_dim=32, n_steps=300, batch_size=256,
    ...                       lr=1e-2, random_state=0).fit(keys)
    >>> amips.predict([[1.0, 0.2], [0.1, -1.0]])
    array([0, 3])
    >>> round(amips.score(np.c_[np.cos([0.3, 2.0]), np.sin([0.3, 2.0])]), 2)
    1.0
    """

    # fitted attributes, set by fit_amips and _set_state
    key_mean_: np.ndarray | None
    model_: AMIPSNetwork

    def __init__(
        self,
        *,
        arch: Arch = "keynet",
        depth: int = 8,
        hidden_dim: int | None = None,
        params_fraction: float = 0.2,
        wx_inject: int | bool = 4,
        negative_slope: float = 0.1,
        beta: float = 20.0,
        homogenize: bool = True,
        resnet: bool = False,
        score_weight: float = 0.01,
        target_weight: float = 1.0,
        n_steps: int = 2000,
        batch_size: int = 1024,
        lr: float = 3e-3,
        warmup: float = 0.05,
        end_lr_ratio: float = 0.125,
        ema_decay: float = 0.97,
        grad_clip: float | None = 1.0,
        noise_std: float = 0.02,
        n_noise: int = 10,
        search_batch_size: int = 8192,
        retrieval: Metric = "ip",
        n_candidates: int = 1,
        center_keys: bool = False,
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.arch = arch
        self.depth = depth
        self.hidden_dim = hidden_dim
        self.params_fraction = params_fraction
        self.wx_inject = wx_inject
        self.negative_slope = negative_slope
        self.beta = beta
        self.homogenize = homogenize
        self.resnet = resnet
        self.score_weight = score_weight
        self.target_weight = target_weight
        self.n_steps = n_steps
        self.batch_size = batch_size
        self.lr = lr
        self.warmup = warmup
        self.end_lr_ratio = end_lr_ratio
        self.ema_decay = ema_decay
        self.grad_clip = grad_clip
        self.noise_std = noise_std
        self.n_noise = n_noise
        self.search_batch_size = search_batch_size
        self.retrieval = retrieval
        self.n_candidates = n_candidates
        self.center_keys = center_keys
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # -- parameters ----------------------------------------------------------
    def _check_params(self) -> None:
        check_amips_params(self)

    def _rebuild_param_names(self) -> tuple[str, ...]:
        # what build_amips_model reads besides the saved hidden widths
        own = ("resnet",) if self.arch == "keynet" else ("homogenize",)
        return ("arch", "wx_inject", "negative_slope", "beta") + own

    def _build_model(self, n_keys: int, d: int, hidden_dims: tuple[int, ...] | None = None,
                     seed: int = 0) -> tuple[AMIPSNetwork, tuple[int, ...]]:
        return build_amips_model(self, n_keys, d, hidden_dims, seed=seed)

    # -- fit -----------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike | None = None, *,
            queries: QuerySource = None) -> Self:
        """Train the amortized search model on the database ``X``.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_keys, n_features)
            The database of keys (numpy arrays, array-likes or torch tensors), stored in
            float32.
        y : None or array-like of shape (n_keys,)
            Ignored (e.g. a Pipeline's labels). A 2-D array or a callable raises
            ``TypeError``: training queries go in ``queries=``.
        queries : None, array-like of shape (n_queries, n_features) or callable
            Training queries: ``None`` draws them uniformly on the unit sphere; an
            array is resampled with replacement; a callable ``sampler(n, rng)``
            returns ``n`` queries (``rng`` a numpy Generator). Noise augmentation
            is applied on top (``noise_std``, ``n_noise``).

        Returns
        -------
        self : AmortizedMIPS
            The fitted estimator.

        Raises
        ------
        TypeError
            If ``y`` is 2-D, callable, or a nested sequence numpy cannot make an array
            of (e.g. ``[[1], 2, 3]``): training queries passed in its place.
        """
        # fit(keys, Q) put the training queries in the ignored ``y``: the model then
        # trained on sphere queries without a word. A 1-D ``y`` (a Pipeline's labels)
        # stays ignored.
        if y is not None and (callable(y) or _ndim(y) >= 2):
            raise TypeError("y is ignored; pass the training queries (an array or a "
                            "sampler) as fit(X, queries=...).")
        return self._fit(X, queries)

    # training needs autograd, also inside the caller's no_grad / inference_mode block
    @with_autograd
    # a fit that stops part-way (the user's query sampler or callback raising, Ctrl-C)
    # left the previous model_ with the new database_ and data units (predictions off by
    # their ratio): the estimator is put back as it was
    @restore_on_failure
    def _fit(self, X: ArrayLike, queries: QuerySource,
             callback: Callable[[int, nn.Module], None] | None = None) -> Self:
        """:meth:`fit`, with ``callback(step, model)`` after every step (learning curves;
        the model sees ``X / query_scale_`` and predicts keys in units of ``key_scale_``)."""
        self._check_params()
        self._init_fit()
        # (a refit must not keep the previous database's centred copy alive: twice its
        # size, on the device)
        self.__dict__.pop("_centred_cache", None)
        fit_amips(self, self._fit_database(X), queries, callback=callback)
        self._search_keys()  # cached here: predict keeps __dict__ (as _fit_database)
        return self

    # -- inference -----------------------------------------------------------
    def _key_mean(self) -> torch.Tensor | None:
        """``key_mean_`` as a tensor on the device (``None`` without centring; files and
        pickles from before ``center_keys`` get ``None`` in ``_set_state`` and
        ``__setstate__``)."""
        m = self.key_mean_
        return None if m is None else torch.as_tensor(m, device=self._resolved_device)

    def _search_keys(self) -> tuple[torch.Tensor, _KeyStats]:
        """The keys ranked by the predicted key and their scale statistics: the stored
        keys, or with ``key_mean_`` the centred copy the network was trained on,
        cached (centring per call would cost a pass over the database)."""
        m = self.key_mean_
        if m is None:
            return self._keys(), self._key_stats()
        keys = self._keys()
        cached = getattr(self, "_centred_cache", None)
        if cached is None or cached[0] is not keys or cached[1] is not m:
            centred = centre(keys, torch.as_tensor(m, device=self._resolved_device))
            cached = (keys, m, centred, _KeyStats(centred))
            self._centred_cache = cached
        return cached[2], cached[3]

    def _queries(self, X: ArrayLike) -> torch.Tensor:
        Q = self._validate_data(X, reset=False, dtype=torch.float32)
        self._check_params()  # inference reads parameters (set_params after fit)
        # not ``Q.norm(dim=1) == 0``: in float32 the norm of a row of 1e-23 underflows
        if not bool((Q != 0).any(dim=1).all()):
            raise ValueError("X contains queries with zero norm; every key is then a "
                             "maximiser and the search is undefined.")
        return Q

    @fill_doc(X=_QUERIES_X)
    def predict_key(self, X: ArrayLike) -> np.ndarray:
        """Predicted argmax key (KeyNet output or SupportNet gradient).

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_queries, n_features), float32
            The predicted keys :math:`\\hat k(x)`, in the units and coordinates of
            ``database_`` (``key_mean_`` added back with ``center_keys``).
        """
        Q = self._queries(X)
        return self._to_numpy(check_predicted_keys(
            uncentre(self, Q, None, score_and_key(self, Q)[1])[1]))

    @property
    def _n_features_out(self) -> int:
        """The width of :meth:`transform`'s predicted keys, for
        ``get_feature_names_out`` (``amortizedmips0``, ...) and ``set_output``."""
        return int(self.database_.shape[1])

    @fill_doc(X=_QUERIES_X)
    def transform(self, X: ArrayLike) -> np.ndarray:
        """Projected queries :math:`\\hat k(x)` for an ANN index (:meth:`predict_key`).

        With ``center_keys=True`` they are in the centred coordinates of the search,
        ``predict_key(X) - key_mean_``, as is the index of :meth:`to_faiss_ivf`.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_queries, n_features), float32
            The predicted keys, to search the index of :meth:`to_faiss_ivf` with (over
            ``database_``, or ``database_ - key_mean_`` with ``center_keys``).
        """
        # (the model's own coordinates: no round trip through + key_mean_ - key_mean_)
        return self._to_numpy(check_predicted_keys(score_and_key(self, self._queries(X))[1]))

    @fill_doc(X=_QUERIES_X)
    def value(self, X: ArrayLike) -> np.ndarray:
        """Estimated support value :math:`\\hat\\sigma_K(x)`.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_queries,), float32
            The estimates of :math:`\\max_i \\langle x, k_i\\rangle` (KeyNet: the
            Euler score :math:`\\langle x, \\hat k(x)\\rangle`); with
            ``center_keys``, :math:`\\hat\\sigma_{K-m}(x) + \\langle x, m\\rangle`.

        Raises
        ------
        ValueError
            Where an estimate does not fit float32 (beyond 3.4e38), as in
            :meth:`kneighbors`, or is NaN (a model whose outputs are not finite).
        """
        Q = self._queries(X)
        out = self._to_numpy(uncentre(self, Q, score_and_key(self, Q)[0], None)[0])
        if np.isinf(out).any():  # queries and keys are finite: an overflow
            raise ValueError("support-value estimates overflow float32 (beyond 3.4e38) "
                             "and cannot be returned; rescale the queries or the keys.")
        if np.isnan(out).any():
            raise ValueError("the model's support-value estimates are not finite (NaN); "
                             "check that the keys and training queries are finite and "
                             "not all zero or subnormal, then fit again.")
        return out

    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ...,
                   return_distance: Literal[True] = ...) -> tuple[np.ndarray, np.ndarray]: ...
    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ..., *,
                   return_distance: Literal[False]) -> np.ndarray: ...
    @overload
    def kneighbors(self, X: ArrayLike, n_neighbors: int = ..., return_distance: bool = ...
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray: ...
    @fill_doc(X=_QUERIES_X)
    def kneighbors(self, X: ArrayLike, n_neighbors: int = 10, return_distance: bool = True
                   ) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
        """Keys ranked by similarity to the predicted key (see ``retrieval``).

        Parameters
        ----------
        %(X)s
        n_neighbors : int, default=10
            Number of keys returned per query, in ``[1, n_keys]``.
        return_distance : bool, default=True
            Also return the true inner products of the returned keys.

        Returns
        -------
        similarities : ndarray of shape (n_queries, n_neighbors), float32
            The true inner products ``<x, k_j>`` of the returned keys (only if
            ``return_distance``), in the predicted order; with ``n_candidates > 1``
            the keys are re-ranked by them, in descending order (ties keep the
            predicted order).
        indices : ndarray of shape (n_queries, n_neighbors), int64
            Row indices in ``database_``, in the order described above.

        Raises
        ------
        ValueError
            If ``return_distance`` and a returned similarity does not fit float32
            (beyond ``3.4e38``), as :meth:`ExactMIPS.kneighbors`; the indices
            (``return_distance=False``) and :meth:`predict` are still available.
            Also where a predicted key is not finite (the network's output overflows
            float32 at that scale of queries or keys), unless every key is ranked
            (``n_neighbors`` or ``n_candidates`` = the number of keys).
        """
        check_bool(return_distance, "return_distance")
        Q = self._queries(X)
        k = _check_n_neighbors(n_neighbors, self.database_.shape[0])
        if not return_distance:
            return retrieve(self, Q, k, return_distance=False)
        sims, idx = retrieve(self, Q, k, return_distance=True)
        return float32_similarities(sims), idx

    @fill_doc(X=_QUERIES_X)
    def predict(self, X: ArrayLike) -> np.ndarray:
        """Top-1 key index for the predicted key (:meth:`transform`, which with
        ``center_keys`` ranks the centred keys; see ``center_keys``).

        See ``retrieval`` and ``n_candidates`` (re-ranking by the true inner product).

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_queries,), int64
            Row index in ``database_`` of the retrieved key.
        """
        return predict_top1(self, self._queries(X))

    @fill_doc(X=_QUERIES_X)
    def score(self, X: ArrayLike, y: object = None) -> float:
        """Match rate (recall@1) against exact search, counting exact ties as hits.

        Parameters
        ----------
        %(X)s
        y : None
            Ignored: the exact answers are recomputed from the database.

        Returns
        -------
        float
            The fraction of queries whose :meth:`predict` attains the largest inner
            product, counted in float64 (a tie with the exact answer counts as a hit:
            within ``1e-6 * ||x|| * ||k_max - k_pred||`` plus the float64 rounding, see
            :func:`match_rate`; a common offset of the keys changes nothing).
        """
        Q = self._queries(X)
        # exact answers in chunks of search_batch_size (bounded memory, as in training)
        # validated once: a second validation of the tensor would warn about missing
        # feature names after a fit on a DataFrame
        return match_rate(None, predict_top1(self, Q), queries=Q, database=self._keys(),
                          batch_size=self.search_batch_size)

    def to_faiss_ivf(self, n_lists: int | None = None) -> Any:
        """Build a faiss ``IndexIVFFlat`` over the database, with the metric of ``retrieval``.

        Search it with :meth:`transform` (projected queries), the paper's main
        evaluation. With ``center_keys=True`` the index holds the centred keys
        ``database_ - key_mean_`` (same row ids), the coordinates of :meth:`transform`.
        Needs the optional ``faiss-cpu`` package.

        Parameters
        ----------
        n_lists : int or None, default=None
            Number of inverted lists, in ``[1, n_keys]``; ``None`` uses
            ``int(sqrt(n_keys))``, at most ``n_keys // 39`` (see :func:`build_faiss_ivf`).

        Returns
        -------
        faiss.IndexIVFFlat
        """
        self._check_fitted()
        # the same float32 rows as the ranking of kneighbors (_search_keys)
        keys = self.database_ if self.key_mean_ is None else self._search_keys()[0]
        return build_faiss_ivf(keys, n_lists, metric=self.retrieval)

    # -- persistence ---------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        state.pop("model_")
        state["model_state_dict"] = {k: v.detach().cpu() for k, v in
                                     self.model_.state_dict().items()}
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        weights = state.pop("model_state_dict")
        # files saved before center_keys existed hold no key_mean_: no centring
        state.setdefault("key_mean_", None)
        super()._set_state(state)
        n_keys, d = self.database_.shape
        if self.key_mean_ is not None:
            m = np.asarray(self.key_mean_)
            if m.shape != (d,) or m.dtype != np.float32:
                raise ValueError(f"key_mean_ must be a float32 array of shape ({d},), got "
                                 f"{m.dtype} of shape {m.shape}.")
            self.key_mean_ = m
        # normal tensors even when loaded inside inference_mode (the parameters of a model
        # built there are inference tensors, which cannot be fine-tuned later)
        with torch.inference_mode(False):
            model, _ = self._build_model(n_keys, d, tuple(self.hidden_dims_))
            model.load_state_dict(weights)
        model = model.to(self._resolved_device).eval()
        model.requires_grad_(False)
        self.model_ = model
        if self.key_mean_ is not None:
            self._search_keys()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # pickles made before center_keys existed (the base class gives the parameter
        # its default, no centring)
        state = dict(state)
        if "model_" in state:  # fitted: key_mean_ is None without centring, as documented
            state.setdefault("key_mean_", None)
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # the learned map is a float32 network: float64 queries come back as float32
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags

    @classmethod
    def _estimator_check_instances(cls) -> list:
        kw: dict[str, Any] = dict(depth=2, hidden_dim=8, n_steps=3, batch_size=16, random_state=0)
        return [cls(**kw), cls(arch="supportnet", **kw), cls(center_keys=True, **kw)]

    def _expected_failed_checks(self) -> dict[str, str]:
        float32 = ("the network runs in float32 and BLAS blocking depends on the batch, so "
                   "outputs differ by ~1e-6 relative with the batch composition")
        return {
            "check_estimators_dtypes": "integer test data contain all-zero rows, and zero "
                                       "queries are rejected (MIPS is undefined for them)",
            "check_methods_sample_order_invariance": float32,
            "check_methods_subset_invariance": float32,
        }
