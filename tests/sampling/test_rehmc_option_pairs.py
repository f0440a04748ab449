"""Option interactions of ReflectiveHMC and StiefelSampler: a pairwise covering array.

Every pair of values of every two code-path options appears in at least one
configuration (a greedy covering array, generated deterministically below); each
configuration checks the promises every option makes alone: shapes, finite draws in
the container and the support, a seed's determinism, a pickled sampler's equality,
``thin`` keeping every ``thin``-th state, ``grad_log_prob`` equal to autograd
(bit-exact gradients), and ``sample(n1)`` + ``resume`` equal to one ``sample(n1 + n2)``.
Plus the regressions found by this audit.
"""

import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    bingham_log_density,
    matrix_von_mises_fisher_log_density,
)
from tests._pairwise import covering_array, uncovered_pairs

# short runs: the convergence warnings are expected
pytestmark = [pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:n_leapfrog='auto':UserWarning")]
D = 2
N = 6  # kept draws per chain



def log_prob(x):
    return -0.5 * ((x - 0.3) ** 2).sum(-1)


def grad_log_prob(x):  # bit for bit autograd's gradient of log_prob
    return -(x - 0.3)


def g_disc(x):
    return (x ** 2).sum(-1) - 1.0


def off_centre(x):  # a non-convex support: the unit disc minus a small disc
    return (x ** 2).sum(-1) >= 0.04


CONTAINERS = {
    "box": lambda: Box([-1, -1], [1, 1]),
    "ball": lambda: Ball([0, 0], 1.0),
    "polytope": lambda: Polytope([[1.0, 0], [-1, 0], [0, 1], [0, -1], [1, 1]],
                                 [1.0, 1, 1, 1, 1.5]),
    "ellipsoid": lambda: Ellipsoid([0, 0], np.diag([1.0, 2.0])),
    "convexset": lambda: ConvexSet(g_disc, dim=2),
}
SUPPORTS = {None: lambda: None, "region": lambda: Region(off_centre),
            "ball": lambda: Ball([0.1, 0.1], 0.8)}
OPTIONS = {
    "container": list(CONTAINERS),
    "support": list(SUPPORTS),
    "grad": [False, True],
    "step_size": ["auto", 0.2],
    "n_leapfrog": ["auto", 3],
    "mass": ["identity", "diag"],
    "jitter": [True, False],
    "max_reflections": [None, 1],
    "dtype": [torch.float64, "float32"],
    "n_chains": [None, 1, 3],
    "x0": [None, "point", "rows"],
    "thin": [1, 2],
    "warmup": [0, 12],
}
CONFIGS = covering_array(OPTIONS, seed=1, n_candidates=25)


def build(c):
    return ReflectiveHMC(log_prob, CONTAINERS[c["container"]](),
                         grad_log_prob=grad_log_prob if c["grad"] else None,
                         support=SUPPORTS[c["support"]](), step_size=c["step_size"],
                         n_leapfrog=c["n_leapfrog"], mass=c["mass"], jitter=c["jitter"],
                         max_reflections=c["max_reflections"], dtype=c["dtype"],
                         random_state=3)


def start(c):
    rows = c["n_chains"] or 4
    if c["x0"] == "point":
        return [0.2, 0.25]
    if c["x0"] == "rows":
        return np.tile([0.2, 0.25], (rows, 1)) + 0.01 * np.arange(rows)[:, None]
    return None


def draw(hmc, c, n=N, **kw):
    opts = dict(n_chains=c["n_chains"], warmup=c["warmup"], thin=c["thin"])
    opts.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs: convergence and ChEES warnings
        return hmc.sample(n, start(c), **opts)


def test_covering_array_covers_every_pair():
    assert uncovered_pairs(OPTIONS, CONFIGS) == []


@pytest.mark.parametrize("c", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_option_pairs(c):
    hmc = build(c)
    res = draw(hmc, c)
    chains = c["n_chains"] or 4
    assert isinstance(res.samples, np.ndarray) and res.samples.shape == (chains, N, D)
    assert np.isfinite(res.samples).all()
    flat = torch.as_tensor(res.samples.reshape(-1, D))
    assert bool(CONTAINERS[c["container"]]().contains(flat).all())
    support = SUPPORTS[c["support"]]()
    if support is not None:
        assert bool(support.contains(flat).all())
    for value in (res.sample_stats or {}).values():
        assert value.shape == (chains, N)
    assert hmc.step_size_.shape == (chains,) and hmc.inv_mass_.shape == (D,)
    # the same seed, through a pickled clone of the sampler: the same draws
    again = draw(pickle.loads(pickle.dumps(clone(hmc))), c)
    np.testing.assert_array_equal(again.samples, res.samples)
    # grad_log_prob and autograd give the same gradients, hence the same draws
    other = dict(c, grad=not c["grad"])
    np.testing.assert_array_equal(draw(build(other), other).samples, res.samples)
    # sample(3) then resume (pickled) for 3: the chain of one sample(6)
    first_run = build(c)
    first = draw(first_run, c, n=3)
    more = first_run.sample(N - 3, resume=pickle.loads(pickle.dumps(first)), thin=c["thin"])
    joined = first.concat(more)
    assert joined.samples.shape == res.samples.shape
    if support is None:  # (bit for bit without a support, as documented)
        np.testing.assert_array_equal(joined.samples, res.samples)
        # and concat's diagnostics are the one run's
        for name in ("accept_rate", "n_reflections", "n_divergent", "n_iterations",
                     "kept_fraction", "mean_leapfrog", "step_size", "inv_mass", "last_state"):
            np.testing.assert_allclose(getattr(joined, name), getattr(res, name), rtol=1e-12)
        assert (joined.n_leapfrog, joined.trajectory_length) == (res.n_leapfrog,
                                                                 res.trajectory_length)
        for key, value in res.sample_stats.items():
            np.testing.assert_array_equal(joined.sample_stats[key], value)
        if c["thin"] > 1:  # every thin-th state of the unthinned chain
            full = draw(build(c), c, n=N * c["thin"], thin=1)
            np.testing.assert_array_equal(full.samples[:, c["thin"] - 1::c["thin"]],
                                          res.samples)
    elif c["x0"] is not None:  # (without x0 the start is drawn in S, another stream)
        # container plus thinning: the kept draws are the recorded states (every thin-th)
        # of the chain on K that lie in S, the first N of them
        free = dict(c, support=None)
        states = draw(build(free), free, n=res.n_iterations, thin=1).samples
        for chain in range(chains):
            recorded = states[chain, c["thin"] - 1::c["thin"]]
            inside = support.contains(torch.as_tensor(recorded)).numpy()
            np.testing.assert_array_equal(recorded[inside][:N], res.samples[chain])


STIEFEL_OPTIONS = {
    "density": [None, "vmf", "bingham"],
    "nk": [(3, 1), (3, 3), (4, 2)],
    "n_leapfrog": ["auto", 4],
    "dtype": [torch.float64, "float32"],
    "n_chains": [None, 1],
    "thin": [1, 2],
}
STIEFEL_CONFIGS = covering_array(STIEFEL_OPTIONS, seed=2, n_candidates=25)


def stiefel(c):
    n, k = c["nk"]
    density = None
    if c["density"] == "vmf":
        density = matrix_von_mises_fisher_log_density(np.arange(n * k).reshape(n, k) / (n * k))
    elif c["density"] == "bingham":
        density = bingham_log_density(np.diag(np.arange(n, dtype=float)), np.eye(k))
    return StiefelSampler(density, n, k, n_leapfrog=c["n_leapfrog"], dtype=c["dtype"],
                          random_state=5)


@pytest.mark.parametrize("c", STIEFEL_CONFIGS,
                         ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_stiefel_option_pairs(c):
    n, k = c["nk"]
    sampler = stiefel(c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sampler.sample(5, n_chains=c["n_chains"], warmup=4, thin=c["thin"])
        # pickled with the library's own densities (a closure did not pickle)
        again = pickle.loads(pickle.dumps(clone(sampler))).sample(
            5, n_chains=c["n_chains"], warmup=4, thin=c["thin"])
    chains = c["n_chains"] or 4
    assert res.Q.shape == (chains, 5, n, k) and res.samples.shape == (chains, 5, n * k)
    gram = np.einsum("cdik,cdij->cdkj", res.Q, res.Q)
    atol = 1e-10 if c["dtype"] is torch.float64 else 1e-5
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(k), gram.shape), atol=atol)
    np.testing.assert_array_equal(again.Q, res.Q)


# -- regressions ----------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: matrix_von_mises_fisher_log_density([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]),
    lambda: bingham_log_density(np.diag([3.0, 1.0, 0.0]), np.diag([1.0, 0.5])),
])
def test_library_densities_pickle_with_their_sampler(make):
    """A StiefelSampler holding matrix_von_mises_fisher_log_density or
    bingham_log_density pickled (closures did not): same values, same draws."""
    density = make()
    Q = torch.linalg.qr(torch.randn(5, 3, 2, dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(0)))[0]
    copy = pickle.loads(pickle.dumps(density))
    torch.testing.assert_close(copy(Q), density(Q), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"needs Q of shape \(\.\.\., 3, 2\)"):
        copy(Q[:, :2])  # the shape check survives the round trip
    sampler = StiefelSampler(density, 3, 2, n_leapfrog=3, step_size=0.2, random_state=0)
    res = sampler.sample(3, n_chains=2, warmup=0)
    res2 = pickle.loads(pickle.dumps(sampler)).sample(3, n_chains=2, warmup=0)
    np.testing.assert_array_equal(res2.Q, res.Q)


