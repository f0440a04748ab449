"""Scikit-learn's bundled 8x8 digits placed on a larger noisy canvas."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from mlpapers._utils import RandomStateLike, check_positive, check_random_state


def make_shifted_digits(
    n_samples: int | None = None,
    canvas: int = 16,
    noise: float = 0.1,
    random_state: RandomStateLike = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Place scikit-learn's 8x8 digits at random positions on a noisy canvas.

    A small, offline image dataset with translation variability, for
    self-supervised and anomaly-detection tests. Pixel values of the digits
    (0..16) are scaled to [0, 1], pasted at a uniformly random offset, Gaussian
    noise of standard deviation ``noise`` is added and the result clipped to
    [0, 1].

    Parameters
    ----------
    n_samples : int or None, default=None
        Number of images. ``None`` uses each of the 1,797 digits once; a larger
        number resamples digits with replacement.
    canvas : int, default=16
        Side of the square canvas (at least 8).
    noise : float, default=0.1
        Standard deviation of the additive Gaussian pixel noise (>= 0).
    random_state : int, RandomState, Generator or None, default=None
        Seed for the digit choice, positions and noise.

    Returns
    -------
    X : ndarray of shape (n_samples, 1, canvas, canvas), float32
        Images in [0, 1], channels first.
    y : ndarray of shape (n_samples,), int64
        Digit labels 0..9.

    Examples
    --------
    >>> from mlpapers.datasets import make_shifted_digits
    >>> X, y = make_shifted_digits(n_samples=10, canvas=12, random_state=0)
    >>> X.shape, y.shape
    ((10, 1, 12, 12), (10,))
    """
    check_positive(canvas, "canvas", integer=True)
    if canvas < 8:
        raise ValueError(f"canvas must be >= 8 to hold an 8x8 digit, got {canvas}.")
    check_positive(noise, "noise", strict=False)
    if n_samples is not None:
        check_positive(n_samples, "n_samples", integer=True)
    rng = check_random_state(random_state)
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    labels = digits.target.astype(np.int64)
    if n_samples is None:
        idx = rng.permutation(len(images))
    else:
        idx = rng.choice(len(images), size=n_samples, replace=n_samples > len(images))
    n = len(idx)
    top = rng.randint(0, canvas - 8 + 1, size=n)
    left = rng.randint(0, canvas - 8 + 1, size=n)
    X = np.zeros((n, canvas, canvas), dtype=np.float32)
    rows = top[:, None, None] + np.arange(8)[None, :, None]
    cols = left[:, None, None] + np.arange(8)[None, None, :]
    X[np.arange(n)[:, None, None], rows, cols] = images[idx]
    if noise > 0:
        # clipped to [-1, 1] first: the same pixels after the final clip, and no float32
        # overflow warning from the cast for a huge noise (nor from the product, whose
        # infinities near noise = 1e308 clip to +-1 all the same)
        with np.errstate(over="ignore"):
            X += np.clip(noise * rng.standard_normal(X.shape), -1.0, 1.0).astype(np.float32)
    np.clip(X, 0.0, 1.0, out=X)
    return X[:, None], labels[idx]
