"""``random_state`` handling and parameter validation shared by the dataset generators."""

import numpy as np
import pytest

from mlpapers._utils import check_random_state
from mlpapers.datasets import (
    make_extreme_classification,
    make_federated_digits,
    make_federated_linear,
    make_mips_problem,
    make_relevance_problem,
    make_shifted_digits,
    make_texture_anomalies,
)

SMALL = [
    (make_shifted_digits, dict(n_samples=6)),
    (make_extreme_classification, dict(n_samples=60, n_classes=5, n_features=4)),
    (make_mips_problem, dict(n_keys=20, n_features=4, n_queries=3)),
    (make_federated_linear, dict(n_clusters=2, n_clients_per_cluster=2, n_samples=5,
                                 n_features=4)),
    (make_federated_digits, dict(n_clusters=2, n_clients_per_cluster=1, n_samples=5)),
    (make_texture_anomalies, dict(n_train=2, n_test=2, image_size=16)),
    (make_relevance_problem, dict(n_queries=3, n_items=4)),
]
IDS = [f.__name__ for f, _ in SMALL]


def _arrays(out):
    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, list | tuple):
        return [a for o in out for a in _arrays(o)]
    return []


@pytest.mark.parametrize("make, kw", SMALL, ids=IDS)
def test_numpy_generator_is_accepted_and_reproducible(make, kw):
    a = _arrays(make(**kw, random_state=np.random.default_rng(3)))
    b = _arrays(make(**kw, random_state=np.random.default_rng(3)))
    assert a and len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    # int seeds keep scikit-learn's RandomState stream
    c = _arrays(make(**kw, random_state=np.random.RandomState(5)))
    d = _arrays(make(**kw, random_state=5))
    assert all(np.array_equal(x, y) for x, y in zip(c, d))


@pytest.mark.parametrize("make, kw", SMALL, ids=IDS)
@pytest.mark.parametrize("bad, err", [(1.5, TypeError), ("0", TypeError), (True, TypeError),
                                      (-1, ValueError), (2**40, ValueError)])
def test_bad_random_state_names_the_parameter(make, kw, bad, err):
    with pytest.raises(err, match="random_state"):
        make(**kw, random_state=bad)


def test_check_random_state_types():
    assert isinstance(check_random_state(None), np.random.RandomState)
    rs = np.random.RandomState(0)
    assert check_random_state(rs) is rs
    assert check_random_state(np.int64(7)).randint(1000) == np.random.RandomState(7).randint(1000)


@pytest.mark.parametrize("kwargs, err, name", [
    (dict(textures=2), TypeError, "textures"),
    (dict(defects=None), TypeError, "defects"),
    (dict(defects=3), TypeError, "defects"),
    (dict(anomaly_ratio="0.1"), TypeError, "anomaly_ratio"),
    (dict(anomaly_ratio=None), TypeError, "anomaly_ratio"),
    (dict(anomaly_ratio=True), TypeError, "anomaly_ratio"),
    (dict(return_texture="yes"), TypeError, "return_texture"),
])
def test_texture_parameters_of_wrong_type_name_the_parameter(kwargs, err, name):
    with pytest.raises(err, match=name):
        make_texture_anomalies(2, 2, image_size=16, random_state=0, **kwargs)


def test_texture_names_may_be_one_string():
    *_, t_train, t_test = make_texture_anomalies(2, 2, image_size=16, textures="checker",
                                                 defects="spot", return_texture=True,
                                                 random_state=0)
    assert set(t_train) | set(t_test) == {0}
