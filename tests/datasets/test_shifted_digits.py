import numpy as np
import pytest
from sklearn.datasets import load_digits

from mlpapers.datasets import make_shifted_digits


def test_shapes_range_and_dtype():
    X, y = make_shifted_digits(n_samples=50, canvas=20, random_state=0)
    assert X.shape == (50, 1, 20, 20) and X.dtype == np.float32
    assert y.shape == (50,) and y.dtype == np.int64
    assert X.min() >= 0.0 and X.max() <= 1.0
    assert set(np.unique(y)) <= set(range(10))


def test_default_uses_every_digit_once():
    X, y = make_shifted_digits(random_state=0)
    assert len(X) == 1797
    np.testing.assert_array_equal(np.bincount(y), np.bincount(load_digits().target))


def test_noise_free_images_contain_the_digit_exactly():
    digits = load_digits()
    X, y = make_shifted_digits(n_samples=30, canvas=12, noise=0.0, random_state=1)
    originals = digits.images / 16.0
    for img, label in zip(X[:, 0], y):
        rows, cols = np.nonzero(img)
        top, left = rows.min(), cols.min()
        # some stored digit of that label matches the pasted 8x8 window
        windows = [img[r:r + 8, c:c + 8] for r in range(max(0, top - 7), top + 1)
                   for c in range(max(0, left - 7), left + 1)
                   if r + 8 <= 12 and c + 8 <= 12]
        cands = originals[digits.target == label]
        assert any(np.abs(cands - w).max(axis=(1, 2)).min() < 1e-6 for w in windows)


def test_positions_vary_and_seed_is_deterministic():
    X1, y1 = make_shifted_digits(n_samples=200, canvas=16, noise=0.0, random_state=3)
    X2, y2 = make_shifted_digits(n_samples=200, canvas=16, noise=0.0, random_state=3)
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    mass_rows = (X1[:, 0].sum(2) * np.arange(16)).sum(1) / X1[:, 0].sum((1, 2))
    assert mass_rows.std() > 1.0  # digits are not all at the same place


def test_oversampling_and_bad_arguments():
    X, _ = make_shifted_digits(n_samples=2000, random_state=0)
    assert len(X) == 2000
    with pytest.raises(ValueError, match="canvas must be >= 8"):
        make_shifted_digits(canvas=6)
    with pytest.raises(ValueError, match="noise must be >= 0"):
        make_shifted_digits(noise=-1.0)
    with pytest.raises(TypeError, match="n_samples must be an integer"):
        make_shifted_digits(n_samples=2.5)


@pytest.mark.slow
def test_offsets_are_uniform_chi_square():
    from scipy.stats import chisquare

    canvas = 12
    X, _ = make_shifted_digits(n_samples=6000, canvas=canvas, noise=0.0, random_state=5)
    # the leftmost column of every 8x8 digit in sklearn's set has ink in rows or not;
    # use the bounding box of the ink and the known 8x8 window width of 5 free offsets
    cols_any = X[:, 0].max(axis=1) > 0
    left_ink = cols_any.argmax(axis=1)
    digits = load_digits().images
    # the offset distribution convolved with the digit's own left margin must match
    margins = (digits.max(axis=1) > 0).argmax(axis=1)
    p_margin = np.bincount(margins, minlength=8) / len(margins)
    n_off = canvas - 8 + 1
    expected = np.convolve(np.full(n_off, 1.0 / n_off), p_margin)[:canvas]
    observed = np.bincount(left_ink, minlength=canvas)[:canvas]
    keep = expected > 0
    stat = chisquare(observed[keep], expected[keep] / expected[keep].sum() * observed.sum())
    assert stat.pvalue > 1e-3
