"""Validation of a federation given as a list of clients."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import _get_feature_names

from mlpapers._utils import check_real, check_tensor, to_numpy, user_stacklevel


@dataclass
class Federation:
    """Validated clients: tensors per client plus what the model needs to know."""

    Xs: list[torch.Tensor]
    ys: list[np.ndarray] | None
    input_shape: tuple[int, ...]
    #: column names of the clients' DataFrames (the same for all), or None
    feature_names: np.ndarray | None = None


def _split_client(item):
    """``(X, y)`` of one client entry: a pair, or a bare ``X`` (``y`` None)."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        # a tuple holding an array, tensor or DataFrame/Series is an (X, y) pair: (X, y)
        # of two 1-D arrays of one length (one feature per sample) was read as a 2-row
        # X, so the client lost its targets; plain rows of numbers may still be an X
        if isinstance(item, tuple) and any(
                isinstance(part, (np.ndarray, torch.Tensor)) or hasattr(part, "iloc")
                for part in item):
            return item[0], item[1]
        if not _is_matrix_like(item):
            return item[0], item[1]
    return item, None


def _is_matrix_like(item) -> bool:
    # a 2-row list of numbers is an X, not an (X, y) pair
    if any(isinstance(part, torch.Tensor) for part in item):
        return all(isinstance(part, torch.Tensor) and part.ndim == 1 for part in item)
    try:
        arr = np.asarray(item, dtype=float)
    except (TypeError, ValueError, RuntimeError):
        return False
    return arr.ndim == 2


def validate_clients(clients, *, ndim, device: torch.device, owner: str,
                     input_shape: tuple[int, ...] | None = None,
                     supervised: bool | None = None, record_names: bool = False,
                     single: bool = False) -> Federation:
    """Check a list of ``(X, y)`` pairs (or ``X`` / ``(X, None)``) and convert it.

    With ``single`` (one client given as the arguments ``X, y`` of a method, e.g.
    ``assign``), messages name ``X`` and ``y`` rather than ``clients[0]``.

    With ``record_names`` (``fit``), the clients' DataFrame column names become
    ``Federation.feature_names`` (:func:`_common_names`); otherwise they are not
    compared across clients (prediction checks each client against the fitted names).

    Raises
    ------
    TypeError
        If ``clients`` is not a list or tuple of clients.
    ValueError
        On an empty federation, an empty client, NaN/inf, inconsistent feature
        shapes across clients, mixed supervised and unsupervised clients or
        mismatched ``X``/``y`` lengths. Messages name the client index.
    """
    def of(i: int) -> str:
        return "" if single else f" of clients[{i}]"
    if isinstance(clients, (np.ndarray, torch.Tensor)) or not isinstance(clients, (list, tuple)):
        raise TypeError(
            "clients must be a list of (X, y) pairs, X arrays or (X, None) pairs, "
            f"got {type(clients).__name__}."
        )
    if len(clients) == 0:
        raise ValueError("clients must contain at least one client, got an empty list.")
    Xs, ys, names = [], [], []
    for i, item in enumerate(clients):
        X, y = _split_client(item)
        if sp.issparse(X):
            raise TypeError(f"X{of(i)} is a scipy sparse matrix, but {owner} needs "
                            "dense data: pass X.toarray().")
        names.append(_get_feature_names(X))
        Xt = check_tensor(X, name=f"X{of(i)}", ndim=ndim, dtype=torch.float32,
                          device=device, owner=owner)
        shape = tuple(Xt.shape[1:])
        if input_shape is None:
            input_shape = shape
        elif shape != input_shape:
            who = "X" if single else f"clients[{i}]"
            raise ValueError(
                f"{who} has samples of shape {shape} "
                f"({int(np.prod(shape))} features), but {'clients[0]' if i else owner} "
                f"expects {input_shape}."
            )
        if y is not None:
            y_np = to_numpy(y) if isinstance(y, torch.Tensor) else np.asarray(y)
            if y_np.ndim not in (1, 2) or y_np.shape[0] != Xt.shape[0]:
                raise ValueError(
                    f"y{of(i)} must have shape ({Xt.shape[0]},) or ({Xt.shape[0]}, "
                    f"n_outputs) to match X, got {y_np.shape}."
                )
            check_real(y_np, f"y{of(i)}")
            if not _finite_targets(y_np):
                raise ValueError(f"Input y{of(i)} contains NaN or infinity.")
            ys.append(y_np)
        Xs.append(Xt)
    n_sup = len(ys)
    if 0 < n_sup < len(Xs):
        raise ValueError("either every client gives targets y or none does; got a mix of "
                         "(X, y) and unsupervised clients.")
    is_sup = n_sup > 0
    assert input_shape is not None  # set by the first client (clients is not empty)
    if supervised is not None and is_sup != supervised:
        raise ValueError(f"{owner} was fitted {'with' if supervised else 'without'} targets y; "
                         f"got clients {'with' if is_sup else 'without'} them.")
    return Federation(Xs, ys if is_sup else None, input_shape,
                      _common_names(names) if record_names else None)


