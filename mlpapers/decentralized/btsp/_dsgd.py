"""Decentralized SGD on a circulant topology, with simulated wall-clock time.

All node models are stacked along a leading ``n`` axis and trained together
(model building, seeded init and stacked gradients live in ``_node_models``); one
round is a local SGD step on every node followed by gossip ``x <- W_t x`` with the
doubly stochastic mixing matrix of the round.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal, Self

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import metadata_routing
from sklearn.utils.multiclass import check_classification_targets
from torch import nn
from torch.func import functional_call

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    RandomStateLike,
    check_bool,
    check_in_options,
    check_learning_rate,
    check_positive,
    encode_labels,
    to_numpy,
    warn_if_worse_than_constant,
)
from mlpapers._utils._ambient import with_autograd
from mlpapers.decentralized.btsp._bottleneck import bottleneck_delay
from mlpapers.decentralized.btsp._node_models import (
    _build_module,
    _check_module_output,
    _init_params,
    _local_grads_fn,
    average_buffers,
    split_state,
    user_grads,
)
from mlpapers.decentralized.btsp._topology import (
    TopologyLike,
    check_assignment,
    check_delays,
    circulant_schedule,
    round_mixing_matrix,
)

__all__ = ["DecentralizedSGD", "consensus_distance", "mix"]


def mix(params: dict[str, torch.Tensor], W: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gossip step ``x_i <- sum_j W[i, j] x_j`` on stacked parameters.

    Parameters
    ----------
    params : dict of str to Tensor
        Stacked node parameters, each of shape ``(n, *shape)``.
    W : Tensor of shape (n, n)
        Mixing matrix (rows: receivers).

    Returns
    -------
    dict of str to Tensor
        Mixed parameters, same shapes.
    """
    return {k: (W.to(v.dtype) @ v.reshape(v.shape[0], -1)).reshape(v.shape)
            for k, v in params.items()}


def consensus_distance(params: dict[str, torch.Tensor]) -> float:
    """Mean squared distance of the node models to their average,
    ``(1/n) sum_i ||x_i - x_bar||^2`` over all stacked parameters.

    Computed in float64: the average of equal float32 rows is then exact, so equal
    node models give exactly 0, and large models do not overflow the squares.
    """
    total = 0.0
    for v in params.values():
        flat = v.reshape(v.shape[0], -1)
        if flat.device.type == "mps":  # (MPS has no float64)
            flat = flat.cpu()
        if flat.is_complex():  # |z|^2 = re^2 + im^2 (.double() dropped the imaginary part)
            flat = torch.view_as_real(flat).reshape(flat.shape[0], -1)
        flat = flat.double()
        total += float(((flat - flat.mean(0, keepdim=True)) ** 2).sum(1).mean())
    return total


def _node_labels(nodes, n_samples: int, n_nodes: int) -> np.ndarray:
    """``nodes`` as one node label per sample; a list of shards is converted."""
    is_shards = (isinstance(nodes, (list, tuple)) and len(nodes) > 0
                 and all(np.ndim(s) == 1 for s in nodes))
    if not is_shards:
        return to_numpy(nodes)  # (np.asarray refuses grad, bfloat16 and CUDA tensors)
    if len(nodes) != n_nodes:
        raise ValueError(f"nodes as shards must list one index array per node ({n_nodes}), "
                         f"got {len(nodes)}.")
    shards = [to_numpy(s) for s in nodes]
    if any(s.size and s.dtype.kind not in "iu" for s in shards):
        raise ValueError("nodes as shards must hold integer sample indices.")
    idx = np.concatenate([s.astype(np.int64) for s in shards])
    if idx.size != n_samples or not np.array_equal(np.sort(idx), np.arange(n_samples)):
        raise ValueError(f"nodes as shards must hold every sample index 0..{n_samples - 1} "
                         "exactly once.")
    node_of = np.empty(n_samples, dtype=np.int64)
    node_of[idx] = np.repeat(np.arange(n_nodes), [s.size for s in shards])
    return node_of


