import importlib.util
import os
import warnings

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


def pytest_configure(config):
    # arviz 0.23.4 writes a once-a-day stamp file on import through a fixed temporary
    # name, so pytest-xdist workers importing it together on a new day race, and the
    # loser's collection fails with FileNotFoundError (seen in CI). Importing it once in
    # the controlling process writes the stamp before any worker starts.
    uses_xdist = bool(getattr(config.option, "numprocesses", None))
    if hasattr(config, "workerinput") or not uses_xdist:
        return
    if importlib.util.find_spec("arviz") is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its once-a-day FutureWarning
            import arviz  # noqa: F401
