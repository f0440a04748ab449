"""Generator arguments that gave irreproducible, silently wrong or late failures."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from mlpapers.datasets import (
    make_extreme_classification,
    make_federated_digits,
    make_relevance_problem,
    make_texture_anomalies,
)
from mlpapers.datasets._mips import GaussianMixtureQuerySampler


@pytest.mark.parametrize("arg", ["textures", "defects"])
def test_texture_names_given_as_a_set_are_refused(arg):
    # a set's order follows the per-process string hash: the same random_state gave
    # different images (and texture indices) in each new Python process
    names = {"textures": {"stripes", "grain"}, "defects": {"spot", "scratch"}}[arg]
    with pytest.raises(TypeError, match=rf"{arg} must be an ordered sequence .* got a set"):
        make_texture_anomalies(2, 2, image_size=16, random_state=0, **{arg: names})


def test_texture_data_is_the_same_in_processes_with_other_hash_seeds():
    code = ("import hashlib; from mlpapers.datasets import make_texture_anomalies as m;"
            "out = m(2, 4, image_size=16, textures=['stripes', 'grain'], "
            "defects=('spot', 'scratch'), return_texture=True, random_state=0);"
            "print(hashlib.md5(b''.join(a.tobytes() for a in out)).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(digests) == 1


def test_extreme_classification_numpy_int32_sizes_keep_the_class_minimum():
    # int32 * int overflowed (65536 * 65536 wrapped to 0) and dropped the guarantee
    with pytest.raises(ValueError, match="exceeds n_samples"):
        make_extreme_classification(20, np.int32(65536), 2, min_samples_per_class=65536,
                                    random_state=0)
    X, y = make_extreme_classification(np.int32(60), np.int32(20), np.int32(3),
                                       min_samples_per_class=np.int32(2), random_state=0)
    assert X.shape == (60, 3) and np.bincount(y, minlength=20).min() >= 2


def test_federated_rotation_checks_n_swaps_as_label_swap_does():
    with pytest.raises(ValueError, match=r"n_swaps must be <= 5"):
        make_federated_digits("rotation", n_clusters=2, n_swaps=6, random_state=0)


@pytest.mark.parametrize("name", ["nonlinearity", "popularity"])
def test_relevance_scales_beyond_float64_are_refused_by_name(name):
    # the relevance matrix was all NaN (nonlinearity) or near overflow, with numpy warnings
    with pytest.raises(ValueError, match=rf"{name}=1e\+308 puts the relevance beyond"):
        make_relevance_problem(5, 7, random_state=0, **{name: 1e308})
    Q, I, f = make_relevance_problem(5, 7, random_state=0, **{name: 1e100})
    assert np.isfinite(f(Q, I)).all()


@pytest.mark.parametrize("anchors, error, match", [
    (np.eye(2) * 1j, ValueError, "Complex data not supported: anchors"),
    ([["a"]], TypeError, "anchors must contain numbers"),
    (np.zeros((3, 0)), ValueError, r"0 feature\(s\) .* in anchors"),
    (np.zeros((0, 3)), ValueError, r"0 sample\(s\) .* in anchors"),
    ([[np.nan, 1.0]], ValueError, "anchors contains NaN"),
    (np.ones(3), ValueError, "Expected 2D array for anchors"),
])
def test_query_sampler_refuses_bad_anchors_by_name(anchors, error, match):
    with pytest.raises(error, match=match):
        GaussianMixtureQuerySampler(anchors, 0.1)


def test_query_sampler_names_rng_and_takes_tensor_anchors():
    sampler = GaussianMixtureQuerySampler(torch.eye(3), 0.1)
    with pytest.raises(TypeError, match="rng must be None, an int"):
        sampler(3, torch.Generator())
    np.testing.assert_array_equal(sampler(4, 0),
                                  GaussianMixtureQuerySampler(np.eye(3), 0.1)(4, 0))


def test_fraction_levels_are_taken_as_floats():
    # a Fraction passed the checks (a real number) and made object arrays, or failed in
    # numpy's exp
    from fractions import Fraction

    from mlpapers.datasets import make_mips_problem, make_relevance_problem

    Q, items, rel = make_relevance_problem(5, 6, cluster_std=Fraction(1, 3),
                                           popularity=Fraction(1, 3),
                                           nonlinearity=Fraction(1, 2), random_state=0)
    Q2, items2, rel2 = make_relevance_problem(5, 6, cluster_std=1 / 3, popularity=1 / 3,
                                              nonlinearity=0.5, random_state=0)
    assert items.dtype == np.float64
    np.testing.assert_array_equal(items, items2)
    np.testing.assert_array_equal(rel(Q, items), rel2(Q2, items2))
    keys = make_mips_problem(10, 3, norm_spread=Fraction(1, 4), query_noise=Fraction(1, 2),
                             random_state=0)[0]
    np.testing.assert_array_equal(keys, make_mips_problem(10, 3, norm_spread=0.25,
                                                          query_noise=0.5, random_state=0)[0])


@pytest.mark.parametrize("cluster_std", [1e308, 3e307])
def test_a_cluster_std_beyond_float64_is_named(cluster_std):
    # 1e308 leaked numpy's overflow warning and blamed popularity=0; 3e307 built a
    # relevance function returning inf
    from mlpapers.datasets import make_relevance_problem

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^cluster_std=.* beyond float64's range"):
            make_relevance_problem(50, 50, cluster_std=cluster_std, popularity=0,
                                   random_state=0)


def test_huge_noise_clips_without_overflow_warnings():
    from mlpapers.datasets import make_shifted_digits, make_texture_anomalies

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        X, _ = make_shifted_digits(3, noise=1e308, random_state=0)
        X_train = make_texture_anomalies(2, 2, image_size=16, noise=1e308, random_state=0)[0]
    assert np.isin(X, (0.0, 1.0)).mean() > 0.99 and np.isfinite(X_train).all()


def test_a_large_but_representable_cluster_std_is_accepted():
    # the bound on cluster_std summed squares of the items, which overflow from 1e154:
    # 1e160 was refused although its relevance is finite
    from mlpapers.datasets import make_relevance_problem

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Q, items, rel = make_relevance_problem(20, 30, cluster_std=1e160, random_state=0)
        assert np.isfinite(rel(Q, items)).all()
