"""KL-DRO linear models: minimise lambda * log mean exp(loss / lambda) with SCENT.

The SGD's starting point (ERM warm starts, standardised parameterisation) lives in
``_dro_init``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, Self

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    RandomStateLike,
    check_bool,
    check_float32_param,
    check_in_options,
    check_positive,
    encode_labels,
    with_autograd,
)
from mlpapers._utils._docs import fill_doc
from mlpapers.optim.scent._common import (
    SAMPLES_X,
    GammaMeter,
    TensorTargetsScore,
    check_common_params,
    lr_factor,
    make_loss,
    set_lrs,
    surrogate_overflow,
    warn_if_worse_than_start,
)
from mlpapers.optim.scent._dro_init import (
    erm_least_squares,
    erm_logistic,
    feature_scaling,
    standardise,
    unscale,
)
from mlpapers.optim.scent._kernels import log_mean_exp, tempered_log_mean_exp
from mlpapers.optim.scent._loss import Method

__all__ = ["KLDROClassifier", "KLDRORegressor"]

_DOC_PARAMS = r"""
    lam : float, default=1.0
        KL-DRO temperature :math:`\lambda > 0`; small values approach the
        worst-case (maximum) loss, large values the average loss. It is in the
        units of the loss (for the regressor, squared units of ``y``): compare it
        with the mean ERM loss, or standardise ``y`` first. The SGD is float32:
        ``lam`` above 3.4e38, or so small that ``loss / lam`` overflows float32,
        raises a ``ValueError`` (the regressor first rescales ``y`` by a power of
        two, an exact change of units, when its residuals are beyond
        :math:`2^{\pm 32}`).
    method : {"scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"}, default="scent"
        Update rule of the single dual variable (see :class:`EntropicRiskLoss`).
    log_alpha : float, "auto" or None, default=None
        :math:`\log\alpha` of SCENT. ``"auto"`` uses :math:`-\nu_0`, minus the
        dual variable :math:`\log\text{mean}\,e^{\ell/\lambda}` at the initial
        model, so that :math:`\gamma` starts at 1/2 (the paper's heuristic
        :math:`\alpha \approx e^{-\nu^*}`; best on the diabetes benchmark at
        small :math:`\lambda`, but seed-sensitive there: as the loss falls,
        :math:`\gamma = \sigma(\nu - \nu_0)` collapses and outliers' weights
        explode; at :math:`\lambda = 0.2`, ``lr=1e-3`` it ended above the ERM
        start on 6 of 12 seeds after 10 epochs, 1 of 12 after 40). ``None``
        (the stable default) uses 0: losses are non-negative,
        so :math:`\nu \ge 0` and :math:`\gamma = \sigma(\log\alpha + \nu)` stays
        in [1/2, 1). Smaller values average ``nu`` over more batches but, once
        :math:`\nu` falls, make :math:`\gamma` tiny and the primal weights
        :math:`e^{\ell/\lambda - \nu}` explosive on heavy-tailed losses (a value
        calibrated at the ERM start diverged in our tests); the official code
        tunes -22, -4, -1.1 for :math:`\lambda` = 0.2, 1, 5.
    lr : float, default=1e-4
        Learning rate of the primal (Nesterov) SGD. The curvature of the
        objective grows like :math:`e^{\ell/\lambda}`, so small :math:`\lambda` or
        heavy-tailed losses need small steps (the official code uses 5e-6 to 1e-5).
    lr_schedule : {"cosine", "constant"}, default="cosine"
        Per-step decay of ``lr`` (and of ``dual_lr`` for the ASGD family): cosine
        from ``lr`` to 0 over all the steps of ``fit``, or constant.
    momentum : float, default=0.9
        Nesterov momentum in [0, 1) (0 for plain SGD), as in the official code.
    epochs : int, default=100
        Passes over the data (a positive integer).
    batch_size : int, default=64
        Samples per SGD step (a positive integer; capped at ``n_samples``).
    fit_intercept : bool, default=True
        Learn an intercept (not penalised by ``alpha``).
    alpha : float
        L2 penalty :math:`\frac{\alpha}{2}\|W\|^2` added to both the ERM warm
        start and the DRO objective.
    init : {"erm", "zeros"}, default="erm"
        Start from the ERM solution (least squares / logistic regression with
        the same ``alpha``), as in the paper, or from zero.
    gamma, dual_lr, delta, rho : float
        Parameters of the baselines (defaults 0.5, 0.1, 1.0, 1e-3).
        Each method reads only its own parameters (``log_alpha`` SCENT's,
        ``gamma`` SOX's, ...) and ignores the others', so one set of keyword
        arguments serves a comparison of methods.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the mini-batch shuffling; an int gives reproducible fits.
    device : str or torch.device, default="cpu"
        Torch device of the training (``"cpu"``, ``"cuda"``, ...).
    verbose : int, default=0
        Progress bar with the exact objective after each epoch.
"""

_DOC_ATTRS = r"""
    nu_ : float
        Final dual variable (estimate of :math:`\log\text{mean}\,e^{\ell/\lambda}`);
        NaN for ``method="bsgd"``, which has none.
    loss_curve_ : list of float
        Exact full-data objective after each epoch.
    gamma_curve_ : list of float
        Mean SCENT step weight :math:`\gamma = \sigma(\log\alpha + \nu)` per epoch
        (NaN for the other methods; the first step only sets :math:`\nu` and does not
        count). Close to 1, SCENT's step is nearly BSGD's: try
        ``log_alpha="auto"`` or a negative ``log_alpha`` (see the user guide).
    init_objective_ : float
        Exact objective at the initial (ERM) model.
    n_iter_ : int
        Epochs run.
    n_features_in_ : int
        Number of features seen in ``fit``.
"""

_REF = r"""
    References
    ----------
    .. [1] X. Wei, L. Zhou, B. Wang, C.-J. Lin, T. Yang, "A Geometry-Aware
       Efficient Algorithm for Compositional Entropic Risk Minimization",
       ICML 2026, arXiv:2602.02877.
"""


class _KLDROBase(TorchEstimatorMixin, BaseEstimator):
    _supports_auto_alpha = True

    def __init__(self, *, lam: float = 1.0, method: Method = "scent",
                 log_alpha: float | Literal["auto"] | None = None, lr: float = 1e-4,
                 lr_schedule: Literal["cosine", "constant"] = "cosine", momentum: float = 0.9,
                 epochs: int = 100, batch_size: int = 64, fit_intercept: bool = True,
                 alpha: float = 0.0, init: Literal["erm", "zeros"] = "erm", gamma: float = 0.5,
                 dual_lr: float = 0.1, delta: float = 1.0, rho: float = 1e-3,
                 random_state: RandomStateLike = None, device: str | torch.device = "cpu",
                 verbose: int = 0) -> None:
        self.lam = lam
        self.method = method
        self.log_alpha = log_alpha
        self.lr = lr
        self.lr_schedule = lr_schedule
        self.momentum = momentum
        self.epochs = epochs
        self.batch_size = batch_size
        self.fit_intercept = fit_intercept
        self.alpha = alpha
        self.init = init
        self.gamma = gamma
        self.dual_lr = dual_lr
        self.delta = delta
        self.rho = rho
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    # subclasses define _y_numeric, _prepare_targets, _encode_eval, _zeros, _losses(W, b,
    # X, y), _erm_init, _store and _params (and may override _target_unit)
    _prepare_targets: Callable[[Any], torch.Tensor]
    _encode_eval: Callable[[Any, torch.device], torch.Tensor]
    def _penalty(self, W):
        return 0.5 * self.alpha * (W * W).sum() if self.alpha > 0 else W.new_zeros(())

    def _dro_value(self, W, b, X, y) -> torch.Tensor:
        ell = self._losses(W, b, X, y)
        return tempered_log_mean_exp(ell, self.lam) + self._penalty(W)

    # the ERM warm start and the SGD need autograd even inside the caller's no_grad /
    # inference_mode block
    @restore_on_failure
    @with_autograd
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit by minimising the KL-DRO objective with SCENT (or a baseline).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training samples (numpy arrays, array-likes or torch tensors).
        y : array-like or torch.Tensor of shape (n_samples,)
            Targets (regressor: real numbers) or class labels (classifier: at least 2
            classes).

        Returns
        -------
        self : object
            The fitted estimator.
        """
        self._init_fit()
        X64, y = self._validate_data(X, y, reset=True, dtype=torch.float64,
                                     y_numeric=self._y_numeric)
        y = self._prepare_targets(y)
        check_common_params(self)
        check_bool(self.fit_intercept, "fit_intercept")
        check_positive(self.lam, "lam")
        check_float32_param(self.alpha, "alpha", strict=False)
        check_in_options(self.init, "init", ("erm", "zeros"))
        dev = self._device
        W0, b0 = self._erm_init(X64, y) if self.init == "erm" else self._zeros(X64.shape[1])
        W0, b0 = W0.to(X64.device), b0.to(X64.device)  # (the zeros are made on the CPU)
        with torch.no_grad():
            self.init_objective_ = float(self._dro_value(W0, b0, X64, y))
        # SGD runs on standardised features Z = (X - mu) / s with V = W s, c = b + W mu
        # (same predictions, same objective): a diagonal preconditioner that makes the
        # fit independent of the features' units and offsets.
        mu, scale, const = feature_scaling(X64, bool(self.fit_intercept))
        if self.alpha > 0:
            # the penalty's curvature in V = W s is alpha / s^2: floor s so that SGD stays
            # stable (lr alpha / s^2 <= 1); the penalised objective depends on units anyway
            scale = scale.clamp_min(math.sqrt(float(self.lr) * float(self.alpha)))
        X = standardise(X64, mu, scale, const).float()
        # The regressor's float32 SGD runs on y / t, t a power of two near the initial
        # residuals: the parameters scale by 1/t and the squared losses, lam and the
        # penalty by 1/t^2, all exactly in floating point, so the iterates (mapped back)
        # are those of the unscaled problem, but losses of |y| ~ 1e20 (or 1e-25) no
        # longer overflow (or underflow) float32.
        t = self._target_unit(W0, b0, X64, y)
        v = float((W0 * scale).abs().max()) if W0.numel() else 0.0
        if t > 1.0 and 0.0 < v < math.inf and v / t < 2.0 ** -120:
            # a near-perfect fit under a huge lam: the t that keeps lam / t^2 in range
            # put the weights below float32's normal range (lam=1e150 returned zero
            # coefficients); the weights keep theirs, and lam / t^2 is checked below
            t = math.ldexp(1.0, math.frexp(v)[1] + 120)
        # the regressor's targets are also shifted by the initial intercept c (in
        # float64, which the trained intercept absorbs exactly): y = 1e7 + noise rounded
        # to float32 kept steps of 1 and the SGD saw mostly rounding noise
        c = self._target_shift(W0, b0, mu)
        y_t = (y - c) / t if self._y_numeric else y
        lam_t = float(self.lam) / (t * t)
        W = (W0 * scale / t).float().to(dev).requires_grad_(True)
        b = ((b0 + W0 @ mu - c) / t).float().to(dev).requires_grad_(bool(self.fit_intercept))
        scale_f = scale.float().to(dev)
        self._check_lam(self._losses(W, b, X, y_t).detach(), lam_t,
                        lambda: float(self._losses(W0, b0, X64, y).mean()))
        if isinstance(self.log_alpha, str):  # "auto"
            with torch.no_grad():
                log_alpha = -float(log_mean_exp(self._losses(W0, b0, X64, y) / self.lam))
        else:
            log_alpha = 0.0 if self.log_alpha is None else float(self.log_alpha)
        loss_fn = make_loss(self, 1, log_alpha, temperature=lam_t).to(dev)
        params = [W, b] if self.fit_intercept else [W]
        opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                              nesterov=self.momentum > 0)
        n = X.shape[0]
        bs = min(int(self.batch_size), n)
        total, step = self.epochs * math.ceil(n / bs), 0
        zero = torch.zeros(1, dtype=torch.long)
        self.loss_curve_, self.gamma_curve_ = [], []
        log = ProgressLogger(self.epochs, self.verbose, desc=f"{type(self).__name__}")
        for epoch in log:
            perm = torch.randperm(n, generator=self._torch_gen).to(dev)
            gammas = GammaMeter()
            for start in range(0, n, bs):
                rows = perm[start:start + bs]
                set_lrs(opt, loss_fn, self, lr_factor(self.lr_schedule, step, total))
                opt.zero_grad()
                ell = self._losses(W, b, X[rows], y_t[rows])
                if not bool(torch.isfinite(ell.detach() / lam_t).all()):
                    raise FloatingPointError(
                        f"{type(self).__name__}(method={self.method!r}) diverged at epoch "
                        f"{epoch + 1}; lower lr.")
                surrogate = loss_fn(ell[None, :], zero)
                if not bool(torch.isfinite(surrogate.detach())):
                    # ASGD's exp(L - nu) overflowed: nu = inf, every later weight 0 (the
                    # model would freeze without a word); other methods: loss / lam did
                    raise surrogate_overflow(type(self).__name__, self.method, epoch + 1,
                                             "loss / lam")
                (surrogate + self._penalty(W / scale_f)).backward()
                opt.step()
                gammas.add(loss_fn)
                step += 1
            with torch.no_grad():
                Wo, bo = unscale(W.detach().double() * t, b.detach().double() * t + c, mu,
                                 scale)
                self.loss_curve_.append(float(self._dro_value(Wo, bo, X64, y)))
            if not math.isfinite(self.loss_curve_[-1]):
                # (the last step's NaN weights reach no later batch's check: a one-epoch
                # fit returned NaN coefficients without an error)
                raise FloatingPointError(
                    f"{type(self).__name__}(method={self.method!r}) diverged at epoch "
                    f"{epoch + 1}: the objective is {self.loss_curve_[-1]}; lower lr.")
            self.gamma_curve_.append(gammas.mean())
            log.log(epoch=epoch + 1, objective=self.loss_curve_[-1])
        self.n_iter_ = int(self.epochs)
        self.nu_ = float(loss_fn.nu[0]) if self.method != "bsgd" else float("nan")
        self._store(*unscale(W.detach().double() * t, b.detach().double() * t + c, mu, scale))
        warn_if_worse_than_start(self, self.init_objective_, self.loss_curve_[-1],
                                 repr(self.init))
        return self

    def _target_unit(self, W0, b0, X64, y) -> float:
        """The power of two ``t`` the regressor's SGD divides ``y`` by (1 otherwise)."""
        return 1.0

    def _target_shift(self, W0, b0, mu) -> float:
        """What the regressor's SGD subtracts from ``y`` before that (0 otherwise)."""
        return 0.0

    def _check_lam(self, ell: torch.Tensor, lam_t: float,
                   mean_loss: Callable[[], float]) -> None:
        """Clear errors, before any step, where float32 cannot hold ``loss / lam``
        (``ell``: the scaled float32 losses; ``mean_loss()``: the unscaled mean, in
        float64, for the message)."""
        big = float(torch.finfo(torch.float32).max)
        if lam_t > big:
            raise ValueError(
                f"lam={self.lam!r} is too large for the float32 SGD of {type(self).__name__}: "
                f"lam is in units of the loss (mean initial loss {mean_loss():.3g}), "
                "and any lam far above it gives the ERM solution.")
        if not bool(torch.isfinite(ell / lam_t).all()):
            raise ValueError(
                f"lam={self.lam!r} is too small for the scale of the losses: loss / lam "
                f"overflows float32 at the initial model (losses up to "
                f"{float(ell.max()) * self.lam / lam_t:.3g}); lam is in units of the loss.")

    @fill_doc(X=SAMPLES_X)
    def objective(self, X: ArrayLike, y: ArrayLike) -> float:
        r"""Exact KL-DRO objective :math:`\lambda\log\frac1n\sum_i e^{\ell_i/\lambda}
        + \frac{\alpha}{2}\|W\|^2` on ``(X, y)``.

        Parameters
        ----------
        %(X)s
        y : array-like or torch.Tensor of shape (n_samples,)
            Targets (regressor) or labels seen in ``fit`` (classifier; others raise
            ``ValueError``).

        Returns
        -------
        float
            The objective of the fitted model on ``(X, y)`` (lower is better).
        """
        X64, y = self._validate_data(X, y, reset=False, dtype=torch.float64,
                                     y_numeric=self._y_numeric)
        check_positive(self.lam, "lam")  # read here (set_params after fit)
        check_positive(self.alpha, "alpha", strict=False)
        y = self._encode_eval(y, X64.device)
        W, b = self._params(X64.device)
        return float(self._dro_value(W, b, X64, y))


