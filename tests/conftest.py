import os

import pytest
import torch

# Two cores: avoid oversubscription when pytest-xdist or BLAS threads compete.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
