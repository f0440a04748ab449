"""Reflected leapfrog: reflection identities, reversibility, volume and energy behaviour."""

import numpy as np
import pytest
import torch

from mlpapers.sampling import Ball, Box, ConvexSet, Ellipsoid, Polytope
from mlpapers.sampling.rehmc._kernels import (
    hmc_transition,
    kinetic_energy,
    log_prob_and_grad,
    reflect_momentum,
    reflected_drift,
    reflective_leapfrog,
)

D = torch.float64


def gauss(x):
    return -0.5 * ((x - 0.3) ** 2 * torch.arange(1, x.shape[1] + 1, dtype=x.dtype)).sum(-1)


def const(x):
    return torch.zeros(x.shape[0], dtype=x.dtype)


def _supports(d):
    rng = np.random.default_rng(3)
    Q = rng.normal(size=(d, d))
    return {
        "box": Box(-np.ones(d), np.ones(d)),
        "corner_box": Box(np.zeros(d), np.full(d, 0.05)),
        "polytope": Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0]),
        "ball": Ball(np.zeros(d), 1.0),
        "ellipsoid": Ellipsoid(np.zeros(d), Q @ Q.T + np.eye(d)),
        "convexset": ConvexSet(lambda x: (x**4).sum(-1) - 1.0, interior_point=np.full(d, 0.1)),
    }


def _run(c, x, p, step, n, lp=gauss, inv_mass=None):
    inv_mass = torch.ones(x.shape[1], dtype=D) if inv_mass is None else inv_mass
    logp, grad = log_prob_and_grad(lp, x)
    return reflective_leapfrog(x, p, logp, grad, torch.full((len(x),), step, dtype=D), n,
                               lp, c, inv_mass, 10**5)


@pytest.mark.parametrize("name", ["box", "corner_box", "polytope", "ball", "ellipsoid",
                                  "convexset"])
def test_reversibility(name):
    d = 3
    c = _supports(d)[name]
    g = torch.Generator().manual_seed(0)
    x0 = c.random_interior(16, g)
    p0 = torch.randn(16, d, generator=g, dtype=D) * 2
    inv_mass = torch.rand(d, generator=g, dtype=D) + 0.5
    x1, p1, _, _, nref, capped = _run(c, x0, p0, 0.2, 10, inv_mass=inv_mass)
    assert int(nref.sum()) > 16 and not bool(capped.any())  # reflections did happen
    assert bool(c.contains(x1, tol=1e-12).all())
    x2, p2, _, _, nref2, _ = _run(c, x1, -p1, 0.2, 10, inv_mass=inv_mass)
    np.testing.assert_allclose(x2.numpy(), x0.numpy(), atol=1e-10)
    np.testing.assert_allclose(-p2.numpy(), p0.numpy(), atol=1e-10)
    np.testing.assert_array_equal(nref.numpy(), nref2.numpy())


@pytest.mark.parametrize("name", ["box", "polytope", "ball", "ellipsoid", "convexset"])
def test_energy_exactly_conserved_for_constant_density(name):
    d = 4
    c = _supports(d)[name]
    g = torch.Generator().manual_seed(1)
    x0 = c.random_interior(8, g)
    p0 = torch.randn(8, d, generator=g, dtype=D)
    inv_mass = torch.rand(d, generator=g, dtype=D) + 0.5
    x1, p1, _, _, nref, _ = _run(c, x0, p0, 0.5, 20, lp=const, inv_mass=inv_mass)
    assert int(nref.min()) >= 1
    np.testing.assert_allclose(kinetic_energy(p1, inv_mass).numpy(),
                               kinetic_energy(p0, inv_mass).numpy(), rtol=1e-12)
    # every intermediate position stays in K: check per step
    x, p = x0, p0
    for _ in range(20):
        x, p, _, _, _, _ = _run(c, x, p, 0.5, 1, lp=const, inv_mass=inv_mass)
        assert bool(c.contains(x, tol=1e-12).all())


def test_single_planar_hit_reflection_identities():
    g = torch.Generator().manual_seed(2)
    n = torch.randn(32, 5, generator=g, dtype=D)
    n = n / n.norm(dim=1, keepdim=True)
    p = torch.randn(32, 5, generator=g, dtype=D)
    m_inv = torch.rand(5, generator=g, dtype=D) + 0.1
    q = reflect_momentum(p, n, m_inv)
    np.testing.assert_allclose(kinetic_energy(q, m_inv).numpy(),
                               kinetic_energy(p, m_inv).numpy(), rtol=1e-13)
    np.testing.assert_allclose((n * m_inv * q).sum(1).numpy(), -(n * m_inv * p).sum(1).numpy(),
                               atol=1e-13)
    q1 = reflect_momentum(p, n, torch.ones(5, dtype=D))  # identity mass: v' = v - 2 (v.n) n
    np.testing.assert_allclose(q1.norm(dim=1).numpy(), p.norm(dim=1).numpy(), rtol=1e-13)
    np.testing.assert_allclose(reflect_momentum(q, n, m_inv).numpy(), p.numpy(), atol=1e-13)
    # a drift through one plane: x' is the mirror image of the free flight
    P = Polytope([[1.0, 0.0]], [1.0])
    x, p2, nr, _ = reflected_drift(torch.tensor([[0.0, 0.0]], dtype=D),
                                   torch.tensor([[2.0, 1.0]], dtype=D),
                                   torch.tensor([1.0], dtype=D), P, torch.ones(2, dtype=D), 10)
    np.testing.assert_allclose(x.numpy(), [[0.0, 1.0]], atol=1e-15)
    assert p2.tolist() == [[-2.0, 1.0]] and int(nr[0]) == 1


