import numpy as np
import pytest

from mlpapers.datasets import make_extreme_classification


def test_shapes_dtypes_and_determinism():
    X, y = make_extreme_classification(500, 40, 6, random_state=1)
    assert X.shape == (500, 6) and X.dtype == np.float32 and y.dtype == np.int64
    assert y.min() >= 0 and y.max() < 40
    X2, y2 = make_extreme_classification(500, 40, 6, random_state=1)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)


def test_zipf_labels_follow_power_law():
    _, y = make_extreme_classification(200_000, 20, 2, zipf_exponent=1.0, random_state=0)
    freq = np.bincount(y, minlength=20) / len(y)
    p = 1.0 / np.arange(1, 21)
    np.testing.assert_allclose(freq, p / p.sum(), atol=4e-3)
    _, yu = make_extreme_classification(50_000, 10, 2, zipf_exponent=0.0, random_state=0)
    np.testing.assert_allclose(np.bincount(yu) / len(yu), 0.1, atol=1e-2)


def test_noise_is_within_class_spread():
    X, y = make_extreme_classification(20_000, 5, 3, noise=0.3, zipf_exponent=0.0,
                                       random_state=0)
    within = np.mean([X[y == k].std(axis=0).mean() for k in range(5)])
    assert within == pytest.approx(0.3, rel=0.05)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_classes=1), "n_classes"), (dict(noise=-1.0), "noise"),
    (dict(n_samples=0), "n_samples"), (dict(zipf_exponent=-0.5), "zipf_exponent"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_extreme_classification(**{"n_samples": 10, **kwargs})


def test_noise_beyond_float32_is_refused():
    # the points overflowed to inf with only numpy's cast warning
    with pytest.raises(ValueError, match=r"^noise=1e\+39 puts values beyond float32's range"):
        make_extreme_classification(10, 5, 3, noise=1e39, random_state=0)
    X, _ = make_extreme_classification(10, 5, 3, noise=1e30, random_state=0)
    assert np.isfinite(X).all()
