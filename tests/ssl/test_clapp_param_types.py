"""``spatial_pool`` as a 1-D numpy array, and ``update_similarity``'s seed error naming
the torch.Generator it accepts."""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl.clapp import CLAPPEncoder, update_similarity


@pytest.fixture(scope="module")
def fitted():
    X, _ = make_shifted_digits(n_samples=16, random_state=0)
    return CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X), X


def test_spatial_pool_takes_a_numpy_array_of_ints_as_the_list(fitted):
    enc, X = fitted
    n = len(enc.grids_)
    grids = np.full(n, 2, dtype=np.int64)
    np.testing.assert_array_equal(enc.transform(X[:3], spatial_pool=grids),
                                  enc.transform(X[:3], spatial_pool=[2] * n))
    assert list(enc.get_feature_names_out(spatial_pool=grids)) == list(
        enc.get_feature_names_out(spatial_pool=[2] * n))
    with pytest.raises(ValueError, match="spatial_pool must give one positive int"):
        enc.transform(X[:3], spatial_pool=np.full(n, 1.5))


@pytest.mark.parametrize("bad", ["abc", True, 1.5])
def test_update_similarity_seed_error_names_the_torch_generator(fitted, bad):
    enc, X = fitted
    with pytest.raises(TypeError, match="or a torch.Generator"):
        update_similarity(enc, X, n_batches=1, random_state=bad)
    sim = update_similarity(enc, X, n_batches=1, random_state=torch.Generator().manual_seed(0))
    assert set(sim) == set(range(len(enc.grids_)))
