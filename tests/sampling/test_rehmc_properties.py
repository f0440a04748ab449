"""Properties that must hold for every valid input, on inputs hypothesis generates
(mlpapers.sampling.rehmc).

Containers (boxes, H-polytopes, simplices, products, balls, ellipsoids, convex level
sets) are generated at several scales and positions, with points and velocities drawn
inside them; the relations are exact consequences of the billiard flow and of the
leapfrog map (speed kept by reflections, positions kept in ``K``, reversibility,
the flow property of the exact drift, volume preservation, an energy error that
vanishes with the step), and of the documented sampler contract (draws in the
support, float64 output, seeds). ``PROP_EXAMPLES`` raises the number of examples for
exploration (``HYPOTHESIS_PROFILE=explore PROP_EXAMPLES=500``).
"""

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    ess,
    matrix_von_mises_fisher_log_density,
    polar_factor,
    rhat,
)
from mlpapers.sampling.rehmc._kernels import (
    hmc_transition,
    kinetic_energy,
    log_prob_and_grad,
    reflect_momentum,
    reflected_drift,
    reflective_leapfrog,
)

D = torch.float64
EPS = float(np.finfo(np.float64).eps)
N = int(os.environ.get("PROP_EXAMPLES", 0))


def _ex(default: int) -> int:
    return N or default


KINDS = ("box", "polytope", "simplex", "product", "ball", "ellipsoid", "convexset")


def _make(kind: str, d: int, scale: float, shift: np.ndarray, rng: np.random.Generator):
    """A container of kind ``kind`` in dimension ``d``, of size about ``scale``, placed
    around ``shift``. Returns the container and its size (for tolerances)."""
    if kind == "box":
        lo = shift - scale * rng.uniform(0.1, 1.0, d)
        return Box(lo, lo + scale * rng.uniform(0.05, 2.0, d)), scale
    if kind == "polytope":  # random half-spaces 0.2-1 x scale from shift, plus a box
        m = int(rng.integers(1, 3 * d + 1))
        A = np.vstack([rng.normal(size=(m, d)), np.eye(d), -np.eye(d)])
        A /= np.linalg.norm(A, axis=1, keepdims=True)
        b = scale * np.r_[rng.uniform(0.2, 1.0, m), rng.uniform(0.5, 2.0, 2 * d)]
        return Polytope(A, b + A @ shift), scale
    if kind == "simplex":  # {x >= shift, sum(x - shift) <= scale}
        A = np.vstack([-np.eye(d), np.ones((1, d))])
        return Polytope(A, A @ shift + np.r_[np.zeros(d), scale]), scale
    if kind == "product":  # an interval times a simplex: a product written as one polytope
        if d == 1:
            return Polytope([[1.0], [-1.0]], [shift[0] + scale, scale - shift[0]]), scale
        A = np.zeros((d + 2, d))
        A[0, 0], A[1, 0] = 1.0, -1.0
        A[2:d + 1, 1:] = -np.eye(d - 1)
        A[d + 1, 1:] = 1.0
        b = np.r_[scale, scale, np.zeros(d - 1), scale * rng.uniform(0.5, 2.0)]
        return Polytope(A, b + A @ shift), scale
    if kind == "ball":
        r = scale * rng.uniform(0.2, 2.0)
        return Ball(shift, r), r
    if kind == "ellipsoid":
        Q = rng.normal(size=(d, d))
        E = (Q @ Q.T + 0.3 * np.eye(d)) / scale**2
        return Ellipsoid(shift, E), scale
    # convex level set: an axis-aligned ellipsoid with semi-axes ``a`` (bisection oracle)
    a = torch.as_tensor(scale * rng.uniform(0.3, 2.0, d))
    c = torch.as_tensor(shift)
    return ConvexSet(lambda x: (((x - c.to(x)) / a.to(x)) ** 2).sum(-1) - 1.0,
                     interior_point=shift), scale