class _SimClock:
    """Simulated wall clock after ``t`` rounds, ``t * compute + sum of t round delays``,
    correctly rounded.

    The round delays repeat with period ``tau``: whole periods plus a prefix, in
    exact rational arithmetic, so long runs do not drift as a running float sum
    would (one rounding in all). Only evaluated when the time is recorded.
    """

    def __init__(self, compute_time: float, round_delays: np.ndarray):
        self.compute = Fraction(compute_time)
        vals = [Fraction(float(d)) for d in round_delays]
        self.tau = len(vals)
        self.prefix = [sum(vals[:r], Fraction(0)) for r in range(self.tau + 1)]

    def __call__(self, t: int) -> float:
        q, r = divmod(int(t), self.tau)
        exact = t * self.compute + q * self.prefix[self.tau] + self.prefix[r]
        try:
            return float(exact)
        except OverflowError:  # beyond float64 (e.g. compute_time=1e308): as a float sum
            return float("inf")


# each fitted estimator's per-thread predict modules (see DecentralizedSGD._thread_module)
_PREDICT_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PREDICT_MODULES_LOCK = threading.Lock()


class DecentralizedSGD(TorchEstimatorMixin, ClassifierMixin, BaseEstimator):
    r"""Decentralized SGD classifier simulated on a circulant topology.

    ``n`` nodes hold shards of the training data. In round ``t`` every node takes a
    local (momentum) SGD step on a minibatch of its shard and then averages with its
    neighbours (adapt-then-combine, :math:`x \leftarrow W_t (x - \eta m)`), with
    :math:`W_t` the doubly stochastic mixing matrix of round ``t mod tau`` of the
    schedule (see :func:`~mlpapers.decentralized.btsp.mixing_matrices`), mapped to
    physical nodes through ``assignment``. The simulated wall clock advances by
    ``compute_time`` plus the round's bottleneck delay (the slowest link used in
    the round, :func:`~mlpapers.decentralized.btsp.bottleneck_delay` with
    ``reduce="none"``): a synchronous round waits for its slowest message.

    Parameters
    ----------
    model : {"logistic", "mlp"} or torch.nn.Module, default="logistic"
        Node model mapping ``(batch, n_features)`` to class logits. A module is
        used as the common initialisation of every node (save/load then needs
        pickle, since a module is not a safe parameter); ``fit`` trains a copy of
        it (cast to float32 if its parameters are another floating dtype) and leaves
        the module itself untouched. The copy trains in train mode, vectorised over
        the nodes with :func:`torch.func.vmap` (dropout masks differ per node and
        are seeded by ``random_state``; BatchNorm statistics are kept per node), and
        predicts in eval mode with the nodes' pooled statistics (``buffers_``).
        Parameters with ``requires_grad=False`` are not trained. A module holding a
        built-in model's initial weights (``nn.Linear``; ``Linear``, ``ReLU``,
        ``Linear`` for "mlp") computes the same rounds bit for bit on the same
        minibatches, but with the same ``random_state`` its minibatches differ:
        the built-in initialisation draws from the estimator's generator first.
        See the user guide, "Your own model".
    topology : str, sequence or ndarray, default="exponential"
        Circulant schedule: a topology name or explicit skip sets, as
        ``BottleneckNodeAssigner``'s ``topology`` (see
        :func:`~mlpapers.decentralized.btsp.circulant_schedule`).
    assignment : array-like of shape (n,) or None, default=None
        Physical node at each virtual position (e.g. ``BottleneckNodeAssigner``'s
        ``assignment_``); ``None`` is the identity.
    delays : array-like of shape (n, n) or None, default=None
        Link delays between physical nodes; ``None`` means no communication delay.
    n_nodes : int or None, default=None
        Number of nodes when neither ``delays`` nor ``assignment`` gives it
        (default 8).
    compute_time : float, default=1.0
        Simulated time of one local step, same unit as ``delays``.
    lr : float, default=0.1
        Step size.
    momentum : float, default=0.0
        Local heavy-ball momentum in ``[0, 1)``.
    weight_decay : float, default=0.0
        L2 penalty added to the local gradients.
    n_rounds : int, default=200
        Communication rounds.
    batch_size : int, default=16
        Local minibatch size (sampled with replacement from the node's shard).
    partition : {"iid", "dirichlet"}, default="iid"
        How ``fit`` splits the data when ``nodes`` is not given: a uniformly random
        split into shards of equal size (within one sample), or label-skewed, each
        class divided among the nodes in proportions drawn from ``Dirichlet(alpha)``
        (some nodes may then hold no sample).
    alpha : float, default=0.5
        Concentration of the Dirichlet split (smaller is more skewed).
    hidden : int, default=64
        Hidden width of ``model="mlp"``.
    eval_every : int, default=10
        Record ``history_`` every ``eval_every`` rounds (and after the last).
    directed : bool, default=False
        Evaluate delays of messages ``u -> v`` exactly (asymmetric delays).
    device : str or torch.device, default="cpu"
        Torch device of the stacked node models and the data (``"cpu"``,
        ``"cuda"``, ``"cuda:1"``, ``"mps"``, ...); the fitted ``params_`` are kept
        on the CPU.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the built-in models' initialisation, the data split of
        ``partition``, the minibatches and a user module's dropout masks: equal
        seeds give equal runs.
    verbose : int, default=0
        Show a progress bar with the loss.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    n_nodes_ : int
    node_params_ : dict of str to Tensor
        Stacked final node parameters, each ``(n_nodes, *shape)`` (the trainable
        ones: frozen parameters are the same on every node).
    params_ : dict of str to Tensor
        The average model used by :meth:`predict` (all its parameters).
    node_buffers_ : dict of str to Tensor
        Stacked final buffers of a user module's nodes (e.g. BatchNorm running
        statistics of each node's batches), each ``(n_nodes, *shape)``; empty for
        the built-in models.
    buffers_ : dict of str to Tensor
        The buffers :meth:`predict` uses, pooled over the nodes with data: running
        means averaged, running variances by the law of total variance (mean of
        the node variances plus the variance of the node means), other floating
        buffers averaged, integer buffers (counters) their maximum.
    round_delays_ : ndarray of shape (tau,)
        Bottleneck delay of each round of the schedule.
    sim_time_ : float
        Simulated wall-clock time of the whole run.
    history_ : list of dict
        ``round``, ``sim_time``, ``loss`` and ``accuracy`` of the average model on
        the training data (or ``eval_set``), and ``consensus`` distance.
    node_of_ : ndarray of shape (n_samples,), int64
        Physical node that held each training sample (``nodes`` of :meth:`fit`, or
        the split drawn by ``partition``).

    References
    ----------
    .. [1] "Bottleneck Communication Delay Minimization for Communication-Efficient
       Decentralized Learning", ICML 2026.
    .. [2] B. Ying, K. Yuan, Y. Chen, H. Hu, P. Pan and W. Yin, "Exponential Graph is
       Provably Efficient for Decentralized Deep Training", NeurIPS 2021.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from mlpapers.decentralized.btsp import DecentralizedSGD
    >>> X, y = load_iris(return_X_y=True)
    >>> X = (X - X.mean(0)) / X.std(0)
    >>> clf = DecentralizedSGD(n_nodes=8, n_rounds=30, lr=1.0, random_state=0).fit(X, y)
    >>> bool(clf.score(X, y) > 0.85)
    True
    """

    # nodes / eval_set are fit options, not routed metadata (score's sample_weight is).
    __metadata_request__fit = {"nodes": metadata_routing.UNUSED,
                               "eval_set": metadata_routing.UNUSED}

    # load rebuilds the built-in model from ``model`` (params_ carry the widths)
    _REBUILD_PARAMS = ("model",)

    def __init__(self, *, model: Literal["logistic", "mlp"] | nn.Module = "logistic",
                 topology: TopologyLike = "exponential", assignment: ArrayLike | None = None,
                 delays: ArrayLike | None = None, n_nodes: int | None = None,
                 compute_time: float = 1.0, lr: float = 0.1, momentum: float = 0.0,
                 weight_decay: float = 0.0, n_rounds: int = 200, batch_size: int = 16,
                 partition: Literal["iid", "dirichlet"] = "iid", alpha: float = 0.5,
                 hidden: int = 64, eval_every: int = 10, directed: bool = False,
                 device: str | torch.device = "cpu", random_state: RandomStateLike = None,
                 verbose: int = 0) -> None:
        self.model = model
        self.topology = topology
        self.assignment = assignment
        self.delays = delays
        self.n_nodes = n_nodes
        self.compute_time = compute_time
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.n_rounds = n_rounds
        self.batch_size = batch_size
        self.partition = partition
        self.alpha = alpha
        self.hidden = hidden
        self.eval_every = eval_every
        self.directed = directed
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------- set-up -----
    def _check_params(self) -> tuple[int, np.ndarray, np.ndarray | None]:
        if not (isinstance(self.model, nn.Module) or self.model in ("logistic", "mlp")):
            raise ValueError(f"model must be 'logistic', 'mlp' or a torch.nn.Module, "
                             f"got {self.model!r}.")
        check_positive(self.compute_time, "compute_time", strict=False)
        check_learning_rate(self.lr)
        check_positive(self.weight_decay, "weight_decay", strict=False)
        check_positive(self.momentum, "momentum", strict=False)
        if self.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}.")
        check_positive(self.n_rounds, "n_rounds", integer=True)
        check_positive(self.batch_size, "batch_size", integer=True)
        check_positive(self.hidden, "hidden", integer=True)
        check_positive(self.eval_every, "eval_every", integer=True)
        check_in_options(self.partition, "partition", ("iid", "dirichlet"))
        check_positive(self.alpha, "alpha")
        check_bool(self.directed, "directed")
        D = None if self.delays is None else check_delays(self.delays)
        sizes = set()
        if D is not None:
            sizes.add(D.shape[0])
        if self.assignment is not None:
            a = self._to_numpy(self.assignment)
            if a.ndim != 1:  # a scalar or a string has no length to compare
                raise ValueError("assignment must be None or a 1D permutation of the nodes, "
                                 f"got {self.assignment!r}.")
            sizes.add(len(a))
        if self.n_nodes is not None:
            check_positive(self.n_nodes, "n_nodes", integer=True)
            sizes.add(int(self.n_nodes))
        if len(sizes) > 1:
            raise ValueError(f"delays, assignment and n_nodes disagree on the number of "
                             f"nodes: {sorted(sizes)}.")
        n = sizes.pop() if sizes else 8
        if n < 2:
            raise ValueError(f"n_nodes must be >= 2, got {n}.")
        perm = (np.arange(n) if self.assignment is None
                else check_assignment(self.assignment, n))
        return n, perm, D

    def _split(self, y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.partition == "iid":
            nodes = np.empty(len(y), dtype=np.int64)
            nodes[rng.permutation(len(y))] = np.arange(len(y)) % n
            return nodes
        nodes = np.empty(len(y), dtype=np.int64)
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            share = rng.dirichlet(np.full(n, float(self.alpha)))
            cuts = (np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
            for node, part in enumerate(np.split(idx, cuts)):
                nodes[part] = node
        return nodes

    # ---------------------------------------------------------------- fit -----
    # the local gradients need autograd, also inside the caller's no_grad/inference_mode
    @with_autograd
    @restore_on_failure
    def fit(self, X: ArrayLike, y: ArrayLike, nodes: ArrayLike | Sequence[ArrayLike] | None = None,
            eval_set: tuple[ArrayLike, ArrayLike] | None = None) -> Self:
        """Run ``n_rounds`` rounds of decentralized SGD.

        Parameters
        ----------
        X : array-like or Tensor of shape (n_samples, n_features)
            Training features (numpy array, torch tensor, pandas DataFrame or
            nested lists; cast to float32); standardise them for the built-in
            models.
        y : array-like of shape (n_samples,)
            Class labels (any labels scikit-learn accepts for classification).
        nodes : array-like of shape (n_samples,) or list of n_nodes index arrays, optional
            Physical node holding each sample (default: split by ``partition``), or
            the shards themselves: ``nodes[i]`` the indices of the samples on node
            ``i`` (e.g. ``np.array_split(rng.permutation(n_samples), n_nodes)``;
            every sample in exactly one shard). A node without samples only
            averages with its neighbours.
        eval_set : tuple (X_eval, y_eval), optional
            Data on which ``history_`` reports loss and accuracy.

        Returns
        -------
        self : object
            The fitted classifier.

        Raises
        ------
        FloatingPointError
            When the node models are no longer finite (checked whenever ``history_``
            records a round): the run diverged; lower ``lr``.

        Warns
        -----
        ConvergenceWarning
            When the last recorded loss is more than twice that of the best constant
            predictor (the entropy of the recorded labels' class frequencies):
            standardise ``X``, run more rounds, or change ``lr``.
        """
        n, perm, D = self._check_params()
        self._init_fit()
        X32, y = self._validate_data(X, y, reset=True, dtype=torch.float32)
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        rng = self._numpy_gen
        if nodes is None:
            node_of = self._split(y_enc, n, rng)
        else:
            node_of = _node_labels(nodes, len(y_enc), n)
            if node_of.shape != (len(y_enc),) or node_of.dtype.kind not in "iu":
                raise ValueError("nodes must be an integer array of shape (n_samples,) "
                                 f"or a list of {n} index arrays (one shard per node).")
            if node_of.min() < 0 or node_of.max() >= n:
                raise ValueError(f"nodes must be in 0..{n - 1}.")
        dev = self._device
        yt = torch.as_tensor(y_enc, dtype=torch.long, device=dev)
        if eval_set is not None:
            if not isinstance(eval_set, (tuple, list)) or len(eval_set) != 2:
                raise ValueError("eval_set must be a pair (X_eval, y_eval).")
            Xe, ye_np = self._validate_data(eval_set[0], eval_set[1], reset=False,
                                            dtype=torch.float32)
            ye = encode_labels(ye_np, self.classes_, name="eval_set's y", seen_in="y",
                               device=dev)
        else:
            Xe, ye = X32, yt

        # shards as a padded index matrix (n, max_count)
        counts = np.bincount(node_of, minlength=n)
        order = np.argsort(node_of, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        width = max(int(counts.max()), 1)
        pad = np.zeros((n, width), dtype=np.int64)
        col = np.arange(len(order)) - np.repeat(starts, counts)
        pad[node_of[order], col] = order
        pad_t = torch.as_tensor(pad, device=dev)
        counts_t = torch.as_tensor(counts, device=dev, dtype=torch.float32)
        has_data = (counts_t > 0).float()

        # mixing matrices in physical indices and the round delays
        # (built round by round in float32: the float64 stack in virtual and in physical
        # indices took 5x the memory of the float32 one the rounds use, 1.3 GB at n=2048)
        schedule = circulant_schedule(n, self.topology)
        inv = np.argsort(perm)  # W_phys[perm[a], perm[b]] = W_virt[a, b]
        W_t = torch.empty((len(schedule), n, n), dtype=torch.float32, device=dev)
        for l, skips in enumerate(schedule):
            W_t[l] = torch.as_tensor(round_mixing_matrix(n, skips)[inv][:, inv],
                                     dtype=torch.float32)
        if D is None:
            self.round_delays_ = np.zeros(len(schedule))
        else:
            self.round_delays_ = bottleneck_delay(D, perm, schedule, reduce="none",
                                                  directed=bool(self.directed))

        # stacked node models, all starting from the same initialisation
        user = isinstance(self.model, nn.Module)
        base = _build_module(self.model, X32.shape[1], len(self.classes_), int(self.hidden))
        if not user:
            _init_params(base, self._torch_gen)
        base = base.to(dev)
        if user:  # (a copy: a module may modify its input in place)
            _check_module_output(base, X32[:1].clone(), len(self.classes_))
        # trainable parameters and buffers per node; frozen ones (requires_grad=False)
        # once, never trained
        params, frozen, buffers = split_state(base, n)
        if not params:
            raise ValueError("model has no trainable parameters (every parameter has "
                             "requires_grad=False, or it has none): there is nothing "
                             "to train.")
        velocity = {k: torch.zeros_like(v) for k, v in params.items()}
        # the private copy trains in train mode (dropout on, BatchNorm on batch
        # statistics, as torch training loops do); evaluation and predict use eval mode
        base.train()
        local_grads = _local_grads_fn(self.model, base, frozen, buffers)
        # a user module's random layers (dropout) draw from torch's global generator:
        # seeded per round from this stream (drawn from the numpy generator, which fit
        # uses no more after the split), in a fork that leaves the caller's RNG as it was
        drop_seeds = (np.random.default_rng(int(rng.integers(0, 2**63 - 1)))
                      if user else None)
        no_data = bool((counts == 0).any()) and bool(buffers)

        logger = ProgressLogger(int(self.n_rounds), self.verbose, desc="DSGD")
        clock = _SimClock(float(self.compute_time), self.round_delays_)
        B = int(self.batch_size)
        rows = torch.arange(n, device=dev)[:, None]
        for t in logger:
            r = torch.rand(n, B, generator=self._torch_gen, dtype=torch.float32).to(dev)
            local = (r * counts_t[:, None]).long().clamp_max(width - 1)
            idx = pad_t[rows, local]  # (n, B)
            if drop_seeds is not None:  # a user module
                grads = user_grads(local_grads, params, buffers, X32[idx], yt[idx],
                                   int(drop_seeds.integers(0, 2**63 - 1)), dev,
                                   has_data if no_data else None)
            else:
                grads = local_grads(params, X32[idx], yt[idx])
            with torch.no_grad():
                for k in params:
                    g = grads[k] * has_data.view(-1, *[1] * (grads[k].ndim - 1))
                    if self.weight_decay:
                        g = g + self.weight_decay * params[k]
                    velocity[k] = self.momentum * velocity[k] + g
                    params[k] = params[k] - self.lr * velocity[k]
                params = mix(params, W_t[t % len(schedule)])
            if (t + 1) % int(self.eval_every) == 0 or t + 1 == int(self.n_rounds):
                if not all(bool(torch.isfinite(v).all()) for v in params.values()):
                    decay = (f", lower weight_decay (now {self.weight_decay})"
                             if self.weight_decay else "")
                    raise FloatingPointError(
                        f"DecentralizedSGD diverged by round {t + 1}: non-finite node "
                        f"parameters; lower lr (now {self.lr}){decay} or standardise X.")
                avg_buffers = average_buffers(base, buffers, has_data)
                loss, acc = self._evaluate(base, params, frozen, avg_buffers,
                                           Xe.clone() if user else Xe, ye)
                logger.log(round=t + 1, sim_time=clock(t + 1), loss=loss, accuracy=acc,
                           consensus=consensus_distance(params))
        self.n_nodes_ = n
        self.node_params_ = {k: v.detach().cpu() for k, v in params.items()}
        # in the module's order; frozen parameters exactly as given (a mean of equal
        # float32 rows can round)
        self.params_ = {k: (self.node_params_[k].mean(0) if k in self.node_params_
                            else frozen[k].cpu()) for k, _ in base.named_parameters()}
        self.node_buffers_ = {k: v.detach().cpu() for k, v in buffers.items()}
        self.buffers_ = {k: v.cpu() for k, v in
                         average_buffers(base, buffers, has_data).items()}
        self.sim_time_ = clock(int(self.n_rounds))
        self.history_ = logger.history
        self._warn_if_not_learned(ye)
        # (a copy in int64, as documented: the labels may be a view of the caller's array)
        self.node_of_ = node_of.astype(np.int64)
        # the architecture predict runs (a user's module as it was at this fit: changing
        # it afterwards, e.g. deleting a layer, must not change the fitted model), and no
        # predict module of an earlier fit in any thread
        # (on the CPU, like params_: a pickle of the estimator then loads anywhere)
        self._architecture = base.cpu() if user else None
        with _PREDICT_MODULES_LOCK:
            _PREDICT_MODULES.pop(self, None)
        return self

    def _warn_if_not_learned(self, y: torch.Tensor) -> None:
        """``ConvergenceWarning`` when the last recorded loss is more than twice that of
        the best constant predictor (the entropy of the class frequencies of ``y``), as
        CLoVE, IFCA and FedAvg warn: features offset by 1e6 gave a loss of 1.4e11 and a
        constant prediction without a word."""
        freq = torch.bincount(y.cpu(), minlength=len(self.classes_)).double() / len(y)
        freq = freq[freq > 0]
        warn_if_worse_than_constant(
            self, float(self.history_[-1]["loss"]), float(-(freq * freq.log()).sum()),
            loss="final loss", reference_name="the entropy of the class frequencies",
            learner="the average model",
            advice=(f"Standardise X, run more rounds or raise lr if the loss fell slowly, "
                    f"and lower lr (now {self.lr!r}) if it grew."))

    @staticmethod
    def _evaluate(module, params, frozen, buffers, X, y) -> tuple[float, float]:
        """Loss and accuracy of the average model, in eval mode."""
        avg = {k: v.mean(0) for k, v in params.items()}
        module.eval()
        try:
            with torch.no_grad():
                logits = functional_call(module, (avg, frozen, buffers), (X,))
                loss = float(nn.functional.cross_entropy(logits, y))
                acc = float((logits.argmax(1) == y).float().mean())
        finally:
            module.train()
        return loss, acc

    # ------------------------------------------------------------ predict -----
    def _thread_module(self, device: torch.device) -> nn.Module:
        """This thread's eval-mode module of the model's architecture, built once per
        thread and kept outside the estimator (predict leaves ``__dict__`` as it is):
        ``functional_call`` swaps a module's tensors in and out during a call, so one
        module shared by simultaneous predictions mixed their weights."""
        with _PREDICT_MODULES_LOCK:
            local = _PREDICT_MODULES.setdefault(self, threading.local())
        if getattr(local, "device", None) != device:
            template = getattr(self, "_architecture", None)
            if template is None:  # a built-in model (or an older pickle)
                template = _build_module(self._fitted_model(), self.n_features_in_,
                                         len(self.classes_), int(self.hidden))
            local.module = copy.deepcopy(template).to(device).eval()
            local.device = device
        return local.module

    def _fitted_model(self) -> str | nn.Module:
        """``model`` as it was at fit: ``params_`` hold that architecture's weights
        (set to another model after fit, predict built the new one and ran it with
        missing weights left uninitialised: NaN or constant probabilities)."""
        return getattr(self, "_fitted_rebuild_params", {}).get("model", self.model)

    def _logits(self, X) -> torch.Tensor:
        X = self._validate_data(X, reset=False, dtype=torch.float32)
        module = self._thread_module(X.device)
        # params_ and buffers_ as they are now (a user may replace or edit them after
        # fit), in eval mode with the buffers learnt in fit (BatchNorm statistics), so
        # one row's output never depends on the other rows (older pickles hold no
        # buffers: the module's own are used)
        state = {k: v.to(X.device) for k, v in
                 (*self.params_.items(), *getattr(self, "buffers_", {}).items())}
        if isinstance(self._fitted_model(), nn.Module):  # it may modify its input in place
            X = X.clone()
        with torch.no_grad():  # float32 as documented, also for a float64 output
            return functional_call(module, state, (X,), strict=False).float()

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities of the average model ``params_``.

        Parameters
        ----------
        X : array-like or Tensor of shape (n_samples, n_features)
            Samples, in the forms :meth:`fit` accepts, with ``n_features_in_``
            features.

        Returns
        -------
        ndarray of shape (n_samples, n_classes), float32
            Softmax of the average model's logits (the node models run in float32);
            columns follow ``classes_``.
        """
        return self._to_numpy(torch.softmax(self._logits(X), dim=1))

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted labels of the average model ``params_``.

        Parameters
        ----------
        X : array-like or Tensor of shape (n_samples, n_features)
            Samples, in the forms :meth:`fit` accepts, with ``n_features_in_``
            features.

        Returns
        -------
        ndarray of shape (n_samples,)
            The label in ``classes_`` of the largest logit of each sample.
        """
        labels = self._to_numpy(self._logits(X).argmax(1))
        return self.classes_[labels]

    @classmethod
    def _estimator_check_instances(cls) -> list:
        return [cls(n_nodes=4, n_rounds=20, lr=1.0, batch_size=16, eval_every=20,
                    random_state=0)]
