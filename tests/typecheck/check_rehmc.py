"""Reflective HMC, its containers, the Stiefel sampler and the diagnostics, as typed user code."""

import warnings
from typing import assert_type

import numpy as np
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    ReflectiveHMC,
    Region,
    SampleResult,
    SampleSummary,
    StiefelResult,
    StiefelSampler,
    ess,
    matrix_von_mises_fisher_log_density,
    polar_factor,
    rhat,
)


def _log_prob(x: torch.Tensor) -> torch.Tensor:
    return -0.5 * (x ** 2).sum(-1)


def check() -> None:
    box = Box([-1.0, -1.0], [1.0, 1.0])
    x = torch.zeros(2, 2, dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    assert_type(box.contains(x), torch.Tensor)
    t, normal = box.hit(x, v, 10.0)
    assert_type(box.interior_point(), np.ndarray)
    assert_type(box.width(), float)
    assert_type(Ball([0.0, 0.0], 1.0).width(), float)
    disc = ConvexSet(lambda z: (z ** 2).sum(-1) - 1.0, dim=2)
    assert_type(disc.interior_point(), np.ndarray)
    half = Region(lambda z: z[:, 0] > 0)
    assert_type(half.contains(x), torch.Tensor)

    hmc = ReflectiveHMC(_log_prob, box, support=half, n_leapfrog=3, random_state=0)
    with warnings.catch_warnings():  # (so short a run warns that the chains disagree)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = hmc.sample(20, x0=np.array([0.5, 0.0]), n_chains=2, warmup=20)
        more = hmc.sample(5, resume=res, return_tensor=True)
    assert_type(res, SampleResult)
    assert_type(res.samples, np.ndarray)
    assert_type(res.ess(), np.ndarray)
    assert_type(res.rhat(), np.ndarray)
    assert_type(res.summary(names=["a", "b"]), SampleSummary)
    assert_type(more.samples_tensor, torch.Tensor)
    assert_type(res.concat(more), SampleResult)
    assert_type(ess(res.samples), np.ndarray | float)
    assert_type(rhat(res.samples), np.ndarray | float)

    assert_type(polar_factor(np.eye(3, 2)), np.ndarray)
    assert_type(polar_factor(torch.eye(3, 2)), torch.Tensor)
    log_g = matrix_von_mises_fisher_log_density(np.eye(3, 2))
    stiefel = StiefelSampler(log_g, n=3, k=2, n_leapfrog=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        draws = stiefel.sample(10, n_chains=2, warmup=10)
    assert_type(draws, StiefelResult)
    assert_type(draws.Q, np.ndarray)
    del t, normal
