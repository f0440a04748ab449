"""SCENTClassifier: many-class linear softmax classifier trained with sampled negatives."""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from mlpapers._base import TorchEstimatorMixin
from mlpapers._utils import ProgressLogger, check_positive
from mlpapers.optim.scent._common import (
    check_common_params,
    load_nu,
    lr_factor,
    make_loss,
    nu_to_numpy,
    set_lrs,
)
from mlpapers.optim.scent._sampled import (
    sampled_scores,
    shared_negatives,
    sparse_rows_grad,
    sparse_sgd_step,
)

__all__ = ["SCENTClassifier"]

_CHUNK = 4096


class SCENTClassifier(TorchEstimatorMixin, ClassifierMixin, BaseEstimator):
    r"""Linear softmax classifier for many classes, trained by SCENT with sampled negatives.

    Minimises the (temperature-scaled) softmax cross-entropy
    :math:`\frac{1}{n}\sum_i \tau\big[\log\sum_k e^{z_{ik}/\tau} - z_{iy_i}/\tau\big]
    + \frac{\text{alpha}}{2}\|W\|^2`, :math:`z_{ik} = w_k^\top x_i + b_k`, as the
    compositional entropic risk :math:`\frac{\tau}{n}\sum_i \log \frac{1}{C}\sum_k
    e^{(z_{ik}-z_{iy_i})/\tau}` (the same objective shifted by :math:`\tau\log C`).
    Each step costs :math:`O((B + \text{n\_negatives})\,d)` instead of
    :math:`O(BCd)`: ``n_negatives`` classes drawn uniformly with replacement from
    all :math:`C` classes are shared by the batch (as in sampled softmax and the
    paper's in-batch negatives); for each sample the draws equal to its own label
    are masked, and the exact positive term plus the valid draws form an
    unbiased estimate of :math:`\frac{1}{C}\sum_k e^{(z_{ik}-z_{iy_i})/\tau}`,
    whose per-sample dual variable :math:`\nu_i` is tracked by
    :class:`EntropicRiskLoss` with the chosen ``method`` [1]_. Only the weight
    rows of the batch's labels and of the drawn negatives are updated (a
    row-sparse SGD step; ``momentum > 0`` or ``alpha > 0`` use the dense
    gradient). With ``n_negatives = n_classes - 1`` all classes are used and
    the step is exact full-softmax SGD.
    Predictions use the exact softmax.

    Parameters
    ----------
    n_negatives : int, default=64
        Negative classes drawn per step, shared by the batch; must be
        ``< n_classes`` (``n_classes - 1`` uses every class: exact softmax).
    method : {"scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"}, default="scent"
        Dual update rule (see :class:`EntropicRiskLoss`).
    log_alpha : float or None, default=None
        :math:`\log\alpha` of SCENT. ``None`` uses :math:`\log C`, so that
        :math:`\gamma = \sigma(\log\alpha + \nu_i) = \sigma(\text{CE}_i/\tau)` stays in
        [0.5, 1) (the official code uses 12 for :math:`C \approx 3.6\times10^5`,
        :math:`\log C \approx 12.8`).
    temperature : float, default=1.0
        Softmax temperature :math:`\tau`.
    alpha : float, default=0.0
        L2 penalty on the weights (not the intercept).
    lr : float, default=1.0
        Learning rate of the primal SGD.
    lr_schedule : {"cosine", "constant"}, default="cosine"
        Per-step decay of ``lr`` (and of ``dual_lr`` for the ASGD family) in ``fit``;
        ``partial_fit`` always uses a constant rate.
    momentum : float, default=0.0
        Heavy-ball momentum of SGD.
    epochs : int, default=20
        Passes over the data in ``fit``.
    batch_size : int, default=256
        Anchors per step.
    fit_intercept : bool, default=False
        Learn a per-class bias.
    gamma, dual_lr, delta, rho : float
        Parameters of the baselines ``"sox"``, ``"asgd"``/``"umax"``/``"asgd_softplus"``,
        ``"umax"`` and ``"asgd_softplus"`` (defaults 0.9, 0.1, 1.0, 1e-3).
    random_state : int, RandomState instance or None, default=None
        Seed of the shuffling and the negative sampling.
    device : str, default="cpu"
        Torch device.
    verbose : int, default=0
        Show a progress bar with the current objective estimate.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_classes, n_features)
    intercept_ : ndarray of shape (n_classes,)
        Zeros when ``fit_intercept=False``.
    nu_ : ndarray of shape (n_samples,)
        Dual variables, estimates of :math:`\log\frac{1}{C}\sum_k e^{(z_{ik}-z_{iy_i})/\tau}`;
        NaN for samples never visited (and for ``method="bsgd"``, which has none).
    loss_curve_ : list of float
        Mean surrogate value (estimate of the dual objective plus :math:`\tau\log C`,
        i.e. of the cross-entropy) per epoch.
    n_iter_ : int
        Epochs run.
    n_features_in_ : int

    References
    ----------
    .. [1] X. Wei, L. Zhou, B. Wang, C.-J. Lin, T. Yang, "A Geometry-Aware
       Efficient Algorithm for Compositional Entropic Risk Minimization",
       ICML 2026, arXiv:2602.02877.

    Examples
    --------
    >>> from mlpapers.datasets import make_extreme_classification
    >>> from mlpapers.optim import SCENTClassifier
    >>> X, y = make_extreme_classification(2000, 100, 16, noise=0.3, random_state=0)
    >>> clf = SCENTClassifier(n_negatives=8, epochs=10, lr=3.0, random_state=0).fit(X, y)
    >>> clf.predict_proba(X[:2]).shape
    (2, 100)
    >>> bool(clf.score(X, y) > 0.9)
    True
    """

    def __init__(
        self,
        *,
        n_negatives: int = 64,
        method: str = "scent",
        log_alpha: float | None = None,
        temperature: float = 1.0,
        alpha: float = 0.0,
        lr: float = 1.0,
        lr_schedule: str = "cosine",
        momentum: float = 0.0,
        epochs: int = 20,
        batch_size: int = 256,
        fit_intercept: bool = False,
        gamma: float = 0.9,
        dual_lr: float = 0.1,
        delta: float = 1.0,
        rho: float = 1e-3,
        random_state=None,
        device: str = "cpu",
        verbose: int = 0,
    ) -> None:
        self.n_negatives = n_negatives
        self.method = method
        self.log_alpha = log_alpha
        self.temperature = temperature
        self.alpha = alpha
        self.lr = lr
        self.lr_schedule = lr_schedule
        self.momentum = momentum
        self.epochs = epochs
        self.batch_size = batch_size
        self.fit_intercept = fit_intercept
        self.gamma = gamma
        self.dual_lr = dual_lr
        self.delta = delta
        self.rho = rho
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    # -- validation ------------------------------------------------------------------
    def _check_params(self, n_classes: int) -> None:
        check_common_params(self)
        check_positive(self.n_negatives, "n_negatives", integer=True)
        check_positive(self.temperature, "temperature")
        check_positive(self.alpha, "alpha", strict=False)
        if self.n_negatives >= n_classes:
            raise ValueError(
                f"n_negatives must be < n_classes (at most {n_classes - 1} negatives exist), "
                f"got n_negatives={self.n_negatives} with {n_classes} classes."
            )

    def _encode(self, y: np.ndarray) -> torch.Tensor:
        pos = np.searchsorted(self.classes_, y)
        pos = np.clip(pos, 0, len(self.classes_) - 1)
        unseen = self.classes_[pos] != y
        if np.any(unseen):
            raise ValueError(f"y contains labels not seen in fit: {np.unique(y[unseen])[:5]}.")
        return torch.as_tensor(pos, dtype=torch.long)

    # -- fitting ----------------------------------------------------------------------
    def fit(self, X, y):
        """Fit the classifier.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self : SCENTClassifier
        """
        self._init_fit()
        X, y = self._validate_data(X, y, reset=True)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError("SCENTClassifier needs samples of at least 2 classes in the data, "
                             f"got 1 class: {self.classes_[0]!r}.")
        self._check_params(len(self.classes_))
        self._start_training(X.shape[0], X.shape[1])
        self.loss_curve_ = []
        self._run(X, self._encode(y), torch.arange(X.shape[0]), self.epochs, self.lr_schedule)
        return self

    def partial_fit(self, X, y, classes=None, sample_index=None):
        """Run one epoch on ``(X, y)`` with a constant learning rate.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like, optional
            All classes; required on the first call.
        sample_index : array-like of int of shape (n_samples,), optional
            Global indices of the rows in the dual table. ``None`` means
            ``0 .. n_samples - 1``, i.e. the same data set on every call.

        Returns
        -------
        self : SCENTClassifier
        """
        first = not hasattr(self, "classes_")
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self._init_fit()
            X, y = self._validate_data(X, y, reset=True)
            check_classification_targets(y)
            self.classes_ = np.unique(np.asarray(classes))
            if len(self.classes_) < 2:
                raise ValueError("classes must hold at least 2 classes.")
            self._check_params(len(self.classes_))
            self.loss_curve_ = []
        else:
            X, y = self._validate_data(X, y, reset=False)
            if classes is not None and not np.array_equal(np.unique(classes), self.classes_):
                raise ValueError("classes differ from those of the first call to partial_fit.")
            self._check_params(len(self.classes_))
            if not hasattr(self, "_torch_gen"):
                self._init_fit()
        if sample_index is None:
            index = torch.arange(X.shape[0])
        else:
            index = torch.as_tensor(np.asarray(sample_index), dtype=torch.long)
            if index.shape != (X.shape[0],) or bool((index < 0).any()):
                raise ValueError("sample_index must hold one non-negative integer per row of X.")
        n_anchors = int(index.max()) + 1
        if first:
            self._start_training(n_anchors, X.shape[1])
        else:
            self._resume_training(n_anchors)
        self._run(X, self._encode(y), index, 1, "constant")
        return self

    def _start_training(self, n_anchors: int, n_features: int) -> None:
        C = len(self.classes_)
        dev = self._device
        self._W = torch.zeros(C, n_features, device=dev, requires_grad=True)
        self._b = torch.zeros(C, device=dev, requires_grad=bool(self.fit_intercept))
        self._log_alpha = math.log(C) if self.log_alpha is None else float(self.log_alpha)
        self._loss_fn = make_loss(self, n_anchors, self._log_alpha).to(dev)
        params = [self._W, self._b] if self.fit_intercept else [self._W]
        self._opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
        self.n_iter_ = 0

    def _resume_training(self, n_anchors: int) -> None:
        dev = self._resolved_device
        if not hasattr(self, "_W"):  # after load or pickling without private state
            self._device = dev
            self._W = torch.as_tensor(self.coef_, dtype=torch.float32, device=dev).clone()
            self._W.requires_grad_(True)
            self._b = torch.as_tensor(self.intercept_, dtype=torch.float32, device=dev).clone()
            self._b.requires_grad_(bool(self.fit_intercept))
            C = len(self.classes_)
            self._log_alpha = math.log(C) if self.log_alpha is None else float(self.log_alpha)
            self._loss_fn = make_loss(self, max(n_anchors, len(self.nu_)),
                                      self._log_alpha).to(dev)
            load_nu(self._loss_fn, self.nu_)
            params = [self._W, self._b] if self.fit_intercept else [self._W]
            self._opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
        elif n_anchors > self._loss_fn.n_anchors:
            old = self._loss_fn
            self._loss_fn = make_loss(self, n_anchors, self._log_alpha).to(dev)
            self._loss_fn.nu[: old.n_anchors] = old.nu
            self._loss_fn.initialized[: old.n_anchors] = old.initialized

    def _step(self, Xb: torch.Tensor, yb: torch.Tensor, index: torch.Tensor) -> float:
        """One primal-dual step on a batch; only the touched rows of ``W`` change."""
        C, tau = len(self.classes_), float(self.temperature)
        neg, valid = shared_negatives(C, int(self.n_negatives), yb, self._torch_gen)
        W = self._W.detach()
        Wp = W.index_select(0, yb).requires_grad_(True)   # (B, d)
        Wn = W.index_select(0, neg).requires_grad_(True)  # (k, d)
        z_pos = (Xb * Wp).sum(1) + self._b[yb]
        z_neg = Xb @ Wn.T + self._b[neg]
        scores, mask = sampled_scores(z_pos, z_neg, valid, C, tau)
        if not bool(torch.isfinite(scores.detach()).all()):
            raise FloatingPointError(
                f"SCENTClassifier(method={self.method!r}) diverged at epoch "
                f"{self.n_iter_ + 1}: non-finite scores; lower lr (or dual_lr).")
        self._opt.zero_grad()
        loss = tau * self._loss_fn(scores, index, mask)
        loss.backward()
        rows = [(yb, Wp.grad), (neg, Wn.grad)]
        value = float(loss.detach())
        if self.momentum == 0 and self.alpha == 0:
            sparse_sgd_step(self._W, rows, self._opt.param_groups[0]["lr"])
        else:  # momentum / L2 need the dense gradient
            grad = sparse_rows_grad(W, rows)
            if self.alpha > 0:
                grad.add_(W, alpha=self.alpha)
                value += 0.5 * self.alpha * float((W * W).sum())
            self._W.grad = grad
        self._opt.step()
        return value

    def _run(self, X, y, index, epochs: int, schedule: str) -> None:
        n, tau = X.shape[0], float(self.temperature)
        y = y.to(X.device)
        bs = min(int(self.batch_size), n)
        n_batches = math.ceil(n / bs)
        total, step = epochs * n_batches, 0
        shift = tau * math.log(len(self.classes_))
        log = ProgressLogger(epochs, self.verbose, desc=f"SCENTClassifier[{self.method}]")
        for _ in log:
            perm = torch.randperm(n, generator=self._torch_gen).to(X.device)
            running = 0.0
            for start in range(0, n, bs):
                rows = perm[start:start + bs]
                set_lrs(self._opt, self._loss_fn, self, lr_factor(schedule, step, total))
                loss = self._step(X[rows], y[rows], index[rows.cpu()])
                running += loss * len(rows)
                step += 1
            self.n_iter_ += 1
            self.loss_curve_.append(running / n + shift)
            log.log(epoch=self.n_iter_, loss=self.loss_curve_[-1])
        self.coef_ = self._W.detach().cpu().numpy().copy()
        self.intercept_ = self._b.detach().cpu().numpy().copy()
        self.nu_ = nu_to_numpy(self._loss_fn)

    # -- prediction -------------------------------------------------------------------
    def _logits(self, X) -> torch.Tensor:
        X = self._validate_data(X, reset=False, dtype=torch.float64)
        W = torch.as_tensor(self.coef_, dtype=torch.float64, device=X.device)
        b = torch.as_tensor(self.intercept_, dtype=torch.float64, device=X.device)
        return torch.cat([X[i:i + _CHUNK] @ W.T + b for i in range(0, X.shape[0], _CHUNK)])

    def decision_function(self, X):
        """Class scores :math:`z = XW^\\top + b`.

        Returns
        -------
        ndarray of shape (n_samples, n_classes), or (n_samples,) for two classes
            (the score of ``classes_[1]`` minus that of ``classes_[0]``).
        """
        z = self._logits(X)
        if z.shape[1] == 2:
            z = z[:, 1] - z[:, 0]
        return self._to_numpy(z)

    def predict_proba(self, X):
        """Exact softmax probabilities :math:`\\text{softmax}(z/\\tau)` over all classes.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return self._to_numpy(torch.softmax(self._logits(X) / self.temperature, dim=1))

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, computed stably."""
        return self._to_numpy(torch.log_softmax(self._logits(X) / self.temperature, dim=1))

    def predict(self, X):
        """Most probable class of each row."""
        best = self._to_numpy(self._logits(X).argmax(dim=1))
        return self.classes_[best]

    def objective(self, X, y) -> float:
        r"""Exact regularised cross-entropy
        :math:`\frac{\tau}{n}\sum_i[\log\sum_k e^{z_{ik}/\tau} - z_{iy_i}/\tau]
        + \frac{\text{alpha}}{2}\|W\|^2` over all classes.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Labels seen in ``fit`` (others raise ``ValueError``).

        Returns
        -------
        float
        """
        z = self._logits(X) / self.temperature
        yi = self._encode(np.asarray(self._to_numpy(y) if isinstance(y, torch.Tensor) else y))
        if len(yi) != z.shape[0]:
            raise ValueError(f"X and y have inconsistent numbers of samples: "
                             f"{z.shape[0]} != {len(yi)}.")
        ce = torch.logsumexp(z, dim=1) - z[torch.arange(len(yi)), yi.to(z.device)]
        reg = 0.5 * self.alpha * float((self.coef_.astype(np.float64) ** 2).sum())
        return float(self.temperature * ce.mean()) + reg

    # -- persistence / checks ---------------------------------------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        for key in ("_W", "_b", "_opt", "_loss_fn", "_torch_gen", "_numpy_gen"):
            state.pop(key, None)
        return state

    @classmethod
    def _estimator_check_instances(cls):
        return [cls(n_negatives=1, epochs=8, batch_size=32, lr=1.0, random_state=0)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags
