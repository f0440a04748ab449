"""Starting point of the KL-DRO linear models' SGD: ERM warm start and parameterisation.

The KL-DRO objective is minimised from the solution of the ordinary,
L2-regularised empirical risk with the same ``alpha`` (the paper's initial
model): least squares for ``KLDRORegressor`` (in closed form) and multinomial
logistic regression for ``KLDROClassifier`` (by L-BFGS), both on the standardised
features and in float64. The SGD then runs on standardised features
``Z = (X - mu) / s`` with parameters ``V = W s, c = b + W mu`` (same predictions,
same objective); :func:`feature_scaling` and :func:`unscale` map between the two.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mlpapers._utils import row_power_of_two
from mlpapers.optim.scent._common import minimize_lbfgs

__all__ = ["erm_least_squares", "erm_logistic", "feature_scaling", "standardise", "unscale"]


def erm_least_squares(X: torch.Tensor, y: torch.Tensor, *, alpha: float, fit_intercept: bool,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Ridge least squares :math:`\min \frac1n\sum_i r_i^2 + \frac{\alpha}{2}\|w\|^2`.

    Parameters
    ----------
    X : Tensor of shape (n, d), float64
    y : Tensor of shape (n,)
    alpha : float
        L2 penalty (the intercept is not penalised).
    fit_intercept : bool
    device : torch.device
        Device of the returned parameters.

    Returns
    -------
    W : Tensor of shape (d,), float64
    b : Tensor of shape (), float64
        Zero when ``fit_intercept`` is false.
    """
    y = y.double().cpu()
    X = X.double().cpu()
    n, d = X.shape
    # solved on the standardised features Z = (X - mu) / s, then mapped back: gelsd
    # truncates singular values below eps * the largest, so on raw features whose units
    # differ from the intercept column's by ~1e16 (features ~1e-30 or ~1e30) it dropped
    # the features or the intercept; the same problem in V = W s is scale-free
    mu, scale, const = feature_scaling(X, fit_intercept)
    Z = standardise(X, mu, scale, const)
    A = torch.cat([Z, torch.ones(n, 1, dtype=X.dtype)], 1) if fit_intercept else Z
    rhs = y
    if alpha > 0:  # mean (r^2) + alpha/2 |V / s|^2  <=>  rows sqrt(n alpha / 2) diag(1 / s)
        reg = torch.zeros(d, A.shape[1], dtype=X.dtype)
        reg[:, :d] = torch.diag(math.sqrt(n * alpha / 2) / scale)
        A = torch.cat([A, reg])
        rhs = torch.cat([y, torch.zeros(d, dtype=X.dtype)])
    # unit columns for the solver too (a ridge row of a tiny-unit feature is ~1 / s)
    norms = A.norm(dim=0)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))
    sol = torch.linalg.lstsq(A / norms, rhs[:, None], driver="gelsd").solution[:, 0] / norms
    # a zero column's coefficient is SVD rounding (~1e-14): exactly 0, as in the SGD
    V = sol[:d].masked_fill(const, 0.0)
    c = sol[d] if fit_intercept else torch.zeros((), dtype=X.dtype)
    W, b = unscale(V, c, mu, scale)
    return W.to(device), b.to(device)


def erm_logistic(X: torch.Tensor, y: torch.Tensor, n_classes: int, *, alpha: float,
                 fit_intercept: bool) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Multinomial logistic regression :math:`\min \frac1n\sum_i \ell_i + \frac{\alpha}{2}\|W\|^2`.

    Solved by L-BFGS from zero (at most 200 iterations, tolerance 1e-9) on the
    standardised features of :func:`feature_scaling` (the same problem, with the
    penalty on the original-unit weights): on raw features whose scales differ by
    orders of magnitude, L-BFGS in the original units stops far from the optimum.

    Parameters
    ----------
    X : Tensor of shape (n, d), float64
    y : long Tensor of shape (n,)
        Encoded labels in ``[0, n_classes)``.
    n_classes : int
    alpha : float
        L2 penalty (the intercept is not penalised).
    fit_intercept : bool

    Returns
    -------
    W : Tensor of shape (n_classes, d), float64
    b : Tensor of shape (n_classes,), float64
        Zero when ``fit_intercept`` is false.
    """
    X = X.double()
    mu, scale, const = feature_scaling(X, fit_intercept)
    Z = standardise(X, mu, scale, const)
    V = torch.zeros(n_classes, X.shape[1], dtype=torch.float64, device=X.device)
    c = torch.zeros(n_classes, dtype=torch.float64, device=X.device)
    V.requires_grad_(True)
    c.requires_grad_(bool(fit_intercept))
    params = [V, c] if fit_intercept else [V]

    def objective():
        ell = F.cross_entropy(Z @ V.T + c, y, reduction="none")
        penalty = 0.5 * alpha * ((V / scale) ** 2).sum() if alpha > 0 else V.new_zeros(())
        return ell.mean() + penalty

    minimize_lbfgs(objective, params, max_iter=200, tol=1e-9)
    return unscale(V, c, mu, scale)


def feature_scaling(X: torch.Tensor, fit_intercept: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Centre (with an intercept) and scale (std, or RMS without intercept) of X.

    Returns ``mu`` and ``scale``, each of shape ``(d,)``, and the bool mask ``const``
    of the columns taken as constant (they get scale 1; :func:`standardise` sets them
    to exactly 0). A column is constant when its spread is at most ``1e-12`` of its
    mean's magnitude (rounding noise), so a feature offset by more than about 1e12
    times its standard deviation is taken as constant.
    """
    # moments of each column divided by a power of two near its largest magnitude (an
    # exact change of units): squares of a spread above ~1e154 overflowed float64, the
    # scale became inf and the model silently all-zero
    unit = row_power_of_two(X, dim=0)[0]
    Xu = X / unit
    if fit_intercept:
        mu_u = Xu.mean(0)
        mu = mu_u * unit
        scale = (Xu - mu_u).pow(2).mean(0).sqrt() * unit
    else:
        mu = torch.zeros(X.shape[1], dtype=X.dtype, device=X.device)
        scale = Xu.pow(2).mean(0).sqrt() * unit
    del Xu
    if not (torch.isfinite(mu).all() and torch.isfinite(scale).all()):
        raise ValueError("X has features whose mean or spread overflows float64 "
                         "(values near 1.8e308); rescale them.")
    # constant columns (spread at the rounding level of their mean, or all zero) get 1;
    # the threshold is relative only: a feature in tiny units (std 1e-30) is not constant
    const = ~((scale > 1e-12 * mu.abs()) & (scale > 0))
    scale = torch.where(const, torch.ones_like(scale), scale)
    return mu, scale, const


def standardise(X: torch.Tensor, mu: torch.Tensor, scale: torch.Tensor,
                const: torch.Tensor) -> torch.Tensor:
    """``(X - mu) / scale`` with the constant columns of :func:`feature_scaling` exactly 0.

    A constant column keeps the rounding error of its float64 mean: ~1e-16 of it,
    but 16384 for a column of 1e20 (n = 101), which the float32 SGD saw as a feature
    of curvature 16384^2 and diverged on; the least-squares warm start would fit it.
    """
    return ((X - mu) / scale).masked_fill(const, 0.0)


def unscale(W, b, mu, scale):
    """Parameters in the original feature units (float64) from the standardised ones."""
    Wo = W.detach().double().to(mu.device) / scale
    return Wo, b.detach().double().to(mu.device) - Wo @ mu