def _common_names(names: list) -> np.ndarray | None:
    """The column names shared by the clients that have them.

    Named clients with different columns raise ``ValueError`` (their features would
    be silently misaligned); a mix of named and unnamed clients (DataFrames next to
    arrays) warns and records no names, as the arrays' columns cannot be checked.
    """
    named = [(i, n) for i, n in enumerate(names) if n is not None]
    if not named:
        return None
    i0, first = named[0]
    for i, other in named[1:]:
        if not np.array_equal(first, other):
            raise ValueError(f"clients[{i}] has feature names {_show(other)}, but "
                             f"clients[{i0}] has {_show(first)}: give every client the same "
                             "columns.")
    if len(named) < len(names):
        warnings.warn(f"{len(names) - len(named)} of {len(names)} clients have no feature "
                      f"names (arrays next to DataFrames): feature_names_in_ is not recorded.",
                      UserWarning, stacklevel=user_stacklevel())
        return None
    return first


def _show(names) -> str:
    return "none" if names is None else str(list(names[:5]))[:-1] + (
        ", ...]" if len(names) > 5 else "]")


def _finite_targets(y: np.ndarray) -> bool:
    """Whether no target is missing: NaN or infinity in a float ``y``, and ``None``,
    NaN or infinity in an object one (a list or pandas column with a ``None`` passed as
    labels and was read as NaN by the MSE loss: ``assign`` then took the argmin of
    NaN losses, model 0, and ``fit`` blamed the learning rate)."""
    if y.dtype.kind == "f":
        return bool(np.isfinite(y).all())
    if y.dtype.kind == "O":
        return not any(v is None or (isinstance(v, (float, np.floating)) and not np.isfinite(v))
                       for v in y.ravel())
    return True


def mse_targets(ys: list[np.ndarray], device: torch.device, prefix: str = ""
                ) -> list[torch.Tensor]:
    """The MSE loss's targets: one float32 tensor ``(n_i, n_outputs)`` per client (a 1-D
    ``y`` is one output), as fit, ``assign`` and a Flower node encode them (``score``
    compares predictions with the raw ``y`` by ``r2_score``); targets that are not
    numbers raise a ``ValueError`` (``prefix`` names the caller)."""
    try:
        return [torch.as_tensor(y.reshape(len(y), -1).astype(np.float32), device=device)
                for y in ys]
    except ValueError as exc:
        raise ValueError(f"{prefix}loss='mse' needs numeric targets y: {exc}") from exc


def check_class_label_shapes(ys: list[np.ndarray], single: bool = False) -> None:
    """The cross-entropy's targets are 1-D class labels (fit, score and assign alike: a
    column ``(n, 1)`` broadcast against the ``(n,)`` predictions in ``score``)."""
    for i, y in enumerate(ys):
        if y.ndim != 1:
            where = "" if single else f" for every client (clients[{i}] has shape {y.shape})"
            got = f", got shape {y.shape}" if single else ""
            raise ValueError(f"loss='cross_entropy' needs 1D class labels y{where}{got}; "
                             "pass y.ravel() for a column.")


def infer_loss(loss: str, model, ys: list[np.ndarray] | None) -> str:
    """Resolve ``loss="auto"`` from the model and the targets."""
    if loss != "auto":
        if loss in ("mse", "cross_entropy") and ys is None:
            raise ValueError(f"loss={loss!r} needs targets y, but the clients give none.")
        if loss in ("mse", "cross_entropy") and model == "autoencoder":
            # its decoder outputs n_features values: the MSE broadcast them against y
            # silently, the cross-entropy read them as class scores (or failed in torch)
            raise ValueError(f"model='autoencoder' reconstructs X (n_features outputs) "
                             f"and needs loss='reconstruction' (or 'auto'), got "
                             f"loss={loss!r}; use model='mlp' for a supervised loss.")
        return loss
    if ys is None or model == "autoencoder":
        return "reconstruction"
    if model == "linear":
        return "mse"
    if model == "logistic":
        return "cross_entropy"
    y_all = np.concatenate([y.reshape(len(y), -1) for y in ys])
    target = type_of_target(y_all if y_all.shape[1] > 1 else y_all.ravel())
    return "mse" if target.startswith("continuous") else "cross_entropy"


def check_cluster_labels(cluster_labels, n_clients: int) -> np.ndarray:
    """The true cluster of every client, for the adjusted Rand index: one label of one
    orderable kind per client (ints or strings), shape ``(n_clients,)`` (a column
    ``(n_clients, 1)`` too). A 2-D table was flattened into labels of the wrong
    clients, and a ``None`` failed inside scikit-learn's ARI with a bare ``TypeError``."""
    truth = to_numpy(cluster_labels)  # (a tensor on a GPU or requiring grad too)
    if truth.ndim == 2 and truth.shape[1] == 1:
        truth = truth[:, 0]
    if truth.shape != (n_clients,):
        raise ValueError(f"cluster_labels must have shape ({n_clients},), one label per "
                         f"client, got {truth.shape}.")
    check_real(truth, "cluster_labels")
    if truth.dtype.kind == "f" and not np.isfinite(truth).all():
        raise ValueError("cluster_labels must not hold NaN or inf.")
    try:
        np.unique(truth)  # (the ARI sorts the labels)
    except TypeError as exc:
        raise ValueError(f"cluster_labels must be labels of one orderable kind (ints or "
                         f"strings), got {sorted({type(v).__name__ for v in truth})}.") from exc
    return truth
