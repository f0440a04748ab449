"""Amortized MIPS (SupportNet / KeyNet) as a scikit-learn style estimator."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.base import TransformerMixin
from sklearn.utils import metadata_routing

from mlpapers._utils import ProgressLogger, check_in_options, check_positive, check_tensor
from mlpapers.retrieval.amips._exact import (
    _check_n_neighbors,
    _MIPSBase,
    build_faiss_ivf,
)
from mlpapers.retrieval.amips._kernels import (
    amips_loss,
    match_rate,
    mips_topk,
    support_function,
    warmup_cosine_lr,
)
from mlpapers.retrieval.amips._networks import Homogenize, KeyNet, SupportNet, solve_width

__all__ = ["AmortizedMIPS"]


QuerySource = None | np.ndarray | torch.Tensor | Callable[[int, np.random.Generator], Any]


class AmortizedMIPS(TransformerMixin, _MIPSBase):
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
    depth : int, default=8
        Number of hidden layers.
    hidden_dim : int or None, default=None
        Hidden width. ``None`` solves it from the parameter budget
        ``params_fraction * n_keys * n_features`` (rounded to a multiple of 4, at
        least 16).
    params_fraction : float, default=0.2
    wx_inject : int or bool, default=4
        Re-inject the input every ``wx_inject`` layers (and at the output layer).
    negative_slope, beta : float, default=0.1, 20.0
        Soft-leaky-ReLU :math:`a t + (1-a)\,\mathrm{softplus}(\beta t)/\beta`.
    homogenize : bool, default=True
        Wrap SupportNet in the 1-homogeneous wrapper (ignored by KeyNet).
    resnet : bool, default=False
        KeyNet returns ``x + F(x)`` (ignored by SupportNet).
    score_weight, target_weight : float, default=0.01, 1.0
        Loss weights of the score and the key terms.
    n_steps : int, default=2000
        Optimisation steps (each on a fresh batch of queries).
    batch_size : int, default=1024
        Training batch size; also the chunk size at inference.
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
        Queries per chunk of the exact label search.
    retrieval : {"ip", "l2"}, default="ip"
        How the predicted key is turned into an index: ``"ip"`` ranks keys by
        :math:`\langle \hat k(x), k_j\rangle` (the paper's rule); ``"l2"`` ranks them
        by :math:`-\|\hat k(x) - k_j\|^2`. Both agree when all keys have the same
        norm (the paper's normalised embeddings); with varied norms ``"ip"`` can
        return a longer key than the predicted one (see the user guide).
    n_candidates : int, default=1
        :meth:`predict` (and :meth:`score`) re-rank the first ``n_candidates`` keys
        retrieved with the predicted key by their true inner product with the
        query (``n_candidates`` extra dot products per query). ``1`` is the
        paper's rule; the match rate then equals the recall at ``n_candidates``.
    device : str, default="cpu"
    random_state : int, RandomState, Generator or None, default=None
    verbose : int, default=0
        Show a progress bar with the loss.

    Attributes
    ----------
    database_ : ndarray of shape (n_keys, n_features), float32
    model_ : torch.nn.Module
        The (EMA) trained network, in eval mode.
    hidden_dims_ : tuple of int
    n_params_ : int
    history_ : list of dict
        ``step``, ``loss``, ``score_loss``, ``key_loss``, ``lr`` every
        ``max(1, n_steps // 200)`` steps.
    n_features_in_ : int

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

    # ``queries`` is a fit option, not routed metadata (no ``set_fit_request``)
    __metadata_request__fit = {"queries": metadata_routing.UNUSED}

    def __init__(
        self,
        *,
        arch: str = "keynet",
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
        retrieval: str = "ip",
        n_candidates: int = 1,
        device: str = "cpu",
        random_state=None,
        verbose: int = 0,
    ):
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
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # -- parameters ----------------------------------------------------------
    def _check_params(self) -> None:
        check_in_options(self.arch, "arch", ("keynet", "supportnet"))
        check_positive(self.depth, "depth", integer=True)
        if self.hidden_dim is not None:
            check_positive(self.hidden_dim, "hidden_dim", integer=True)
        check_positive(self.params_fraction, "params_fraction")
        if not isinstance(self.wx_inject, numbers.Integral):
            raise TypeError(f"wx_inject must be a bool or an int, got {self.wx_inject!r}.")
        check_positive(self.negative_slope, "negative_slope", strict=False)
        if self.negative_slope >= 1:
            raise ValueError(f"negative_slope must be in [0, 1), got {self.negative_slope}.")
        check_positive(self.beta, "beta")
        check_positive(self.score_weight, "score_weight", strict=False)
        check_positive(self.target_weight, "target_weight", strict=False)
        if self.score_weight == 0 and self.target_weight == 0:
            raise ValueError("score_weight and target_weight cannot both be 0.")
        check_positive(self.n_steps, "n_steps", integer=True)
        check_positive(self.batch_size, "batch_size", integer=True)
        check_positive(self.lr, "lr")
        check_positive(self.warmup, "warmup", strict=False)
        if self.warmup >= 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup}.")
        check_positive(self.end_lr_ratio, "end_lr_ratio", strict=False)
        check_positive(self.ema_decay, "ema_decay", strict=False)
        if self.ema_decay >= 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}.")
        if self.grad_clip is not None:
            check_positive(self.grad_clip, "grad_clip")
        check_positive(self.noise_std, "noise_std", strict=False)
        check_positive(self.n_noise, "n_noise", strict=False, integer=True)
        check_positive(self.search_batch_size, "search_batch_size", integer=True)
        check_in_options(self.retrieval, "retrieval", ("ip", "l2"))
        check_positive(self.n_candidates, "n_candidates", integer=True)

    def _build_model(self, n_keys: int, d: int, hidden_dims: tuple[int, ...] | None = None):
        if hidden_dims is None:
            out = d if self.arch == "keynet" else 1
            width = self.hidden_dim if self.hidden_dim is not None else solve_width(
                self.params_fraction * n_keys * d, d, out, self.depth, self.wx_inject)
            hidden_dims = (int(width),) * self.depth
        kw = dict(wx_inject=self.wx_inject, negative_slope=self.negative_slope, beta=self.beta)
        if self.arch == "keynet":
            model = KeyNet(d, list(hidden_dims), resnet=self.resnet, **kw)
        else:
            model = SupportNet(d, list(hidden_dims), **kw)
            if self.homogenize:
                model = Homogenize(model)
        return model, tuple(hidden_dims)

    # -- training queries ----------------------------------------------------
    def _query_source(self, queries: QuerySource, d: int) -> Callable[[int], torch.Tensor]:
        dev = self._device
        gen, np_gen = self._torch_gen, self._numpy_gen
        if queries is None:
            def draw(n):
                q = torch.randn(n, d, generator=gen)
                return (q / q.norm(dim=1, keepdim=True).clamp_min(1e-12)).to(dev)
            return draw
        if callable(queries) and not isinstance(queries, (np.ndarray, torch.Tensor)):
            def draw(n):
                q = check_tensor(queries(n, np_gen), name="sampler output", dtype=torch.float32,
                                 device=dev, n_features=d, owner=type(self).__name__)
                if q.shape[0] != n:
                    raise ValueError(f"the query sampler returned {q.shape[0]} rows, "
                                     f"expected {n}.")
                return q
            return draw
        pool = check_tensor(queries, name="queries", dtype=torch.float32, device=dev,
                            n_features=d, owner=type(self).__name__)
        if bool((pool.norm(dim=1) == 0).any()):
            raise ValueError("queries contains rows with zero norm; MIPS needs nonzero queries.")

        def draw(n):
            idx = torch.randint(pool.shape[0], (n,), generator=gen).to(dev)
            return pool[idx]
        return draw

    def _augment(self, q: torch.Tensor) -> torch.Tensor:
        if self.noise_std == 0 or self.n_noise == 0:
            return q
        gen = self._torch_gen
        n, d = q.shape
        norm = q.norm(dim=1, keepdim=True)
        noisy = q + self.noise_std * norm * torch.randn(n, d, generator=gen).to(q)
        noisy = noisy * (norm / noisy.norm(dim=1, keepdim=True).clamp_min(1e-12))
        replace = torch.rand(n, 1, generator=gen).to(q.device) < self.n_noise / (self.n_noise + 1)
        return torch.where(replace, noisy, q)

    # -- fit -----------------------------------------------------------------
    def fit(self, X, y=None, *, queries: QuerySource = None):
        """Train the amortized search model on the database ``X``.

        Parameters
        ----------
        X : array-like of shape (n_keys, n_features)
            The database of keys.
        y : None
            Ignored.
        queries : None, array-like of shape (n_queries, n_features) or callable
            Training queries: ``None`` draws them uniformly on the unit sphere; an
            array is resampled with replacement; a callable ``sampler(n, rng)``
            returns ``n`` queries (``rng`` a numpy Generator). Noise augmentation
            is applied on top (``noise_std``, ``n_noise``).

        Returns
        -------
        self
        """
        self._check_params()
        self._init_fit()
        keys = self._fit_database(X)
        n_keys, d = keys.shape
        draw = self._query_source(queries, d)

        # model init on the private generator; the global RNG state is restored
        seed = int(torch.randint(2**62, (1,), generator=self._torch_gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, self.hidden_dims_ = self._build_model(n_keys, d)
        model = model.to(self._device)
        init_batch = self._augment(draw(min(self.batch_size, 1024)))
        if init_batch.shape[0] >= 2:
            model.data_init(init_batch)
        if not (self.arch == "keynet" and self.resnet):
            # match the initial key norms to the labels' (a positive scale keeps convexity)
            with torch.no_grad():
                _, pred = model.score_and_key(init_batch)
            _, idx = support_function(init_batch, keys, batch_size=self.search_batch_size)
            target = keys[idx].norm(dim=1).mean()
            got = pred.norm(dim=1).mean()
            if bool(got > 0) and bool(torch.isfinite(got)):
                model.scale_output(float(target / got))
        ema = copy.deepcopy(model) if self.ema_decay > 0 else None
        if ema is not None:
            ema.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=self.lr)
        warmup_steps = int(round(self.warmup * self.n_steps))
        end_lr = self.lr * self.end_lr_ratio
        log_every = max(1, self.n_steps // 200)
        needs_graph = self.arch == "supportnet"
        logger = ProgressLogger(self.n_steps, self.verbose, desc=type(self).__name__)
        model.train()
        for step in logger:
            lr_t = warmup_cosine_lr(step + 1, self.n_steps, self.lr, warmup_steps, end_lr)
            for group in opt.param_groups:
                group["lr"] = lr_t
            q = self._augment(draw(self.batch_size))
            with torch.no_grad():
                true_score, idx = support_function(q, keys, batch_size=self.search_batch_size)
            x = q.requires_grad_(True) if needs_graph else q
            pred_score, pred_key = model.score_and_key(x, create_graph=True)
            loss, s_loss, k_loss = amips_loss(
                pred_score, pred_key, true_score, keys[idx],
                score_weight=self.score_weight, target_weight=self.target_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p in params:
                if p.grad is not None:
                    torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
            if self.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            opt.step()
            if ema is not None:
                with torch.no_grad():
                    for pe, p in zip(ema.parameters(), model.parameters()):
                        pe.lerp_(p, 1.0 - self.ema_decay)
            if step % log_every == 0 or step == self.n_steps - 1:
                logger.log(step=step, loss=loss.item(), score_loss=s_loss.item(),
                           key_loss=k_loss.item(), lr=lr_t)
        final = ema if ema is not None else model
        final.eval()
        final.requires_grad_(False)
        self.model_ = final
        self.n_params_ = int(sum(p.numel() for p in final.parameters()))
        self.history_ = logger.history
        return self

    # -- inference -----------------------------------------------------------
    def _queries(self, X) -> torch.Tensor:
        Q = self._validate_data(X, reset=False, dtype=torch.float32)
        if bool((Q.norm(dim=1) == 0).any()):
            raise ValueError("X contains queries with zero norm; every key is then a "
                             "maximiser and the search is undefined.")
        return Q

    def _score_and_key(self, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, keys = [], []
        with torch.no_grad():
            for start in range(0, Q.shape[0], self.batch_size):
                v, k = self.model_.score_and_key(Q[start:start + self.batch_size])
                values.append(v)
                keys.append(k)
        return torch.cat(values), torch.cat(keys)

    def predict_key(self, X) -> np.ndarray:
        """Predicted argmax key (KeyNet output or SupportNet gradient), shape (n, d)."""
        return self._to_numpy(self._score_and_key(self._queries(X))[1])

    def transform(self, X) -> np.ndarray:
        """Projected queries :math:`\\hat k(x)` for an ANN index (same as :meth:`predict_key`)."""
        return self.predict_key(X)

    def value(self, X) -> np.ndarray:
        """Estimated support value :math:`\\hat\\sigma_K(x)`, shape (n,)."""
        return self._to_numpy(self._score_and_key(self._queries(X))[0])

    def kneighbors(self, X, n_neighbors: int = 10, return_distance: bool = True):
        """Keys ranked by similarity to the predicted key (see ``retrieval``).

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
        n_neighbors : int, default=10
        return_distance : bool, default=True

        Returns
        -------
        similarities : ndarray of shape (n_queries, n_neighbors), float32
            The true inner products ``<x, k_j>`` of the returned keys (only if
            ``return_distance``), in the predicted order.
        indices : ndarray of shape (n_queries, n_neighbors), int64
        """
        Q = self._queries(X)
        k = _check_n_neighbors(n_neighbors, self.database_.shape[0])
        keys = self._keys()
        _, key_hat = self._score_and_key(Q)
        if self.retrieval == "l2":  # argmin ||k^ - k_j||^2 as a MIPS on augmented vectors
            key_hat = torch.cat([key_hat, key_hat.new_ones(len(key_hat), 1)], 1)
            keys_aug = torch.cat([keys, -0.5 * keys.square().sum(1, keepdim=True)], 1)
            _, idx = mips_topk(key_hat, keys_aug, k, batch_size=self.search_batch_size)
        else:
            _, idx = mips_topk(key_hat, keys, k, batch_size=self.search_batch_size)
        if not return_distance:
            return self._to_numpy(idx)
        sims = torch.einsum("nkd,nd->nk", keys[idx], Q)
        return self._to_numpy(sims), self._to_numpy(idx)

    def predict(self, X) -> np.ndarray:
        """Top-1 key index for the predicted key, shape (n,).

        See ``retrieval`` and ``n_candidates`` (re-ranking by the true inner product).
        """
        if not hasattr(self, "database_"):
            self._check_fitted()
        n_cand = min(int(self.n_candidates), self.database_.shape[0])
        if n_cand == 1:
            return self.kneighbors(X, 1, return_distance=False)[:, 0]
        sims, idx = self.kneighbors(X, n_cand)
        return idx[np.arange(len(idx)), sims.argmax(1)]

    def score(self, X, y=None) -> float:
        """Match rate (recall@1) against exact search, counting exact ties as hits.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
        y : ignored
            The exact answers are recomputed from the database.

        Returns
        -------
        float
        """
        Q = self._queries(X)
        return match_rate(None, self.predict(Q), queries=Q, database=self._keys())

    def to_faiss_ivf(self, n_lists: int | None = None):
        """Build a faiss ``IndexIVFFlat`` over the database, with the metric of ``retrieval``.

        Search it with :meth:`transform` (projected queries), the paper's main
        evaluation. Needs the optional ``faiss-cpu`` package.

        Parameters
        ----------
        n_lists : int or None, default=None
            Number of inverted lists; ``None`` uses ``int(sqrt(n_keys))``.

        Returns
        -------
        faiss.IndexIVFFlat
        """
        self._check_fitted()
        return build_faiss_ivf(self.database_, n_lists, metric=self.retrieval)

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
        super()._set_state(state)
        n_keys, d = self.database_.shape
        model, _ = self._build_model(n_keys, d, tuple(self.hidden_dims_))
        model.load_state_dict(weights)
        model = model.to(self._resolved_device).eval()
        model.requires_grad_(False)
        self.model_ = model

    @classmethod
    def _estimator_check_instances(cls) -> list:
        kw = dict(depth=2, hidden_dim=8, n_steps=3, batch_size=16, random_state=0)
        return [cls(**kw), cls(arch="supportnet", **kw)]

    def _expected_failed_checks(self) -> dict[str, str]:
        float32 = ("the network runs in float32 and BLAS blocking depends on the batch, so "
                   "outputs differ by ~1e-6 relative with the batch composition")
        return {
            "check_estimators_dtypes": "integer test data contain all-zero rows, and zero "
                                       "queries are rejected (MIPS is undefined for them)",
            "check_transformer_preserve_dtypes": "the learned map is a float32 network; "
                                                 "transform returns float32",
            "check_methods_sample_order_invariance": float32,
            "check_methods_subset_invariance": float32,
        }
