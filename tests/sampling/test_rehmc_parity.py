"""Parity between ReHMC code paths that claim to agree.

Each test names the two (or more) paths it compares: the closed-form box fold vs the
masked reflection loop (through ``Box.hit`` or the same box as a ``Polytope``); the
ball, ellipsoid and level-set oracles of one set; resuming vs one long run for every
container type; ``StiefelSampler`` vs ``ReflectiveHMC`` on the polar expansion.
"""

import math

import numpy as np
import pytest
import torch

from mlpapers.sampling.rehmc import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
)
from mlpapers.sampling.rehmc._kernels import reflected_drift
from mlpapers.sampling.rehmc._stiefel import matrix_von_mises_fisher_log_density, polar_factor

D = torch.float64
BIG = 10**6  # no cap


class _LoopBox:
    """A :class:`Box` seen without its closed-form ``fold``: the drift takes the masked
    reflection loop through ``Box.hit``."""

    def __init__(self, box):
        self.box = box

    def __getattr__(self, name):
        if name == "fold":
            raise AttributeError(name)
        return getattr(self.box, name)


def _close(a, b, atol):
    """Two drifts' (x, p) agree to ``atol`` and their reflection counts exactly."""
    np.testing.assert_allclose(a[0].numpy(), b[0].numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(a[1].numpy(), b[1].numpy(), rtol=0, atol=atol)
    np.testing.assert_array_equal(a[2].numpy(), b[2].numpy())
    assert not a[3].any() and not b[3].any()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("d", [1, 2, 5])
@pytest.mark.parametrize("diag", [False, True])
def test_box_fold_equals_box_hit_loop_and_polytope(seed, d, diag):
    """Box.fold (closed form) vs the reflection loop through Box.hit vs Polytope(A, b)
    of the same box: the same billiard drift, with the same reflection counts."""
    g = torch.Generator().manual_seed(seed)
    lo = -torch.rand(d, generator=g, dtype=D) - 0.5
    hi = torch.rand(d, generator=g, dtype=D) + 0.5
    x = lo + (hi - lo) * torch.rand(7, d, generator=g, dtype=D)
    p = 3 * torch.randn(7, d, generator=g, dtype=D)
    tau = 2 * torch.rand(7, generator=g, dtype=D)
    inv_mass = torch.rand(d, generator=g, dtype=D) + 0.5 if diag else None
    box = Box(lo.numpy(), hi.numpy())
    poly = Polytope(np.vstack([np.eye(d), -np.eye(d)]), np.r_[hi.numpy(), -lo.numpy()])
    fold = reflected_drift(x, p, tau, box, inv_mass, BIG)
    assert fold[2].sum() > 0  # the comparison covers reflections
    _close(reflected_drift(x, p, tau, _LoopBox(box), inv_mass, BIG), fold, 1e-11)
    _close(reflected_drift(x, p, tau, poly, inv_mass, BIG), fold, 1e-11)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("diag", [False, True])
def test_ball_ellipsoid_and_level_set_oracles_agree(seed, d, diag):
    """Ball(c, r) vs Ellipsoid(c, I / r^2) vs ConvexSet(|x - c|^2 - r^2) (root finding),
    and a general Ellipsoid(c, E) vs its level set: the same drifts."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(d, generator=g, dtype=D)
    r = 1.3
    u = torch.randn(7, d, generator=g, dtype=D)
    x = c + r * torch.rand(7, 1, generator=g, dtype=D) * u / u.norm(dim=1, keepdim=True)
    p = 3 * torch.randn(7, d, generator=g, dtype=D)
    tau = 3 * torch.rand(7, generator=g, dtype=D)
    inv_mass = torch.rand(d, generator=g, dtype=D) + 0.5 if diag else None
    ball = reflected_drift(x, p, tau, Ball(c.numpy(), r), inv_mass, BIG)
    assert ball[2].sum() > 0
    _close(reflected_drift(x, p, tau, Ellipsoid(c.numpy(), np.eye(d) / r**2), inv_mass, BIG),
           ball, 1e-11)
    level = ConvexSet(lambda y: ((y - c.to(y)) ** 2).sum(-1) - r * r, dim=d)
    _close(reflected_drift(x, p, tau, level, inv_mass, BIG), ball, 1e-9)

    M = torch.randn(d, d, generator=g, dtype=D)
    E = M @ M.T + 0.5 * torch.eye(d, dtype=D)
    L = torch.linalg.cholesky(torch.linalg.inv(E))  # x = c + L z, |z| < 1, is inside
    x = c + (x - c) / r @ L.T
    ell = reflected_drift(x, p, tau, Ellipsoid(c.numpy(), E.numpy()), inv_mass, BIG)
    level = ConvexSet(lambda y: (((y - c.to(y)) @ E.to(y)) * (y - c.to(y))).sum(-1) - 1, dim=d)
    _close(reflected_drift(x, p, tau, level, inv_mass, BIG), ell, 1e-9)


def _target(x):
    return -0.5 * ((x - 0.3) ** 2 / 0.2).sum(-1)


def _containers(d):
    return {
        "box": Box(-np.ones(d), np.ones(d)),
        "polytope": Polytope(np.vstack([np.eye(d), -np.eye(d)]), np.ones(2 * d)),
        "ball": Ball(np.zeros(d), 1.0),
        "ellipsoid": Ellipsoid(np.zeros(d), np.eye(d)),
        "level set": ConvexSet(lambda y: (y**2).sum(-1) - 1, dim=d),
    }


def test_samplers_on_equivalent_containers_give_the_same_draws():
    """ReflectiveHMC.sample with a Box vs the same box as a Polytope, and with a Ball vs
    the same ball as an Ellipsoid or a ConvexSet (from the same x0, a fixed step size and
    the same seed): the same chains, up to the oracles' rounding. (Without ``x0`` the
    random starting points are drawn by each container's own ``random_interior``.)"""
    d = 3
    x0 = np.random.default_rng(0).uniform(-0.5, 0.5, (4, d))
    out = {name: ReflectiveHMC(_target, c, step_size=0.3, n_leapfrog=5, random_state=3)
           .sample(30, n_chains=4, warmup=10, x0=x0) for name, c in _containers(d).items()}
    assert out["box"].n_reflections.sum() > 0 and out["ball"].n_reflections.sum() > 0
    np.testing.assert_allclose(out["polytope"].samples, out["box"].samples, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["ellipsoid"].samples, out["ball"].samples, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["level set"].samples, out["ball"].samples, rtol=0, atol=1e-9)
    for a, b in (("polytope", "box"), ("ellipsoid", "ball"), ("level set", "ball")):
        np.testing.assert_array_equal(out[a].n_reflections, out[b].n_reflections)
        # (mean Metropolis probabilities: rounding-level differences)
        np.testing.assert_allclose(out[a].accept_rate, out[b].accept_rate, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["polytope", "ball", "ellipsoid", "level set"])
def test_resume_equals_one_long_run_for_every_container(name):
    """sample(n1) then sample(n2, resume=...) vs one sample(n1 + n2), bit for bit, with the
    masked reflection loop of each non-box oracle (the resume tests use a Box)."""
    def make():
        return ReflectiveHMC(_target, _containers(2)[name], n_leapfrog=4, random_state=7)

    long = make().sample(25, n_chains=3, warmup=20)
    first = make().sample(10, n_chains=3, warmup=20)
    second = make().sample(15, resume=first)
    assert long.n_reflections.sum() > 0
    np.testing.assert_array_equal(np.concatenate([first.samples, second.samples], 1),
                                  long.samples)
    np.testing.assert_array_equal(second.step_size, long.step_size)


def test_stiefel_sampler_is_reflective_hmc_on_the_polar_expansion():
    """StiefelSampler.sample vs ReflectiveHMC run by hand on X with the potential
    -log g(Q_X) + |X|^2 / 2, the Frobenius ball of radius b sqrt(k) and the
    well-conditioned support: the same X draws (bit for bit), and Q is polar_factor(X).
    The chains start at Gaussian matrices from random_state's numpy stream, or, outside
    the bounds, at their polar factors times sqrt(n)."""
    from mlpapers._utils import make_generators

    n, k, a, b = 4, 2, 0.5, 3.5
    F = np.random.default_rng(1).normal(size=(n, k))
    g = matrix_von_mises_fisher_log_density(F)
    st = StiefelSampler(g, n=n, k=k, a=a, b=b, n_leapfrog=4, random_state=2).sample(
        30, n_chains=3, warmup=30)

    def log_prob(x):
        # (in the sampler's order: autograd sums the three gradient terms of x in the
        # order the graph was built, and the billiard amplifies a last-bit difference)
        X = x.reshape(-1, n, k)
        out = -0.5 * (x * x).sum(-1)
        return out + g(polar_factor(X))

    def well_conditioned(x):
        s = torch.linalg.svdvals(x.reshape(-1, n, k))
        return (s[:, -1] >= a) & (s[:, 0] <= b)

    G = make_generators(2)[1].standard_normal((3, n, k))
    sv = np.linalg.svd(G, compute_uv=False)
    inside = (sv[:, -1] > a) & (sv[:, 0] < b)
    x0 = np.where(inside[:, None, None], G, math.sqrt(n) * polar_factor(G)).reshape(3, n * k)
    assert inside.any() and not inside.all()  # (both kinds of start are exercised)
    ref = ReflectiveHMC(log_prob, Ball(np.zeros(n * k), b * math.sqrt(k)),
                        support=Region(well_conditioned), n_leapfrog=4,
                        random_state=2).sample(30, x0, n_chains=3, warmup=30)
    np.testing.assert_array_equal(st.X.reshape(ref.samples.shape), ref.samples)
    np.testing.assert_array_equal(st.step_size, ref.step_size)
    np.testing.assert_array_equal(st.kept_fraction, ref.kept_fraction)
    np.testing.assert_allclose(st.Q, polar_factor(st.X), rtol=0, atol=1e-14)


@pytest.mark.filterwarnings("ignore:the chains disagree")  # 5 draws per chain
@pytest.mark.parametrize("name", ["box", "polytope", "ball"])
def test_float32_chains_follow_the_float64_chains(name):
    """dtype=torch.float32 vs float64 with one seed, x0 and a fixed step size: the random
    stream is drawn in float64 on the CPU for both, so the first transitions agree to
    float32 rounding (later, the billiard amplifies rounding, as any chaotic flow)."""
    x0 = np.random.default_rng(0).uniform(-0.5, 0.5, (4, 3))
    runs = [ReflectiveHMC(_target, _containers(3)[name], step_size=0.3, n_leapfrog=3,
                          dtype=dtype, random_state=3).sample(5, n_chains=4, warmup=0, x0=x0)
            for dtype in (torch.float64, torch.float32)]
    assert runs[1].samples.dtype == np.float32 and runs[0].n_reflections.sum() > 0
    np.testing.assert_allclose(runs[1].samples, runs[0].samples, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(runs[1].n_reflections, runs[0].n_reflections)
