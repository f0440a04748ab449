"""A huge ``lam`` on (near-)noiseless regression data: a clear error, as on noisy data.

For a near-perfect fit the regressor picked a target unit ``t`` that kept ``lam / t^2``
in float32's range but put the scaled weights ``W / t`` below float32's normal range:
``lam=1e120`` returned one coefficient 0 and ``lam=1e150`` all of them, silently.
"""

import numpy as np
import pytest

from mlpapers.optim import KLDRORegressor

RNG = np.random.default_rng(0)
X = RNG.normal(size=(200, 3))
COEF = np.array([1.0, -2.0, 0.5])
Y = X @ COEF + 3.0


@pytest.mark.parametrize("lam", [1e120, 1e150, 1e300])
@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_lam_too_large_for_float32_is_refused_with_or_without_noise(lam, noise):
    y = Y + noise * RNG.normal(size=len(Y))
    with pytest.raises(ValueError, match=r"lam=.* is too large for the float32 SGD"):
        KLDRORegressor(lam=lam, epochs=5, random_state=0).fit(X, y)


def test_the_message_gives_the_unscaled_mean_loss():
    with pytest.raises(ValueError) as info:
        KLDRORegressor(lam=1e150, epochs=5, random_state=0).fit(X, Y)
    mean = float(str(info.value).split("mean initial loss ")[1].split(")")[0])
    assert 0 < mean < 1e-20   # the exact-fit residuals' squares, not 0 (scaled, underflown)


@pytest.mark.parametrize("lam", [1.0, 1e50, 1e100, 1e110])
def test_large_but_representable_lam_recovers_the_exact_fit(lam):
    est = KLDRORegressor(lam=lam, epochs=5, random_state=0).fit(X, Y)
    np.testing.assert_allclose(est.coef_, COEF, rtol=1e-6)
    assert est.intercept_ == pytest.approx(3.0, rel=1e-6)
