"""Acceptance tests of issue #6 read literally, where the library used to differ.

Issue: "Supports, batched over chains: ``Box(lo, hi)``, ``Polytope(A, b)``,
``Ball(center, radius)``, ``Ellipsoid(center, E)``, ``ConvexSet(g, grad_g=None)`` (level
set {g <= 0}, root-finding for the hit), each with ``contains``,
``hit(x, v, t_max) -> (t, normal)``".
"""

import numpy as np
import pytest
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexContainer,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
)

D = torch.float64


def _disc_g(x):
    return ((x - 0.25) ** 2).sum(-1) - 1.5**2


SUPPORTS = {
    "box": lambda: Box([-1.0, -2.0, -0.5], [1.0, 2.0, 0.7]),
    "polytope": lambda: Polytope(np.vstack([-np.eye(3), np.ones((1, 3))]),
                                 [0.5, 0.5, 0.5, 1.0]),
    "ball": lambda: Ball([0.25, 0.25, 0.25], 1.5),
    "ellipsoid": lambda: Ellipsoid([0.0, 0.1, 0.0], np.diag([1.0, 4.0, 0.5])),
    # written as the issue writes it: no interior point, no dimension
    "convex_set": lambda: ConvexSet(_disc_g),
}


@pytest.mark.parametrize("t_max", ["number", "tensor"])
@pytest.mark.parametrize("name", sorted(SUPPORTS))
def test_hit_returns_the_pair_t_normal(name, t_max):
    """"each with contains, hit(x, v, t_max) -> (t, normal)": the hit point lies on the
    boundary, the normal is the unit outward one, and one planar reflection keeps |v| and
    negates n.v. (The oracles returned a triple (t, normal, face), so ``t, n = hit(...)``
    raised, ConvexSet needed interior_point, and its hit failed on a number t_max.)"""
    K = SUPPORTS[name]()
    gen = torch.Generator().manual_seed(7)
    x = 0.05 * torch.randn(6, 3, generator=gen, dtype=D)
    v = torch.randn(6, 3, generator=gen, dtype=D)
    assert K.contains(x).shape == (6,) and bool(K.contains(x).all())
    tm = 50.0 if t_max == "number" else torch.full((6,), 50.0, dtype=D)
    t, n = K.hit(x, v, tm)
    assert t.shape == (6,) and n.shape == (6, 3)
    assert bool(K.contains(x + (1 - 1e-9) * t[:, None] * v).all())
    assert not bool(K.contains(x + (1 + 1e-6) * t[:, None] * v).any())
    torch.testing.assert_close(n.norm(dim=-1), torch.ones(6, dtype=D))
    assert bool(((n * v).sum(-1) > 0).all())  # outward: the ray was leaving
    v_ref = v - 2 * (v * n).sum(-1, keepdim=True) * n
    torch.testing.assert_close(v_ref.norm(dim=-1), v.norm(dim=-1))
    torch.testing.assert_close((v_ref * n).sum(-1), -(v * n).sum(-1))


def test_convex_set_normal_is_the_gradient_direction_of_g():
    """ConvexSet: the normal at the hit is grad g / |grad g| (a disc: (y - c) / r), with
    t_max a plain number as for the closed-form oracles (it raised AttributeError)."""
    K = ConvexSet(_disc_g, interior_point=[0.25, 0.25])
    x = torch.tensor([[0.25, 0.25], [0.0, 0.0]], dtype=D)
    v = torch.tensor([[1.0, 0.0], [0.0, -2.0]], dtype=D)
    out = K.hit(x, v, 10.0)
    t, n = out[0], out[1]
    torch.testing.assert_close(t, torch.tensor([1.5, ((1.5**2 - 0.25**2) ** 0.5 - 0.25) / 2],
                                               dtype=D))
    y = x + t[:, None] * v
    torch.testing.assert_close(n, (y - 0.25) / 1.5)


def test_convex_set_without_interior_point_samples_from_x0():
    """ConvexSet(g) as in the issue samples once x0 is given; the draws stay in the set,
    and its dimension and interior point are fixed from x0 (their mean is inside), on a
    copy: the user's set stays unbound."""
    K = ConvexSet(_disc_g)
    x0 = np.array([[0.0, 0.0], [1.0, 0.5], [0.2, -0.9]])
    hmc = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), K, n_leapfrog=3, random_state=0)
    res = hmc.sample(30, x0=x0, n_chains=3, warmup=20)
    assert res.samples.shape == (3, 30, 2)
    assert (np.linalg.norm(res.samples - 0.25, axis=-1) <= 1.5).all()
    assert K.dim is None
    # the same draws as with the interior point given up front
    K2 = ConvexSet(_disc_g, interior_point=x0.mean(0))
    res2 = ReflectiveHMC(hmc.log_prob, K2, n_leapfrog=3, random_state=0).sample(
        30, x0=x0, n_chains=3, warmup=20)
    np.testing.assert_array_equal(res.samples, res2.samples)


