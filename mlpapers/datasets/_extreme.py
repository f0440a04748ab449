"""Synthetic many-class data with long-tailed labels, for extreme classification."""

from __future__ import annotations

import numpy as np

from mlpapers._utils import (
    RandomStateLike,
    check_positive,
    check_random_state,
    float32_within_range,
)


def make_extreme_classification(
    n_samples: int = 20000,
    n_classes: int = 2000,
    n_features: int = 32,
    *,
    noise: float = 0.7,
    zipf_exponent: float = 1.0,
    min_samples_per_class: int = 0,
    random_state: RandomStateLike = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Gaussian clusters around random class means, with Zipf-distributed labels.

    Class means are drawn from :math:`\mathcal N(0, I_d)`; a label ``y`` is drawn
    with probability proportional to :math:`(y + 1)^{-a}` (``a = zipf_exponent``,
    ``0`` gives uniform labels) and the point is
    :math:`x = \mu_y + \text{noise}\cdot\varepsilon`, :math:`\varepsilon \sim \mathcal N(0, I_d)`.
    With ``min_samples_per_class = m > 0`` the first :math:`mC` labels are
    every class ``m`` times and only the remaining points follow the Zipf law
    (then the rows are shuffled), so every class occurs at least ``m`` times
    however long the tail is. Linear models fit it well, so exact softmax
    objectives are informative, while
    the number of classes makes full-softmax training costly: the setting of the
    extreme-classification experiments of SCENT (Wei et al., ICML 2026).

    Parameters
    ----------
    n_samples : int, default=20000
        Number of points.
    n_classes : int, default=2000
        Number of classes (at least 2). With long tails some classes may not
        occur in a small sample unless ``min_samples_per_class > 0``.
    n_features : int, default=32
        Dimension ``d``.
    noise : float, default=0.7
        Standard deviation of the isotropic noise around each class mean (>= 0).
    zipf_exponent : float, default=1.0
        Exponent ``a`` of the label distribution (>= 0).
    min_samples_per_class : int, default=0
        Guaranteed number of points of every class; needs
        ``n_samples >= min_samples_per_class * n_classes``.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the means, labels and noise.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features), float32
        The points, :math:`\mu_y + \text{noise}\cdot\varepsilon`.
    y : ndarray of shape (n_samples,), int64
        Labels in ``0 .. n_classes - 1``; label 0 is the most likely (for
        ``zipf_exponent > 0``; a sample's counts vary around the law).

    Examples
    --------
    >>> from mlpapers.datasets import make_extreme_classification
    >>> X, y = make_extreme_classification(1000, 50, 8, random_state=0)
    >>> X.shape, y.dtype, int(y.max()) < 50
    ((1000, 8), dtype('int64'), True)
    """
    check_positive(n_samples, "n_samples", integer=True)
    check_positive(n_classes, "n_classes", integer=True)
    check_positive(n_features, "n_features", integer=True)
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes}.")
    check_positive(noise, "noise", strict=False)
    check_positive(zipf_exponent, "zipf_exponent", strict=False)
    check_positive(min_samples_per_class, "min_samples_per_class", strict=False, integer=True)
    # (python ints: numpy int32 sizes overflowed the product and dropped the guarantee)
    n_samples, n_classes, n_features = int(n_samples), int(n_classes), int(n_features)
    n_fixed = int(min_samples_per_class) * n_classes
    if n_fixed > n_samples:
        raise ValueError(
            f"min_samples_per_class * n_classes = {n_fixed} exceeds n_samples = {n_samples}.")
    rng = check_random_state(random_state)
    means = rng.standard_normal((n_classes, n_features))
    p = (np.arange(1, n_classes + 1, dtype=np.float64)) ** (-float(zipf_exponent))
    y = rng.choice(n_classes, size=n_samples - n_fixed, p=p / p.sum()).astype(np.int64)
    if n_fixed:
        fixed = np.tile(np.arange(n_classes, dtype=np.int64), int(min_samples_per_class))
        y = rng.permutation(np.concatenate([fixed, y]))
    with np.errstate(over="ignore"):
        X = means[y] + noise * rng.standard_normal((n_samples, n_features))
    return float32_within_range(X, "noise", noise), y