@st.composite
def containers(draw, kinds=KINDS, max_d=4):
    """(container, size, numpy Generator, torch Generator) over the documented domain."""
    kind = draw(st.sampled_from(kinds))
    d = draw(st.integers(1, max_d))
    scale = 10.0 ** draw(st.integers(-3, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    shift = draw(st.sampled_from([0.0, 1.0, -1e3])) * rng.uniform(0.5, 1.5, d)
    c, size = _make(kind, d, scale, shift, rng)
    return c, size, rng, torch.Generator().manual_seed(seed)


def _res(c, size):
    """Relative resolution of positions in ``c``: one ulp of the largest coordinate reached
    (a shifted container's centre, or its size) over the container's size."""
    return EPS * (float(np.abs(c.interior_point()).max()) + size) / size


def _inside(c, x, size):
    """``x`` lies in ``K`` up to rounding: pulled towards the interior point by a thousand
    times the relative resolution it is in ``K`` (``contains``'s own ``tol`` is in each
    container's units: the level of ``g``, ``y^T E y``, a distance...)."""
    c0 = torch.as_tensor(c.interior_point()).to(x)
    return c.contains(x + 1e3 * _res(c, size) * (c0 - x))


# A relative change of the start by r moves the end of a drift by up to about AMP * r per
# bounce (measured: at most ~400 over 20 bounces in elongated ellipsoids, whose curved
# walls amplify perturbations; flat walls do not): the tolerance of two computations of
# the same billiard that differ only by rounding.
AMP = 1e4


def _assert_same_billiard(xa, pa, xb, pb, c, size, growth, amp=AMP, curved=False):
    """Two computations of one trajectory agree to rounding. With Gaussian kicks between
    bounces (``curved=True``), a near-grazing hit of a curved wall fixes the hit point only
    to the square root of the resolution (the root of ``b^2 - a c ~ 0``), and the kicks
    carry that error on: measured up to 2e-7 relative after 60 bounces, within
    ``10 * growth * sqrt(resolution)``."""
    res = _res(c, size)
    r = 10 * growth * math.sqrt(res) if curved else amp * growth * res
    assert np.all(np.abs((xa - xb).numpy()) <= r * size)
    pscale = torch.maximum(pa.norm(dim=1, keepdim=True), pb.norm(dim=1, keepdim=True)).numpy()
    assert np.all(np.abs((pa - pb).numpy()) <= r * pscale)


def _curved(c):
    return isinstance(c, Ball | Ellipsoid | ConvexSet)


def _inv_mass(rng, d, kind):
    if kind == "identity":
        return None
    return torch.as_tensor(10.0 ** rng.uniform(-1, 1, d))


# ------------------------------------------------------------ reflections ------
@settings(max_examples=_ex(30), deadline=None)
@given(d=st.integers(1, 6), log_mass=st.floats(-3, 3), seed=st.integers(0, 2**31 - 1),
       pscale=st.floats(-6, 6))
def test_reflection_keeps_kinetic_energy_negates_normal_velocity_and_is_an_involution(
        d, log_mass, seed, pscale):
    rng = np.random.default_rng(seed)
    n = rng.normal(size=(8, d))
    n = torch.as_tensor(n / np.linalg.norm(n, axis=1, keepdims=True))
    p = torch.as_tensor(rng.normal(size=(8, d)) * 10.0**pscale)
    m = torch.as_tensor(10.0 ** (log_mass + rng.uniform(-1, 1, d)))
    for inv_mass in (None, m):
        q = reflect_momentum(p, n, inv_mass)
        k0, k1 = kinetic_energy(p, inv_mass), kinetic_energy(q, inv_mass)
        # a reflection is an isometry of the M^{-1} metric: K exact to rounding
        np.testing.assert_allclose(k1.numpy(), k0.numpy(), rtol=1e-12)
        w = n if inv_mass is None else n * inv_mass
        vn0, vn1 = (w * p).sum(1), (w * q).sum(1)
        scale = (w.norm(dim=1) * p.norm(dim=1)).numpy()
        assert np.all(np.abs((vn1 + vn0).numpy()) <= 1e-12 * scale)
        back = reflect_momentum(q, n, inv_mass)
        assert np.all(np.abs((back - p).numpy()) <= 1e-12 * p.norm(dim=1, keepdim=True).numpy())


@settings(max_examples=_ex(40), deadline=None)
@given(cont=containers(), speed=st.integers(-3, 3))
def test_hit_is_the_first_exit_with_an_outward_unit_normal(cont, speed):
    c, size, rng, gen = cont
    x = c.random_interior(16, gen)
    assert bool(c.contains(x).all())
    v = torch.randn(16, c.dim, generator=gen, dtype=D) * (10.0**speed) * size
    # t_max: the bisection oracle reports inf for an exit beyond it (documented); every
    # container here has a diameter below 10 * size
    t, normal = c.hit(x, v, 10 * size / v.norm(dim=1))
    assert bool((t > 0).all()) and bool(torch.isfinite(t).all())  # bounded containers
    xs = x + t[:, None] * v
    assert bool(_inside(c, xs, size).all())  # the hit point is on K
    # ... and it is the first exit: the whole segment before it lies in K
    for f in (0.25, 0.5, 0.9, 0.999):
        assert bool(_inside(c, x + f * t[:, None] * v, size).all())
    np.testing.assert_allclose(normal.norm(dim=1).numpy(), 1.0, atol=1e-12)
    assert bool(((normal * v).sum(1) > 0).all())  # outward: the ray leaves through it
    # past the hit point, along the ray, the particle is outside K
    beyond = x + (t + 1e-6 * size / v.norm(dim=1))[:, None] * v
    assert not bool(c.contains(beyond).any())


@settings(max_examples=_ex(30), deadline=None)
@given(cont=containers(), k=st.integers(-8, 8))
def test_hit_time_scales_inversely_with_the_speed(cont, k):
    # t(x, a v) = t(x, v) / a: the first exit is a property of the ray, not its speed
    c, size, rng, gen = cont
    x = c.random_interior(8, gen)
    v = torch.randn(8, c.dim, generator=gen, dtype=D)
    a = 2.0**k
    t1 = c.hit(x, v, torch.full((8,), 1e4 * size, dtype=D))[0]
    t2 = c.hit(x, a * v, torch.full((8,), 1e4 * size / a, dtype=D))[0]
    # closed forms are exactly homogeneous in powers of two; bisection to its bracket
    np.testing.assert_allclose((a * t2).numpy(), t1.numpy(), rtol=1e-9)


# ---------------------------------------------------------------- drift ---------
def _state(c, size, rng, gen, n=8, mass="diag"):
    x = c.random_interior(n, gen)
    p = torch.randn(n, c.dim, generator=gen, dtype=D)
    inv_mass = _inv_mass(rng, c.dim, mass)
    if inv_mass is not None:
        p = p / inv_mass.sqrt()
    # speed about one container size per unit time
    return x, p * size, inv_mass


@settings(max_examples=_ex(40), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]),
       tau=st.floats(0.0, 6.0))
