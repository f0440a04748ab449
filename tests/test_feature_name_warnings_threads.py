"""Inputs with feature names on one side only: warned once at the user's call, in
any thread, without touching the process-wide warnings filters.

The validation used to silence scikit-learn's own copy of the warning with
``warnings.catch_warnings()``, which swaps the process-wide filter list: calls
overlapping in several threads restored each other's lists and left an "ignore"
filter for these warnings installed for good (scikit-learn's own estimators then
stopped warning too).
"""

import threading
import warnings

import numpy as np
import pytest

from mlpapers.optim import KLDRORegressor

pd = pytest.importorskip("pandas")

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 3))
Y = X @ np.array([1.0, 2.0, 3.0])
NAMES = ["a", "b", "c"]


def _fitted(with_names):
    data = pd.DataFrame(X, columns=NAMES) if with_names else X
    return KLDRORegressor(epochs=1, random_state=0).fit(data, Y)


@pytest.mark.parametrize("fit_names", [True, False])
def test_one_sided_names_warn_once_pointing_at_the_caller(fit_names):
    est = _fitted(fit_names)
    other = X if fit_names else pd.DataFrame(X, columns=NAMES)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        est.predict(other)
    names = [w for w in record if "feature names" in str(w.message)]
    assert len(names) == 1 and names[0].filename == __file__


def test_one_sided_names_still_check_the_feature_count():
    est = _fitted(True)
    with pytest.warns(UserWarning, match="feature names"), \
            pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])


def test_concurrent_calls_leave_the_warnings_filters_as_they_were():
    estimators = [_fitted(True) for _ in range(3)]
    big = RNG.normal(size=(20_000, 3))
    errors = []

    def work(est):
        try:
            for _ in range(30):
                est.predict(big)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with warnings.catch_warnings():  # (main thread only: the filter list is process-wide)
        warnings.simplefilter("ignore", UserWarning)   # the expected warnings, quietly
        before = list(warnings.filters)
        filters_seen = []   # any filter on these messages installed during the calls
        threads = [threading.Thread(target=work, args=(e,)) for e in estimators]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            filters_seen.extend(f for f in list(warnings.filters)
                                if f[1] is not None and "feature names" in f[1].pattern)
        for t in threads:
            t.join()
        assert not errors
        assert filters_seen == []
        assert warnings.filters == before