@pytest.mark.parametrize("name", ["polytope", "ball", "box"])
def test_one_step_jacobian_determinant_is_one(name):
    d = 2
    c = {"polytope": Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[0.0, 0.0, 1.0]),
         "ball": Ball(np.zeros(d), 1.0), "box": Box(-np.ones(d), np.ones(d))}[name]
    x0 = torch.tensor([0.3, 0.2], dtype=D)
    p0 = torch.tensor([1.7, 0.9], dtype=D)

    def step(z):
        x, p = z[:, :d].contiguous(), z[:, d:].contiguous()
        x1, p1, _, _, nref, _ = _run(c, x, p, 0.6, 1)
        return torch.cat([x1, p1], 1), nref

    z0 = torch.cat([x0, p0])[None]
    out, nref = step(z0)
    assert int(nref[0]) >= 1
    h = 1e-6
    eye = torch.eye(2 * d, dtype=D)
    zs = torch.cat([z0 + h * eye, z0 - h * eye])
    outs, nrefs = step(zs)
    assert bool((nrefs == nref[0]).all())  # same reflection sequence nearby
    J = (outs[: 2 * d] - outs[2 * d:]).T / (2 * h)
    assert abs(float(torch.linalg.det(J)) - 1.0) < 1e-6


def _energy_errors(lp, hs):
    c = Box(-np.ones(3), np.ones(3))
    g = torch.Generator().manual_seed(4)
    x0 = c.random_interior(32, g)
    p0 = torch.randn(32, 3, generator=g, dtype=D)
    lp0, _ = log_prob_and_grad(lp, x0)
    one = torch.ones(3, dtype=D)
    errs = []
    for h in hs:
        x1, p1, lp1, _, nref, _ = _run(c, x0, p0, h, int(round(0.4 / h)), lp=lp)
        assert int(nref.sum()) > 5
        dh = (-lp1 + kinetic_energy(p1, one)) - (-lp0 + kinetic_energy(p0, one))
        errs.append(float(dh.abs().max()))
    return np.array(errs)


def test_energy_error_order_with_reflections():
    hs = (0.04, 0.02, 0.01, 0.005, 0.0025)
    # grad f . n = 0 on the walls: the reflected leapfrog keeps second order
    e = _energy_errors(lambda x: torch.cos(np.pi * x).sum(-1), hs)
    np.testing.assert_allclose(e[:-1] / e[1:], 4.0, rtol=0.05)
    # grad f . n != 0 on the walls: the error still vanishes, but only at first order
    e = _energy_errors(gauss, hs)
    slope = np.polyfit(np.log(hs), np.log(e), 1)[0]
    assert 0.8 < slope < 2.2 and e[-1] < e[0] / 10


def test_vectorised_chains_agree_with_one_chain_loop():
    d = 3
    for c in (_supports(d)["polytope"], _supports(d)["ball"]):
        g = torch.Generator().manual_seed(5)
        x0 = c.random_interior(6, g)
        p0 = torch.randn(6, d, generator=g, dtype=D) * 3
        xb, pb, _, _, nb, _ = _run(c, x0, p0, 0.3, 7)
        for i in range(6):
            xi, pi, _, _, ni, _ = _run(c, x0[i:i + 1], p0[i:i + 1], 0.3, 7)
            np.testing.assert_allclose(xi.numpy(), xb[i:i + 1].numpy(), atol=1e-14)
            np.testing.assert_allclose(pi.numpy(), pb[i:i + 1].numpy(), atol=1e-14)
            assert int(ni[0]) == int(nb[i])


def test_capped_trajectory_is_rejected_and_divergent():
    c = Polytope(np.vstack([-np.eye(2), np.ones((1, 2))]), np.r_[0.0, 0.0, 1.0])
    g = torch.Generator().manual_seed(6)
    x0 = c.random_interior(16, g)
    lp, gr = log_prob_and_grad(const, x0)
    out = hmc_transition(x0, lp, gr, torch.full((16,), 50.0, dtype=D), 3, const, c,
                         torch.ones(2, dtype=D), 4, g)
    assert bool(out["divergent"].all())
    assert not bool(out["accepted"].any())
    assert torch.equal(out["x"], x0)
    box = Box([0, 0], [1, 1])  # the closed-form fold is capped the same way
    out = hmc_transition(x0, lp, gr, torch.full((16,), 50.0, dtype=D), 1, const, box,
                         torch.ones(2, dtype=D), 4, g)
    assert bool(out["divergent"].all()) and torch.equal(out["x"], x0)


def test_log_prob_shape_is_checked():
    with pytest.raises(ValueError, match="shape"):
        log_prob_and_grad(lambda x: x.sum(), torch.zeros(3, 2, dtype=D))
