"""One-way partial AUC maximisation in its KL-DRO form, optimised with SCENT."""

from __future__ import annotations

import math
from typing import Literal, Self

import numpy as np
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import roc_auc_score
from sklearn.utils.multiclass import check_classification_targets

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    RandomStateLike,
    check_positive,
    encode_labels,
    with_autograd,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for
from mlpapers._utils._docs import fill_doc
from mlpapers.optim.scent._common import (
    SAMPLES_X,
    GammaMeter,
    check_common_params,
    lr_factor,
    make_loss,
    nu_to_numpy,
    set_lrs,
    surrogate_overflow,
    tensors_to_numpy,
    warn_if_worse_than_start,
)
from mlpapers.optim.scent._dro_init import feature_scaling, standardise
from mlpapers.optim.scent._kernels import tempered_log_mean_exp
from mlpapers.optim.scent._loss import Method

__all__ = ["PartialAUCClassifier"]


#: pair losses held at once by the exact objective (a block of positives x n_neg, 32 MB)
_PAIR_ELEMENTS = BLOCK_ELEMENTS


class PartialAUCClassifier(TorchEstimatorMixin, ClassifierMixin, BaseEstimator):
    r"""Linear scorer maximising the one-way partial AUC through its KL-DRO surrogate.

    Minimises, over positives :math:`i` (anchors) and negatives :math:`j` (items),

    .. math::

        F(w) = \frac{\lambda}{n_+}\sum_{i \in +} \log \frac{1}{n_-}\sum_{j \in -}
               \exp\big(L(h_i - h_j)/\lambda\big),\qquad
        L(t) = (m - t)_+^2,\quad h = \sigma\big(w^\top (x - \bar x)\big),

    the "SOPA-s" form of the one-way pAUC used in the paper's experiments [1]_:
    small :math:`\lambda` concentrates on the hardest negatives, i.e. on the low
    false-positive region of the ROC curve. Each step samples ``batch_size``
    positives and ``n_negatives`` negatives (shared by the batch) and updates the
    positives' dual variables with the chosen ``method``. The sigmoid acts on
    scores centred at the training mean :math:`\bar x` (``intercept_`` holds
    :math:`-w^\top \bar x`): uncentred raw features would put every score in the
    flat tail of the sigmoid, where the surrogate has no gradient. The SGD steps
    are taken on the centred features divided by their standard deviation (a
    diagonal preconditioner; ``coef_`` is in the original units), so the fit
    depends neither on the features' units nor on their offsets.

    Parameters
    ----------
    lam : float, default=1.0
        KL-DRO temperature :math:`\lambda`, in the units of the pair losses.
    margin : float, default=1.0
        Margin :math:`m` of the squared hinge on sigmoid scores. The float32 SGD
        needs :math:`(m+1)^2` (the largest pair loss) below 3.4e38 and
        :math:`(m+1)^2/\lambda` below 3.4e38 / (2 min(``batch_size``, number of
        positives)); a ``ValueError`` otherwise.
    max_fpr : float, default=0.3
        FPR bound of :meth:`score` (standardised partial AUC) and of the
        decision threshold.
    method : {"scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"}, default="scent"
        Update rule of the positives' dual variables (see :class:`EntropicRiskLoss`).
    log_alpha : float or None, default=None
        ``None`` uses 0: as the pairwise losses are non-negative,
        :math:`\nu \ge 0` and :math:`\gamma = \sigma(\log\alpha + \nu)` stays in
        [1/2, 1) however small the objective becomes (a value calibrated at the
        start, where :math:`\nu = m^2/\lambda`, would freeze :math:`\nu` once the
        loss falls; the official code uses -4 for :math:`\lambda = 0.1`).
    lr : float, default=0.1
        Learning rate of the primal (Nesterov) SGD, on the standardised features.
    lr_schedule : {"cosine", "constant"}, default="cosine"
        Per-step decay of ``lr`` (and of ``dual_lr`` for the ASGD family): cosine
        from ``lr`` to 0 over all the steps of ``fit``, or constant.
    momentum : float, default=0.9
        Nesterov momentum in [0, 1) (0 for plain SGD).
    epochs : int, default=50
        Passes over the positives.
    batch_size : int, default=32
        Positives per step.
    n_negatives : int, default=32
        Distinct negatives per step (at most the number of negatives): consecutive
        slices of a shuffled order of the negatives, reshuffled when fewer remain.
    gamma, dual_lr, delta, rho : float
        Baseline parameters (defaults 0.9, 0.1, 1.0, 1e-3).
        Each method reads only its own parameters (``log_alpha`` SCENT's,
        ``gamma`` SOX's, ...) and ignores the others', so one set of keyword
        arguments serves a comparison of methods.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the shuffling of the positives and of the negative sampling.
    device : str or torch.device, default="cpu"
        Torch device of the training (``"cpu"``, ``"cuda"``, ...).
    verbose : int, default=0
        Show a progress bar with the exact objective after each epoch.

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
        ``classes_[1]`` is the positive class.
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
        :math:`-w^\top \bar x`: the surrogate scores are
        :math:`\sigma(w^\top x + \text{intercept\_})`. The ranking, the pAUC and
        :meth:`decision_function` do not depend on it.
    threshold_ : float
        Decision threshold: the training negatives' score quantile at
        ``1 - max_fpr`` (``method="higher"``: a training negative's score), so
        that ``predict`` has training FPR <= ``max_fpr``.
    nu_ : ndarray of shape (n_positives,)
        Dual variables of the positives (in the order of the training positives),
        estimates of :math:`\log\frac{1}{n_-}\sum_j e^{L(h_i - h_j)/\lambda}`; NaN for
        positives never visited (and for ``method="bsgd"``).
    init_objective_ : float
        Exact training objective at the start, ``w = 0`` (every pair loss is
        ``margin**2``); a fit ending above it warns (``ConvergenceWarning``: lower
        ``lr``).
    loss_curve_ : list of float
        Exact training objective after each epoch.
    gamma_curve_ : list of float
        Mean SCENT step weight :math:`\gamma = \sigma(\log\alpha + \nu)` per epoch,
        over the positives that took a SCENT step (NaN for the other methods, and
        for the first epoch: a first visit sets a positive's :math:`\nu` to its
        estimate, with no step).
    n_iter_ : int
        Epochs run.
    n_features_in_ : int
        Number of features seen in ``fit``.

    References
    ----------
    .. [1] X. Wei, L. Zhou, B. Wang, C.-J. Lin, T. Yang, "A Geometry-Aware
       Efficient Algorithm for Compositional Entropic Risk Minimization",
       ICML 2026, arXiv:2602.02877.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import StandardScaler
    >>> from mlpapers.optim import PartialAUCClassifier
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> clf = PartialAUCClassifier(lam=1.0, epochs=5, random_state=0).fit(X, y)
    >>> bool(clf.score(X, y) > 0.9)
    True
    """

    def __init__(self, *, lam: float = 1.0, margin: float = 1.0, max_fpr: float = 0.3,
                 method: Method = "scent", log_alpha: float | None = None, lr: float = 0.1,
                 lr_schedule: Literal["cosine", "constant"] = "cosine", momentum: float = 0.9,
                 epochs: int = 50, batch_size: int = 32, n_negatives: int = 32,
                 gamma: float = 0.9, dual_lr: float = 0.1, delta: float = 1.0,
                 rho: float = 1e-3, random_state: RandomStateLike = None,
                 device: str | torch.device = "cpu", verbose: int = 0) -> None:
        self.lam = lam
        self.margin = margin
        self.max_fpr = max_fpr
        self.method = method
        self.log_alpha = log_alpha
        self.lr = lr
        self.lr_schedule = lr_schedule
        self.momentum = momentum
        self.epochs = epochs
        self.batch_size = batch_size
        self.n_negatives = n_negatives
        self.gamma = gamma
        self.dual_lr = dual_lr
        self.delta = delta
        self.rho = rho
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    def _hinge(self, hp, hn):
        """Pair losses :math:`L(h_i - h_j)` of sigmoid scores ``hp`` (B,) and ``hn`` (k,)."""
        return torch.clamp(self.margin - (hp[:, None] - hn[None, :]), min=0) ** 2

    def _pair_losses(self, w, Xp, Xn):
        """Pair losses of a training batch (features already centred: no intercept)."""
        return self._hinge(torch.sigmoid(Xp @ w), torch.sigmoid(Xn @ w))

    def _objective_t(self, w, Xp, Xn, b=0.0):
        """Exact objective over all pairs, in blocks of positives: at most about
        ``_PAIR_ELEMENTS`` pair losses at once, never ``n_pos x n_neg`` (20 GB of
        float64 for 50k positives and 50k negatives). Both sets are non-empty (``fit``
        has two classes, ``objective`` refuses one)."""
        hp, hn = torch.sigmoid(Xp @ w + b), torch.sigmoid(Xn @ w + b)
        rows = block_rows_for(len(hn), _PAIR_ELEMENTS)
        total = hp.new_zeros(())
        for i in range(0, len(hp), rows):
            total = total + tempered_log_mean_exp(self._hinge(hp[i:i + rows], hn),
                                                  self.lam).sum()
        return total / len(hp)

    # training needs autograd even inside the caller's no_grad / inference_mode block
    @restore_on_failure
    @with_autograd
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit the scorer.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training samples (numpy arrays, array-likes or torch tensors), centred and
            scaled in float64 before the float32 SGD (as the KL-DRO estimators do), so
            features with large offsets or units lose no precision.
        y : array-like or torch.Tensor of shape (n_samples,)
            Labels of exactly two classes; the larger one (``classes_[1]``) is positive.

        Returns
        -------
        self : PartialAUCClassifier
            The fitted estimator.
        """
        self._init_fit()
        # validated in float64: the features are centred before the float32 cast (as in
        # the KL-DRO estimators); rounding raw X to float32 first lost the spread of
        # features with a large offset (at 1e7 the SGD saw steps of 1 for a spread of 1),
        # so the fit depended on the offset and loss_curve_ disagreed with objective
        X64, y = self._validate_data(X, y, reset=True, dtype=torch.float64)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) != 2:
            raise ValueError("Only binary classification is supported. PartialAUCClassifier "
                             f"needs exactly 2 classes, got {len(self.classes_)} class(es).")
        check_common_params(self)
        for name in ("lam", "margin"):
            check_positive(getattr(self, name), name)
        check_positive(self.max_fpr, "max_fpr")
        if self.max_fpr > 1:
            raise ValueError(f"max_fpr must be in (0, 1], got {self.max_fpr!r}.")
        check_positive(self.n_negatives, "n_negatives", integer=True)
        pos = torch.as_tensor(y == self.classes_[1], device=X64.device)
        n_pos = int(pos.sum())
        bs = min(int(self.batch_size), n_pos)
        # the pair losses lie in [0, (margin + 1)^2] (sigmoid scores): the float32 SGD
        # needs lam, the losses themselves and loss / lam in range, the last one with a
        # factor 2 bs to spare (the surrogate sums about nu ~ loss / lam over the bs
        # anchors of a batch); else a NaN step, or an inf surrogate, after the check
        big = float(torch.finfo(torch.float32).max)
        ratio_max = big / (2 * bs)
        if (self.lam > big or self.margin + 1.0 > math.sqrt(big)
                or (self.margin + 1.0) ** 2 / self.lam > ratio_max):
            raise ValueError(
                f"lam={self.lam!r} and margin={self.margin!r} are out of float32 range: the "
                f"SGD needs lam and (margin + 1)^2 below {big:.3g} and (margin + 1)^2 / lam "
                f"below {ratio_max:.3g} (float32 max / (2 min(batch_size, positives))): pair "
                "losses are at most (margin + 1)^2, and lam is in their units.")
        # SGD on Z = (X - mean) / s (s: feature std) with v = w s: the sigmoid sees
        # centred scores, and the diagonal preconditioner makes the fit independent of
        # the features' units and offsets
        mu, scale, const = feature_scaling(X64, fit_intercept=True)
        Z64 = standardise(X64, mu, scale, const)
        # the exact objective of loss_curve_ on the float64 features, as objective() sees
        # them (the float32 copies of the SGD differ from them by their rounding)
        Xp64, Xn64 = Z64[pos], Z64[~pos]
        del Z64
        Xp, Xn = Xp64.float(), Xn64.float()
        n_neg = len(Xn)
        k = min(int(self.n_negatives), n_neg)
        dev = self._device
        w = torch.zeros(X64.shape[1], dtype=torch.float32, device=dev, requires_grad=True)
        log_alpha = 0.0 if self.log_alpha is None else float(self.log_alpha)
        loss_fn = make_loss(self, n_pos, log_alpha, temperature=float(self.lam)).to(dev)
        opt = torch.optim.SGD([w], lr=self.lr, momentum=self.momentum,
                              nesterov=self.momentum > 0)
        total, step = self.epochs * math.ceil(n_pos / bs), 0
        self.loss_curve_, self.gamma_curve_ = [], []
        with torch.no_grad():  # w = 0: every pair loss is margin^2
            self.init_objective_ = float(self._objective_t(w.double(), Xp64, Xn64))
        log = ProgressLogger(self.epochs, self.verbose, desc="PartialAUCClassifier")
        # negatives come in passes over a shuffled order, k distinct ones per step (as
        # LibAUC's DualSampler shuffles them), so k = n_neg is every negative at every
        # step; drawn with replacement, 8 of 8 held repeats in all but 0.24 % of steps
        neg_order, neg_at = torch.randperm(n_neg, generator=self._torch_gen), 0
        for epoch in log:
            perm = torch.randperm(n_pos, generator=self._torch_gen)
            gammas = GammaMeter()
            for start in range(0, n_pos, bs):
                idx = perm[start:start + bs]
                if neg_at + k > n_neg:  # (the tail of a pass waits for the next one)
                    neg_order, neg_at = torch.randperm(n_neg, generator=self._torch_gen), 0
                neg = neg_order[neg_at:neg_at + k].to(dev)
                neg_at += k
                set_lrs(opt, loss_fn, self, lr_factor(self.lr_schedule, step, total))
                opt.zero_grad()
                ell = self._pair_losses(w, Xp[idx.to(dev)], Xn[neg])
                if not bool(torch.isfinite(ell.detach()).all()):
                    # finite weights whose scores overflow float32 (lr near 1e38): the
                    # loss would report "scores contain NaN", which the user never passed
                    raise FloatingPointError(
                        f"PartialAUCClassifier(method={self.method!r}) diverged at epoch "
                        f"{epoch + 1}: the scores overflowed float32; lower lr.")
                surrogate = loss_fn(ell, idx)
                if not bool(torch.isfinite(surrogate.detach())):
                    # ASGD's exp(L - nu) overflowed (nu = inf freezes these anchors), or
                    # loss / lam summed over the batch did
                    raise surrogate_overflow("PartialAUCClassifier", self.method, epoch + 1,
                                             "loss / lam")
                surrogate.backward()
                opt.step()
                if not bool(torch.isfinite(w.detach()).all()):
                    raise FloatingPointError(
                        f"PartialAUCClassifier(method={self.method!r}) diverged at epoch "
                        f"{epoch + 1}; lower lr.")
                gammas.add(loss_fn)
                step += 1
            with torch.no_grad():
                self.loss_curve_.append(float(self._objective_t(w.double(), Xp64, Xn64)))
            self.gamma_curve_.append(gammas.mean())
            log.log(epoch=epoch + 1, objective=self.loss_curve_[-1])
        self.n_iter_ = int(self.epochs)
        self.coef_ = (w.detach().double() / scale).cpu().numpy()
        if not np.isfinite(self.coef_).all():  # w / scale of a subnormal spread (1e-310)
            raise ValueError("X has features whose spread is too small for float64 "
                             "(subnormal values, below about 1e-300): their coefficients "
                             "in X's units overflow; rescale those features.")
        self.intercept_ = -float(torch.as_tensor(self.coef_) @ mu.cpu())
        self.nu_ = nu_to_numpy(loss_fn)
        # scored exactly as decision_function does (float64 input, all rows), so that the
        # negative at the threshold is not let through by a float32 rounding of X
        scores = self._to_numpy(X64 @ torch.as_tensor(self.coef_, device=X64.device))
        neg_scores = scores[~self._to_numpy(pos)]
        # "higher": a training negative's score, with at most max_fpr * n_neg above it
        # (linear interpolation let ceil((n_neg - 1) max_fpr) negatives through)
        self.threshold_ = float(np.quantile(neg_scores, 1 - self.max_fpr, method="higher"))
        warn_if_worse_than_start(self, self.init_objective_, self.loss_curve_[-1], "w = 0")
        return self

    @fill_doc(X=SAMPLES_X)
    def decision_function(self, X: ArrayLike) -> np.ndarray:
        """Shifted linear scores :math:`w^\\top x - \\text{threshold\\_}`.

        Higher means more likely positive; the shift does not change the
        ranking (hence the pAUC) and makes ``> 0`` the decision of :meth:`predict`.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples,)
            The shifted scores.
        """
        X64 = self._validate_data(X, reset=False, dtype=torch.float64)
        w = torch.as_tensor(self.coef_, device=X64.device)
        return self._to_numpy(X64 @ w) - self.threshold_

    @fill_doc(X=SAMPLES_X)
    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """:math:`\\sigma` of :meth:`decision_function` (a monotone score, not calibrated).

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples, 2)
            Columns ``1 - p`` and ``p`` for ``classes_[0]`` and ``classes_[1]``; ``p``
            is 1/2 exactly at ``threshold_``.
        """
        p = expit(self.decision_function(X))  # no overflow for large scores
        return np.stack([1 - p, p], axis=1)

    @fill_doc(X=SAMPLES_X)
    def predict(self, X: ArrayLike) -> np.ndarray:
        """``classes_[1]`` where the score exceeds ``threshold_``, else ``classes_[0]``.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples,)
            Predicted labels (the training FPR of these decisions is at most ``max_fpr``).
        """
        above = self.decision_function(X) > 0
        return self.classes_[above.astype(int)]

    @fill_doc(X=SAMPLES_X)
    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> float:
        """Standardised partial AUC at FPR <= ``max_fpr`` (scikit-learn's ``roc_auc_score``).

        ``max_fpr`` is read when called: set to another value after ``fit``, the score
        is taken at the new one, while ``threshold_`` (hence :meth:`predict`) keeps the
        value of ``fit`` until the next fit.

        Parameters
        ----------
        %(X)s
        y : array-like or torch.Tensor of shape (n_samples,)
            True labels, among ``classes_`` (``classes_[1]`` is positive); both classes
            must be present.
        sample_weight : array-like or torch.Tensor of shape (n_samples,), optional
            Per-sample weights of the ROC curve; ``None`` weighs samples equally.

        Returns
        -------
        float
            The McClish-standardised partial AUC: 1 for a perfect ranking, 0.5 for
            a random one.
        """
        scores = self.decision_function(X)
        # (numpy, hence roc_auc_score, refuses tensors that require grad)
        y, sample_weight = tensors_to_numpy(y, sample_weight)
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:  # a column vector, as scikit-learn accepts
            y = y.ravel()
        if y.shape != scores.shape:
            raise ValueError(f"y must have shape ({len(scores)},) to match X, got {y.shape}.")
        positive = encode_labels(y, self.classes_).numpy() == 1
        if positive.all() or not positive.any():  # (roc_auc_score: NaN and a warning)
            raise ValueError("score needs samples of both classes: the partial AUC ranks "
                             f"positives above negatives, and y holds only the label {y[0]}.")
        return float(roc_auc_score(positive, scores,
                                   max_fpr=self.max_fpr, sample_weight=sample_weight))

    @fill_doc(X=SAMPLES_X)
    def objective(self, X: ArrayLike, y: ArrayLike) -> float:
        """Exact KL-DRO pAUC objective over all positive-negative pairs of ``(X, y)``.

        The :math:`F(w)` of the class docstring, with the fitted ``coef_`` and
        ``intercept_``, computed in float64 in blocks of positives.

        Parameters
        ----------
        %(X)s
        y : array-like or torch.Tensor of shape (n_samples,)
            Labels among ``classes_``; both classes must be present.

        Returns
        -------
        float
            The objective (lower is better).
        """
        X64, y = self._validate_data(X, y, reset=False, dtype=torch.float64)
        for name in ("lam", "margin"):  # read here (set_params after fit): NaN or 0.0
            check_positive(getattr(self, name), name)
        y = np.asarray(y)
        pos = encode_labels(y, self.classes_, device=X64.device) == 1
        if bool(pos.all()) or not bool(pos.any()):  # (it failed with "math domain error")
            raise ValueError("objective needs samples of both classes: it averages over the "
                             f"positive-negative pairs, and y holds only the label {y[0]}.")
        w = torch.as_tensor(self.coef_, device=X64.device)
        # models saved before intercept_ existed scored uncentred features
        b = float(getattr(self, "intercept_", 0.0))
        return float(self._objective_t(w, X64[pos], X64[~pos], b))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    @classmethod
    def _estimator_check_instances(cls):
        return [cls(epochs=5, random_state=0)]
