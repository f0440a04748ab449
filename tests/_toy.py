"""A minimal torch-backed estimator used to test the shared base."""

import torch
from sklearn.base import BaseEstimator, RegressorMixin

from mlpapers._base import TorchEstimatorMixin


class ToyRidge(TorchEstimatorMixin, RegressorMixin, BaseEstimator):
    """Ridge regression solved in torch, with a random feature-dropping noise term
    so that ``random_state`` matters."""

    def __init__(self, *, alpha=1.0, jitter=0.0, device="cpu", random_state=None, verbose=0):
        self.alpha = alpha
        self.jitter = jitter
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        self._init_fit()
        X, y = self._validate_data(X, y, reset=True, dtype=torch.float64, y_numeric=True)
        y = torch.as_tensor(y, dtype=torch.float64)
        noise = self.jitter * torch.randn(X.shape[1], generator=self._torch_gen,
                                          dtype=torch.float64)
        Xc = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
        A = Xc.T @ Xc + self.alpha * torch.eye(Xc.shape[1], dtype=X.dtype)
        w = torch.linalg.solve(A, Xc.T @ y)
        self.coef_ = self._to_numpy(w[:-1] + noise)
        self.intercept_ = float(w[-1])
        self.history_ = [{"alpha": float(self.alpha)}]
        return self

    def predict(self, X):
        X = self._validate_data(X, reset=False, dtype=torch.float64)
        return self._to_numpy(X @ torch.from_numpy(self.coef_) + self.intercept_)