def test_convex_set_without_any_point_asks_for_one():
    """Without x0 there is nothing to start from: a clear ValueError naming the ways out."""
    with pytest.raises(ValueError, match=r"x0.*dim=.*interior_point="):
        ReflectiveHMC(lambda x: -(x**2).sum(-1), ConvexSet(_disc_g)).sample(5, warmup=2)
    with pytest.raises(ValueError, match="interior_point"):
        ConvexSet(_disc_g).interior_point()
    # a bad x0 is named, also when it must fix the set's dimension
    hmc = ReflectiveHMC(lambda x: -(x**2).sum(-1), ConvexSet(_disc_g))
    for x0 in (np.array([[np.nan, 0.0]] * 4), np.zeros((4, 2, 1)), np.zeros((0, 2))):
        with pytest.raises(ValueError, match="x0 must be a finite"):
            hmc.sample(5, x0=x0, warmup=2)


def test_convex_set_dim_finds_an_interior_point_away_from_the_origin():
    """ConvexSet(g, dim=d): the origin lies outside this disc, so the interior point is
    found by descent on g; a set with no interior (min g > 0) is refused."""
    K = ConvexSet(lambda x: ((x - 5.0) ** 2).sum(-1) - 1.0, dim=3)
    c = torch.as_tensor(K.interior_point())
    assert c.shape == (3,) and float(((c - 5.0) ** 2).sum()) < 1.0
    with pytest.raises(ValueError, match="no point with g < 0"):
        ConvexSet(lambda x: (x**2).sum(-1) + 1.0, dim=2)
    with pytest.raises(ValueError, match="dim=2"):
        ConvexSet(_disc_g, interior_point=[0.0, 0.0, 0.0], dim=2)


class _PairBall(ConvexContainer):
    """A user's container whose hit returns the pair (t, normal) of the issue."""

    def __init__(self):
        self._ball, self.dim = Ball([0.0, 0.0], 1.0), 2

    def contains(self, x, tol=0.0):
        return self._ball.contains(x, tol)

    def hit(self, x, v, t_max=None, exclude=None):
        t, n = self._ball.hit(x, v, t_max)
        return t, n

    def interior_point(self):
        return np.zeros(2)

    def width(self):
        return 2.0


def test_a_user_container_returning_the_pair_samples_like_the_built_in():
    """A container written to the issue's hit -> (t, normal) works (no face to exclude: a
    ball needs none) and gives the built-in Ball's draws bit for bit."""
    def run(K):
        return ReflectiveHMC(lambda x: -2.0 * ((x - 0.6) ** 2).sum(-1), K, n_leapfrog=4,
                             random_state=3).sample(25, n_chains=2, warmup=15).samples
    np.testing.assert_array_equal(run(_PairBall()), run(Ball([0.0, 0.0], 1.0)))


@pytest.mark.parametrize("name", sorted(SUPPORTS))
def test_oracles_take_numpy_points_and_answer_in_numpy(name):
    """"Every kept sample lies in S exactly", checked as a user would, with the support's
    own ``contains`` on ``result.samples`` (numpy): the oracles raised a torch TypeError
    on numpy points. Numpy in gives numpy out, equal to the tensor answer."""
    K = SUPPORTS[name]()
    gen = np.random.default_rng(3)
    pts = 0.05 * gen.standard_normal((5, 3))
    far = pts + 10.0
    got = K.contains(np.vstack([pts, far]))
    assert isinstance(got, np.ndarray) and got.dtype == bool
    np.testing.assert_array_equal(got, [True] * 5 + [False] * 5)
    np.testing.assert_array_equal(K.contains(pts.tolist()), [True] * 5)
    v = gen.standard_normal((5, 3))
    t, n = K.hit(pts, v, 50.0)
    t_ref, n_ref = K.hit(torch.as_tensor(pts), torch.as_tensor(v), 50.0)
    assert isinstance(t, np.ndarray) and isinstance(n, np.ndarray)
    np.testing.assert_array_equal(t, t_ref.numpy())
    np.testing.assert_array_equal(n, n_ref.numpy())


def test_kept_draws_pass_the_supports_own_membership_test():
    """Draws of a thinned run lie in S and in K by their own contains (numpy draws)."""
    S = Region(lambda x: x.norm(dim=-1) >= 1.0)
    K = Ball([0.0, 0.0], 2.0)
    res = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), K, support=S, n_leapfrog=3,
                        random_state=1).sample(40, n_chains=2, warmup=20)
    flat = res.samples.reshape(-1, 2)
    assert S.contains(flat).all() and K.contains(flat).all()


