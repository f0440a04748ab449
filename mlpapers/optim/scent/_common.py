"""Helpers shared by the SCENT estimators (parameter checks, schedules, ERM warm starts)."""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from mlpapers._utils import (
    ArrayLike,
    check_in_options,
    check_learning_rate,
    check_positive,
    to_numpy,
    user_stacklevel,
)
from mlpapers.optim.scent._loss import METHODS, EntropicRiskLoss, check_dual_params
from mlpapers.optim.scent._sparse_input import SparseArrayLike

PAPER_REF = (
    'X. Wei, L. Zhou, B. Wang, C.-J. Lin, T. Yang, "A Geometry-Aware Efficient Algorithm '
    'for Compositional Entropic Risk Minimization", ICML 2026, arXiv:2602.02877.'
)


def check_common_params(est) -> None:
    """Validate the optimisation parameters every SCENT estimator shares."""
    check_in_options(est.method, "method", METHODS)
    check_learning_rate(est.lr)
    check_positive(est.epochs, "epochs", integer=True)
    check_positive(est.batch_size, "batch_size", integer=True)
    check_positive(est.momentum, "momentum", strict=False)
    if est.momentum >= 1:
        raise ValueError(f"momentum must be in [0, 1), got {est.momentum!r}.")
    check_in_options(est.lr_schedule, "lr_schedule", ("cosine", "constant"))
    check_dual_params(est.gamma, est.dual_lr, est.delta, est.rho)
    la = est.log_alpha
    if isinstance(la, str) and la == "auto" and getattr(est, "_supports_auto_alpha", False):
        return
    if la is not None and (isinstance(la, bool) or not isinstance(la, numbers.Real)
                           or not math.isfinite(la)):
        raise ValueError(f"log_alpha must be None or a finite real number, got {la!r}.")


def make_loss(est, n_anchors: int, log_alpha: float, temperature: float = 1.0):
    return EntropicRiskLoss(
        n_anchors, method=est.method, log_alpha=float(log_alpha), temperature=temperature,
        gamma=est.gamma, dual_lr=est.dual_lr, delta=est.delta, rho=est.rho,
    )


def lr_factor(schedule: str, step: int, total: int) -> float:
    """Cosine decay from 1 to 0 over ``total`` steps, or 1 for a constant schedule."""
    if schedule == "constant" or total <= 1:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * step / total))


def set_lrs(opt, loss_fn, est, factor: float) -> None:
    for group in opt.param_groups:
        group["lr"] = est.lr * factor
    # the dual step of the ASGD family decays with the primal one (official code)
    loss_fn.dual_lr = est.dual_lr * max(factor, 1e-12)
    loss_fn.gamma = est.gamma  # set_params(gamma=...) between partial_fit calls (schedules)


def minimize_lbfgs(fun, params, max_iter: int = 500, tol: float = 1e-10) -> None:
    """Minimise ``fun()`` over ``params`` in place with full-batch L-BFGS."""
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=tol,
                            tolerance_change=tol * 1e-2, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = fun()
        value.backward()
        return value

    opt.step(closure)


def surrogate_overflow(name: str, method: str, epoch: int, ratio: str) -> FloatingPointError:
    """The error for a non-finite surrogate value, naming its actual cause.

    Only ASGD's dual step ``nu - dual_lr (1 - exp(L - nu))`` can overflow (``nu``
    lagging far behind ``L``); SCENT's, SOX's and U-max's cannot, so with them the
    overflow is in the surrogate itself: ``loss / lam`` (``ratio``) near the top of
    float32, summed over the batch.
    """
    if method in ("asgd", "asgd_softplus"):
        return FloatingPointError(
            f"{name}(method={method!r}) diverged at epoch {epoch}: the dual update "
            "overflowed; lower dual_lr or lr.")
    return FloatingPointError(
        f"{name}(method={method!r}) diverged at epoch {epoch}: the surrogate overflowed "
        f"float32 ({ratio} too large); lower lr, or raise {ratio.split(' / ')[-1]}.")


