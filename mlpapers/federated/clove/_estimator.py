"""Clustered federated learning estimators: CLoVE and its baselines IFCA and FedAvg."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias

import numpy as np
import torch
from torch import nn

from mlpapers._utils import RandomStateLike, check_in_options, check_positive
from mlpapers.federated.clove._engine import Optimizer
from mlpapers.federated.clove._federation import _FederatedBase
from mlpapers.federated.clove._kernels import (
    choose_n_clusters,
    clove_assign,
    ifca_assign,
    random_assignment,
)
from mlpapers.federated.clove._models import BuiltinModel, ModelLoss

__all__ = ["CLoVE", "FedAvg", "IFCA"]

#: ``model``: a built-in client model, or a callable ``f(n_features, n_outputs)`` building one.
ClientModel: TypeAlias = BuiltinModel | Callable[[int, int], nn.Module]
#: ``loss``: the training loss of the client models.
ClientLoss: TypeAlias = Literal["auto"] | ModelLoss

_COMMON_PARAMS = """model : {"linear", "logistic", "mlp", "autoencoder"} or callable, \
default="linear"
        Client model. ``"linear"``: affine regression (MSE); ``"logistic"``:
        softmax regression (cross-entropy); ``"mlp"``: ReLU network with
        ``hidden_layer_sizes``; ``"autoencoder"``: ReLU autoencoder whose last
        hidden size is the bottleneck (reconstruction loss). A callable
        ``f(n_features, n_outputs) -> torch.nn.Module`` builds any model; it is
        called in a seeded fork of torch's global CPU RNG (left as it was) under a
        float32 default dtype, and the models are float32 copies of its modules
        (build on the CPU: the estimator moves them to ``device``, and a module
        built on a GPU would draw from that GPU's unseeded generator).
        Losses and predictions use eval mode, local training train mode (dropout
        seeded by ``random_state``); ``requires_grad=False`` parameters are not
        trained. BatchNorm layers need running statistics
        (``track_running_stats=True``). A BatchNorm that gets one value per channel
        from a sample (``BatchNorm1d`` on ``(N, C)`` features) needs at least 2
        samples per training batch: ``batch_size=1`` and clients of one sample are
        then refused, and a lone sample left at the end of an epoch joins the batch
        before it (BatchNorm2d after a convolution trains on any batch, unchanged).
        See the user guide, "Your own model".
    hidden_layer_sizes : int or sequence of int, default=(64,)
        Hidden widths of ``"mlp"`` and ``"autoencoder"`` (an int is one hidden layer).
    loss : {"auto", "mse", "cross_entropy", "reconstruction"}, default="auto"
        ``"auto"`` picks the reconstruction loss without targets or with the
        autoencoder, MSE for ``"linear"`` and continuous targets, cross-entropy
        otherwise. ``model="autoencoder"`` takes the reconstruction loss only
        (``"mse"`` or ``"cross_entropy"`` with it raise a ``ValueError``).
    n_rounds : int, default=20
        Communication rounds.
    local_epochs : int, default=1
        Epochs of local training per round.
    lr : float, default=1e-2
        Learning rate of the local optimizer.
    batch_size : int or None, default=100
        Local mini-batch size (``None``: full batch). The batch orders are drawn
        in the order of the client list, so with mini-batches a permuted list of
        clients gives another fit of the same distribution, not the permuted one.
    optimizer : {"adam", "sgd"}, default="adam"
        Local optimizer; its state is reset every round."""

_RUN_PARAMS = """participation : float, default=1.0
        Fraction of clients sampled each round (at least one per model).
    vectorize : {"auto", True, False}, default="auto"
        Simulate all clients as batched tensor operations (``torch.func.vmap``)
        or in a per-client loop. ``"auto"`` vectorises the built-in models and
        loops over clients for a callable model (which may use BatchNorm etc.);
        a callable model that ``vmap`` cannot run but that runs outside it
        (``.item()``, data-dependent shapes) raises a ``ValueError`` with
        ``vectorize=True`` (a model that fails outside vmap too raises its own
        error).
    device : str or torch.device, default="cpu"
        Torch device.
    random_state : int, RandomState, Generator or None, default=None
        Seeds model initialisation, assignments, sampling and mini-batches.
    verbose : int, default=0
        Show a progress bar per round."""

_ATTRIBUTES = """labels_ : ndarray of int of shape (n_clients,)
        Model (cluster) index of every client after the last round.
    models_ : list of torch.nn.Module
        The trained models.
    loss_vectors_ : ndarray of shape (n_clients, n_models)
        Training loss of every model on every client after training.
    n_clusters_ : int
        Number of models that hold at least one client.
    history_ : list of dict
        Per round: ``loss`` (data-weighted mean training loss of the assigned
        models, before local training; absent from rounds with ``frozen`` True,
        which compute no losses), ``ari`` (when ``cluster_labels`` were given),
        ``n_participants``, ``n_models_used``, ``frozen``, ``time_s``.
    classes_ : ndarray
        Class labels (cross-entropy loss only).
    n_features_in_ : int
        Number of (flattened) input features.
    feature_names_in_ : ndarray of str
        Column names of the clients' DataFrames (all alike); only set when the
        clients were DataFrames with string column names.
    n_clients_ : int
        Number of training clients.
    loss_ : {"mse", "cross_entropy", "reconstruction"}
        The loss trained, what ``loss="auto"`` resolved to.
    input_shape_ : tuple of int
        Shape of one client sample (without the sample axis).
    n_outputs_ : int
        Number of model outputs: classes (cross-entropy), target columns (MSE) or
        input features (reconstruction)."""


class _ClusteredBase(_FederatedBase):
    def _n_models(self, n_clients: int) -> int:
        if self.n_clusters == "auto":
            return min(int(self.max_clusters), n_clients)
        return int(self.n_clusters)


class CLoVE(_ClusteredBase):
    """CLoVE: clustered federated learning by clustering loss vector embeddings.

    Every round, each participating client evaluates all :math:`K` cluster
    models on its training data; its vector of mean losses
    :math:`L_i = (\\ell_i(\\theta_1), \\dots, \\ell_i(\\theta_K))` is its embedding.
    The server clusters the :math:`n \\times K` loss matrix with k-means, matches
    clusters to models with the Hungarian algorithm on summed losses
    (:func:`clove_assign`), each client trains its assigned model locally, and
    each model becomes the data-size weighted average of its clients' updates
    (a model without clients keeps its weights).

    Parameters
    ----------
    n_clusters : int or "auto", default=2
        Number of cluster models. ``"auto"`` keeps ``max_clusters`` models and
        picks the number of clusters every round by Ward linkage + silhouette
        (a larger number must improve the silhouette by more than 10%).
    %(common)s
    init : {"random", "same"}, default="random"
        Distinct random initial models, or one random model copied K times.
    first_assignment : {"loss", "random"}, default="loss"
        Round-0 assignment: by the loss vectors, or random with every model
        getting at least one client.
    loss_transform : {None, "sqrt", "log"}, default=None
        Transform of the losses before k-means (the paper's square-root
        ablation; ``"log"`` tames unbounded cross-entropy outliers). The
        clusters are still matched to the models on summed raw losses.
    max_clusters : int, default=15
        Upper bound on the number of clusters when ``n_clusters="auto"``.
    freeze_after : int or None, default=None
        Stop re-clustering, from the start of a round on, once every client
        taking part in that round was given the same model in each of its
        last ``freeze_after`` recorded assignments (the official code's rule;
        the paper uses 3). No loss vectors are computed after that; clients
        seen for the first time afterwards take their lowest-loss model.
        ``freeze_after=1`` freezes after the first round, on its assignment (a
        random one with ``first_assignment="random"``).
    n_init : int, default=10
        k-means restarts.
    %(run)s

    Attributes
    ----------
    %(attrs)s

    See Also
    --------
    IFCA : clients take their lowest-loss model.
    FedAvg : one global model.
    clove_assign : the assignment step alone.

    Notes
    -----
    Degenerate loss matrices (fewer distinct loss vectors than clusters, for
    example identical clients) run k-means with fewer clusters; in round 0 they
    fall back to a random assignment so that every model gets a client.

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    >>> from mlpapers.datasets import make_federated_linear
    >>> from mlpapers.federated import CLoVE
    >>> from sklearn.metrics import adjusted_rand_score
    >>> clients, truth, coef = make_federated_linear(
    ...     n_clusters=3, n_clients_per_cluster=3, n_samples=100, random_state=0)
    >>> est = CLoVE(n_clusters=3, n_rounds=3, local_epochs=10, lr=0.05,
    ...             random_state=0).fit(clients)
    >>> adjusted_rand_score(truth, est.labels_)
    1.0
    """

    _supports_auto = True

    def __init__(
        self,
        *,
        n_clusters: int | Literal["auto"] = 2,
        model: ClientModel = "linear",
        hidden_layer_sizes: int | Sequence[int] = (64,),
        loss: ClientLoss = "auto",
        n_rounds: int = 20,
        local_epochs: int = 1,
        lr: float = 1e-2,
        batch_size: int | None = 100,
        optimizer: Optimizer = "adam",
        init: Literal["random", "same"] = "random",
        first_assignment: Literal["loss", "random"] = "loss",
        loss_transform: Literal["sqrt", "log"] | None = None,
        max_clusters: int = 15,
        freeze_after: int | None = None,
        n_init: int = 10,
        participation: float = 1.0,
        vectorize: Literal["auto"] | bool = "auto",
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.n_clusters = n_clusters
        self.model = model
        self.hidden_layer_sizes = hidden_layer_sizes
        self.loss = loss
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.init = init
        self.first_assignment = first_assignment
        self.loss_transform = loss_transform
        self.max_clusters = max_clusters
        self.freeze_after = freeze_after
        self.n_init = n_init
        self.participation = participation
        self.vectorize = vectorize
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self, n_clients: int) -> None:
        super()._check_params(n_clients)
        check_in_options(self.loss_transform, "loss_transform", (None, "sqrt", "log"))
        # (up front, whatever the run: k-means read it only after a round's work, and a
        # run that never reached k-means accepted any value)
        check_positive(self.n_init, "n_init", integer=True)

    def _assign(self, L: np.ndarray, round_: int) -> np.ndarray:
        raw = L
        if self.loss_transform == "sqrt":
            L = np.sqrt(np.maximum(L, 0.0))
        elif self.loss_transform == "log":
            L = np.log(np.maximum(L, 0.0) + 1e-12)
        M = L.shape[1]
        if M == 1:
            # one model is FedAvg: no k-means seed is drawn, which would shift the
            # participants sampled later from the same generator (participation < 1)
            return np.zeros(L.shape[0], dtype=np.int64)
        if self.n_clusters == "auto":
            k = choose_n_clusters(L, M)
        else:
            k = int(self.n_clusters)
        k = min(k, L.shape[0])
        if round_ == 0 and np.unique(L, axis=0).shape[0] < k:
            return random_assignment(L.shape[0], M, self._numpy_gen)
        seed = int(self._numpy_gen.integers(0, 2**31 - 1))
        # the transform shapes the embedding only: the clusters are matched to the models
        # on their summed raw losses (summed logs would let one near-zero loss decide)
        return clove_assign(L, k, random_state=seed, n_init=self.n_init, match_losses=raw)


class IFCA(_ClusteredBase):
    """IFCA: iterative federated clustering, each client takes its lowest-loss model.

    The same simulation as :class:`CLoVE` with the assignment
    :math:`a_i = \\arg\\min_j \\ell_i(\\theta_j)` (model averaging variant). Its
    guarantees need a good initialisation. With identical initial models every
    client picks model 0 in the first round (a tie), which becomes the FedAvg
    model; later a group moves only to an untouched initial model that happens
    to fit it better, so the clusters separate partially if at all.

    Parameters
    ----------
    n_clusters : int, default=2
        Number of cluster models.
    %(common)s
    init : {"random", "same"}, default="random"
        Distinct random initial models, or one random model copied K times.
    first_assignment : {"loss", "random"}, default="loss"
        Round-0 assignment: lowest loss, or random.
    freeze_after : int or None, default=None
        Stop re-assigning once every participant of a round kept the same model
        in its last ``freeze_after`` assignments (as :class:`CLoVE`).
    %(run)s

    Attributes
    ----------
    %(attrs)s

    References
    ----------
    .. [1] Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered
       Federated Learning", NeurIPS 2020, arXiv:2006.04088.
    .. [2] Bhatia et al., "CLoVE", ICML 2026, arXiv:2506.22427 (baseline).

    Examples
    --------
    >>> from mlpapers.datasets import make_federated_linear
    >>> from mlpapers.federated import IFCA
    >>> from sklearn.metrics import adjusted_rand_score
    >>> clients, truth, coef = make_federated_linear(
    ...     n_clusters=2, n_clients_per_cluster=3, n_samples=100, separation=1.5,
    ...     random_state=0)
    >>> est = IFCA(n_clusters=2, n_rounds=5, local_epochs=10, lr=0.05,
    ...            random_state=0).fit(clients)
    >>> adjusted_rand_score(truth, est.labels_)
    1.0
    >>> est.predict(clients[0][0][:3], client=0).shape  # with client 0's model
    (3,)
    """

    def __init__(
        self,
        *,
        n_clusters: int = 2,
        model: ClientModel = "linear",
        hidden_layer_sizes: int | Sequence[int] = (64,),
        loss: ClientLoss = "auto",
        n_rounds: int = 20,
        local_epochs: int = 1,
        lr: float = 1e-2,
        batch_size: int | None = 100,
        optimizer: Optimizer = "adam",
        init: Literal["random", "same"] = "random",
        first_assignment: Literal["loss", "random"] = "loss",
        freeze_after: int | None = None,
        participation: float = 1.0,
        vectorize: Literal["auto"] | bool = "auto",
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.n_clusters = n_clusters
        self.model = model
        self.hidden_layer_sizes = hidden_layer_sizes
        self.loss = loss
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.init = init
        self.first_assignment = first_assignment
        self.freeze_after = freeze_after
        self.participation = participation
        self.vectorize = vectorize
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _assign(self, L: np.ndarray, round_: int) -> np.ndarray:
        return ifca_assign(L)


class FedAvg(_FederatedBase):
    """FedAvg: one global model, the data-size weighted average of local updates.

    Same interface as :class:`CLoVE` (``labels_`` is all zeros).

    Parameters
    ----------
    %(common)s
    %(run)s

    Attributes
    ----------
    %(attrs)s

    References
    ----------
    .. [1] McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient
       Learning of Deep Networks from Decentralized Data", AISTATS 2017,
       arXiv:1602.05629.

    Examples
    --------
    >>> from mlpapers.datasets import make_federated_linear
    >>> from mlpapers.federated import FedAvg
    >>> clients, truth, coef = make_federated_linear(
    ...     n_clusters=2, n_clients_per_cluster=2, n_samples=100, random_state=0)
    >>> est = FedAvg(n_rounds=3, local_epochs=10, lr=0.05, random_state=0).fit(clients)
    >>> est.labels_.tolist(), len(est.models_)
    ([0, 0, 0, 0], 1)
    >>> est.predict(clients[0][0][:3]).shape  # one model: no client= needed
    (3,)
    """

    _assigns_by_loss = False

    def __init__(
        self,
        *,
        model: ClientModel = "linear",
        hidden_layer_sizes: int | Sequence[int] = (64,),
        loss: ClientLoss = "auto",
        n_rounds: int = 20,
        local_epochs: int = 1,
        lr: float = 1e-2,
        batch_size: int | None = 100,
        optimizer: Optimizer = "adam",
        participation: float = 1.0,
        vectorize: Literal["auto"] | bool = "auto",
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.model = model
        self.hidden_layer_sizes = hidden_layer_sizes
        self.loss = loss
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.participation = participation
        self.vectorize = vectorize
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _n_models(self, n_clients: int) -> int:
        return 1

    def _assign(self, L: np.ndarray, round_: int) -> np.ndarray:
        return np.zeros(L.shape[0], dtype=np.int64)


for _cls in (CLoVE, IFCA, FedAvg):
    if _cls.__doc__ is not None:  # None under python -OO (docstrings stripped)
        _cls.__doc__ = (_cls.__doc__.replace("%(common)s", _COMMON_PARAMS)
                        .replace("%(run)s", _RUN_PARAMS).replace("%(attrs)s", _ATTRIBUTES))