def test_convex_set_binding_is_per_call_and_leaves_the_users_set_unbound():
    """``ConvexSet(g)`` gets its dimension from each call's x0 on a copy: a failed call
    (here in log_prob) leaves nothing behind, the same set then samples in another
    dimension, and a call's draws do not depend on an earlier call's x0."""
    def lp(x):
        if x.shape[-1] == 3:
            raise RuntimeError("this model is 2-d")
        return -(x**2).sum(-1)

    K = ConvexSet(_disc_g)
    hmc = ReflectiveHMC(lp, K, n_leapfrog=3, random_state=1)
    with pytest.raises(RuntimeError, match="2-d"):
        hmc.sample(5, x0=np.full((2, 3), 0.1), n_chains=2, warmup=2)
    assert K.dim is None
    x0 = np.array([[0.1, 0.2], [-0.3, 0.1]])
    got = hmc.sample(8, x0=x0, n_chains=2, warmup=4).samples
    assert K.dim is None
    fresh = ReflectiveHMC(lp, ConvexSet(_disc_g), n_leapfrog=3, random_state=1)
    hmc.sample(8, x0=np.array([[0.0, 0.9], [0.1, 0.85]]), n_chains=2, warmup=4)
    again = hmc.sample(8, x0=x0, n_chains=2, warmup=4).samples
    np.testing.assert_array_equal(got, fresh.sample(8, x0=x0, n_chains=2, warmup=4).samples)
    np.testing.assert_array_equal(got, again)


class _NaiveBox(ConvexContainer):
    """A user's box whose pair-returning hit keeps every t >= 0, with no direction
    filter: from a face, moving inwards, it reports that face again at t = 0."""

    def __init__(self):
        self.dim = 2

    def contains(self, x, tol=0.0):
        return (x.abs() <= 1.0 + tol).all(-1)

    def hit(self, x, v, t_max=None, exclude=None):
        T = torch.cat([(-1.0 - x) / v, (1.0 - x) / v], 1)
        T = torch.where(T >= 0, T, torch.full_like(T, float("inf")))
        t, j = T.min(1)
        normal = torch.zeros_like(x)
        normal[torch.arange(len(x)), j % 2] = torch.where(j >= 2, 1.0, -1.0).to(x.dtype)
        return t, normal

    def interior_point(self):
        return np.zeros(2)

    def width(self):
        return 2.0


def test_a_pair_returning_hit_that_re_reports_its_face_is_refused():
    """With no face index the sampler cannot exclude the face just hit; a container that
    reports it again at t ~ 0 bounced in place to the reflection cap (divergent
    trajectories, only an R-hat warning). It is refused before any work."""
    with pytest.raises(ValueError, match=r"hit returns \(t, normal\) without the face"):
        ReflectiveHMC(lambda x: -(x**2).sum(-1), _NaiveBox(), random_state=0).sample(
            4, n_chains=2, warmup=2)


def test_oracles_take_mixed_numpy_and_tensor_arguments():
    """Tensor points with numpy velocities follow the points (tensor out); numpy points
    with tensor velocities answer in numpy; both equal the all-tensor answer."""
    K = Polytope(np.vstack([np.eye(2), -np.eye(2)]), np.ones(4))
    x = np.array([[0.0, 0.0], [0.5, -0.2]])
    v = np.array([[1.0, 0.5], [-0.3, -1.0]])
    ref_t, ref_n = K.hit(torch.from_numpy(x), torch.from_numpy(v), 10.0)
    t1, n1 = K.hit(torch.from_numpy(x), v, 10.0)
    t2, n2 = K.hit(x, torch.from_numpy(v).float(), 10.0)
    assert isinstance(t1, torch.Tensor) and isinstance(t2, np.ndarray)
    np.testing.assert_allclose(t1.numpy(), ref_t.numpy())
    np.testing.assert_allclose(t2, ref_t.numpy(), rtol=1e-6)
    np.testing.assert_allclose(n2, ref_n.numpy(), rtol=1e-6)


class _L1Ball(ConvexContainer):
    """The 2-d L1 ball, a pair-returning hit that ignores the faces a ray moves away
    from (as the user guide advises); a ray along e1 ends exactly on a vertex."""

    def __init__(self):
        self.dim = 2
        self._A = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]],
                               dtype=torch.float64) / 2**0.5
        self._b = torch.full((4,), 2**-0.5, dtype=torch.float64)

    def contains(self, x, tol=0.0):
        return (x @ self._A.T.to(x.dtype) <= self._b.to(x.dtype) + tol).all(-1)

    def hit(self, x, v, t_max, exclude):
        A, b = self._A.to(x.dtype), self._b.to(x.dtype)
        rate = v @ A.T
        T = torch.where(rate > 0, (b - x @ A.T).clamp_min(0.0) / rate, float("inf"))
        t, j = T.min(1)
        return t, A[j]

    def interior_point(self):
        return np.zeros(2)

    def width(self):
        return 2**0.5


def test_a_valid_pair_returning_container_is_not_refused_at_a_vertex():
    """The probe of pair-returning hits refuses only a re-hit of the same face: at a
    vertex the next face is met at t = 0 with another normal, which is valid (and a hit
    that requires ``exclude`` gets it)."""
    res = ReflectiveHMC(lambda x: torch.zeros(len(x), dtype=x.dtype), _L1Ball(),
                        random_state=0).sample(40, n_chains=2, warmup=20)
    assert (np.abs(res.samples).sum(-1) <= 1.0 + 1e-9).all()


def test_polar_factor_needs_k_at_most_n():
    from mlpapers.sampling.rehmc import polar_factor
    with pytest.raises(ValueError, match="k <= n"):
        polar_factor(np.ones((2, 3)))
    with pytest.raises(ValueError, match="k <= n"):
        polar_factor(torch.ones(4, 2, 3, dtype=torch.float64))
