"""One ``ReflectiveHMC`` shared by several threads: each call returns its own result.

The call read its generator from the sampler after seeding it (another thread's call
could replace it in between: both then drew from one generator), and built its result
from the ``step_size_`` / ``inv_mass_`` / ``trajectory_length_`` attributes written just
before (another call's values, of another chain count, which ``resume`` then refused).
"""

import concurrent.futures as cf
import sys
import warnings

import numpy as np
import pytest

from mlpapers.sampling import Box, ReflectiveHMC


def _log_prob(x):
    return -0.5 * (x**2).sum(-1)


@pytest.fixture
def fast_switching():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # thread switches between any two bytecodes
    yield
    sys.setswitchinterval(interval)


def test_each_call_gets_its_own_adapted_state(fast_switching):
    sampler = ReflectiveHMC(_log_prob, Box([0, 0], [1, 2]), n_leapfrog=3, random_state=0)

    def job(i):
        chains = 1 + i % 4
        return chains, sampler.sample(3, n_chains=chains, warmup=2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (few draws: R-hat and ESS warnings)
        with cf.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(job, range(400)))
        for chains, res in results:
            assert res.step_size.shape == (chains,)
        # and each can be resumed (it was refused: "step_size has shape (1,), expected (2,)")
        chains, res = results[5]
        more = ReflectiveHMC(_log_prob, Box([0, 0], [1, 2]), n_leapfrog=3,
                             random_state=0).sample(3, resume=res)
        assert more.samples.shape[0] == chains


def test_concurrent_seeded_calls_equal_sequential_ones(fast_switching):
    sampler = ReflectiveHMC(_log_prob, Box([0, 0], [1, 2]), n_leapfrog=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sampler.sample(4, n_chains=2, warmup=3).samples
        with cf.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda _: sampler.sample(4, n_chains=2, warmup=3).samples,
                              range(200)))
    for samples in got:
        np.testing.assert_array_equal(samples, expected)
