import warnings

import numpy as np
import pytest

from mlpapers.datasets import make_mips_problem
from mlpapers.datasets._mips import GaussianMixtureQuerySampler


def test_shapes_dtypes_and_unit_queries():
    keys, queries, sampler = make_mips_problem(200, 12, n_queries=30, random_state=0)
    assert keys.shape == (200, 12) and keys.dtype == np.float32
    assert queries.shape == (30, 12) and queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, rtol=1e-5)
    q = sampler(7, np.random.default_rng(1))
    assert q.shape == (7, 12) and q.dtype == np.float32
    assert make_mips_problem(5, 3, n_queries=0)[1].shape == (0, 3)


def test_determinism():
    a = make_mips_problem(50, 4, n_queries=10, random_state=3)
    b = make_mips_problem(50, 4, n_queries=10, random_state=3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2](5, 0), b[2](5, 0))


def test_key_norms_make_mips_differ_from_cosine():
    keys, queries, _ = make_mips_problem(500, 8, n_queries=500, norm_spread=0.5,
                                         random_state=0)
    norms = np.linalg.norm(keys, axis=1)
    assert norms.std() > 0.2
    mips = (queries @ keys.T).argmax(1)
    cosine = (queries @ (keys / norms[:, None]).T).argmax(1)
    assert np.mean(mips != cosine) > 0.2
    unit, _, _ = make_mips_problem(100, 8, norm_spread=0.0, random_state=0)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)


def test_norm_spread_beyond_float32_range_is_refused():
    # regression: exp(30 * z) overflowed the float32 keys to inf, with only a cast warning
    with pytest.raises(ValueError, match="^norm_spread=30.0 gives key norms beyond float32"):
        make_mips_problem(1000, 8, norm_spread=30.0, random_state=0)
    keys, _, _ = make_mips_problem(1000, 8, norm_spread=20.0, random_state=0)
    assert np.isfinite(keys).all()


@pytest.mark.parametrize("seed", [9, 20, 69])
def test_keys_are_normal_float32_or_refused(seed):
    # the lower tail underflowed to subnormal or zero keys without a word
    for spread in (23.0, 24.0, 25.0):
        try:
            keys, _, _ = make_mips_problem(300, 4, n_queries=0, norm_spread=spread,
                                           random_state=seed)
        except ValueError as exc:
            assert "beyond float32's range" in str(exc)
            continue
        assert np.abs(keys).max(axis=1).min() >= np.finfo(np.float32).tiny


def test_a_huge_norm_spread_is_refused_without_numpy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="norm_spread=1000.0 gives key norms"):
            make_mips_problem(100, 4, norm_spread=1000.0, random_state=0)


def test_huge_query_noise_still_gives_unit_queries():
    # the squared norm overflowed above query_noise ~ 1e155 and every query became 0
    _, queries, sampler = make_mips_problem(10, 4, n_queries=3, query_noise=1e200,
                                            random_state=0)
    for q in (queries, sampler(5, 0)):
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-6)
    # the same directions as a / noise + eps / sqrt(d)
    s = GaussianMixtureQuerySampler(np.eye(4), noise=1e200)
    small = GaussianMixtureQuerySampler(np.eye(4) * 1e-200, noise=1.0)
    np.testing.assert_allclose(s(6, 1), small(6, 1), rtol=1e-6)


def test_sampler_concentrates_around_anchors():
    anchors = np.eye(4)
    sampler = GaussianMixtureQuerySampler(anchors, noise=0.05)
    q = sampler(1000, np.random.default_rng(0))
    assert (q @ anchors.T).max(1).min() > 0.9
    assert np.bincount((q @ anchors.T).argmax(1), minlength=4).min() > 150
    assert "n_anchors=4" in repr(sampler)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_keys"):
        make_mips_problem(0)
    with pytest.raises(TypeError, match="n_features"):
        make_mips_problem(10, 2.5)
    with pytest.raises(ValueError, match="query_noise"):
        make_mips_problem(10, query_noise=-1)
    with pytest.raises(ValueError, match="anchors"):
        GaussianMixtureQuerySampler(np.zeros(3), 0.1)


def test_large_databases_hold_one_float64_copy_of_the_keys():
    """1M x 128 keys are 0.5 GB: the generator used to peak at five times that."""
    import tracemalloc

    n, d = 100_000, 32
    tracemalloc.start()
    keys, _, _ = make_mips_problem(n, d, n_queries=0, random_state=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1.7 * n * d * 8  # float64 work array + float32 result (1.5x)
    # unchanged values: unit directions times log-normal norms, drawn as before
    rng = np.random.RandomState(0)
    dirs = rng.standard_normal((n, d))
    dirs /= np.maximum(np.linalg.norm(dirs, axis=1, keepdims=True), 1e-12)
    ref = (dirs * np.exp(0.25 * rng.standard_normal((n, 1)))).astype(np.float32)
    np.testing.assert_array_equal(keys, ref)
