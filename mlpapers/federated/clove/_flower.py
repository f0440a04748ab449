"""CLoVE on a real Flower deployment (``flwr >= 1.42``, Message API).

Requires the optional extra ``mlpapers[flower]``. The server side is
:class:`CLoVEStrategy`, a :class:`flwr.serverapp.strategy.Strategy` whose
:meth:`~CLoVEStrategy.start` runs CLoVE rounds over a ``Grid``:

1. every node receives all K models (``train.losses`` message, one ArrayRecord
   per model under keys ``m0 .. m{K-1}``) and replies with its loss vector;
2. the server runs :func:`~mlpapers.federated.clove.clove_assign` on the loss
   matrix;
3. every node receives its assigned model (``train`` message), trains it locally
   and replies with the new weights and its number of examples;
4. the server averages the replies per model, weighted by data size.

The client side is built by :func:`make_client_app` from a model factory and a
function returning the node's data; it reuses the estimator's training engine.
"""

from __future__ import annotations

import math
import numbers
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from sklearn.utils import check_random_state

from mlpapers._utils import check_in_options, check_positive, on_cpu_default_device
from mlpapers._utils._ambient import autograd_enabled, seeded_global_rng
from mlpapers._utils._modules import refusing_layers
from mlpapers._utils._validation import probe_module
from mlpapers.federated.clove._assign import SklearnSeed
from mlpapers.federated.clove._data import mse_targets, validate_clients
from mlpapers.federated.clove._engine import ClientData, Engine, Optimizer, check_local_training
from mlpapers.federated.clove._federation import _unfittable_layer
from mlpapers.federated.clove._kernels import clove_assign
from mlpapers.federated.clove._models import (
    LOSSES,
    ModelLoss,
    build_user_module,
    check_model_output,
    check_trainable,
)

__all__ = ["CLoVEStrategy", "make_client_app"]

_LOSSES_ACTION = "losses"


def _to_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """The record's arrays by name, in their own dtypes."""
    return dict(zip(record.keys(), record.to_numpy_ndarrays()))


def _is_integer(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_


def _layout_difference(arrays: dict[str, np.ndarray],
                       reference: dict[str, np.ndarray]) -> str | None:
    """How ``arrays`` differ from ``reference`` in names, shapes or kinds (floating or
    integer), or ``None`` when they match: one architecture for the nodes to stack."""
    if set(arrays) != set(reference):
        return f"arrays {sorted(arrays)}, expected {sorted(reference)}"
    for k, a in arrays.items():
        if a.shape != reference[k].shape or _is_integer(a) != _is_integer(reference[k]):
            return (f"array {k!r} of shape {a.shape} and dtype {a.dtype}, expected "
                    f"{reference[k].shape} {reference[k].dtype}")
    return None


def _positive_number(value: Any) -> bool:
    """A finite number > 0 (not a bool): a node's ``num-examples``."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and float(value) > 0)


def _num_examples(reply: Message, node_id: int, server_round: int) -> float:
    """The weight of a node's trained model: its ``num-examples`` metric (a weight of
    0, a negative one or NaN made the average NaN or inf with only numpy's warning)."""
    metrics: Any = reply.content["metrics"] if "metrics" in reply.content else {}
    n = metrics.get("num-examples")
    if not _positive_number(n):
        raise ValueError(f"CLoVEStrategy, round {server_round}: node {node_id} replied "
                         "without a positive finite 'num-examples' metric (its number of "
                         f"training examples, the weight of its model), got {n!r}.")
    return float(cast(float, n))


def _reply_arrays(reply: Message, node_id: int, model: dict[str, np.ndarray], j: int,
                  server_round: int) -> dict[str, np.ndarray]:
    """A node's trained model, checked against the model ``j`` it was sent: same
    names, shapes and kinds (floating or integer), finite values. (Arrays of another
    shape were broadcast into the average, or replaced the model when one node
    trained it; a float array sent back as integers took the maximum.)"""
    where = f"CLoVEStrategy, round {server_round}: node {node_id}"
    record = reply.content["arrays"] if "arrays" in reply.content else None
    if not isinstance(record, ArrayRecord):
        raise ValueError(f"{where} replied without its trained model (an ArrayRecord "
                         f"under 'arrays'), got {type(record).__name__}.")
    arrays = _to_arrays(record)
    difference = _layout_difference(arrays, model)
    if difference is not None:
        raise ValueError(f"{where} replied with {difference} (model {j}'s).")
    if not all(np.isfinite(a).all() for a in arrays.values()):
        # averaged in, it would poison model j for every later round
        raise FloatingPointError(f"CLoVEStrategy: node {node_id} diverged in round "
                                 f"{server_round}: its trained model is not finite; "
                                 "lower the clients' lr.")
    return arrays


def _loss_vector(reply: Message, node_id: int, n_models: int,
                 server_round: int) -> list[float]:
    """A node's ``losses`` metric: one number per model. (Vectors of another length
    gave numpy's "inhomogeneous shape" error, or were clustered silently when every
    node sent the same wrong length.)"""
    metrics: Any = reply.content["metrics"] if "metrics" in reply.content else {}
    losses = metrics.get("losses")
    if (not isinstance(losses, list) or len(losses) != n_models
            or not all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                       for v in losses)):
        got = (f"{len(losses)} values" if isinstance(losses, list) else repr(losses))
        raise ValueError(f"CLoVEStrategy, round {server_round}: node {node_id} replied "
                         f"without a 'losses' metric of {n_models} numbers (its loss "
                         f"under each model), got {got}.")
    return [float(v) for v in losses]


