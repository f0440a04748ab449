"""Reflective HMC, its containers, the Stiefel sampler and the diagnostics, as typed user code."""

import warnings
from typing import assert_type

import numpy as np
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    SampleResult,
    SampleSummary,
    StiefelResult,
    StiefelSampler,
    bingham_log_density,
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

    # the oracles: tensors in, tensors out; numpy arrays or nested lists in, numpy out
    hit = box.hit(x, v, 10.0)
    assert_type(hit.t.clamp_min(0), torch.Tensor)
    assert_type(hit.face, torch.Tensor | None)
    assert_type(hit.normal, torch.Tensor)
    assert_type(box.contains(x, tol=0.1).any(), torch.Tensor)
    xn, vn = np.zeros((2, 2)), v.numpy()
    assert_type(box.contains(xn), np.ndarray)
    assert_type(box.contains([[0.0, 0.0], [2.0, 0.0]]), np.ndarray)
    hit_np = box.hit(xn, vn, np.full(2, 10.0))
    assert_type(hit_np.t, np.ndarray)
    t_np, normal_np = hit_np
    assert_type(normal_np, np.ndarray)
    ball = Ball([0.0, 0.0], 1.0)
    assert_type(ball.contains(xn), np.ndarray)
    assert_type(ball.hit(xn, vn).normal, np.ndarray)
    assert_type(ball.hit(x, v).t.isfinite(), torch.Tensor)
    assert_type(disc.contains([[0.0, 0.0]]), np.ndarray)
    assert_type(disc.hit(x, v, 10.0).t, torch.Tensor)
    assert_type(half.contains(xn), np.ndarray)
    del t_np

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
    check_constructors()


def _grad_log_prob(x: torch.Tensor) -> torch.Tensor:
    return -x


def check_constructors() -> None:
    # each constructor with the non-default kinds of values its parameters accept
    x0 = np.array([0.1, 0.2])
    # numpy answers from g, grad_g and the membership test (g's needs grad_g)
    disc = ConvexSet(lambda z: (z.numpy() ** 2).sum(-1) - 1.0, grad_g=lambda z: 2.0 * z.numpy(),
                     interior_point=[0.0, 0.0], dim=2, n_bisect=40)
    ConvexSet(lambda z: (z ** 2).sum(-1) - 1.0, interior_point=torch.zeros(2))
    ConvexSet(lambda z: (z ** 2).sum(-1) - 1.0, lambda z: 2 * z, dim=2)  # with grad_g
    right = Region(lambda z: z[:, 0].numpy() > -0.9)
    Ellipsoid([0.0, 0.0], np.eye(2))
    Polytope(np.vstack([np.eye(2), -np.eye(2)]), torch.ones(4))
    Box(-1.0, 1.0, dim=2)
    ball = Ball(torch.zeros(2), 1.5)

    hmc = ReflectiveHMC(_log_prob, disc, grad_log_prob=_grad_log_prob, support=ball,
                        step_size=0.3, n_leapfrog=4, mass="diag", target_accept=0.7,
                        max_reflections=50, jitter=0.1, dtype=np.float32,
                        device=torch.device("cpu"), random_state=np.random.default_rng(0),
                        verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_type(hmc.sample(5, x0=x0, n_chains=2, warmup=5), SampleResult)
    ReflectiveHMC(_log_prob, Box([0, 0], [1, 1]), support=right, step_size="auto",
                  n_leapfrog="auto", jitter=False, dtype="float32",
                  random_state=np.random.RandomState(0))
    ReflectiveHMC(_log_prob, ball, dtype=np.dtype("float64"), random_state=np.int64(3))

    StiefelSampler(bingham_log_density(np.eye(3), np.diag([2.0, 1.0])), 3, 2, a=0.5, b=3.0,
                   n_leapfrog="auto", step_size=0.2, target_accept=0.9, jitter=0.5,
                   max_reflections=20, dtype="float64", device=torch.device("cpu"),
                   random_state=np.random.default_rng(0), verbose=0)
    StiefelSampler(lambda Q: Q[:, 0, 0], n=2, k=1, step_size="auto", jitter=True,
                   dtype=torch.float32, random_state=np.random.RandomState(1))