class KLDRORegressor(TensorTargetsScore, RegressorMixin, _KLDROBase):
    __doc__ = r"""Linear least squares under KL distributionally robust optimisation.

    Minimises :math:`\lambda \log \frac{1}{n}\sum_i \exp\big((x_i^\top w + b - y_i)^2/\lambda\big)`,
    the worst-case expected squared loss over distributions within a KL ball of
    the data (in its penalised dual form), starting from ordinary least squares.
    It is a compositional entropic risk with a single anchor, optimised with
    SCENT's dual update and weights :math:`e^{\ell_i/\lambda - \nu}` on the
    mini-batch losses [1]_. The SGD steps are taken on internally standardised
    features (a diagonal preconditioner; ``coef_``, ``intercept_`` and the
    objective are in the original units), so the fit does not depend on the
    features' units. Standardise ``y``: :math:`\lambda` is in units of the
    squared loss.

    Parameters
    ----------""" + _DOC_PARAMS.replace(
        "    alpha : float\n", "    alpha : float, default=0.0\n") + r"""
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float""" + _DOC_ATTRS + _REF + r"""
    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.optim import KLDRORegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 3)); y = X @ [1.0, -2.0, 0.5] + rng.standard_t(5, 200)
    >>> reg = KLDRORegressor(lam=1.0, epochs=20, random_state=0).fit(X, y)
    >>> bool(reg.objective(X, y) < reg.init_objective_)
    True
    """

    _y_numeric = True

    def _prepare_targets(self, y):
        # (1-D: fit's _validate_data ravels a column and refuses other shapes)
        return torch.as_tensor(np.asarray(y, dtype=np.float64), dtype=torch.float64,
                               device=self._device)

    def _encode_eval(self, y, device):
        return torch.as_tensor(np.asarray(y, dtype=np.float64), device=device)

    def _zeros(self, d):
        return torch.zeros(d, dtype=torch.float64), torch.zeros((), dtype=torch.float64)

    def _losses(self, W, b, X, y):
        return (X.to(W.dtype) @ W + b - y.to(W.dtype)) ** 2

    def _target_shift(self, W0, b0, mu) -> float:
        # the initial model's intercept on the centred features: the targets' offset
        return float(b0 + W0 @ mu) if self.fit_intercept else 0.0

    def _target_unit(self, W0, b0, X64, y) -> float:
        with torch.no_grad():
            r = float((X64 @ W0 + b0 - y).abs().max())
        if not 0 < r < math.inf or 2.0 ** -32 <= r <= 2.0 ** 32:
            return 1.0    # float32 holds these squared residuals: nothing to rescale
        # a power of two >= max |residual|, but keeping lam / t^2 within 2^+-100 (a
        # near-perfect fit has tiny residuals: t from them alone would make it overflow)
        half = math.frexp(float(self.lam))[1] // 2
        return math.ldexp(1.0, min(max(math.frexp(r)[1], half - 50), half + 50))

    def _erm_init(self, X, y):
        return erm_least_squares(X, y, alpha=self.alpha, fit_intercept=self.fit_intercept,
                                 device=self._device)

    def _store(self, W, b):
        self.coef_ = W.cpu().numpy()
        self.intercept_ = float(b)

    def _params(self, device):
        return (torch.as_tensor(self.coef_, dtype=torch.float64, device=device),
                torch.tensor(self.intercept_, dtype=torch.float64, device=device))

    @fill_doc(X=SAMPLES_X)
    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted targets :math:`Xw + b`.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples,)
            The predictions, in float64.
        """
        X64 = self._validate_data(X, reset=False, dtype=torch.float64)
        W, b = self._params(X64.device)
        return self._to_numpy(X64 @ W + b)

    @classmethod
    def _estimator_check_instances(cls):
        return [cls(epochs=2, random_state=0)]


class KLDROClassifier(TensorTargetsScore, ClassifierMixin, _KLDROBase):
    __doc__ = r"""Multinomial logistic regression under KL distributionally robust optimisation.

    Minimises :math:`\lambda \log \frac{1}{n}\sum_i \exp(\ell_i/\lambda)
    + \frac{\alpha}{2}\|W\|^2` with :math:`\ell_i` the softmax cross-entropy of
    sample :math:`i` (the logistic loss for two classes), starting from the
    regularised ERM solution, with SCENT's single-anchor dual update [1]_. As
    in :class:`KLDRORegressor`, the SGD steps are taken on internally
    standardised features (the fitted parameters are in the original units).

    Parameters
    ----------""" + _DOC_PARAMS.replace(
        "    alpha : float\n", "    alpha : float, default=1e-4\n") + r"""
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_classes, n_features)
    intercept_ : ndarray of shape (n_classes,)""" + _DOC_ATTRS + _REF + r"""
    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import StandardScaler
    >>> from mlpapers.optim import KLDROClassifier
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> clf = KLDROClassifier(lam=1.0, epochs=5, random_state=0).fit(X, y)
    >>> bool(clf.objective(X, y) <= clf.init_objective_)
    True
    """

    _y_numeric = False

    def __init__(self, *, lam: float = 1.0, method: Method = "scent",
                 log_alpha: float | Literal["auto"] | None = None, lr: float = 1e-4,
                 lr_schedule: Literal["cosine", "constant"] = "cosine", momentum: float = 0.9,
                 epochs: int = 100, batch_size: int = 64, fit_intercept: bool = True,
                 alpha: float = 1e-4, init: Literal["erm", "zeros"] = "erm", gamma: float = 0.5,
                 dual_lr: float = 0.1, delta: float = 1.0, rho: float = 1e-3,
                 random_state: RandomStateLike = None, device: str | torch.device = "cpu",
                 verbose: int = 0) -> None:
        super().__init__(lam=lam, method=method, log_alpha=log_alpha, lr=lr,
                         lr_schedule=lr_schedule, momentum=momentum, epochs=epochs,
                         batch_size=batch_size, fit_intercept=fit_intercept, alpha=alpha,
                         init=init, gamma=gamma, dual_lr=dual_lr, delta=delta, rho=rho,
                         random_state=random_state, device=device, verbose=verbose)

    def _prepare_targets(self, y):
        check_classification_targets(y)
        self.classes_, yi = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("KLDROClassifier needs samples of at least 2 classes, got 1 "
                             f"class: {self.classes_[0]!s}.")
        return torch.as_tensor(yi.reshape(-1), dtype=torch.long, device=self._device)

    def _encode_eval(self, y, device):
        return encode_labels(y, self.classes_, device=device)

    def _zeros(self, d):
        C = len(self.classes_)
        return torch.zeros(C, d, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)

    def _losses(self, W, b, X, y):
        return F.cross_entropy(X.to(W.dtype) @ W.T + b, y, reduction="none")

    def _erm_init(self, X, y):
        return erm_logistic(X, y, len(self.classes_), alpha=self.alpha,
                            fit_intercept=self.fit_intercept)

    def _store(self, W, b):
        self.coef_ = W.cpu().numpy()
        self.intercept_ = b.cpu().numpy()

    def _params(self, device):
        return (torch.as_tensor(self.coef_, dtype=torch.float64, device=device),
                torch.as_tensor(self.intercept_, dtype=torch.float64, device=device))

    def _logits(self, X):
        X = self._validate_data(X, reset=False, dtype=torch.float64)
        W, b = self._params(X.device)
        return X @ W.T + b

    @fill_doc(X=SAMPLES_X)
    def decision_function(self, X: ArrayLike) -> np.ndarray:
        """Class scores :math:`XW^\\top + b`.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples, n_classes), or (n_samples,) for two classes
            The scores (for two classes the score of ``classes_[1]`` minus that of
            ``classes_[0]``, the log-odds of ``classes_[1]``).
        """
        z = self._logits(X)
        return self._to_numpy(z[:, 1] - z[:, 0] if z.shape[1] == 2 else z)

    @fill_doc(X=SAMPLES_X)
    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Softmax class probabilities.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Probabilities of the classes in the order of ``classes_``; rows sum to 1.
        """
        return self._to_numpy(torch.softmax(self._logits(X), dim=1))

    @fill_doc(X=SAMPLES_X)
    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most probable class of each row.

        Parameters
        ----------
        %(X)s

        Returns
        -------
        ndarray of shape (n_samples,)
            Predicted labels, taken from ``classes_``.
        """
        best = self._to_numpy(self._logits(X).argmax(dim=1))
        return self.classes_[best]

    @classmethod
    def _estimator_check_instances(cls):
        # a firmer ridge keeps the L-BFGS warm start short on separable check data
        return [cls(epochs=2, alpha=1e-2, random_state=0)]