@pytest.mark.parametrize("rows, n_chains, default", [(1, None, True), (3, None, True),
                                                      (3, 2, False)])
def test_x0_rows_against_n_chains_is_a_clear_error(rows, n_chains, default):
    """x0 of shape (rows, d) with another n_chains (the default 4 when not passed) says
    both numbers, whether n_chains was the default, and the two ways out."""
    hmc = ReflectiveHMC(log_prob, Box([-1, -1], [1, 1]), n_leapfrog=3, random_state=0)
    x0 = np.zeros((rows, D))
    chains = 4 if n_chains is None else n_chains
    msg = (rf"x0 of shape \({rows}, 2\) has {rows} rows? .*n_chains={chains}"
           + (r" \(the default\)" if default else "")
           + rf"; pass n_chains={rows} .* or x0 of shape \(2,\) to start all {chains}")
    with pytest.raises(ValueError, match=msg):
        hmc.sample(5, x0, n_chains=n_chains, warmup=0)
    # each way out works: n_chains=rows, or a (d,) x0 shared by the chains
    assert hmc.sample(5, x0, n_chains=rows, warmup=0).samples.shape == (rows, 5, D)
    assert hmc.sample(5, x0[0], n_chains=n_chains, warmup=0).samples.shape == (chains, 5, D)


def test_stiefel_covering_array_covers_every_pair():
    assert uncovered_pairs(STIEFEL_OPTIONS, STIEFEL_CONFIGS) == []


def test_x0_without_rows_is_a_plain_error():
    # the row-count message used to advise n_chains=0, itself refused
    hmc = ReflectiveHMC(log_prob, Box([-1, -1], [1, 1]), n_leapfrog=3, random_state=0)
    with pytest.raises(ValueError, match=r"x0 of shape \(0, 2\) has no rows") as info:
        hmc.sample(3, np.zeros((0, D)), warmup=0)
    assert "n_chains=0" not in str(info.value)
