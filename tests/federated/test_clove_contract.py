"""Documented promises of CLoVE checked directly (sixth audit)."""

import numpy as np
import pytest

from mlpapers.federated import CLoVE


@pytest.mark.parametrize("transform", ["sqrt", "log"])
def test_loss_transform_changes_the_embedding_not_the_matching_cost(transform):
    # Summed raw losses give model 1 to client 0 and model 0 to client 1 (0.6 + 0.3 <
    # 1e-9 + 1.0); summed square roots (1.32 > 1.0) or logs (-1.7 > -20.7) of the same
    # losses picked the other matching, against the documented "summed losses".
    L = np.array([[1e-9, 0.6], [0.3, 1.0]])
    for est in (CLoVE(n_clusters=2, loss_transform=transform), CLoVE(n_clusters=2)):
        est._numpy_gen = np.random.default_rng(0)
        np.testing.assert_array_equal(est._assign(L, 1), [1, 0])