def test_billiard_drift_stays_in_k_keeps_the_speed_and_is_reversible(cont, mass, tau):
    c, size, rng, gen = cont
    x0, p0, inv_mass = _state(c, size, rng, gen, mass=mass)
    t = torch.full((len(x0),), tau, dtype=D)
    x1, p1, nref, capped = reflected_drift(x0, p0, t, c, inv_mass, 10**4)
    assert not bool(capped.any())
    assert bool(_inside(c, x1, size).all())
    # every reflection is an isometry of M^{-1}: the kinetic energy is unchanged
    k0, k1 = kinetic_energy(p0, inv_mass), kinetic_energy(p1, inv_mass)
    np.testing.assert_allclose(k1.numpy(), k0.numpy(), rtol=1e-12 * (1 + float(nref.max())))
    # time reversal: flip the momentum and drift again, back to the start
    x2, p2, nref2, _ = reflected_drift(x1, -p1, t, c, inv_mass, 10**4)
    _assert_same_billiard(x2, -p2, x0, p0, c, size, 1 + float(nref.max()))
    if tau == 0.0 and getattr(c, "fold", None) is None:  # a drift for time 0: identity
        assert torch.equal(x1, x0) and torch.equal(p1, p0) and int(nref.sum()) == 0


def test_box_drift_for_negative_time_does_not_move_backwards():
    # found by the drift property above: the closed-form fold of a box drifted backwards
    # for tau < 0, where the reflection loop of the other containers clamps tau to 0.
    # (For tau = 0 the fold moves a chain by the rounding of its round trip through box
    # units: documented in reflected_drift, and kept for the speed of every box drift.)
    box = Box([-1e3 - 0.3, 0.1], [-1e3 + 0.7, 0.2])
    x = torch.tensor([[-1e3 + 0.0123456789, 0.15], [-1e3 - 0.1, 0.1 + 1e-9]], dtype=D)
    p = torch.tensor([[1.0, 1.0], [-2.0, 3.0]], dtype=D)
    still, _, _, _ = reflected_drift(x, p, torch.zeros(2, dtype=D), box, None, 10)
    x1, p1, nref, capped = reflected_drift(x, p, torch.full((2,), -0.5, dtype=D), box,
                                           None, 10)
    assert torch.equal(x1, still) and torch.equal(p1, p)
    assert nref.tolist() == [0, 0] and not bool(capped.any())
    np.testing.assert_allclose(x1.numpy(), x.numpy(), rtol=0, atol=1e-12)


@settings(max_examples=_ex(40), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]),
       t1=st.floats(0.0, 3.0), t2=st.floats(0.0, 3.0))
