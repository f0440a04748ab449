"""Scipy sparse (CSR) input of :class:`SCENTClassifier`.

Extreme-classification features are usually sparse (bag of words, TF-IDF). The
training loop takes mini-batches of rows as torch sparse COO tensors (a step
costs :math:`O(\\text{nnz}\\cdot k)`, never densifying ``X``), and predictions
multiply blocks of CSR rows by the weights with scipy.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils.validation import validate_data

from mlpapers._utils import ArrayLike

__all__: list[str] = []

#: ``X`` of :class:`SCENTClassifier`: array-likes, tensors (dense or sparse) and scipy
#: sparse matrices or arrays
SparseArrayLike: TypeAlias = ArrayLike | sp.spmatrix | sp.sparray


def is_sparse_input(X) -> bool:
    """A scipy sparse matrix, a torch sparse tensor, or a pandas DataFrame whose
    columns are all sparse."""
    if sp.issparse(X) or (isinstance(X, torch.Tensor) and X.layout != torch.strided):
        return True
    dtypes = getattr(X, "dtypes", None)
    return (hasattr(X, "columns") and dtypes is not None and len(dtypes) > 0
            and all(str(dt).startswith("Sparse[") for dt in dtypes))


def validate_sparse(est, X, y=None, *, reset: bool, dtype) -> tuple | sp.csr_matrix:
    """``X`` as a finite CSR matrix of ``dtype`` (and ``y``), as scikit-learn validates:
    records or checks ``n_features_in_`` and ``feature_names_in_``."""
    if not reset:
        est._check_fitted()
    if isinstance(X, torch.Tensor):
        X = _torch_to_scipy(X)
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    kwargs = dict(accept_sparse="csr", dtype=dtype, reset=reset)
    if y is None:
        X = validate_data(est, X, **kwargs)
    else:
        X, y = validate_data(est, X, y, **kwargs)
    X = sp.csr_matrix(X, copy=False)
    return X if y is None else (X, y)


def _torch_to_scipy(X: torch.Tensor) -> sp.csr_matrix:
    """A 2-D torch sparse tensor (COO, CSR, CSC, ...) as a scipy CSR matrix."""
    if X.ndim != 2:
        raise ValueError(f"Expected 2D array, got a {X.ndim}D sparse tensor instead.")
    coo = X.detach().cpu().to_sparse_coo().coalesce()
    idx, val = coo.indices().numpy(), coo.values().numpy()
    return sp.csr_matrix((val, (idx[0], idx[1])), shape=tuple(X.shape))


class SparseRows:
    """Row batches of a CSR matrix as torch sparse tensors (the training loop's ``X``).

    Parameters
    ----------
    X : scipy.sparse.csr_matrix of shape (n_samples, n_features)
    device : torch.device
    """

    def __init__(self, X: sp.csr_matrix, device: torch.device) -> None:
        self.X = X
        self.shape = X.shape
        self.device = device

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (a 1-D integer tensor) as a coalesced sparse COO tensor."""
        return csr_to_torch(self.X[rows.cpu().numpy()], torch.float32, self.device)


def csr_to_torch(X: sp.csr_matrix, dtype: torch.dtype, device) -> torch.Tensor:
    """A coalesced torch sparse COO tensor with the entries of ``X``."""
    X = X.copy()
    X.sum_duplicates()  # sorted, unique (row, col) pairs: the COO order is coalesced
    coo = X.tocoo()
    idx = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(coo.data), coo.shape, dtype=dtype,
                                   device=device, check_invariants=False, is_coalesced=True)


def sparse_row_dot(Xb: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Row-wise products :math:`\\langle x_i, w_i\\rangle` of a sparse ``Xb`` and dense ``W``.

    Parameters
    ----------
    Xb : torch.Tensor, sparse COO (coalesced), of shape (B, d)
    W : torch.Tensor of shape (B, d)

    Returns
    -------
    torch.Tensor of shape (B,)
        Differentiable in ``W``.
    """
    idx, val = Xb.indices(), Xb.values().to(W.dtype)
    out = torch.zeros(Xb.shape[0], dtype=W.dtype, device=W.device)
    return out.index_add(0, idx[0], val * W[idx[0], idx[1]])


def sparse_logit_block(X: sp.csr_matrix, W: np.ndarray, b: np.ndarray, device):
    """``rows -> X[rows] @ W.T + b`` as a float64 torch tensor on ``device``."""
    WT = np.ascontiguousarray(W.T, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return lambda rows: torch.from_numpy(np.asarray(X[rows] @ WT) + b).to(device)
