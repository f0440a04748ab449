"""Run scikit-learn's estimator checks on every public mlpapers estimator.

Estimators are discovered from the public ``__all__`` of every mlpapers
subpackage, so each new algorithm is checked without editing this file. An
estimator chooses the instances to check with ``_estimator_check_instances``
(``[]`` for estimators outside the ``fit(X, y)`` contract) and declares
inapplicable checks, with a reason, in ``_expected_failed_checks``.
"""


from sklearn.base import BaseEstimator
from sklearn.utils.estimator_checks import parametrize_with_checks

from tests._public import public_classes


def public_estimators():
    return [cls for cls in public_classes() if issubclass(cls, BaseEstimator)]


def _instances():
    out = []
    for cls in public_estimators():
        make = getattr(cls, "_estimator_check_instances", None)
        out += make() if make is not None else [cls()]
    return out


def _expected(estimator):
    get = getattr(estimator, "_expected_failed_checks", None)
    return get() if get is not None else {}


@parametrize_with_checks(_instances(), expected_failed_checks=_expected)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_discovery_finds_only_estimators():
    for cls in public_estimators():
        assert issubclass(cls, BaseEstimator)