def _initial_models(initial_arrays: Any, n_clusters: int) -> list[ArrayRecord]:
    """The K initial models, checked: ArrayRecords of the same arrays (names, shapes
    and kinds), as the nodes stack them into one architecture."""
    if isinstance(initial_arrays, ArrayRecord):
        initial_arrays = [initial_arrays] * n_clusters
    if not isinstance(initial_arrays, Sequence) or isinstance(initial_arrays, str) or any(
            not isinstance(r, ArrayRecord) for r in initial_arrays):
        raise TypeError("initial_arrays must be an ArrayRecord or a sequence of them (e.g. "
                        "ArrayRecord(model.state_dict())), got "
                        f"{type(initial_arrays).__name__}"
                        + (" holding other objects." if isinstance(initial_arrays, Sequence)
                           else "."))
    if len(initial_arrays) != n_clusters:
        raise ValueError(f"initial_arrays must hold {n_clusters} models, "
                         f"got {len(initial_arrays)}.")
    first = _to_arrays(initial_arrays[0])
    if not first:
        raise ValueError("initial_arrays holds a model without arrays.")
    for j, record in enumerate(initial_arrays):
        arrays = _to_arrays(record)
        difference = _layout_difference(arrays, first) if j else None
        if difference is not None:
            raise ValueError(f"initial_arrays: model {j} has other arrays than model 0 "
                             f"({difference}); the K models share one architecture.")
        # (a NaN weight was sent out and came back as a node's "non-finite loss, lower
        # the clients' lr" after a whole exchange)
        bad = [k for k, a in arrays.items() if a.dtype.kind in "fc" and not np.isfinite(a).all()]
        if bad:
            raise ValueError(f"initial_arrays: model {j} holds NaN or infinite values in "
                             f"{bad}; start from finite weights.")
    return list(initial_arrays)