def warn_if_worse_than_start(est, start: float, end: float, start_name: str) -> None:
    """Warn when a fit ended above its starting objective (a too large ``lr``).

    Both values are the exact float64 objective on the training data, so they compare
    directly; the tolerance (1e-3 of ``|start| + lam``, the objective's scale) is far
    above the float32 SGD's rounding near a converged start (at most ~1e-5 relative
    over the test suite) and far below a divergence (x 1e9).
    """
    if end > start + 1e-3 * (abs(start) + float(est.lam)):
        warnings.warn(
            f"{type(est).__name__}(method={est.method!r}) ended above its starting "
            f"objective ({end:.4g} after {est.n_iter_} epochs vs {start:.4g} at the "
            f"{start_name} start): the SGD diverged or oscillates; lower lr "
            f"(now {est.lr!r}).", ConvergenceWarning, stacklevel=user_stacklevel())


class GammaMeter:
    r"""Mean over an epoch of SCENT's step weight :math:`\gamma = \sigma(\log\alpha + \nu)`
    over the anchors that took a SCENT step (the loss's ``last_stats``; first visits,
    which set :math:`\nu := L`, do not count).

    The paper's pitfall: with :math:`\alpha e^{\nu} \gg 1`, :math:`\gamma \approx 1`
    and SCENT's step is nearly the biased BSGD step; the estimators keep the means in
    ``gamma_curve_`` so that a user can see it. NaN for the other methods (no
    :math:`\gamma`) and for an epoch of first visits only.
    """

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, loss_fn) -> None:
        stats = loss_fn.last_stats
        if "gamma_mean" in stats:  # absent for other methods and all-first-visit batches
            self.total += stats["gamma_mean"] * stats["gamma_count"]
            self.count += stats["gamma_count"]

    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


def nu_to_numpy(loss_fn) -> np.ndarray:
    """The dual table as a float64 numpy array, NaN at anchors never visited."""
    nu = loss_fn.nu.detach().clone().cpu()
    nu[~loss_fn.initialized.cpu()] = float("nan")
    return nu.numpy()


def load_nu(loss_fn, nu) -> None:
    nu = torch.as_tensor(nu, dtype=torch.float64)
    n = min(len(nu), loss_fn.n_anchors)
    visited = ~torch.isnan(nu[:n])
    loss_fn.nu[:n] = torch.nan_to_num(nu[:n], nan=0.0).to(loss_fn.nu.device)
    loss_fn.initialized[:n] = visited.to(loss_fn.initialized.device)


def tensors_to_numpy(*values):
    """``values`` with every torch tensor as a numpy array (detached, on the CPU)."""
    return tuple(to_numpy(v) if isinstance(v, torch.Tensor) else v for v in values)


class TensorTargetsScore:
    """``score`` of scikit-learn's mixins, taking ``y`` and ``sample_weight`` as tensors too.

    Put it before ``ClassifierMixin``/``RegressorMixin`` in the bases: their ``score``
    reads a tensor through numpy, which refuses one that requires grad.
    """

    def score(self, X: SparseArrayLike, y: ArrayLike,
              sample_weight: ArrayLike | None = None) -> float:
        """The default score on ``(X, y)``: the accuracy of :meth:`predict` for a
        classifier, its :math:`R^2` for a regressor (as scikit-learn's mixins).

        Parameters
        ----------
        X : array-like, scipy sparse matrix or torch.Tensor of shape (n_samples, n_features)
            Test samples, in any form the estimator's ``predict`` accepts.
        y : array-like or torch.Tensor of shape (n_samples,)
            True labels (classifier) or targets (regressor); a tensor may require grad.
        sample_weight : array-like or torch.Tensor of shape (n_samples,), optional
            Per-sample weights of the average; ``None`` weighs every sample equally.

        Returns
        -------
        float
            The (weighted) accuracy for a classifier, the :math:`R^2` for a regressor.
        """
        y, sample_weight = tensors_to_numpy(y, sample_weight)
        # (the score of the next base: ClassifierMixin or RegressorMixin)
        return super().score(X, y, sample_weight=sample_weight)  # type: ignore[misc]  # mixin


#: The ``X`` entry of the linear KL-DRO/pAUC models' inference methods (``fill_doc``).
SAMPLES_X = """\
X : array-like or torch.Tensor of shape (n_samples, n_features)
    Samples (numpy arrays, array-likes or torch tensors); computed in float64."""
