"""Generator arguments that gave irreproducible, silently wrong or late failures."""

import os
import subprocess
import sys

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