def test_billiard_drift_is_a_flow(cont, mass, t1, t2):
    # the exact billiard flow composes: drift(t1 + t2) = drift(t2) o drift(t1), with the
    # reflection counts adding up
    c, size, rng, gen = cont
    x0, p0, inv_mass = _state(c, size, rng, gen, mass=mass)
    n = len(x0)
    xa, pa, na, _ = reflected_drift(x0, p0, torch.full((n,), t1, dtype=D), c, inv_mass, 10**4)
    xb, pb, nb, _ = reflected_drift(xa, pa, torch.full((n,), t2, dtype=D), c, inv_mass, 10**4)
    xc, pc, nc, _ = reflected_drift(x0, p0, torch.full((n,), t1 + t2, dtype=D), c, inv_mass,
                                    10**4)
    # a split exactly at a wall may count that hit in either part: compare positions,
    # momenta, and counts to within one
    _assert_same_billiard(xb, pb, xc, pc, c, size, 1 + float(nc.max()))
    assert np.all(np.abs((na + nb - nc).numpy()) <= 1)


@settings(max_examples=_ex(30), deadline=None)
@given(d=st.integers(1, 4), k=st.integers(-3, 3), seed=st.integers(0, 2**31 - 1),
       mass=st.sampled_from(["identity", "diag"]), tau=st.floats(0.0, 5.0))
def test_box_fold_equals_the_same_box_as_a_polytope(d, k, seed, mass, tau):
    # the closed-form fold of a Box and the generic reflection loop on the same set
    # written as {A x <= b} follow the same billiard
    rng = np.random.default_rng(seed)
    scale = 10.0**k
    lo = scale * rng.uniform(-1, 0, d)
    hi = lo + scale * rng.uniform(0.1, 2, d)
    box = Box(lo, hi)
    poly = Polytope(np.vstack([np.eye(d), -np.eye(d)]), np.r_[hi, -lo])
    gen = torch.Generator().manual_seed(seed)
    x0, p0, inv_mass = _state(box, scale, rng, gen, mass=mass)
    t = torch.full((len(x0),), tau, dtype=D)
    xb, pb, nb, _ = reflected_drift(x0, p0, t, box, inv_mass, 10**4)
    xp, pp, np_, _ = reflected_drift(x0, p0, t, poly, inv_mass, 10**4)
    growth = 1 + float(np_.max())
    _assert_same_billiard(xb, pb.abs(), xp, pp.abs(), box, scale, growth)
    assert torch.equal(torch.sign(pb), torch.sign(pp))  # the same walls were hit
    # a box reflection only flips signs (the polytope's formula, (p . M^-1 n) / (n . M^-1 n),
    # rounds: a few ulps per bounce)
    np.testing.assert_allclose(pb.abs().numpy(), pp.abs().numpy(), rtol=8 * EPS * growth)
    assert np.all(np.abs((nb - np_).numpy()) <= 1)  # a corner may count once or twice


@settings(max_examples=_ex(30), deadline=None)
@given(cont=containers(kinds=("polytope", "simplex", "product")),
       mass=st.sampled_from(["identity", "diag"]), tau=st.floats(0.0, 4.0),
       factor=st.floats(1e-3, 1e3))
def test_polytope_billiard_ignores_row_order_duplicates_scaling_and_redundant_rows(
        cont, mass, tau, factor):
    # documented: rows are normalised and duplicate or redundant rows are harmless; the
    # set, hence its billiard, does not depend on how {A x <= b} is written
    c, size, rng, gen = cont
    A, b = c.A, c.b
    m = len(b)
    dup = rng.integers(0, m, size=2)
    far = rng.normal(size=(2, c.dim))
    far /= np.linalg.norm(far, axis=1, keepdims=True)
    b_far = far @ c.interior_point() + 1e3 * size  # far outside the set: never hit
    A2 = np.vstack([A, factor * A[dup], far])
    b2 = np.r_[b, factor * b[dup], b_far]
    order = rng.permutation(len(b2))
    c2 = Polytope(A2[order], b2[order])
    x0, p0, inv_mass = _state(c, size, rng, gen, mass=mass)
    t = torch.full((len(x0),), tau, dtype=D)
    x1, p1, n1, _ = reflected_drift(x0, p0, t, c, inv_mass, 10**4)
    x2, p2, n2, _ = reflected_drift(x0, p0, t, c2, inv_mass, 10**4)
    _assert_same_billiard(x1, p1, x2, p2, c, size, 1 + float(n1.max()))
    assert torch.equal(n1, n2)


@settings(max_examples=_ex(30), deadline=None)
@given(d=st.integers(1, 4), k=st.integers(-3, 3), seed=st.integers(0, 2**31 - 1),
       tau=st.floats(0.0, 4.0))
