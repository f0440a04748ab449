"""SCENTClassifier: many-class linear softmax classifier trained with sampled negatives."""

from __future__ import annotations

import math
import warnings
from typing import Literal, Self

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    RandomStateLike,
    check_bool,
    check_float32_param,
    check_in_options,
    check_positive,
    encode_labels,
    user_stacklevel,
    with_autograd,
)
from mlpapers.optim.scent._common import TensorTargetsScore, check_common_params
from mlpapers.optim.scent._loss import Method
from mlpapers.optim.scent._sparse_input import (
    SparseArrayLike,
    SparseRows,
    is_sparse_input,
    validate_sparse,
)
from mlpapers.optim.scent._xc import LOSSES, NEGATIVES, Loss, Negatives
from mlpapers.optim.scent._xc_fit import SampledTrainingMixin
from mlpapers.optim.scent._xc_predict import SoftmaxPredictionMixin

__all__ = ["SCENTClassifier"]

#: bound on ``partial_fit``'s ``sample_index``: the dual table is that long
MAX_SAMPLE_INDEX = 2**31


class SCENTClassifier(SampledTrainingMixin, SoftmaxPredictionMixin, TorchEstimatorMixin,
                      TensorTargetsScore, ClassifierMixin, BaseEstimator):
    r"""Linear classifier for many classes, trained by SCENT with sampled negatives.

    Two objectives are available (``loss``), both compositional entropic
    risks :math:`\frac{\tau}{n}\sum_i\log\mathbb E_k e^{(z_{ik}-z_{iy_i})/\tau}`
    with :math:`z_{ik} = w_k^\top x_i + b_k`, plus
    :math:`\frac{\text{alpha}}{2}\|W\|^2`:

    * ``loss="softmax"`` (default): the mean over *all* :math:`C` classes, i.e. the
      softmax cross-entropy :math:`\frac{\tau}{n}\sum_i[\log\sum_k
      e^{z_{ik}/\tau}-z_{iy_i}/\tau]` minus :math:`\tau\log C`. The positive
      term is kept exactly and the negatives estimate the rest (unbiased).
    * ``loss="negatives"``: the mean over the :math:`C-1` *other* classes,
      :math:`\frac{\tau}{n}\sum_i\log\frac{1}{C-1}\sum_{k\ne y_i}
      e^{(z_{ik}-z_{iy_i})/\tau}`, the risk that the official SCENT
      extreme-classification code optimises (no positive term, so the inner
      estimate stays noisy and its log is biased: the setting SCENT targets).

    ``negatives`` chooses the sampler. ``"uniform"`` draws ``n_negatives``
    classes per step: for ``"softmax"`` uniform over all classes, shared by the
    batch, each anchor's own label masked; for ``"negatives"`` uniform over each
    anchor's other classes (the shared draws :math:`u` are mapped to
    :math:`u + [u \ge y_i]`). ``"in_batch"`` uses the batch's distinct labels,
    own label masked, as the official code does. Uniform estimates are unbiased;
    in-batch ones are unbiased when the classes are balanced (for the anchors
    whose batch holds another class; the others are skipped) and otherwise favour
    frequent classes. The per-sample dual variable :math:`\nu_i` of the inner mean
    is tracked by :class:`EntropicRiskLoss` with the chosen ``method`` [1]_. A
    step costs :math:`O((B + k)\,d)` instead of :math:`O(BCd)`: only the weight
    rows of the batch's labels and of the negatives are updated (a row-sparse SGD
    step; ``momentum > 0`` or ``alpha > 0`` use the dense gradient). With
    ``n_negatives = n_classes - 1`` and ``"uniform"`` every class is used and the
    estimate is exact (``method="bsgd"`` is then exact mini-batch SGD).
    Predictions use the exact softmax of :math:`z/\tau`. As with any plain
    SGD estimator (and unlike the KL-DRO and partial-AUC estimators, which
    precondition), the steps depend on the features' units: standardise ``X``
    (a feature a thousand times larger than the others dominates the steps).
    For sparse ``X`` use ``StandardScaler(with_mean=False)``, which keeps it
    sparse: raw TF-IDF rows have unit norm and need a much larger ``lr``.
    Sparse ``X`` (scipy CSR, usual for bag-of-words or TF-IDF features; other
    scipy formats and torch sparse tensors are converted to CSR) is supported
    everywhere and never densified: the training batches are torch
    sparse tensors (a step costs :math:`O(\text{nnz}\cdot k)`) and predictions
    multiply blocks of rows with scipy.

    Parameters
    ----------
    n_negatives : int, default=64
        Negative classes drawn per step with ``negatives="uniform"``; must be
        ``< n_classes`` (``n_classes - 1`` uses every class: exact). Unused with
        ``negatives="in_batch"``.
    loss : {"softmax", "negatives"}, default="softmax"
        The risk minimised (see above); :meth:`objective` evaluates it exactly,
        for ``"softmax"`` as the cross-entropy itself (without the constant
        :math:`-\tau\log C`, which does not change the minimiser).
    negatives : {"uniform", "in_batch"}, default="uniform"
        The sampler of the negatives (see above). With ``"in_batch"`` an anchor
        whose batch holds no other class is skipped for that step (so
        ``batch_size`` must be at least 2).
    method : {"scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus"}, default="scent"
        Dual update rule (see :class:`EntropicRiskLoss`).
    log_alpha : float or None, default=None
        :math:`\log\alpha` of SCENT. ``None`` uses :math:`\log C`, so that
        :math:`\gamma = \sigma(\log\alpha + \nu_i) = \sigma(\text{CE}_i/\tau)` stays in
        [0.5, 1) for ``loss="softmax"`` (the official code uses 12 for
        :math:`C \approx 3.6\times10^5`, :math:`\log C \approx 12.8`). With
        ``loss="negatives"`` :math:`\nu_i` is unbounded below, so :math:`\gamma`
        of well-classified samples tends to 0 (their :math:`\nu_i` freezes and
        their primal weights can grow by :math:`1/(\alpha e^{\nu_i})`): use a
        smaller ``lr`` than for BSGD, or ``alpha > 0``.
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
        Each method reads only its own parameters (``log_alpha`` SCENT's,
        ``gamma`` SOX's, ...) and ignores the others', so one set of keyword
        arguments serves a comparison of methods.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the shuffling and the negative sampling.
    device : str or torch.device, default="cpu"
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
        Dual variables, estimates of the log inner mean
        :math:`\log\mathbb E_k e^{(z_{ik}-z_{iy_i})/\tau}`; NaN for samples never
        visited (and for ``method="bsgd"``, which has none).
    loss_curve_ : list of float
        Mean surrogate value per epoch: an estimate of the objective (for
        ``"softmax"`` shifted by :math:`\tau\log C`, i.e. of the cross-entropy).
    gamma_curve_ : list of float
        Mean SCENT step weight :math:`\gamma = \sigma(\log\alpha + \nu)` per epoch,
        over the anchors that took a SCENT step (NaN for the other methods, and for
        the first epoch: a first visit sets an anchor's :math:`\nu` to its estimate,
        with no step). Close to 1, SCENT's step is nearly BSGD's: lower
        ``log_alpha`` (see the user guide).
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
        loss: Loss = "softmax",
        negatives: Negatives = "uniform",
        method: Method = "scent",
        log_alpha: float | None = None,
        temperature: float = 1.0,
        alpha: float = 0.0,
        lr: float = 1.0,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        momentum: float = 0.0,
        epochs: int = 20,
        batch_size: int = 256,
        fit_intercept: bool = False,
        gamma: float = 0.9,
        dual_lr: float = 0.1,
        delta: float = 1.0,
        rho: float = 1e-3,
        random_state: RandomStateLike = None,
        device: str | torch.device = "cpu",
        verbose: int = 0,
    ) -> None:
        self.n_negatives = n_negatives
        self.loss = loss
        self.negatives = negatives
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
        check_bool(self.fit_intercept, "fit_intercept")
        check_positive(self.n_negatives, "n_negatives", integer=True)
        check_in_options(self.loss, "loss", LOSSES)
        check_in_options(self.negatives, "negatives", NEGATIVES)
        # (the float32 step multiplies the loss by the temperature: inf * 0 = NaN)
        check_float32_param(self.temperature, "temperature")
        check_float32_param(self.alpha, "alpha", strict=False)
        if self.negatives == "in_batch" and self.batch_size < 2:
            # a batch of one holds no other class: every anchor was skipped, nothing
            # trained and loss_curve_ was NaN
            raise ValueError(f"negatives='in_batch' takes the negatives from the other "
                             f"samples of a batch: batch_size must be >= 2, got "
                             f"{self.batch_size}.")
        if self.negatives == "uniform" and self.n_negatives >= n_classes:
            raise ValueError(
                f"n_negatives must be < n_classes (at most {n_classes - 1} negatives exist), "
                f"got n_negatives={self.n_negatives} with {n_classes} classes. "
                f"Set n_negatives={n_classes - 1} to use every class (the exact softmax "
                f"gradient); the default of 64 targets problems with many classes."
            )

    def _encode(self, y: np.ndarray) -> torch.Tensor:
        return encode_labels(y, self.classes_)

    # -- fitting ----------------------------------------------------------------------
    # training needs autograd even inside the caller's no_grad / inference_mode block
    @with_autograd
    @restore_on_failure
    def fit(self, X: SparseArrayLike, y: ArrayLike) -> Self:
        """Fit the classifier.

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Training samples (numpy arrays, array-likes, torch tensors, or scipy / torch
            sparse matrices, which are trained on sparse batches); cast to float32.
        y : array-like or torch.Tensor of shape (n_samples,)
            Class labels; at least 2 distinct classes.

        Returns
        -------
        self : SCENTClassifier
            The fitted estimator.
        """
        self._init_fit()
        X, y = self._train_data(X, y, reset=True)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError("SCENTClassifier needs samples of at least 2 classes in the data, "
                             f"got 1 class: {self.classes_[0]!s}.")
        self._check_params(len(self.classes_))
        self._start_training(X.shape[0], X.shape[1])
        self.loss_curve_ = []
        self.gamma_curve_ = []
        self._run(X, self._encode(y), torch.arange(X.shape[0]), self.epochs, self.lr_schedule)
        return self

    @with_autograd
    def partial_fit(self, X: SparseArrayLike, y: ArrayLike, classes: ArrayLike | None = None,
                    sample_index: ArrayLike | None = None) -> Self:
        """Run one epoch on ``(X, y)`` with a constant learning rate.

        Parameters changed by ``set_params`` since the last call (``lr``, ``log_alpha``,
        ``method``, ``momentum``, ...) apply from this call on (schedules).

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Training samples, in any form :meth:`fit` accepts.
        y : array-like or torch.Tensor of shape (n_samples,)
            Class labels, all among ``classes``.
        classes : array-like, optional
            All classes; required on the first call.
        sample_index : array-like of int of shape (n_samples,), optional
            Global indices of the rows in the dual table, below ``2**31`` (the
            table holds one entry per index up to the largest). ``None`` means
            ``0 .. n_samples - 1``, i.e. the same data set on every call.

        Returns
        -------
        self : SCENTClassifier
            The updated estimator.
        """
        if hasattr(self, "classes_"):
            return self._resume_or_roll_back(X, y, classes, sample_index)
        # the first call starts from scratch: one that raises (one class, a bad
        # sample_index, Ctrl-C) leaves the estimator unfitted, as it was (it kept classes_
        # without a model: predict raised AttributeError, and every later call was
        # refused as "classes differ from those of the first call")
        return restore_on_failure(type(self)._partial_fit)(self, X, y, classes, sample_index)

    def _resume_or_roll_back(self, X, y, classes, sample_index) -> Self:
        """A later :meth:`partial_fit` call that, if it raises, leaves the model as it was.

        The live training tensors (weights, dual table, optimizer) change in place step
        by step, so the shallow restore of :func:`restore_on_failure` is not enough: a
        call that diverged had written ``nu = inf`` into the dual table (absorbing under
        ASGD), and every later call failed again however small ``lr`` was set, while a
        pickled copy, rebuilt from ``coef_`` and ``nu_``, trained on. After a failure the
        live tensors are dropped and rebuilt from the public fitted state, as an
        unpickled copy is; the heavy-ball buffers and the generator are put back too.
        """
        state = self.__dict__
        # (copies of the lists: the epoch's loss_curve_ / gamma_curve_ entries are
        # appended in place, and a call that failed after its epoch kept them)
        before = {k: v.copy() if isinstance(v, list) else v for k, v in state.items()}
        buffers = self._momentum_state()
        gen = getattr(self, "_torch_gen", None)
        gen_state = gen.get_state() if gen is not None else None
        try:
            return self._partial_fit(X, y, classes, sample_index)
        except BaseException:
            state.clear()
            state.update(before)
            for key in ("_W", "_b", "_opt", "_loss_fn"):
                state.pop(key, None)
            if buffers is not None:
                self._momentum_buffers = buffers
            if gen is not None:
                gen.set_state(gen_state)
            raise

    def _partial_fit(self, X, y, classes, sample_index):
        first = not hasattr(self, "classes_")
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self._init_fit()
            X, y = self._train_data(X, y, reset=True)
            check_classification_targets(y)
            self.classes_ = np.unique(self._to_numpy(classes))  # (grad/CUDA tensors too)
            if len(self.classes_) < 2:
                raise ValueError("classes must hold at least 2 classes.")
            self._check_params(len(self.classes_))
            self.loss_curve_ = []
            self.gamma_curve_ = []
        else:
            X, y = self._train_data(X, y, reset=False)
            if classes is not None and not np.array_equal(np.unique(self._to_numpy(classes)),
                                                          self.classes_):
                raise ValueError("classes differ from the fitted classes_ (set by fit or by "
                                 "the first call to partial_fit).")
            self._check_params(len(self.classes_))
            if not hasattr(self, "_torch_gen"):  # loaded from a file without generator states
                self._init_fit()
        if sample_index is None:
            index = torch.arange(X.shape[0])
        else:
            raw = (self._to_numpy(sample_index) if isinstance(sample_index, torch.Tensor)
                   else np.asarray(sample_index))
            integral = raw.dtype.kind in "iu" or (
                raw.dtype.kind == "f" and bool(np.all(np.isfinite(raw) & (raw == np.round(raw)))))
            if raw.shape != (X.shape[0],) or not integral or bool((raw < 0).any()):
                raise ValueError("sample_index must hold one non-negative integer per row of X.")
            if len(np.unique(raw)) != len(raw):  # two rows cannot share one dual variable
                raise ValueError("sample_index must not repeat an index within one call.")
            if raw.size and not float(raw.max()) < MAX_SAMPLE_INDEX:
                # (1e20 or a uint64 above 2**63 wrapped to a negative int64 row of the
                # dual table, and 1e12 asked for a table of 1e12 entries)
                raise ValueError(
                    f"sample_index values must be below 2**31 (the dual table holds one "
                    f"entry per index up to the largest), got {raw.max()!r}; number the "
                    "training samples 0, 1, ..., n - 1.")
            index = torch.as_tensor(raw.astype(np.int64))
        n_anchors = int(index.max()) + 1
        if first:
            self._start_training(n_anchors, X.shape[1])
        else:
            self._resume_training(n_anchors)
        # (labels outside classes: "not seen in fit" blamed a fit that never ran)
        self._run(X, encode_labels(y, self.classes_, seen_in="the classes of partial_fit"), index,
                  1, "constant")
        if math.isnan(self.loss_curve_[-1]):  # no anchor had a negative: nothing moved
            warnings.warn("this partial_fit call trained nothing: with negatives='in_batch' "
                          "the negatives are the other classes of a batch, and no batch held "
                          "2 classes; pass batches of several classes.", UserWarning,
                          stacklevel=user_stacklevel())
        return self

    def _train_data(self, X, y, *, reset: bool) -> tuple[SparseRows | torch.Tensor, np.ndarray]:
        """Validated ``(X, y)``: a float32 tensor, or row batches of a scipy sparse ``X``."""
        if is_sparse_input(X):
            X, y = validate_sparse(self, X, y, reset=reset, dtype=np.float32)
            return SparseRows(X, self._resolved_device), y
        return self._validate_data(X, y, reset=reset)

    # -- persistence / checks ---------------------------------------------------------
    # The weights, dual table and generator state are in the public fitted state
    # (``coef_``, ``nu_``) and the base's saved generators; the heavy-ball buffers
    # are added here so that a saved or pickled model continues exactly.
    _PRIVATE_STATE = ("_momentum_buffers",)

    def _get_state(self):
        state = super()._get_state()
        buffers = self._momentum_state()
        if buffers is not None:
            state["_momentum_buffers"] = buffers
        return state

    def __getstate__(self):
        # the live training tensors are rebuilt from ``coef_``/``nu_`` on resume; the
        # generators pickle with their state, so ``partial_fit`` continues the same stream
        state = super().__getstate__()
        for key in ("_W", "_b", "_opt", "_loss_fn"):
            state.pop(key, None)
        buffers = self._momentum_state()
        if buffers is not None:
            state["_momentum_buffers"] = buffers
        return state

    @classmethod
    def _estimator_check_instances(cls):
        # the checks' data are unscaled (features near 100) and the negatives-only risk is
        # unbounded below without ``alpha``: a small lr keeps its smoke test in float range
        return [cls(n_negatives=1, epochs=8, batch_size=32, lr=1.0, random_state=0),
                cls(loss="negatives", negatives="in_batch", epochs=8, batch_size=32, lr=0.001,
                    random_state=0)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True  # scipy sparse X: trained on sparse batches
        return tags
