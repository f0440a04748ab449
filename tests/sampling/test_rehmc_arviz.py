"""``SampleResult.to_inference_data`` and agreement of our diagnostics with arviz."""

import numpy as np
import pytest

from mlpapers.sampling import Box, ReflectiveHMC, ess, rhat

az = pytest.importorskip("arviz")


@pytest.fixture(scope="module")
def result():
    def log_prob(x):
        return -2.0 * ((x - 1.0) ** 2).sum(-1)

    return ReflectiveHMC(log_prob, Box([0.0, 0.0, 0.0], [1.0, 1.0, 2.0]), n_leapfrog=5,
                         random_state=0).sample(200, n_chains=3, warmup=100)


def test_inference_data_shapes_and_values_round_trip(result):
    idata = result.to_inference_data()
    x = idata.posterior["x"]
    assert x.dims[:2] == ("chain", "draw")
    assert x.shape == (3, 200, 3)
    np.testing.assert_array_equal(x.values, result.samples)
    step = idata.sample_stats["step_size"].values
    assert step.shape == (3, 200)
    np.testing.assert_array_equal(step, np.repeat(result.step_size[:, None], 200, axis=1))


@pytest.mark.parametrize("method", ["bulk", "tail"])
def test_arviz_ess_equals_ours(result, method):
    ours = result.ess(method)
    theirs = az.ess(result.to_inference_data(), method=method)["x"].values
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)


def test_arviz_rhat_equals_ours(result):
    theirs = az.rhat(result.to_inference_data())["x"].values
    np.testing.assert_allclose(result.rhat(), theirs, rtol=1e-8)


@pytest.mark.parametrize(("chains", "draws"), [(2, 21), (3, 101), (4, 1000)])
def test_arviz_diagnostics_equal_ours_on_random_walks_of_odd_and_even_lengths(chains, draws):
    rng = np.random.default_rng(draws)
    x = np.cumsum(rng.standard_normal((chains, draws, 2)), axis=1) + 3.0 * rng.standard_normal(
        (chains, draws, 2))
    data = az.convert_to_dataset({"x": x})
    for method in ("bulk", "tail"):
        np.testing.assert_allclose(ess(x, kind=method), az.ess(data, method=method)["x"].values,
                                   rtol=1e-8)
    np.testing.assert_allclose(rhat(x), az.rhat(data)["x"].values, rtol=1e-8)
