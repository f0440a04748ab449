"""The simulation loop shared by CLoVE, IFCA and FedAvg.

The three estimators differ only in how the server assigns clients to models
each round (:meth:`_FederatedBase._assign`) and in the number of models. The
inference methods (``predict``, ``assign``, ``score``) come from the mixin in
``_inference``.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.metrics import adjusted_rand_score
from sklearn.utils import metadata_routing
from sklearn.utils.multiclass import check_classification_targets

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    check_in_options,
    check_positive,
    user_stacklevel,
    warn_if_worse_than_constant,
)
from mlpapers._utils._ambient import with_autograd
from mlpapers._utils._modules import refusing_layers, without_running_statistics
from mlpapers.federated.clove._data import (
    check_class_label_shapes,
    check_cluster_labels,
    infer_loss,
    mse_targets,
    validate_clients,
)
from mlpapers.federated.clove._engine import (
    ClientData,
    Engine,
    check_local_training,
    stack_states,
    unstack_state,
)
from mlpapers.federated.clove._inference import _FederatedInferenceMixin
from mlpapers.federated.clove._kernels import (
    ifca_assign,
    random_assignment,
    weighted_model_average,
)
from mlpapers.federated.clove._models import (
    BUILTIN_MODELS,
    LOSSES,
    build_module,
    check_model_output,
    check_trainable,
    row_elements,
)


def _unfittable_layer(layer: torch.nn.Module) -> str | None:
    """Why a layer of a user model cannot be fitted (``None`` if it can)."""
    text = without_running_statistics(layer)
    return None if text is None else f"{text}; build it with track_running_stats=True."


class _FederatedBase(_FederatedInferenceMixin, TorchEstimatorMixin, BaseEstimator):
    """Shared simulation loop; subclasses define the number of models and the assignment."""

    # load rebuilds the models from ``model`` (the hidden widths are saved)
    _REBUILD_PARAMS = ("model",)

    _supports_auto = False
    # whether the assignment reads the loss matrix (FedAvg's does not)
    _assigns_by_loss = True
    # fit/predict/score take clients, not (X, y) plus routable metadata: no set_*_request.
    __metadata_request__fit = {"clients": metadata_routing.UNUSED,
                               "cluster_labels": metadata_routing.UNUSED}
    __metadata_request__predict = {"client": metadata_routing.UNUSED,
                                   "cluster": metadata_routing.UNUSED}
    __metadata_request__score = {"clients": metadata_routing.UNUSED}

    # -- hooks ----------------------------------------------------------------
    def _n_models(self, n_clients: int) -> int:
        raise NotImplementedError

    def _assign(self, L: np.ndarray, round_: int) -> np.ndarray:
        raise NotImplementedError

    # -- parameter validation ---------------------------------------------------
    def _check_params(self, n_clients: int) -> None:
        model = self.model
        if isinstance(model, str) or not callable(model):
            check_in_options(model, "model", BUILTIN_MODELS + ("<callable>",))
        check_in_options(self.loss, "loss", ("auto",) + LOSSES)
        check_positive(self.n_rounds, "n_rounds", integer=True)
        check_local_training(self.local_epochs, self.lr, self.batch_size, self.optimizer)
        check_in_options(self.vectorize, "vectorize", ("auto", True, False))
        p = self.participation
        check_positive(p, "participation")
        if p > 1:
            raise ValueError(f"participation must be in (0, 1], got {p!r}.")
        hls = self.hidden_layer_sizes
        if isinstance(hls, numbers.Integral):
            hls = (hls,)
        # a sequence (or an array): a generator was consumed by the check below and the
        # model built without its hidden layers; a set has no order for its layers
        if not isinstance(hls, (Sequence, np.ndarray)) and hasattr(hls, "__iter__"):
            raise ValueError(f"hidden_layer_sizes must be a sequence of positive integers "
                             f"(a list or tuple), got a {type(hls).__name__}.")
        if isinstance(hls, (str, bytes)) or not hasattr(hls, "__iter__") \
                or not all(isinstance(h, numbers.Integral) and not isinstance(h, bool)
                           and int(h) > 0 for h in hls):
            raise ValueError(f"hidden_layer_sizes must be positive integers, got {hls!r}.")
        self._hidden = tuple(int(h) for h in hls)
        if hasattr(self, "init"):
            check_in_options(self.init, "init", ("random", "same"))
            check_in_options(self.first_assignment, "first_assignment", ("loss", "random"))
        if getattr(self, "freeze_after", None) is not None:
            check_positive(self.freeze_after, "freeze_after", integer=True)
        if self._supports_auto:  # read with n_clusters="auto" only, checked whatever it is
            check_positive(self.max_clusters, "max_clusters", integer=True)
        k = getattr(self, "n_clusters", 1)
        if isinstance(k, str) and self._supports_auto:
            check_in_options(k, "n_clusters", ("auto",))
        else:
            check_positive(k, "n_clusters", integer=True)
            if k > n_clients:
                raise ValueError(f"n_clusters={k} must be <= the number of clients "
                                 f"({n_clients}).")

    # -- fit ------------------------------------------------------------------
    # local training needs autograd, also inside the caller's no_grad/inference_mode
    @with_autograd
    @restore_on_failure
    def fit(self, clients: list[Any] | tuple[Any, ...],
            cluster_labels: ArrayLike | None = None) -> Self:
        """Run the federated simulation.

        Parameters
        ----------
        clients : list
            One entry per client: an ``(X, y)`` pair, or ``X`` / ``(X, None)`` for
            the unsupervised (autoencoder) loss. ``X`` has shape
            ``(n_samples_i, n_features)`` (any trailing shape for a callable model).
        cluster_labels : array-like of shape (n_clients,), optional
            True cluster of each client, only used to log the adjusted Rand index
            per round in ``history_``.

        Returns
        -------
        self : object
            The fitted estimator.

        Raises
        ------
        FloatingPointError
            When a client's local update or a training loss is not finite (too large
            a ``lr``, or losses beyond float32, the models' dtype), naming the round
            and the client.
        """
        self._init_fit()
        for stale in ("classes_", "_y_1d"):  # from a previous fit with another loss
            self.__dict__.pop(stale, None)
        ndim = 2 if isinstance(self.model, str) else None
        fed = validate_clients(clients, ndim=ndim, device=self._device,
                               owner=type(self).__name__, record_names=True)
        n = len(fed.Xs)
        self._check_params(n)
        if fed.feature_names is not None:  # DataFrame clients, as scikit-learn records them
            self.feature_names_in_ = fed.feature_names
        else:
            self.__dict__.pop("feature_names_in_", None)
        truth = None
        if cluster_labels is not None:
            truth = check_cluster_labels(cluster_labels, n)
        kind = infer_loss(self.loss, self.model, fed.ys)
        data, n_out = self._encode_targets(fed, kind)
        self.loss_ = kind
        self.input_shape_ = fed.input_shape
        self.n_features_in_ = int(np.prod(fed.input_shape))
        self.n_outputs_ = n_out
        self.n_clients_ = n
        M = self._n_models(n)
        template = build_module(self.model, self.n_features_in_, n_out, self._hidden).to(
            self._device)
        if not isinstance(self.model, str):
            # a BatchNorm without running statistics normalises by the batch also in eval
            # mode: loss vectors and predictions of a row would depend on the other rows
            # (and the one-sample probe failed with torch's "more than 1 value" error)
            with refusing_layers(template, _unfittable_layer, "model's"):
                check_model_output(template, fed.Xs[0][:1], kind, n_out)
            check_trainable(template)
        states = self._init_states(template, M)
        vectorize = self._resolve_vectorize(template)
        # a user model: its random layers (dropout) train in a seeded fork of the global
        # RNG, and it is given copies of its inputs (it may modify them in place)
        engine = Engine(template, kind, vectorize=vectorize, optimizer=self.optimizer,
                        lr=self.lr, batch_size=self.batch_size, local_epochs=self.local_epochs,
                        user_model=not isinstance(self.model, str))
        engine.check_batches(data)  # BatchNorm on one value per channel: no batch of 1
        weights = data.sizes.to(torch.float64)

        assignment = np.full(n, -1, dtype=np.int64)
        # run[i]: how many of client i's last recorded assignments equal its current one
        run = np.zeros(n, dtype=np.int64)
        frozen = False
        freeze_after = getattr(self, "freeze_after", None)
        log = ProgressLogger(self.n_rounds, self.verbose, desc=type(self).__name__)
        overflowed = False  # float32 overflow of the losses warned about (once per fit)
        for t in log:
            start = time.perf_counter()
            part = self._participants(n, M)
            pdata = data.take(torch.as_tensor(part, device=self._device))
            L = None
            if not frozen and freeze_after is not None:
                # the official rule, checked at the start of a round: every participant kept
                # the same model in its last freeze_after recorded assignments
                frozen = bool(np.all(run[part] >= freeze_after))
            if frozen:
                new = assignment[part] < 0
                if new.any():  # late clients: their lowest-loss model
                    Ln = self._to_numpy(engine.loss_matrix(states, data.take(
                        torch.as_tensor(part[new], device=self._device))))
                    overflowed = self._check_losses(Ln, part[new], t, overflowed)
                    assignment[part[new]] = ifca_assign(Ln)
                a_part = assignment[part]
            else:
                L = self._to_numpy(engine.loss_matrix(states, pdata)).astype(np.float64)
                overflowed = self._check_losses(L, part, t, overflowed)
                if t == 0 and getattr(self, "first_assignment", "loss") == "random" \
                        and M > 1:  # (one model: nothing to draw, as FedAvg draws nothing)
                    a_part = random_assignment(len(part), M, self._numpy_gen)
                else:
                    a_part = self._assign(L, t)
                kept = assignment[part] == a_part
                run[part] = np.where(kept, run[part] + 1, 1)
                assignment[part] = a_part
            a_t = torch.as_tensor(a_part, device=self._device)
            client_states = engine.local_train(states, a_t, pdata, self._torch_gen)
            self._check_updates(client_states, part, t)
            previous = states
            states = weighted_model_average(client_states, a_t, weights[part], previous)
            # frozen parameters (requires_grad=False) stay exactly as they were: the mean
            # of the clients' equal copies can round
            states.update({k: previous[k] for k in engine.frozen if k in previous})
            entry: dict[str, Any] = {"round": t, "n_participants": len(part),
                                     "n_models_used": len(np.unique(a_part)), "frozen": frozen}
            if L is not None:
                w = self._to_numpy(weights[part])
                entry["loss"] = float((L[np.arange(len(part)), a_part] * w).sum() / w.sum())
            if truth is not None:
                seen = assignment >= 0
                entry["ari"] = float(adjusted_rand_score(truth[seen], assignment[seen]))
            entry["time_s"] = time.perf_counter() - start
            log.log(**entry)

        final = engine.loss_matrix(states, data)
        self.loss_vectors_ = self._to_numpy(final).astype(np.float64)
        self._check_losses(self.loss_vectors_, np.arange(n), "the final evaluation",
                           overflowed)
        missing = assignment < 0
        if missing.any():
            assignment[missing] = ifca_assign(self.loss_vectors_[missing])
        self.labels_ = assignment
        self.n_clusters_ = int(len(np.unique(assignment)))
        self.history_ = log.history
        self._set_models(template, states)
        self._warn_if_worse_than_constant(fed.ys, kind, self._to_numpy(weights))
        return self

    def _warn_if_worse_than_constant(self, ys, kind: str, sizes: np.ndarray) -> None:
        """Warn when the final training loss is far above that of a constant predictor.

        The final training loss is the data-weighted mean, over the clients, of the loss
        of each client's model after the last round (``loss_vectors_`` at ``labels_``),
        i.e. the mean per-sample loss over the pooled training data (``history_``'s
        ``loss`` is the same mean before each round's local training). A constant
        prediction reaches log C with cross-entropy (uniform probabilities; the class
        frequencies do at least as well) and, with the squared error, the variance of
        ``y`` (averaged over the outputs) within the clients of each model, weighted by
        their data (each model's bias reaches its clients' mean). Ending at more than
        twice that means the steps could not reach the data's units (raw features,
        targets offset far from 0: 1e6 against 4.2 with ``y`` offset by 1000). Short fits
        from the random initial models end up to 1.8 times above it (1 to 3 rounds, in
        the test suite), hence the factor 2. Constant targets (variance 0) give no scale
        to judge by, and the reconstruction loss no constant reference: not checked.
        An infinite loss (float32 overflow) has been reported by ``_check_losses``.
        """
        if kind == "cross_entropy":
            reference, name = math.log(len(self.classes_)), "log C"
        elif kind == "mse":
            # the best constant of each model (its bias) over the clients it serves: a
            # pooled variance counted the spread between clusters' offsets, so targets
            # offset by +-1000 per cluster (loss 6.7e5 against 3.8 within the clients)
            # passed; with one model (FedAvg) it is the pooled variance
            # y is joined once (float64, one row per sample, the clients in order): each
            # model's rows are picked by a mask of the same order, so every group's
            # variance is that of its clients' concatenated targets
            Y = np.concatenate([np.asarray(y, dtype=np.float64).reshape(len(y), -1)
                                for y in ys])
            row_label = np.repeat(np.asarray(self.labels_), [len(y) for y in ys])
            total = 0.0
            for g in np.unique(row_label):
                Yg = Y[row_label == g]
                total += float(Yg.var(axis=0).mean()) * len(Yg)
            reference = total / len(Y)
            name = "the variance of y within each model's clients"
            if reference <= 1e-12 * float((Y * Y).mean()):
                # constant targets within each model: no scale to judge a near miss by
                # (any rounding-level loss would be "twice" 0): the pooled variance
                reference, name = float(Y.var(axis=0).mean()), "the pooled variance of y"
        else:
            return
        chosen = self.loss_vectors_[np.arange(len(self.labels_)), self.labels_]
        final = float((chosen * sizes).sum() / sizes.sum())
        # (an infinite loss is float32 overflow, already warned about or raised above)
        warn_if_worse_than_constant(
            self, final, reference, loss="final training loss", reference_name=name,
            learner="the models",
            advice=(f"Standardise X (and y for a regression: a model starts near 0 and "
                    f"takes many steps to reach an offset, also one that differs per "
                    f"cluster), run more rounds or raise lr if the loss fell slowly, and "
                    f"lower lr (now {self.lr!r}) if it grew."))

    # -- helpers ----------------------------------------------------------------
    def _check_updates(self, client_states: dict[str, torch.Tensor], clients: np.ndarray,
                       t: int) -> None:
        """A diverged local update (NaN/inf weights) would be averaged into its model and
        poison every later round silently: stop with the culprits named."""
        bad = torch.zeros(len(clients), dtype=torch.bool, device=self._device)
        for v in client_states.values():
            if v.is_floating_point():
                bad |= ~torch.isfinite(v.reshape(v.shape[0], -1)).all(1)
        if bool(bad.any()):
            ids = clients[self._to_numpy(bad).astype(bool)].tolist()
            raise FloatingPointError(
                f"{type(self).__name__} diverged in round {t}: the local update of "
                f"client(s) {ids[:10]} is not finite; lower lr (now {self.lr}) or "
                "standardise the data.")

    def _check_losses(self, L: np.ndarray, clients: np.ndarray, when,
                      warned: bool = False) -> bool:
        """Non-finite losses would make the clustering fail (or silently pick a model).

        An algorithm whose assignment ignores the losses (FedAvg) only stops on NaN; an
        infinite loss there is a float32 overflow of a model that still trains (warned,
        unless ``warned``: once per fit, not once per round). Returns whether that
        warning has been given (now or before, ``warned``).
        """
        bad = ~np.isfinite(L)
        if not bad.any():
            return warned
        i, j = np.argwhere(bad)[0]
        where = f"round {when}" if isinstance(when, (int, np.integer)) else when
        advice = (f"lower lr (now {self.lr}) or rescale the data (e.g. standardise X "
                  "and y).")
        if not self._assigns_by_loss and not np.isnan(L).any():
            if not warned:
                warnings.warn(f"{type(self).__name__}: some training losses overflow "
                              "float32 (the models train in float32) and are recorded as "
                              "inf; " + advice, RuntimeWarning, stacklevel=user_stacklevel())
            return True
        raise FloatingPointError(
            f"{type(self).__name__}: the training loss of model {j} on client "
            f"{int(clients[i])} is not finite in {where}: a model diverged, or the loss "
            "overflows float32 (the models train in float32); " + advice)

    def _encode_targets(self, fed, kind: str) -> tuple[ClientData, int]:
        if kind == "reconstruction":
            return ClientData.from_lists(fed.Xs, None, self._device), int(np.prod(fed.input_shape))
        if kind == "cross_entropy":
            check_class_label_shapes(fed.ys)
            y_all = np.concatenate([y.ravel() for y in fed.ys])
            try:
                check_classification_targets(y_all)  # continuous targets are no classes
            except ValueError as exc:
                raise ValueError(f"loss='cross_entropy' needs class labels y: {exc}") from exc
            classes = np.unique(y_all)
            self.classes_ = classes
            Ys = [torch.as_tensor(np.searchsorted(classes, y), dtype=torch.long,
                                  device=self._device) for y in fed.ys]
            return ClientData.from_lists(fed.Xs, Ys, self._device), len(classes)
        Ys = mse_targets(fed.ys, self._device)
        widths = {y.shape[1] for y in Ys}
        if len(widths) > 1:
            raise ValueError(f"clients have targets with different numbers of outputs {widths}.")
        self._y_1d = all(y.ndim == 1 for y in fed.ys)
        return ClientData.from_lists(fed.Xs, Ys, self._device), Ys[0].shape[1]

    def _init_states(self, template: torch.nn.Module, M: int) -> dict[str, torch.Tensor]:
        """``M`` models, distinct random (``init="random"``) or identical (``"same"``)."""
        same = getattr(self, "init", "random") == "same"
        modules = []
        for _j in range(1 if same else M):
            seed = int(torch.randint(0, 2**62, (1,), generator=self._torch_gen))
            modules.append(build_module(self.model, self.n_features_in_, self.n_outputs_,
                                        self._hidden, seed=seed).to(self._device))
        states = stack_states(modules)
        if same:
            states = {k: v.expand(M, *v.shape[1:]).clone() for k, v in states.items()}
        return states

    def _resolve_vectorize(self, template: torch.nn.Module) -> bool:
        if self.vectorize == "auto":
            return isinstance(self.model, str)
        if self.vectorize and len(list(template.buffers())) > 0:
            raise ValueError("vectorize=True needs a model without buffers (e.g. BatchNorm "
                             "statistics); use vectorize=False.")
        return bool(self.vectorize)

    def _participants(self, n: int, M: int) -> np.ndarray:
        p = float(getattr(self, "participation", 1.0))
        if p >= 1.0:
            return np.arange(n)
        # at least one client per model; p * n rounded first: 0.07 * 100 = 7.000000000000001
        # took an eighth client
        k = min(n, max(M, math.ceil(round(p * n, 9))))
        return np.sort(self._numpy_gen.choice(n, size=k, replace=False))

    def _set_models(self, template: torch.nn.Module, states: dict[str, torch.Tensor]) -> None:
        self._template = template
        K = next(iter(states.values())).shape[0]
        models = []
        for j in range(K):
            mod = build_module(self.model, self.n_features_in_, self.n_outputs_, self._hidden)
            mod.load_state_dict(unstack_state({k: v.detach() for k, v in states.items()}, j))
            models.append(mod.to(self._resolved_device).eval())
        self.models_ = models
        self._predict_row_elements = row_elements(template, self.input_shape_)

    # -- persistence -----------------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        state.pop("models_", None)
        state["model_states_"] = dict(self._states)
        state["hidden_"] = self._hidden
        if hasattr(self, "_y_1d"):
            state["y_1d_"] = self._y_1d
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        states = state.pop("model_states_")
        self._hidden = tuple(state.pop("hidden_"))
        if "y_1d_" in state:
            self._y_1d = bool(state.pop("y_1d_"))
        state["input_shape_"] = tuple(state["input_shape_"])
        super()._set_state(state)
        # load() inside inference_mode would give inference-tensor weights, which a user
        # fine-tuning ``models_`` could not use in autograd
        with torch.inference_mode(False):
            template = build_module(self.model, self.n_features_in_, self.n_outputs_,
                                    self._hidden)
            self._set_models(template.to(self._resolved_device),
                             {k: v.to(self._resolved_device).clone() for k, v in states.items()})

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # Not a fit(X, y) estimator: fit takes a list of clients, so scikit-learn's
        # estimator checks do not apply. The contract is tested in tests/federated.
        return []
