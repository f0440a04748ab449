import os

import pytest
import torch
from hypothesis import settings

# Tests use small tensors: one intra-op thread avoids thread start-up and spinning
# costs that dominate tiny ops (and oversubscription when several runs share cores, as
# pytest-xdist's workers do). The variables give the processes tests start (guide
# snippets, the demo, peak-memory children) the same single thread.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

# CI must be reproducible: hypothesis draws the same examples on every run unless
# HYPOTHESIS_PROFILE=explore is set to search new inputs locally.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)


# CI runs the default suite once without the optional extras, then, with every extra
# installed, only the tests that skipped there (.ci/run): this hook writes their node ids.
_SKIPPED_LOG = os.environ.get("MLPAPERS_SKIPPED_LOG")


def _log_skip(report):
    if _SKIPPED_LOG and report.skipped and not hasattr(report, "wasxfail"):  # not xfails
        with open(_SKIPPED_LOG, "a", encoding="utf-8") as log:
            log.write(report.nodeid + "\n")


def pytest_collectreport(report):
    _log_skip(report)  # a module-level importorskip skips the whole module at collection


def pytest_runtest_logreport(report):
    _log_skip(report)