class CLoVEStrategy(Strategy):
    """Flower strategy running CLoVE's loss-vector clustering across nodes.

    Parameters
    ----------
    n_clusters : int
        Number of cluster models K (``>= 1``, else ``ValueError``).
    min_nodes : int, default=2
        Wait for at least this many connected nodes (and at least K: it is raised to
        ``n_clusters``) before round 1.
    random_state : int, RandomState instance or None, default=None
        Seed of the k-means step.
    n_init : int, default=10
        k-means restarts.
    poll_interval : float, default=0.1
        Seconds between polls for replies.

    Attributes
    ----------
    models_ : list of ArrayRecord
        The K models after the last round.
    labels_ : dict of int to int
        Node id -> model index (last round).
    partitions_ : dict of int to object
        Node id -> the node's ``partition-id`` node config, when it reports one
        (a :func:`make_client_app` node reports an integer id, an integral float such
        as ``2.0`` as the int; an id that is no integer, such as ``"site-a"``, ``0.5``
        or a bool, is not reported, and its node is missing here).
    loss_vectors_ : ndarray of shape (n_nodes, K)
        The last loss matrix (rows in ``node_ids_`` order).
    history_ : list of dict
        Per round: the data-weighted mean loss of the assigned models (before local
        training, weighted by the nodes' ``num-examples``; as ``CLoVE.history_``)
        and the round's wall time.
    node_ids_ : list of int
        The connected nodes' ids, sorted, fixed when :meth:`start` begins.

    Notes
    -----
    Unlike Flower's built-in strategies, :meth:`start` runs its own rounds (a
    loss-vector exchange, then training) and returns the strategy itself; the
    evaluation hooks do nothing (evaluate the ``models_`` afterwards).

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    The ServerApp of a deployment (its ClientApp is :func:`make_client_app`'s):

    >>> import torch
    >>> from flwr.app import ArrayRecord
    >>> from flwr.serverapp import ServerApp
    >>> from mlpapers.federated.flower import CLoVEStrategy
    >>> app = ServerApp()
    >>> @app.main()
    ... def main(grid, context):
    ...     models = [ArrayRecord(torch.nn.Linear(5, 1).state_dict()) for _ in range(2)]
    ...     strategy = CLoVEStrategy(n_clusters=2, min_nodes=4, random_state=0)
    ...     strategy.start(grid, models, num_rounds=5)
    ...     print(strategy.labels_)
    >>> CLoVEStrategy(n_clusters=3, min_nodes=2).min_nodes  # at least one node per model
    3
    """

    def __init__(self, n_clusters: int, *, min_nodes: int = 2,
                 random_state: SklearnSeed = None,
                 n_init: int = 10, poll_interval: float = 0.1) -> None:
        check_positive(n_clusters, "n_clusters", integer=True)
        check_positive(min_nodes, "min_nodes", integer=True)
        # (checked here, not when the run reaches them: a NaN poll interval failed in
        # time.sleep mid-round, a bad n_init in the first assignment)
        check_positive(n_init, "n_init", integer=True)
        check_positive(poll_interval, "poll_interval", strict=False)
        try:  # (a bad seed failed in start, after the wait for the nodes)
            check_random_state(random_state)  # draws nothing
        except (TypeError, ValueError) as exc:
            raise ValueError("random_state must be None, an int in [0, 2**32) or a numpy "
                             f"RandomState, got {random_state!r}.") from exc
        self.n_clusters = int(n_clusters)
        self.min_nodes = max(int(min_nodes), self.n_clusters)
        self.random_state = random_state
        self.n_init = n_init
        self.poll_interval = float(poll_interval)
        self.labels_: dict[int, int] = {}
        self.partitions_: dict[int, Any] = {}
        self.history_: list[dict[str, float]] = []
        self.models_: list[ArrayRecord] = []
        self.node_ids_: list[int] = []

    # -- Strategy interface ------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord | None,
                        config: ConfigRecord, grid: Grid) -> list[Message]:
        """One ``train`` message per node carrying its assigned model.

        Parameters
        ----------
        server_round : int
            The round, sent as the messages' ``group_id``.
        arrays : ArrayRecord or None
            Ignored: each node gets its own assigned model, ``models_[labels_[node]]``
            (Flower's single global model does not exist here).
        config : ConfigRecord
            Sent to every node with its model (e.g. a ``seed``).
        grid : flwr.serverapp.Grid
            Ignored: the nodes are ``node_ids_``, fixed by :meth:`start`.

        Returns
        -------
        list of flwr.app.Message
            One ``train`` message per node of ``node_ids_``, with records
            ``arrays`` (its model) and ``config``.
        """
        self._check_started("configure_train", self.node_ids_)
        return [
            Message(RecordDict({"arrays": self.models_[self._assigned(nid, server_round)],
                                "config": config}),
                    dst_node_id=nid, message_type="train", group_id=str(server_round))
            for nid in self.node_ids_
        ]

    def _check_started(self, method: str, assignment: Any) -> None:
        """``RuntimeError`` unless :meth:`start` has set the models and ``assignment``
        (the nodes of a run, or their labels)."""
        if not self.models_ or not assignment:
            raise RuntimeError(f"CLoVEStrategy.{method} needs the models and the nodes' "
                               "assignment of a run: call start(grid, initial_arrays), "
                               "which calls it every round.")

    def _assigned(self, node_id: int, server_round: int) -> int:
        """The model assigned to ``node_id`` this round (``ValueError`` for another node)."""
        if node_id not in self.labels_:
            raise ValueError(f"CLoVEStrategy, round {server_round}: node {node_id} has no "
                             f"assigned model (the round's nodes are {sorted(self.labels_)}).")
        return self.labels_[node_id]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[None, MetricRecord]:
        """Data-size weighted average of the replies, per assigned model.

        Arrays are matched by name, so the replies may list them in another order
        than the initial models; each must have its model's shape and kind (floating
        or integer). A model that no node trained keeps its weights. Floating arrays
        are averaged in float64 and stored in the model's dtype; integer arrays
        (counters such as BatchNorm's ``num_batches_tracked``) take their maximum, as
        in :class:`~mlpapers.federated.clove.CLoVE`. The results replace ``models_`` in place.

        Parameters
        ----------
        server_round : int
            The round (named in the errors).
        replies : iterable of flwr.app.Message
            The nodes' replies to :meth:`configure_train`: records ``arrays`` (the
            trained model) and ``metrics`` with ``num-examples`` (the weight).

        Returns
        -------
        arrays : None
            No single global model (the K models are in ``models_``).
        metrics : flwr.app.MetricRecord
            ``models-updated``: the number of models that received replies.

        Raises
        ------
        ValueError
            If a reply comes from a node without an assigned model, lacks its
            ``arrays`` or a positive finite ``num-examples``, or holds other array
            names, shapes or kinds than its model's.
        FloatingPointError
            If a node's trained model is not finite (it diverged).
        RuntimeError
            If called before :meth:`start` set ``models_`` and ``labels_``.
        """
        self._check_started("aggregate_train", self.labels_)
        sums: dict[int, dict[str, np.ndarray]] = {}
        weights: dict[int, float] = {}
        models = {j: _to_arrays(m) for j, m in enumerate(self.models_)}
        for reply in replies:
            nid = reply.metadata.src_node_id
            j = self._assigned(nid, server_round)
            n = _num_examples(reply, nid, server_round)
            arrays = _reply_arrays(reply, nid, models[j], j, server_round)
            # float64 sums for exact weighting; integer counters are not averaged
            part = {k: a if _is_integer(a) else n * a.astype(np.float64)
                    for k, a in arrays.items()}
            if j not in sums:
                sums[j], weights[j] = part, n
            else:
                sums[j] = {k: np.maximum(sums[j][k], a) if _is_integer(a) else sums[j][k] + a
                           for k, a in part.items()}
                weights[j] += n
        for j, s in sums.items():  # models without nodes keep their weights
            # np.array: a 0-d array divided by a float is a numpy scalar, which
            # torch.from_numpy refuses (np.ascontiguousarray would make it 1-d)
            self.models_[j] = ArrayRecord({k: torch.from_numpy(np.array(
                s[k] if _is_integer(s[k]) else s[k] / weights[j], dtype=a.dtype,
                order="C")) for k, a in models[j].items()})
        return None, MetricRecord({"models-updated": len(sums)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord,
                           config: ConfigRecord, grid: Grid) -> list[Message]:
        """No federated evaluation: CLoVE's rounds do not evaluate on the nodes.

        Parameters
        ----------
        server_round : int
            The round (unused).
        arrays : ArrayRecord
            Unused.
        config : ConfigRecord
            Unused.
        grid : flwr.serverapp.Grid
            Unused.

        Returns
        -------
        list
            An empty list: no evaluation message is sent.
        """
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> None:
        """No federated evaluation (see :meth:`configure_evaluate`).

        Parameters
        ----------
        server_round : int
            The round (unused).
        replies : iterable of flwr.app.Message
            Unused (there are none).

        Returns
        -------
        None
            No aggregated metrics.
        """
        return None

    def summary(self) -> None:
        """Flower's hook to log the strategy's configuration: logs nothing.

        The state of the run is in the attributes (``labels_``, ``history_``, ...).
        """
        return None

    # -- the CLoVE loop -------------------------------------------------------------
    def _exchange(self, grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
        """Push ``messages`` and pull their replies until all came or ``timeout`` s passed.

        Replies are pulled at least once, and once more at or after the deadline before
        giving up (the loop stopped at the deadline without a last pull: replies that
        came after the last poll were reported missing, and ``timeout=0`` always failed).
        """
        pushed = list(grid.push_messages(messages))
        ids = {i for i in pushed if i is not None}
        if len(ids) < len(messages):
            # (Flower's grids leave out what the link state refused, or give None in its
            # place (HTTP), or push none of a request that is too large: the left-out
            # nodes were silently not trained, or the losses round failed with a bare
            # KeyError, or the run waited for a reply to None until its timeout)
            metas: list[Any] = [getattr(m, "metadata", m) for m in messages]
            if len(pushed) == len(messages):  # positional, None where it failed
                left = sorted(meta.dst_node_id for meta, i in zip(metas, pushed) if i is None)
            else:
                left = sorted(meta.dst_node_id for meta in metas
                              if getattr(meta, "message_id", None) not in ids)
            raise RuntimeError(f"the grid pushed {len(ids)} of {len(messages)} messages; "
                               f"node(s) {left} got none (gone, or the message too large "
                               "for the link).")
        replies: list[Message] = []
        deadline = time.monotonic() + timeout
        while ids:
            now = time.monotonic()  # read before the pull: a pull at now >= deadline is last
            for reply in grid.pull_messages(list(ids)):
                ids.discard(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    raise RuntimeError(f"node {reply.metadata.src_node_id} failed: "
                                       f"{reply.error.reason}")
                replies.append(reply)
            if not ids or now >= deadline:
                break
            # (never past the deadline: the last pull comes at it)
            time.sleep(min(self.poll_interval, deadline - now))
        if ids:
            raise TimeoutError(f"{len(ids)} node(s) did not reply within {timeout} s.")
        return replies

    def start(self, grid: Grid,  # type: ignore[override]  # returns self (documented)
              initial_arrays: ArrayRecord | Sequence[ArrayRecord], num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable | None = None) -> CLoVEStrategy:
        """Run ``num_rounds`` CLoVE rounds.

        Waits for ``min_nodes`` nodes, then every round sends all K models to
        every node, clusters the returned loss vectors
        (:func:`~mlpapers.federated.clove.clove_assign`), sends each node its
        assigned model to train and averages the replies per model
        (:meth:`aggregate_train`).

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            The ServerApp's grid, through which messages reach the nodes.
        initial_arrays : ArrayRecord or sequence of ArrayRecord
            K distinct initial models of one architecture (the same array names,
            shapes and kinds), or one model copied K times.
        num_rounds : int, default=3
            Number of CLoVE rounds (``>= 1``).
        timeout : float, default=3600
            Seconds to wait for the nodes (connection and each exchange); ``>= 0``,
            ``inf`` waits forever.
        train_config : ConfigRecord, optional
            Sent to the nodes with every message (e.g. a ``seed``: an integer).
        evaluate_config : ConfigRecord, optional
            Accepted as in Flower's ``Strategy.start``, but no evaluation runs:
            passing one warns (``UserWarning``) and it is not sent.
        evaluate_fn : callable, optional
            Accepted as in Flower's ``Strategy.start``, but never called (there
            are K models, not one global model): passing one warns
            (``UserWarning``). Evaluate ``models_`` after the run instead.

        Returns
        -------
        CLoVEStrategy
            ``self``, with ``models_``, ``labels_``, ``loss_vectors_``,
            ``partitions_`` and ``history_`` of this run (not Flower's ``Result``;
            a new :meth:`start` begins them anew).

        Raises
        ------
        TypeError
            If ``initial_arrays`` holds no ArrayRecords, ``num_rounds`` is no
            integer, ``timeout`` no number or ``train_config`` no ConfigRecord.
        ValueError
            If ``initial_arrays`` holds another number of models than K, or
            models of different architectures; if ``num_rounds < 1``, ``timeout``
            is negative or NaN; if a node replies without a loss per model (see also
            :meth:`aggregate_train`).
        TimeoutError
            If fewer than ``min_nodes`` nodes connect, or some node does not
            reply, within ``timeout`` seconds.
        RuntimeError
            If a node replies with an error.
        FloatingPointError
            If a node reports a non-finite loss or trains a non-finite model.

        Warns
        -----
        UserWarning
            If ``evaluate_config`` or ``evaluate_fn`` is given (no evaluation runs).
        """
        # (these were swallowed by **_ silently, with any misspelt keyword: num_round=20
        # ran the default 3 rounds; an evaluate_fn was never called, without a word)
        unused = [name for name, value in (("evaluate_config", evaluate_config),
                                           ("evaluate_fn", evaluate_fn)) if value is not None]
        if unused:
            warnings.warn(f"CLoVEStrategy.start runs no evaluation (it trains K cluster "
                          f"models, not one global model): {' and '.join(unused)} "
                          "ignored; evaluate strategy.models_ after the run.", UserWarning,
                          stacklevel=2)
        # checked before the wait for the nodes (a str num_rounds failed there, a
        # negative one ran no round, a NaN timeout gave up at once)
        check_positive(num_rounds, "num_rounds", integer=True)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout must be a number of seconds, got {timeout!r}.")
        if not timeout >= 0:  # (NaN included)
            raise ValueError(f"timeout must be >= 0 seconds (inf waits forever), got "
                             f"{timeout!r}.")
        if train_config is not None and not isinstance(train_config, ConfigRecord):
            raise TypeError("train_config must be a ConfigRecord (e.g. ConfigRecord({'seed': "
                            f"0}})), got {type(train_config).__name__}.")
        models = _initial_models(initial_arrays, self.n_clusters)
        # a new run: nothing of a previous start's (its history, partitions, labels)
        self.models_, self.labels_, self.partitions_, self.history_ = models, {}, {}, []
        self.__dict__.pop("loss_vectors_", None)
        config = train_config if train_config is not None else ConfigRecord()
        deadline = time.monotonic() + timeout
        while len(list(grid.get_node_ids())) < self.min_nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {self.min_nodes} nodes connected.")
            time.sleep(self.poll_interval)
        self.node_ids_ = sorted(grid.get_node_ids())
        rng = check_random_state(self.random_state)
        for rnd in range(1, num_rounds + 1):
            start = time.perf_counter()
            msgs = [
                Message(RecordDict({**{f"m{j}": m for j, m in enumerate(self.models_)},
                                    "config": config}),
                        dst_node_id=nid, message_type=f"train.{_LOSSES_ACTION}",
                        group_id=str(rnd))
                for nid in self.node_ids_
            ]
            by_node = {r.metadata.src_node_id: r for r in self._exchange(grid, msgs, timeout)}
            # (the nodes' ClientApp sends its losses as a list of floats)
            L = np.array([_loss_vector(by_node[nid], nid, len(self.models_), rnd)
                          for nid in self.node_ids_], dtype=np.float64)
            for nid in self.node_ids_:
                metrics = by_node[nid].content["metrics"]
                if "partition-id" in metrics:
                    self.partitions_[nid] = metrics["partition-id"]
            if not np.isfinite(L).all():  # name the node: clove_assign could not
                i, j = np.argwhere(~np.isfinite(L))[0]
                raise FloatingPointError(
                    f"CLoVEStrategy: node {self.node_ids_[i]} reported a non-finite loss "
                    f"for model {j} in round {rnd}: a model diverged (lower the clients' "
                    "lr) or the loss overflows float32 (rescale the data).")
            assignment = clove_assign(L, min(self.n_clusters, len(self.node_ids_)),
                                      random_state=int(rng.randint(0, 2**31 - 1)),
                                      n_init=self.n_init)
            self.labels_ = dict(zip(self.node_ids_, assignment.tolist()))
            self.loss_vectors_ = L
            replies = self._exchange(grid, list(self.configure_train(rnd, None, config, grid)),
                                     timeout)
            self.aggregate_train(rnd, replies)
            # weighted by the nodes' sizes, as the estimator's history_ and Flower's own
            # metric aggregation (num-examples); unweighted if a node does not send it
            sizes = [by_node[nid].content["metrics"].get("num-examples")
                     for nid in self.node_ids_]
            assigned = L[np.arange(len(L)), assignment]
            if all(_positive_number(v) for v in sizes):
                loss = float(np.average(assigned, weights=np.asarray(sizes, dtype=np.float64)))
            else:
                loss = float(assigned.mean())
            self.history_.append({"round": rnd, "loss": loss,
                                  "time_s": time.perf_counter() - start})
        return self


def _probe_output(template: torch.nn.Module, X: torch.Tensor) -> object:
    """The node's model's output for one sample of ``X`` (whatever it returns).

    A BatchNorm without running statistics is refused as CLoVE's fit refuses it (a
    ``ValueError`` naming the layer): it normalises by the batch also in eval mode, so
    a node's loss vector would depend on how its rows are batched, and on one sample
    torch fails with "Expected more than 1 value per channel when training"."""
    # in the library's locked fork of the global RNG: the node's RNG is left as it was,
    # and a seeded fit in another thread is not rewound when the fork restores it
    with seeded_global_rng(0), refusing_layers(template, _unfittable_layer, "model_fn()'s"):
        return probe_module(template, X[:1].clone(), "model_fn()")


def _output_width(template: torch.nn.Module, X: torch.Tensor) -> tuple[int | None, str]:
    """Outputs per sample of the node's model (its logits or targets), from one sample,
    and what the output was (for messages); the width is ``None`` when the output is
    not a ``(batch, width)`` tensor (the MSE node then refuses it, the cross-entropy's
    training fails with torch's own error)."""
    out = _probe_output(template, X)
    if not isinstance(out, torch.Tensor):
        return None, f"a {type(out).__name__}"
    return (out.shape[-1] if out.ndim == 2 else None), f"shape {tuple(out.shape)}"


def _node_data(X, y, loss: str, template: torch.nn.Module) -> ClientData:
    """The node's ``(X, y)`` checked and encoded as :class:`~mlpapers.federated.clove.CLoVE`
    checks and encodes a client's (same errors, same float32 tensors).

    A supervised loss without ``y`` used to train against ``X`` itself (``Y = X``
    broadcast: silent nonsense), float labels were truncated to class indices and
    labels of shape ``(n, 1)`` or out of range failed deep in torch.
    """
    if loss != "reconstruction" and y is None:
        raise ValueError(f"make_client_app: loss={loss!r} needs targets, but data_fn "
                         "returned (X, None); return (X, y), or use loss='reconstruction'.")
    try:
        fed = validate_clients([(X, None if loss == "reconstruction" else y)], ndim=None,
                               device=torch.device("cpu"), owner="make_client_app",
                               single=True)
    except ValueError as exc:  # (its messages name X and y: the node's data here)
        raise ValueError(f"make_client_app: the node's data from data_fn: {exc}") from exc
    if loss == "reconstruction":
        # (the probe also refuses a BatchNorm without running statistics, whose loss
        # vectors would depend on the batching, as fit does)
        out = _probe_output(template, fed.Xs[0])
        n_in = fed.Xs[0][:1].numel()
        if not isinstance(out, torch.Tensor) or out.numel() != n_in:
            got = (f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor)
                   else f"a {type(out).__name__}")
            raise ValueError("make_client_app: loss='reconstruction' needs a model_fn() "
                             f"output of {n_in} values per sample (the input size), as "
                             f"CLoVE's fit does, got {got} for a batch of one sample.")
        _check_output(template, fed.Xs[0], loss, n_in)  # (finite, floating point)
        return ClientData.from_lists(fed.Xs, None, torch.device("cpu"))
    assert fed.ys is not None  # y is not None (checked above)
    y_np = fed.ys[0]
    if loss == "mse":
        Y = mse_targets([y_np], torch.device("cpu"), prefix="make_client_app: ")[0]
        # the squared error broadcast targets of another width against the model's
        # outputs silently (a node cannot know the width: the model's output tells it)
        n_out, got = _output_width(template, fed.Xs[0])
        if n_out is None:
            raise ValueError("make_client_app: loss='mse' needs a model_fn() output of "
                             "shape (batch, n_outputs), as CLoVE's fit does, got "
                             f"{got} for a batch of one sample (the squared error "
                             "would broadcast it against y silently, or fail in torch).")
        if n_out != Y.shape[1]:
            raise ValueError(f"make_client_app: loss='mse' needs a model_fn() output of "
                             f"shape (batch, n_outputs) and y with n_outputs values per "
                             f"sample, got {Y.shape[1]} per sample and an output of "
                             f"{n_out} per sample.")
        _check_output(template, fed.Xs[0], loss, n_out)  # (finite, floating point)
        return ClientData.from_lists(fed.Xs, [Y], torch.device("cpu"))
    # cross-entropy: class indices 0 .. C-1 (no label encoding: every node must agree
    # on it, and a node sees only its own labels)
    if y_np.ndim != 1:
        raise ValueError(f"make_client_app: loss='cross_entropy' needs 1D class labels y, "
                         f"got shape {y_np.shape}.")
    if y_np.dtype.kind not in "biuf" or (
            y_np.dtype.kind == "f" and not np.array_equal(y_np, np.round(y_np))):
        raise ValueError("make_client_app: loss='cross_entropy' needs integer class indices "
                         f"0 .. C-1 as y, got {y_np.dtype} values such as {y_np[:3]!r}; "
                         "encode the labels the same way on every node (e.g. a fixed "
                         "class list and np.searchsorted).")
    n_classes = _output_width(template, fed.Xs[0])[0]
    # the range is read on the labels as given: cast first, 1e20 wrapped to int64's
    # minimum and was reported as a negative label
    lo, hi = y_np.min().item(), y_np.max().item()
    if lo < 0 or hi >= (n_classes if n_classes is not None else 2**62):
        raise ValueError(f"make_client_app: loss='cross_entropy' needs class indices in "
                         f"[0, {n_classes if n_classes is not None else 'C'}) (the model's "
                         f"outputs), got labels from {lo:g} to {hi:g}.")
    # logits of shape (batch, C), as CLoVE's fit checks them: a (batch,) output failed
    # in torch's cross-entropy at every message. (The node knows C from the output
    # only: without one, its labels ask for at least max(label) + 1 >= 2 classes.)
    _check_output(template, fed.Xs[0], loss,
                  n_classes if n_classes is not None else max(int(hi) + 1, 2))
    labels = y_np.astype(np.int64)
    return ClientData.from_lists(fed.Xs, [torch.from_numpy(labels)], torch.device("cpu"))


def _partition_metric(pid: Any) -> int | None:
    """A node's ``partition-id`` node config as its replies report it: an integer (an
    integral float such as ``2.0`` included) in int64's range, else ``None`` (not
    reported: a string such as ``"site-a"``, a bool, a fractional or non-finite number).

    (``int(pid)`` failed every message of a node with a string id, and truncated ``0.5``
    to ``0``: the server's ``partitions_`` got ids the nodes do not have, shared by two
    nodes; a Flower metric holds no string.)
    """
    if isinstance(pid, bool) or not isinstance(pid, numbers.Real):
        return None
    if isinstance(pid, numbers.Integral):
        value = int(cast(int, pid))  # (exact: not through a float)
    else:
        as_float = float(pid)
        if not (math.isfinite(as_float) and as_float.is_integer()):
            return None
        value = int(as_float)
    return value if -2**63 <= value < 2**63 else None  # (what a reply can carry)


def _check_output(template: torch.nn.Module, X: torch.Tensor, loss: str, n_out: int) -> None:
    """CLoVE's fit's check of a user model's output (:func:`check_model_output`: a
    finite floating-point tensor of shape ``(batch, n_out)``, or of the input's size for
    the reconstruction loss) on one sample of the node's ``X``, in the node's words.

    The probe runs as :func:`_probe_output`'s: in a fork of the global RNG, refusing a
    BatchNorm without running statistics. (A cross-entropy model with a ``(batch,)``
    output failed in torch at every message, "Expected floating point type for target".)
    """
    with seeded_global_rng(0), refusing_layers(template, _unfittable_layer, "model_fn()'s"):
        try:
            check_model_output(template, X[:1], loss, n_out)
        except (TypeError, ValueError) as exc:
            msg = re.sub(r"^model(\(n_features, n_outputs\))?", "model_fn()", str(exc))
            msg = msg.replace("of the first client", "of the node's data")
            raise type(exc)(f"make_client_app: {msg}") from exc


def _message_seed(msg: Message) -> int:
    """The ``seed`` of a train message's config (a user's ``train_config``), 0 without
    one; an integer (an integral float is accepted)."""
    config: Any = msg.content["config"] if "config" in msg.content else {}
    value = config.get("seed", 0)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"make_client_app: the train config's 'seed' must be an integer, "
                         f"got {value!r}.")
    return value


def make_client_app(
    model_fn: Callable[[], torch.nn.Module],
    data_fn: Callable[[Context], Sequence[Any]],
    *,
    loss: ModelLoss = "mse",
    local_epochs: int = 1,
    lr: float = 1e-2,
    batch_size: int | None = 100,
    optimizer: Optimizer = "adam",
) -> ClientApp:
    """Build the Flower ``ClientApp`` answering :class:`CLoVEStrategy`'s messages.

    Parameters
    ----------
    model_fn : callable
        ``model_fn() -> torch.nn.Module``: the architecture (same on every node); it
        is built under a float32 default dtype in a fork of the global torch RNG (the
        node's RNG state is left as it was) and cast to float32 like the data, as in
        :class:`~mlpapers.federated.clove.CLoVE`. Losses are computed in eval mode, local
        training runs in train mode with dropout drawn from a fork of the global RNG
        seeded by the message (``config["seed"]`` and the round); parameters with
        ``requires_grad=False`` are not trained. Nodes compute on the CPU (a module
        built on a GPU is copied there).
    data_fn : callable
        ``data_fn(context) -> (X, y)`` (or ``(X, None)`` for the reconstruction loss):
        the node's training data, e.g. chosen by ``context.node_config["partition-id"]``.
        Checked and cast to float32 as :class:`~mlpapers.federated.clove.CLoVE` checks a
        client's data (finite values, matching lengths), so a node computes the loss
        vector the estimator computes for the same data and models.
    loss : {"mse", "cross_entropy", "reconstruction"}, default="mse"
        Cross-entropy needs 1D integer class indices ``0 .. C-1`` (integral floats
        are accepted), encoded the same way on every node: unlike the estimator, a
        node cannot encode arbitrary labels, as it sees only its own.
    local_epochs : int, default=1
        Local epochs per round.
    lr : float, default=1e-2
        Local learning rate.
    batch_size : int or None, default=100
        Local mini-batch size (``None``: full batch).
    optimizer : {"adam", "sgd"}, default="adam"
        Local training, as in :class:`~mlpapers.federated.clove.CLoVE`; the optimizer
        state is fresh every round. With BatchNorm layers that get one value per
        channel from a sample (``BatchNorm1d`` on ``(N, C)`` features), a lone last
        sample of an epoch joins the batch before it, and ``batch_size=1`` or a node
        of one sample is refused (the node replies with the ``ValueError``).

    Returns
    -------
    flwr.clientapp.ClientApp
        The app, answering ``train.losses`` messages (the loss of every model on
        the node's data) and ``train`` messages (local training of the node's
        model). It is built at once; ``data_fn`` and ``model_fn`` run per message.
        Its replies' metrics hold ``num-examples`` and, when the node's
        ``partition-id`` node config is an integer (or an integral float, sent as
        the int), that ``partition-id`` (``CLoVEStrategy.partitions_``); an id
        that is no integer (a string, a bool, ``0.5``) is left out, not converted.

    Raises
    ------
    ValueError
        If ``loss`` or ``optimizer`` is not one of the options, or ``local_epochs``,
        ``lr`` or ``batch_size`` is out of range (as CLoVE's ``fit`` checks them; a
        value of the wrong type gives a ``TypeError``). When a message is handled (the node
        replies with the error, which :meth:`CLoVEStrategy.start` raises as a
        ``RuntimeError`` naming the node): if ``data_fn`` returns no ``y`` for a
        supervised loss, non-finite or mismatched data, labels that are not
        class indices in ``[0, C)`` for the cross-entropy, for the MSE a model
        output that is not ``(batch, n_outputs)`` with ``n_outputs`` the values per
        sample of ``y``, for the cross-entropy a model output that is not
        ``(batch, C)``, or (any loss) a model output that is not finite, a model
        without trainable parameters (every parameter ``requires_grad=False``) or a
        model with a BatchNorm built with ``track_running_stats=False`` that runs,
        as :class:`~mlpapers.federated.clove.CLoVE` refuses them (a model output that is no
        floating-point tensor gives a ``TypeError``). These are raised at the
        node's first message, the losses round.

    Examples
    --------
    The ClientApp of a deployment (``partition-id`` is the node's config):

    >>> import torch
    >>> from mlpapers.datasets import make_federated_linear
    >>> from mlpapers.federated.flower import make_client_app
    >>> def data_fn(context):
    ...     clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
    ...                                           n_features=5, random_state=0)
    ...     return clients[int(context.node_config["partition-id"])]
    >>> app = make_client_app(lambda: torch.nn.Linear(5, 1), data_fn, loss="mse",
    ...                       local_epochs=10, lr=0.05)
    >>> type(app).__name__
    'ClientApp'
    """
    check_in_options(loss, "loss", LOSSES)
    check_local_training(local_epochs, lr, batch_size, optimizer)
    for name, fn in (("model_fn", model_fn), ("data_fn", data_fn)):
        # (a module instance is callable: it failed in forward() at the first message)
        if isinstance(fn, torch.nn.Module) or not callable(fn):
            raise TypeError(f"{name} must be a function (called on every message), got "
                            f"{type(fn).__name__}"
                            + (": pass the class or a lambda building the module."
                               if isinstance(fn, torch.nn.Module) else "."))
    app = ClientApp()

    def setup(context: Context):
        pair = data_fn(context)
        # (a triple, None or a dict failed as a bare unpacking error, or unpacked a
        # dict's keys as the data)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError("make_client_app: data_fn(context) must return a pair (X, y), "
                            "or (X, None) for the reconstruction loss; got "
                            + (f"{len(pair)} items." if isinstance(pair, (tuple, list))
                               else f"{type(pair).__name__}."))
        X, y = pair
        # the architecture only (its weights are replaced): built without advancing the
        # node's global RNG, in float32 whatever the node's default dtype
        module = build_user_module(model_fn)
        if not isinstance(module, torch.nn.Module):
            raise TypeError("model_fn() must return a torch.nn.Module, got "
                            f"{type(module).__name__}.")
        template = module.float().cpu()  # nodes compute on the CPU
        # the model's output checked on the data, then its parameters, as CLoVE's fit
        # checks a user model, at the first message (the losses round)
        data = _node_data(X, y, loss, template)
        check_trainable(template, "make_client_app: model_fn()")
        # random layers (dropout) draw from a fork of the node's global RNG seeded from the
        # message's seed: reproducible, and the node's own RNG is left as it was
        engine = Engine(template, loss, vectorize=False, optimizer=optimizer, lr=lr,
                        batch_size=batch_size, local_epochs=local_epochs, user_model=True)
        engine.check_batches(data, name="node", single=True)  # BatchNorm: batches of 2+
        return data, template, engine

    def stack(records: dict[str, Any], template: torch.nn.Module):
        """The server's models (by record name) as one stacked state of the template,
        checked against model_fn()'s architecture (a mismatch failed in torch's
        load_state_dict, or as a bare KeyError)."""
        expected = {k: tuple(v.shape) for k, v in template.state_dict().items()}
        floating = {k: v.is_floating_point() for k, v in template.state_dict().items()}
        states = []
        for name, record in records.items():
            if not isinstance(record, ArrayRecord):
                raise ValueError(f"make_client_app: the server's model {name!r} is no "
                                 f"ArrayRecord, got {type(record).__name__}.")
            state = record.to_torch_state_dict()
            got = {k: tuple(v.shape) for k, v in state.items()}
            if got != expected:
                missing = sorted(set(expected) - set(got))
                extra = sorted(set(got) - set(expected))
                shapes = {k: (got[k], expected[k]) for k in set(got) & set(expected)
                          if got[k] != expected[k]}
                raise ValueError(f"make_client_app: the server's model {name!r} does not "
                                 f"fit model_fn()'s architecture: missing {missing}, "
                                 f"unexpected {extra}, shapes (sent, expected) {shapes}.")
            # integer weights for floating parameters were trained in float32 and sent
            # back, and the server refused every reply as of another dtype
            kinds = sorted(k for k, v in state.items() if v.is_floating_point() != floating[k])
            if kinds:
                raise ValueError(f"make_client_app: the server's model {name!r} holds "
                                 f"{kinds} as {state[kinds[0]].dtype} where model_fn()'s "
                                 f"are {template.state_dict()[kinds[0]].dtype}: start the "
                                 "strategy from the model's own arrays, e.g. initial_arrays="
                                 "ArrayRecord(model_fn().state_dict()).")
            states.append(state)
        # floating arrays as the float32 of the simulation; integer and bool buffers as
        # they are (a float32 round trip changed counters above 2**24)
        return {k: torch.stack([s[k].float() if floating[k] else s[k] for s in states])
                for k in expected}

    def metrics(context: Context, **values) -> MetricRecord:
        pid = _partition_metric(context.node_config.get("partition-id"))
        if pid is not None:  # (an id that is no integer is not reported)
            values["partition-id"] = pid
        return MetricRecord(values)

    @app.train(_LOSSES_ACTION)
    @on_cpu_default_device  # whatever the node's torch.set_default_device
    def losses(msg: Message, context: Context) -> Message:
        data, template, engine = setup(context)
        records = msg.content.array_records
        keys = [f"m{j}" for j in range(len(records))]
        if not records or set(records) != set(keys):
            raise ValueError("make_client_app: a train.losses message must hold the models "
                             f"as ArrayRecords m0 .. m{{K-1}}, got {sorted(records)}.")
        states = stack({k: records[k] for k in keys}, template)
        L = engine.loss_matrix(states, data)[0].tolist()
        return Message(RecordDict({"metrics": metrics(context, losses=L,
                                                      **{"num-examples": int(data.sizes[0])})}),
                       reply_to=msg)

    @app.train()
    @on_cpu_default_device
    def train(msg: Message, context: Context) -> Message:
        data, template, engine = setup(context)
        if "arrays" not in msg.content:
            raise ValueError("make_client_app: a train message must hold the node's model "
                             "as an ArrayRecord under 'arrays'.")
        states = stack({"arrays": msg.content["arrays"]}, template)
        seed = _message_seed(msg)
        # (a Python int: reduced to the generator's 64 bits, large seeds overflowed)
        gen = torch.Generator().manual_seed(
            (seed * 100003 + int(msg.metadata.group_id or 0)) % 2**64)
        with autograd_enabled():  # also inside a caller's no_grad/inference_mode
            new = engine.local_train(states, torch.zeros(1, dtype=torch.long), data, gen)
        record = ArrayRecord({k: v[0].detach() for k, v in new.items()})
        return Message(RecordDict({"arrays": record, "metrics": metrics(
            context, **{"num-examples": int(data.sizes[0])})}), reply_to=msg)

    return app
