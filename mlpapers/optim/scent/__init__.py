"""SCENT: geometry-aware stochastic optimisation of compositional entropic risks.

Implements the algorithm of Wei, Zhou, Wang, Lin and Yang, "A Geometry-Aware
Efficient Algorithm for Compositional Entropic Risk Minimization" (ICML 2026,
arXiv:2602.02877) and its baselines (BSGD, SOX, ASGD, U-max, ASGD-softplus):

* kernels: :func:`spmd_update`, :func:`log_mean_exp` and the baselines' dual steps;
* :class:`EntropicRiskLoss`, a :class:`torch.nn.Module` holding one dual
  variable per anchor, usable with any :mod:`torch.optim` optimizer;
* scikit-learn estimators: :class:`SCENTClassifier` (extreme classification with
  sampled negatives), :class:`KLDRORegressor`, :class:`KLDROClassifier` and
  :class:`PartialAUCClassifier`.
"""

from mlpapers.optim.scent._classifier import SCENTClassifier
from mlpapers.optim.scent._dro import KLDROClassifier, KLDRORegressor
from mlpapers.optim.scent._kernels import (
    asgd_update,
    log_mean_exp,
    softplus_dual_ratio,
    sox_update,
    spmd_gamma,
    spmd_update,
    umax_update,
)
from mlpapers.optim.scent._loss import METHODS, EntropicRiskLoss, objective
from mlpapers.optim.scent._pauc import PartialAUCClassifier

__all__ = [
    "METHODS",
    "EntropicRiskLoss",
    "KLDROClassifier",
    "KLDRORegressor",
    "PartialAUCClassifier",
    "SCENTClassifier",
    "asgd_update",
    "log_mean_exp",
    "objective",
    "softplus_dual_ratio",
    "sox_update",
    "spmd_gamma",
    "spmd_update",
    "umax_update",
]