def test_ball_ellipsoid_and_level_set_oracles_agree_on_a_ball(d, k, seed, tau):
    rng = np.random.default_rng(seed)
    r = 10.0**k * rng.uniform(0.5, 2)
    c0 = 10.0**k * rng.normal(size=d)
    ct = torch.as_tensor(c0)
    shapes = [Ball(c0, r), Ellipsoid(c0, np.eye(d) / r**2),
              ConvexSet(lambda x: ((x - ct.to(x)) ** 2).sum(-1) / r**2 - 1.0,
                        interior_point=c0)]
    gen = torch.Generator().manual_seed(seed)
    x0, p0, inv_mass = _state(shapes[0], r, rng, gen, mass="identity")
    t = torch.full((len(x0),), tau, dtype=D)
    outs = [reflected_drift(x0, p0, t, s, inv_mass, 10**4) for s in shapes]
    ref = outs[0]
    growth = 1 + float(ref[2].max())
    for x, p, nref, _ in outs[1:]:
        # the bisection oracle finds the hit to a few ulps of the bracket, and a ball is
        # the worst case of curved-wall amplification
        _assert_same_billiard(x, p, ref[0], ref[1], shapes[0], r, growth)
        assert torch.equal(nref, ref[2])


# -------------------------------------------------------------- leapfrog -------
def _quadratic(c, size, rng):
    """A Gaussian log density centred in K with precisions about 1 / size^2."""
    mu = torch.as_tensor(c.interior_point())
    prec = torch.as_tensor(rng.uniform(0.2, 5.0, c.dim)) / size**2

    def log_prob(x):
        return -0.5 * (((x - mu.to(x)) ** 2) * prec.to(x)).sum(-1)

    return log_prob


def _leapfrog(c, x, p, step, n, lp, inv_mass):
    logp, grad = log_prob_and_grad(lp, x)
    return reflective_leapfrog(x, p, logp, grad, torch.full((len(x),), step, dtype=D), n,
                               lp, c, inv_mass, 10**4)


@settings(max_examples=_ex(25), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]),
       n_steps=st.integers(1, 8), step=st.floats(0.05, 0.6))
def test_reflected_leapfrog_is_reversible_and_keeps_positions_in_k(cont, mass, n_steps, step):
    c, size, rng, gen = cont
    x0, p0, inv_mass = _state(c, size, rng, gen, mass=mass)
    p0 = p0 / size  # momenta of the Gaussian's scale (velocity ~ size per unit time)
    lp = _quadratic(c, size, rng)
    x1, p1, lp1, _, nref, capped = _leapfrog(c, x0, p0, step * size, n_steps, lp, inv_mass)
    assert not bool(capped.any())
    assert bool(_inside(c, x1, size).all())
    # the returned log density is that of the returned position
    np.testing.assert_allclose(lp1.numpy(), lp(x1).numpy(), rtol=1e-12, atol=1e-12)
    x2, p2, _, _, nref2, _ = _leapfrog(c, x1, -p1, step * size, n_steps, lp, inv_mass)
    # the kicks of a Gaussian with h sqrt(precision) up to 1.3 (near the leapfrog's
    # stability limit 2) amplify rounding tenfold more than the billiard alone
    _assert_same_billiard(x2, -p2, x0, p0, c, size, 1 + float(nref.max()), amp=10 * AMP,
                          curved=_curved(c))
    assert torch.equal(nref, nref2)


@settings(max_examples=_ex(25), deadline=None)
@given(cont=containers(kinds=("box", "polytope", "simplex", "ball", "ellipsoid"), max_d=2),
       mass=st.sampled_from(["identity", "diag"]), step=st.floats(0.1, 1.0))
