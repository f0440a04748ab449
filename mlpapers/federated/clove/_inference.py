"""Inference of the fitted clustered-federated estimators (CLoVE, IFCA, FedAvg).

A mixin of ``_federation._FederatedBase``: choosing the model of a training
client or cluster, prediction, the model of a new client by its loss vector
(``assign``) and the per-client ``score``. It reads the fitted
state set by ``fit`` (``models_``, ``labels_``, ``_template``, ``_states``,
``loss_``, ``input_shape_``, ``n_outputs_``, ``n_clients_``, ``classes_``, ``_y_1d``) and holds
none of its own.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from sklearn.metrics import r2_score
from sklearn.utils.metaestimators import available_if

from mlpapers._base import (
    check_feature_names,
    feature_names_one_sided,
    warn_feature_names_one_sided,
)
from mlpapers._utils import (
    ArrayLike,
    check_tensor,
    encode_labels,
    on_cpu_default_device,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for, collect_row_blocks
from mlpapers.federated.clove._data import (
    _split_client,
    check_class_label_shapes,
    mse_targets,
    validate_clients,
)
from mlpapers.federated.clove._engine import ClientData, Engine, stack_states
from mlpapers.federated.clove._models import row_elements

__all__: list[str] = []


#: elements of the model's intermediate outputs held at once by predict (16 MB of float32)
_PREDICT_ELEMENTS = BLOCK_ELEMENTS


def _forward_in_blocks(model: torch.nn.Module, Xt: torch.Tensor, row_elements: int,
                       copy_input: bool = False) -> torch.Tensor:
    """``model(Xt)`` without gradients as ``(n, -1)``, in row blocks whose activations
    hold about ``_PREDICT_ELEMENTS`` values (``row_elements`` per row): all rows at
    once held ``n x width`` of every layer (0.4 GB for 100,000 rows through an MLP of
    width 512, growing with ``n``), while the output is ``n x n_outputs``. The fitted
    models are in eval mode, so a row's output does not depend on the other rows of
    its block. A model whose output does not have one row per input row (a
    reconstruction may come back flat or transposed: only its size is checked) runs
    on all rows at once, as the callers reshape its output by size. ``copy_input``
    gives the model copies of the rows (a user model may modify its input in place:
    ``Xt`` may share the caller's memory, and score compares reconstructions to it)."""
    run: Callable[[torch.Tensor], torch.Tensor] = model
    if copy_input:
        run = lambda x: model(x.clone())  # noqa: E731
    n = Xt.shape[0]
    rows = block_rows_for(row_elements, _PREDICT_ELEMENTS)
    with torch.no_grad():
        if n <= rows:
            return run(Xt).reshape(n, -1)
        first = run(Xt[:rows])
        if first.ndim == 0 or first.shape[0] != rows:
            return run(Xt).reshape(n, -1)
        return collect_row_blocks(
            lambda r: (first if r.start == 0 else run(Xt[r])).reshape(r.stop - r.start, -1),
            n, rows)


def _check_index(value, name: str, stop: int) -> None:
    """``value`` must be an integer in ``[0, stop)``: a bool is refused although it is an
    ``Integral`` (``labels_[True]`` is numpy's mask indexing, a cryptic TypeError, and
    ``cluster=True`` picked model 1 silently)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
            or not 0 <= int(value) < stop:
        raise ValueError(f"{name} must be an integer in [0, {stop}), got {value!r}.")


def _check_client_feature_names(est: Any, clients: list[Any] | tuple[Any, ...]) -> None:
    """:func:`check_feature_names` of each client's ``X`` against ``est``'s fitted names,
    with one warning for all the clients that have names on one side only (arrays
    scored by a model fitted on DataFrames, or the reverse), as ``fit`` warns once for
    a mix: a warning per client repeated the same advice ``n_clients`` times. Other
    names or another order of a client raise ``ValueError``, naming it."""
    one_sided = []
    for i, item in enumerate(clients):
        X = _split_client(item)[0]
        if feature_names_one_sided(est, X):
            one_sided.append(i)
        else:
            check_feature_names(est, X, f"clients[{i}]")
    if not one_sided:
        return
    others = ""
    if len(one_sided) > 1:
        shown = ", ".join(map(str, one_sided[:10])) + (", ..." if len(one_sided) > 10 else "")
        others = (f"{len(one_sided) - 1} other clients ({len(one_sided)} of "
                  f"{len(clients)} clients: [{shown}])")
    warn_feature_names_one_sided(est, f"clients[{one_sided[0]}]", others)


class _FederatedInferenceMixin:
    """Prediction, new-client assignment and scoring with the fitted per-cluster models."""

    # set by the estimator that mixes this in (parameters, fitted state, and the
    # helpers of TorchEstimatorMixin)
    model: str | Callable[..., torch.nn.Module]
    loss: str
    loss_: str
    models_: list[torch.nn.Module]
    labels_: np.ndarray
    classes_: np.ndarray
    input_shape_: tuple[int, ...]
    n_outputs_: int
    n_clients_: int
    _template: torch.nn.Module
    _resolved_device: torch.device
    _check_fitted: Callable[[], None]
    _to_numpy: Callable[[Any], np.ndarray]

    @property
    def _states(self) -> dict[str, torch.Tensor]:
        """The models' weights stacked along a leading axis, from ``models_`` on each use:
        ``models_`` is the one copy, so a user's edit of ``models_[j]`` reaches ``assign``,
        ``save`` and pickling (a stack stored beside it went stale)."""
        return stack_states(self.models_)

    def _needs_targets(self) -> bool | None:
        """validate_clients' ``supervised``: targets required, or (reconstruction) either
        way, since fit ignores the targets of ``(X, y)`` pairs there."""
        return None if self.loss_ == "reconstruction" else True

    def _model_for(self, client, cluster) -> torch.nn.Module:
        self._check_fitted()
        if client is not None and cluster is not None:
            raise ValueError("pass either client= or cluster=, not both.")
        if client is not None:
            _check_index(client, "client", self.n_clients_)
            return self.models_[int(self.labels_[client])]
        if cluster is not None:
            _check_index(cluster, "cluster", len(self.models_))
            return self.models_[int(cluster)]
        if len(self.models_) == 1:
            return self.models_[0]
        raise ValueError("pass client=<index of a training client> or cluster=<model index> "
                         "to choose the model; use assign() for a new client.")

    def _check_X(self, X) -> torch.Tensor:
        self._check_fitted()
        # columns of a DataFrame must match ``feature_names_in_`` (warns or raises as in
        # scikit-learn); tensors/arrays on a model fitted on DataFrames warn (at the
        # user's call)
        check_feature_names(self, X)
        Xt = check_tensor(X, ndim=None, dtype=torch.float32, device=self._resolved_device,
                          owner=type(self).__name__)
        if tuple(Xt.shape[1:]) != tuple(self.input_shape_):
            # (one sample as a vector: "samples of shape ()" named no fix)
            one = (" (one sample: pass X.reshape(1, -1))"
                   if Xt.ndim == 1 and len(self.input_shape_) == 1
                   and Xt.shape[0] == self.input_shape_[0] else "")
            raise ValueError(f"X has samples of shape {tuple(Xt.shape[1:])}, but "
                             f"{type(self).__name__} is expecting "
                             f"{tuple(self.input_shape_)}{one}.")
        return Xt

    def predict(self, X: ArrayLike, *, client: int | None = None,
                cluster: int | None = None) -> np.ndarray:
        """Predict with the model of a training client (or a given model).

        Parameters
        ----------
        X : array-like, torch.Tensor or DataFrame of shape (n_samples, n_features)
            The samples (``(n_samples, *input_shape_)`` for a callable model),
            computed in float32 on the estimator's device. A DataFrame's columns
            must match ``feature_names_in_``.
        client : int, optional
            Index of a training client (in ``[0, n_clients_)``): its assigned model
            is used.
        cluster : int, optional
            Index of a model (in ``[0, len(models_))``), as an alternative to
            ``client``. Neither is needed when there is one model (FedAvg).

        Returns
        -------
        numpy.ndarray
            Class labels from ``classes_`` of shape ``(n_samples,)``
            (cross-entropy), predicted targets of shape ``(n_samples,)`` for a
            single 1D target or ``(n_samples, n_outputs)`` (MSE), or
            reconstructions of ``X``'s shape (autoencoder).

        Raises
        ------
        ValueError
            If both ``client`` and ``cluster`` are given, or neither with several
            models, or an index is out of range, or ``X`` has the wrong shape.
        """
        model = self._model_for(client, cluster)
        return self._predict_with(model, self._check_X(X))

    def _has_proba(self) -> bool:
        """``hasattr(est, "predict_proba")``: only for class labels (the cross-entropy
        loss), as scikit-learn's meta-estimators expect; before the fit, unless the
        parameters already rule it out."""
        if hasattr(self, "loss_"):
            return self.loss_ == "cross_entropy"
        if self.loss != "auto":
            return self.loss == "cross_entropy"
        return self.model not in ("linear", "autoencoder")

    @available_if(_has_proba)
    @on_cpu_default_device  # (available_if hides it from the estimators' own wrapping)
    def predict_proba(self, X: ArrayLike, *, client: int | None = None,
                      cluster: int | None = None) -> np.ndarray:
        """Class probabilities (softmax of the logits) of a client's model.

        Only for the cross-entropy loss (``model="logistic"``, ``"mlp"`` on class
        labels, or a callable model returning logits): for other losses the method
        is absent (``hasattr(est, "predict_proba")`` is False), as in scikit-learn.

        Parameters
        ----------
        X, client, cluster : array-like, int or None, int or None
            As in :meth:`predict` (the samples, and the training client whose model,
            or the model itself, is used).

        Returns
        -------
        ndarray of shape (n_samples, n_classes), float32
            Columns in the order of ``classes_``.
        """
        self._check_fitted()
        model = self._model_for(client, cluster)
        out = _forward_in_blocks(model, self._check_X(X), self._row_elements(),
                                 copy_input=not isinstance(self.model, str))
        return self._to_numpy(torch.softmax(out.float(), dim=1))  # (a float64 model too)

    def _row_elements(self) -> int:
        """Values one row holds through a fitted model (its input and the outputs of the
        template's leaf modules), counted once when the models are set (fit, load) on
        the library's template: probing the fitted models on every call would copy
        them (user hooks, locks) or hook them while other threads use them."""
        count = getattr(self, "_predict_row_elements", None)
        return count if count is not None else row_elements(self._template,
                                                            self.input_shape_)

    def _predict_with(self, model: torch.nn.Module, Xt: torch.Tensor) -> np.ndarray:
        out = _forward_in_blocks(model, Xt, self._row_elements(),
                                 copy_input=not isinstance(self.model, str))
        if self.loss_ == "cross_entropy":
            return self.classes_[self._to_numpy(out.argmax(1))]
        if self.loss_ == "mse" and getattr(self, "_y_1d", False):
            return self._to_numpy(out[:, 0])
        return self._to_numpy(out.reshape(Xt.shape) if self.loss_ == "reconstruction" else out)

    def _client_loss_vector(self, X, y) -> np.ndarray:
        check_feature_names(self, X)
        # always an explicit pair: a bare X that is a 2-row tuple is not a client pair
        fed = validate_clients([(X, y)], ndim=None,
                               device=self._resolved_device, owner=type(self).__name__,
                               input_shape=tuple(self.input_shape_),
                               supervised=self._needs_targets(), single=True)
        data = self._encode_new(fed)
        # rows in blocks of predict's size: a large client no longer runs in one pass
        engine = Engine(self._template, self.loss_, vectorize=False, optimizer="sgd", lr=1.0,
                        batch_size=None, local_epochs=1, max_elements=_PREDICT_ELEMENTS,
                        user_model=not isinstance(self.model, str))
        return self._to_numpy(engine.loss_matrix(self._states, data))[0]

    def _encode_new(self, fed) -> ClientData:
        """A new client's data encoded as fit encoded the training clients' targets."""
        if self.loss_ == "cross_entropy":
            check_class_label_shapes(fed.ys, single=True)
            Ys = [encode_labels(fed.ys[0], self.classes_, device=self._resolved_device)]
            return ClientData.from_lists(fed.Xs, Ys, self._resolved_device)
        if self.loss_ == "mse":
            Ys = mse_targets(fed.ys, self._resolved_device)
            # the squared error broadcast a y of another width against the models'
            # outputs: a loss of the wrong shape, and a model picked silently
            if Ys[0].shape[1] != self.n_outputs_:
                raise ValueError(f"y has {Ys[0].shape[1]} output(s) per sample, but "
                                 f"{type(self).__name__} was fitted on {self.n_outputs_}.")
            return ClientData.from_lists(fed.Xs, Ys, self._resolved_device)
        return ClientData.from_lists(fed.Xs, None, self._resolved_device)

    def assign(self, X: ArrayLike, y: ArrayLike | None = None) -> int:
        """Model index for a new client: the model with the lowest loss on its data.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The new client's data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs), optional
            Its targets (required unless the loss is the reconstruction loss); for the
            MSE, as many outputs per sample as the training targets had (else
            ``ValueError``).

        Returns
        -------
        int
            Index of the model (in ``models_``) with the lowest mean loss on
            ``(X, y)`` (ties: the lowest index), as IFCA assigns.
        """
        self._check_fitted()
        return int(np.argmin(self._client_loss_vector(X, y)))

    def score(self, clients: list[Any] | tuple[Any, ...]) -> float:
        """Mean per-client quality of each client's assigned model.

        ``clients`` are held-out data of the training clients, in the same order:
        accuracy (cross-entropy), :math:`R^2` (MSE) or minus the reconstruction
        MSE (autoencoder), averaged over clients.

        Parameters
        ----------
        clients : list
            ``n_clients_`` entries, as in :meth:`fit`.

        Returns
        -------
        float
            The mean over clients of their scores (higher is better).

        Raises
        ------
        ValueError
            Labels of another kind (strings vs numbers) than in fit, targets of another
            width, or a client of fewer than 2 samples for :math:`R^2`.
        """
        self._check_fitted()
        if isinstance(clients, (list, tuple)):
            _check_client_feature_names(self, clients)
        fed = validate_clients(clients, ndim=None, device=self._resolved_device,
                               owner=type(self).__name__, input_shape=tuple(self.input_shape_),
                               supervised=self._needs_targets())
        if len(fed.Xs) != self.n_clients_:
            raise ValueError(f"score needs one entry per training client ({self.n_clients_}), "
                             f"got {len(fed.Xs)}.")
        ys = fed.ys
        if self.loss_ == "cross_entropy":
            check_class_label_shapes(cast(list, ys))
            # (string predictions against integer labels matched nowhere: accuracy 0.0)
            fitted = _label_kind(self.classes_)
            for i, y in enumerate(cast(list, ys)):
                if len(y) and _label_kind(y) != fitted:
                    raise ValueError(f"the labels of client {i} are {_label_kind(y)}s, but "
                                     f"{type(self).__name__} was fitted on {fitted}s.")
        elif self.loss_ == "mse" and ys is not None:
            for i, y in enumerate(ys):
                width = 1 if np.ndim(y) == 1 else int(np.shape(y)[1])
                if width != self.n_outputs_:
                    raise ValueError(f"y of client {i} has {width} output(s) per sample, but "
                                     f"{type(self).__name__} was fitted on {self.n_outputs_}.")
                if len(y) < 2:  # (sklearn's R^2 was NaN with a warning, and so the mean)
                    raise ValueError(f"score needs at least 2 samples per client for R^2; "
                                     f"client {i} has {len(y)}.")
        scores = []
        for i, X in enumerate(fed.Xs):
            pred = self._predict_with(self._model_for(i, None), X)
            if ys is None or self.loss_ == "reconstruction":  # (targets ignored, as in fit)
                scores.append(-float(np.mean((pred - self._to_numpy(X)) ** 2)))
            elif self.loss_ == "cross_entropy":
                scores.append(float(np.mean(pred == ys[i])))
            else:  # mse
                scores.append(float(r2_score(ys[i], pred)))
        return float(np.mean(scores))


def _label_kind(labels: Any) -> str:
    """``"string"`` or ``"number"``: the kind of class labels, for comparing them."""
    a = np.asarray(labels)
    if a.dtype.kind in "US" or (a.dtype.kind == "O" and a.size
                                and isinstance(a.flat[0], str)):
        return "string"
    return "number"
