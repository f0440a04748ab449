import pytest
import torch

# Tests use small tensors: one intra-op thread avoids thread start-up and spinning
# costs that dominate tiny ops (and oversubscription when several runs share cores).
torch.set_num_threads(1)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