def test_one_reflected_leapfrog_step_preserves_volume(cont, mass, step):
    # the kicks are shears and the billiard drift is a piecewise isometry (per fixed
    # sequence of faces): the Jacobian determinant of (x, p) -> (x', p') is 1
    c, size, rng, gen = cont
    d = c.dim
    x0, p0, inv_mass = _state(c, size, rng, gen, n=1, mass=mass)
    p0 = p0 / size
    lp = _quadratic(c, size, rng)
    h = step * size
    # central differences with relative steps of 1e-4 and 5e-5 of each coordinate's
    # natural scale, Richardson-extrapolated: the map is piecewise affine for flat walls
    # (no truncation error) and smooth for curved ones, where near-grazing reflections
    # have large second derivatives (the O(step^2) term cancels, O(step^4) remains);
    # positions round to _res relative to the size, which the differences divide by rel
    z0 = torch.cat([x0, p0], 1)
    unit = torch.tensor([size] * d + [1 + float(p0.abs().max())] * d, dtype=D)

    def step_fn(z):
        out = _leapfrog(c, z[:, :d].contiguous(), z[:, d:].contiguous(), h, 1, lp, inv_mass)
        return torch.cat([out[0], out[1]], 1), out[4]

    _, nref0 = step_fn(z0)
    jac = []
    for rel in (1e-4, 5e-5):
        scales = rel * unit
        zs = torch.cat([z0 + torch.diag(scales), z0 - torch.diag(scales)])
        assume(bool(c.contains(zs[:, :d]).all()))  # perturbed starts still in K
        outs, nrefs = step_fn(zs)
        # the same faces were hit in every perturbed trajectory (else the map is not
        # smooth there: a measure-zero set of starts)
        assume(bool((nrefs == nref0[0]).all()))
        # in units of each coordinate's scale (the same determinant)
        jac.append((outs[: 2 * d] - outs[2 * d:]).T / (2 * scales) * unit[None, :]
                   / unit[:, None])
    Js = (4 * jac[1] - jac[0]) / 3
    # entries are O(1) up to the Gaussian's stiffness (precisions up to 5 / size^2)
    err = 1e-6 + 1e3 * _res(c, size) / 5e-5 * float(Js.abs().max()) ** 2
    assert abs(float(torch.linalg.det(Js)) - 1.0) < err


@settings(max_examples=_ex(8), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]))
def test_energy_error_vanishes_as_the_step_shrinks(cont, mass):
    # Over a fixed integration time the reflected leapfrog's energy error is O(h) (O(h^2)
    # without a wall hit), with a constant that oscillates with where each hit falls
    # inside its step: a single coarse step can be lucky (error near zero). So the worst
    # error over four coarse steps T/4..T/7 bounds the error at T/256 (first order
    # predicts a ratio of about 256 / 5.5 = 46; we require 4).
    c, size, rng, gen = cont
    x0, p0, inv_mass = _state(c, size, rng, gen, n=6, mass=mass)
    p0 = p0 / size
    lp = _quadratic(c, size, rng)
    h0 = kinetic_energy(p0, inv_mass) - lp(x0)

    def err(n_steps):
        x1, p1, lp1, _, _, _ = _leapfrog(c, x0, p0, size / n_steps, n_steps, lp, inv_mass)
        return float((kinetic_energy(p1, inv_mass) - lp1 - h0).abs().max())

    coarse = max(err(n) for n in (4, 5, 6, 7))
    # 1e-9: the rounding floor (the energies are O(1) here)
    assert err(256) <= coarse / 4 + 1e-9


@settings(max_examples=_ex(20), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]), n_chains=st.integers(2, 6))
def test_leapfrog_chains_do_not_interact(cont, mass, n_chains):
    # chains run in one batch but each row follows its own trajectory
    c, size, rng, gen = cont
    x0, p0, inv_mass = _state(c, size, rng, gen, n=n_chains, mass=mass)
    p0 = p0 / size
    lp = _quadratic(c, size, rng)
    xb, pb, _, _, nb, _ = _leapfrog(c, x0, p0, 0.3 * size, 4, lp, inv_mass)
    for i in range(n_chains):
        xi, pi, _, _, ni, _ = _leapfrog(c, x0[i:i + 1], p0[i:i + 1], 0.3 * size, 4, lp,
                                        inv_mass)
        # equal up to rounding (the level-set oracle iterates until every row converged)
        _assert_same_billiard(xi, pi, xb[i:i + 1], pb[i:i + 1], c, size, 1 + int(ni[0]),
                              amp=10 * AMP, curved=_curved(c))
        assert int(ni[0]) == int(nb[i])


# --------------------------------------------------------------- sampler --------
def _region_inside(c, size, rng):
    """A support S in K: a ball around the interior point (non-convex supports are tested
    with an annulus-like complement)."""
    ctr = torch.as_tensor(c.interior_point())
    r = 0.3 * c.width() if math.isfinite(c.width()) else 0.3 * size
    if rng.random() < 0.5:
        return Region(lambda x: (x - ctr.to(x)).norm(dim=-1) <= r)
    return Region(lambda x: (x - ctr.to(x)).norm(dim=-1) >= 0.05 * r)  # punctured K


@pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:only .* of the draws fall in the support:RuntimeWarning")
@settings(max_examples=_ex(12), deadline=None)
@given(cont=containers(kinds=KINDS[:-1]), use_support=st.booleans(),
       mass=st.sampled_from(["identity", "diag"]), auto=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_draws_lie_in_the_support_are_float64_and_seeded(cont, use_support, mass, auto, seed):
    # (the level-set oracle is left out: its bisection makes a run ten times slower, and
    # its billiard is checked against the ball's above; 12 draws of 2 chains after 12
    # warm-up iterations are far from converged: the R-hat warning is expected, and so is
    # the documented small-kept-fraction warning for a small ball S in an elongated K)
    c, size, rng, gen = cont
    lp = _quadratic(c, size, rng)
    support = _region_inside(c, size, rng) if use_support else None
    kw = dict(support=support, mass=mass, n_leapfrog="auto" if auto else 3,
              random_state=seed)
    res = ReflectiveHMC(lp, c, **kw).sample(12, n_chains=2, warmup=12)
    s = res.samples
    assert s.dtype == np.float64 and s.shape == (2, 12, c.dim)
    flat = torch.as_tensor(s.reshape(-1, c.dim))
    assert bool(c.contains(flat).all())  # tolerance 0: every kept draw lies in K ...
    if support is not None:
        assert bool(support.contains(flat).all())  # ... and in S
    assert np.all((res.accept_rate >= 0) & (res.accept_rate <= 1))
    assert np.all((res.kept_fraction > 0) & (res.kept_fraction <= 1))
    assert np.all(res.step_size > 0) and np.all(np.isfinite(res.step_size))
    again = ReflectiveHMC(lp, c, **kw).sample(12, n_chains=2, warmup=12)
    np.testing.assert_array_equal(again.samples, s)  # same seed, same chains


@settings(max_examples=_ex(20), deadline=None)
@given(cont=containers(), mass=st.sampled_from(["identity", "diag"]),
       step=st.floats(0.01, 2.0), n_steps=st.integers(1, 6), max_refl=st.integers(1, 50))
def test_metropolis_transition_keeps_or_moves_to_the_proposal_consistently(
        cont, mass, step, n_steps, max_refl):
    c, size, rng, gen = cont
    x0, _, inv_mass = _state(c, size, rng, gen, mass=mass)
    lp = _quadratic(c, size, rng)
    logp, grad = log_prob_and_grad(lp, x0)
    out = hmc_transition(x0, logp, grad, torch.full((len(x0),), step * size, dtype=D),
                         n_steps, lp, c, inv_mass, max_refl, gen)
    acc, prob = out["accepted"], out["accept_prob"]
    assert bool(((prob >= 0) & (prob <= 1)).all())
    assert not bool((acc & out["divergent"]).any())  # a divergent proposal is rejected
    assert bool((prob[out["divergent"]] == 0).all())
    a = acc[:, None]
    assert torch.equal(out["x"], torch.where(a, out["proposal"], x0))
    assert bool(_inside(c, out["x"], size).all())
    # the state's log density and gradient belong to the state
    np.testing.assert_allclose(out["logp"].numpy(), lp(out["x"]).numpy(), rtol=1e-12,
                               atol=1e-12 * float(lp(out["x"]).abs().max()))
    np.testing.assert_allclose(out["grad"].numpy(), log_prob_and_grad(lp, out["x"])[1].numpy(),
                               rtol=1e-12, atol=1e-12 * float(grad.abs().max()))
    assert bool((out["n_reflections"] >= 0).all())


@pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")
@settings(max_examples=_ex(8), deadline=None)
@given(cont=containers(kinds=KINDS[:-1], max_d=3), thin=st.integers(2, 4),
       auto=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_thinning_records_every_thin_th_state_of_the_same_chain(cont, thin, auto, seed):
    # thin only changes which states are recorded (the random stream is consumed per
    # transition): sample(n, thin=k) is every k-th state of sample(n * k)
    c, size, rng, gen = cont
    lp = _quadratic(c, size, rng)
    kw = dict(n_leapfrog="auto" if auto else 3, random_state=seed)
    a = ReflectiveHMC(lp, c, **kw).sample(4, n_chains=2, warmup=10, thin=thin)
    b = ReflectiveHMC(lp, c, **kw).sample(4 * thin, n_chains=2, warmup=10)
    np.testing.assert_array_equal(a.samples, b.samples[:, thin - 1::thin])
    np.testing.assert_array_equal(a.step_size, b.step_size)


# ----------------------------------------------------------- diagnostics -------
@settings(max_examples=_ex(30), deadline=None)
@given(m=st.integers(1, 5), n=st.integers(4, 60), d=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1), log_a=st.floats(-6, 6), b=st.floats(-1e3, 1e3),
       walk=st.booleans())
def test_rhat_and_ess_are_rank_based_and_chain_order_free(m, n, d, seed, log_a, b, walk):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, n, d))
    if walk:
        x = np.cumsum(x, axis=1)
    a = 10.0**log_a
    y = a * x + b
    perm = rng.permutation(m)
    r, e = rhat(x), ess(x)
    # rank normalisation: any increasing affine map leaves both unchanged (exactly,
    # unless the map merges distinct draws by rounding: then ties change the ranks)
    assume(all(np.unique(y[..., j]).size == np.unique(x[..., j]).size for j in range(d)))
    np.testing.assert_allclose(ess(y), e, rtol=1e-10)
    # R-hat's folded draws |x - median| tie exactly at an even count's two middle draws,
    # which rounding in a + b x may untie: an exact map (a power of two) for R-hat and the
    # tail ESS (its quantile indicators x <= q also move with rounding)
    y2 = 2.0 ** round(log_a) * x
    np.testing.assert_allclose(rhat(y2), r, rtol=1e-10)
    np.testing.assert_allclose(ess(y2, "tail"), ess(x, "tail"), rtol=1e-10)
    # chains are exchangeable
    np.testing.assert_allclose(rhat(x[perm]), r, rtol=1e-10)
    np.testing.assert_allclose(ess(x[perm]), e, rtol=1e-10)
    # dimensions are independent: one dimension alone gives its own value
    np.testing.assert_allclose(rhat(x[..., 0]), r[0], rtol=1e-12)
    # the between-chain variance is >= 0: R-hat^2 >= (N - 1) / N, N draws per split chain
    half = n // 2
    assert np.all(r >= math.sqrt((half - 1) / half) - 1e-12)


