"""Prediction of :class:`~mlpapers.optim.SCENTClassifier`: exact softmax over all classes,
in row blocks whose logits stay within a fixed budget whatever the number of classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils.validation import column_or_1d

from mlpapers._utils import ArrayLike, check_positive
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for, collect_row_blocks, row_blocks
from mlpapers.optim.scent._sparse_input import (
    SparseArrayLike,
    is_sparse_input,
    sparse_logit_block,
    validate_sparse,
)
from mlpapers.optim.scent._xc import exact_objective

__all__: list[str] = []

#: logits held at once by predict / objective (a block of rows x n_classes, 32 MB)
_CHUNK_ELEMENTS = BLOCK_ELEMENTS


class SoftmaxPredictionMixin:
    """``decision_function``, ``predict_proba``, ``predict_log_proba``, ``predict`` and
    ``objective`` of a linear softmax model with fitted ``coef_`` (n_classes, d),
    ``intercept_``, ``classes_``, the ``temperature``, ``loss`` and ``alpha``
    parameters and ``_encode(y)`` (labels to class indices)."""

    # set by the estimator that mixes this in
    coef_: np.ndarray
    intercept_: np.ndarray
    classes_: np.ndarray
    temperature: float
    loss: str
    alpha: float
    _resolved_device: torch.device
    _validate_data: Callable[..., Any]
    _to_numpy: Callable[[Any], np.ndarray]
    _encode: Callable[[np.ndarray], torch.Tensor]

    def _block_rows(self) -> int:
        """Rows per block: about ``_CHUNK_ELEMENTS`` logits at once (at least one row),
        never ``n x n_classes``, whatever the number of classes."""
        return block_rows_for(len(self.coef_), _CHUNK_ELEMENTS)

    def _logit_block(self, X):
        """``rows -> X[rows] @ W.T + b`` in float64 for a validated ``X`` (tensor or CSR)."""
        if sp.issparse(X):
            return sparse_logit_block(X, self.coef_, self.intercept_, self._resolved_device)
        W = torch.as_tensor(self.coef_, dtype=torch.float64, device=X.device)
        b = torch.as_tensor(self.intercept_, dtype=torch.float64, device=X.device)
        # (float32 training rows too: the exact objective of the fit's own data)
        return lambda rows: X[rows].to(torch.float64) @ W.T + b

    def _map_logits(self, X, transform):
        """``transform(logits)`` of every row of a validated ``X``, block by block, into
        one preallocated output (see :mod:`mlpapers._utils._blocks` for why not a list)."""
        logits = self._logit_block(X)
        return collect_row_blocks(lambda rows: transform(logits(rows)), X.shape[0],
                                  self._block_rows())

    def _X64(self, X):
        """Validated float64 ``X``: a tensor, or a CSR matrix for scipy sparse input."""
        if is_sparse_input(X):
            return validate_sparse(self, X, reset=False, dtype=np.float64)
        return self._validate_data(X, reset=False, dtype=torch.float64)

    def _logits(self, X, transform=None) -> torch.Tensor:
        """All logits (``transform`` applied block by block: one block of temporaries)."""
        return self._map_logits(self._X64(X), (lambda z: z) if transform is None else transform)

    def decision_function(self, X: SparseArrayLike) -> np.ndarray:
        """Class scores :math:`z = XW^\\top + b`.

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Samples (numpy arrays, array-likes, torch tensors, or scipy / torch sparse
            matrices, which are never densified); computed in float64.

        Returns
        -------
        ndarray of shape (n_samples, n_classes), or (n_samples,) for two classes
            The scores (for two classes the score of ``classes_[1]`` minus that of
            ``classes_[0]``; the log-odds of :meth:`predict_proba` are this divided by
            ``temperature``).
        """
        z = self._logits(X)
        if z.shape[1] == 2:
            z = z[:, 1] - z[:, 0]
        return self._to_numpy(z)

    def predict_proba(self, X: SparseArrayLike) -> np.ndarray:
        """Exact softmax probabilities :math:`\\text{softmax}(z/\\tau)` over all classes.

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Samples (numpy arrays, array-likes, torch tensors, or scipy / torch sparse
            matrices, which are never densified); computed in float64.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Probabilities of the classes in the order of ``classes_``; each row sums to 1.
        """
        tau = self._temperature()
        return self._to_numpy(self._logits(X, lambda z: torch.softmax(_scaled(z, tau), dim=1)))

    def predict_log_proba(self, X: SparseArrayLike) -> np.ndarray:
        """Logarithm of :meth:`predict_proba`, computed stably (``log_softmax``).

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Samples (numpy arrays, array-likes, torch tensors, or scipy / torch sparse
            matrices, which are never densified); computed in float64.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Log-probabilities of the classes in the order of ``classes_`` (finite even
            where :meth:`predict_proba` underflows to 0).
        """
        tau = self._temperature()
        return self._to_numpy(self._logits(X, lambda z: torch.log_softmax(_scaled(z, tau),
                                                                          dim=1)))

    def _temperature(self) -> float:
        # read at inference: a value set after fit is checked here too (NaN gave NaN
        # probabilities)
        check_positive(self.temperature, "temperature")
        return float(self.temperature)

    def predict(self, X: SparseArrayLike) -> np.ndarray:
        """Most probable class of each row (the largest score of :meth:`decision_function`).

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Samples (numpy arrays, array-likes, torch tensors, or scipy / torch sparse
            matrices, which are never densified); computed in float64.

        Returns
        -------
        ndarray of shape (n_samples,)
            Predicted labels, taken from ``classes_``.
        """
        best = self._map_logits(self._X64(X), lambda z: z.argmax(dim=1))
        return self.classes_[self._to_numpy(best)]

    def objective(self, X: SparseArrayLike, y: ArrayLike) -> float:
        r"""Exact regularised objective of ``loss`` over all classes.

        ``loss="softmax"``: the cross-entropy
        :math:`\frac{\tau}{n}\sum_i[\log\sum_k e^{z_{ik}/\tau} - z_{iy_i}/\tau]`;
        ``loss="negatives"``: :math:`\frac{\tau}{n}\sum_i\log\frac{1}{C-1}
        \sum_{k\ne y_i}e^{(z_{ik}-z_{iy_i})/\tau}`; both plus
        :math:`\frac{\text{alpha}}{2}\|W\|^2`.

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Samples (numpy arrays, array-likes, torch tensors, or scipy / torch sparse
            matrices, which are never densified); computed in float64.
        y : array-like or torch.Tensor of shape (n_samples,)
            Labels seen in ``fit`` (others raise ``ValueError``).

        Returns
        -------
        float
            The objective value (lower is better), computed in float64 over all classes.
        """
        X = self._X64(X)
        # one label per row: an (n, 1) column broadcast against the classes inside the
        # exact objective (a silently different value, or a shape error)
        yi = self._encode(column_or_1d(self._to_numpy(y) if isinstance(y, torch.Tensor) else y))
        if len(yi) != X.shape[0]:
            raise ValueError(f"X and y have inconsistent numbers of samples: "
                             f"{X.shape[0]} != {len(yi)}.")
        return self._objective_of(X, yi)

    def _objective_of(self, X, yi: torch.Tensor) -> float:
        """:meth:`objective` of a validated ``X`` (a tensor or a CSR matrix) and encoded
        labels ``yi``."""
        yi, tau = yi.to(self._resolved_device), self._temperature()
        check_positive(self.alpha, "alpha", strict=False)
        logits = self._logit_block(X)
        value = sum(float(exact_objective(logits(rows), yi[rows], self.loss, tau))
                    * (rows.stop - rows.start)
                    for rows in row_blocks(X.shape[0], self._block_rows())) / X.shape[0]
        reg = 0.5 * self.alpha * float((self.coef_.astype(np.float64) ** 2).sum())
        return value + reg


def _scaled(z: torch.Tensor, tau: float) -> torch.Tensor:
    """``z / tau`` shifted by each row's largest logit (the softmax is unchanged): with
    a tiny ``tau`` (1e-320) ``z / tau`` overflowed to inf and the probabilities were all
    NaN; shifted, the gaps to the best class go to -inf and the best keeps 0."""
    return (z - z.amax(dim=1, keepdim=True)) / tau
