import os

import pytest
import torch
from hypothesis import settings

# Tests use small tensors: one intra-op thread avoids thread start-up and spinning
# costs that dominate tiny ops (and oversubscription when several runs share cores).
torch.set_num_threads(1)

# CI must be reproducible: hypothesis draws the same examples on every run unless
# HYPOTHESIS_PROFILE=explore is set to search new inputs locally.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