# --------------------------------------------------------------- Stiefel -------
@settings(max_examples=_ex(30), deadline=None)
@given(n=st.integers(1, 6), data=st.data(), seed=st.integers(0, 2**31 - 1),
       log_c=st.floats(-6, 6))
def test_polar_factor_is_orthonormal_and_equivariant(n, data, seed, log_c):
    k = data.draw(st.integers(1, n))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3, n, k))
    s = np.linalg.svd(X, compute_uv=False)
    assume(s.min() > 1e-3 * s.max())  # full column rank, moderately conditioned
    Q = polar_factor(X)
    assert Q.dtype == np.float64 and Q.shape == (3, n, k)
    np.testing.assert_allclose(np.swapaxes(Q, 1, 2) @ Q, np.broadcast_to(np.eye(k), (3, k, k)),
                               atol=1e-12)
    # Q X^T X^{-1/2}: the polar factor maximises tr(Q^T X), so X^T Q is symmetric PSD
    S = np.swapaxes(X, 1, 2) @ Q
    np.testing.assert_allclose(S, np.swapaxes(S, 1, 2), atol=1e-10 * np.abs(X).max())
    assert np.all(np.linalg.eigvalsh(0.5 * (S + np.swapaxes(S, 1, 2))) > -1e-10)
    # equivariance: polar(c U X V) = U polar(X) V for c > 0 and orthogonal U, V
    U = np.linalg.qr(rng.normal(size=(n, n)))[0]
    V = np.linalg.qr(rng.normal(size=(k, k)))[0]
    c = 10.0**log_c
    np.testing.assert_allclose(polar_factor(c * U @ X @ V), U @ Q @ V, atol=1e-9)
    # a tensor in gives a tensor out, equal to the numpy result
    Qt = polar_factor(torch.as_tensor(X))
    assert isinstance(Qt, torch.Tensor)
    np.testing.assert_allclose(Qt.numpy(), Q, atol=1e-14)


@pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")
@settings(max_examples=_ex(6), deadline=None)
@given(n=st.integers(1, 4), data=st.data(), seed=st.integers(0, 2**31 - 1),
       log_kappa=st.floats(-2, 1.5))
def test_stiefel_draws_are_orthonormal_and_float64(n, data, seed, log_kappa):
    k = data.draw(st.integers(1, min(n, 3)))
    F = 10.0**log_kappa * np.random.default_rng(seed).normal(size=(n, k))
    kw = dict(n=n, k=k, n_leapfrog=3, random_state=seed)
    res = StiefelSampler(matrix_von_mises_fisher_log_density(F), **kw).sample(
        6, n_chains=2, warmup=10)
    Q = res.Q
    assert Q.dtype == np.float64 and Q.shape == (2, 6, n, k)
    np.testing.assert_allclose(np.swapaxes(Q, -1, -2) @ Q,
                               np.broadcast_to(np.eye(k), (2, 6, k, k)), atol=1e-12)
    np.testing.assert_array_equal(res.samples, Q.reshape(2, 6, n * k))


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
