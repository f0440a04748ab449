"""Counts and sizes beyond any index get a ValueError naming the parameter.

``epochs=2**64`` failed inside tqdm ("Python int too large to convert to C
ssize_t"), ``hidden_dim=2**64`` and ``batch_size=2**64`` inside torch's shape
arguments, ``depth=2**64`` with a bare OverflowError.
"""

import numpy as np
import pytest

from mlpapers._utils import check_positive
from mlpapers.decentralized import DecentralizedSGD
from mlpapers.optim import KLDROClassifier
from mlpapers.retrieval import AmortizedMIPS

X = np.random.default_rng(0).normal(size=(40, 3))
Y = (X[:, 0] > 0).astype(int)


def test_check_positive_bounds_integers_at_the_int64_maximum():
    assert check_positive(2**63 - 1, "n", integer=True) == 2**63 - 1
    with pytest.raises(ValueError, match=r"n must be at most 2\*\*63 - 1"):
        check_positive(2**63, "n", integer=True)
    assert check_positive(2.0**70, "x") == 2.0**70   # real numbers are not counts


@pytest.mark.parametrize("make, name", [
    (lambda v: KLDROClassifier(epochs=v).fit(X, Y), "epochs"),
    (lambda v: AmortizedMIPS(hidden_dim=v).fit(X), "hidden_dim"),
    (lambda v: AmortizedMIPS(depth=v).fit(X), "depth"),
    (lambda v: DecentralizedSGD(batch_size=v).fit(X, Y), "batch_size"),
    (lambda v: DecentralizedSGD(n_rounds=v).fit(X, Y), "n_rounds"),
])
def test_estimators_name_the_huge_count(make, name):
    with pytest.raises(ValueError, match=rf"{name} must be at most 2\*\*63 - 1"):
        make(2**64)


def test_a_mixing_matrix_as_topology_is_named():
    with pytest.raises(TypeError, match="topology skips must be integers.*mixing matrix"):
        DecentralizedSGD(n_nodes=4, topology=np.full((4, 4), 0.25)).fit(X, Y)
