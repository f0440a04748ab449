"""Per-draw sampler statistics: ``SampleResult.sample_stats`` and arviz's ``sample_stats``."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.sampling import Box, ReflectiveHMC, Region, SampleResult, StiefelSampler
from mlpapers.sampling.rehmc._kernels import (
    hmc_transition,
    kinetic_energy,
    log_prob_and_grad,
    reflective_leapfrog,
)

pytestmark = pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")  # short runs
D = torch.float64
LO, HI = np.array([0.0, -1.0]), np.array([1.0, 2.0])
NAMES = ("diverging", "energy", "acceptance_rate", "lp", "n_steps", "reflections")


def gauss(x):
    return -2.0 * ((x - torch.tensor([0.8, 0.5], dtype=x.dtype)) ** 2).sum(-1)


def sampler(**kw):
    kw = {"n_leapfrog": 4, "random_state": 0, **kw}
    return ReflectiveHMC(gauss, Box(LO, HI), **kw)


@pytest.fixture(scope="module")
def divergent_run():
    # a large step and at most 2 reflections per step: many capped (divergent) transitions
    return sampler(step_size=1.5, max_reflections=2, jitter=False).sample(
        150, n_chains=3, warmup=0)


def test_stats_are_aligned_with_the_draws(divergent_run):
    res = divergent_run
    s = res.sample_stats
    assert set(s) == set(NAMES)
    for k in NAMES:
        assert s[k].shape == (3, 150), k
    assert s["diverging"].dtype == bool
    assert s["n_steps"].dtype.kind == "i" and s["reflections"].dtype.kind == "i"
    # thin=1, no support: one transition per draw; n_divergent counts the sampling phase
    assert 0 < s["diverging"].sum() < s["diverging"].size
    np.testing.assert_array_equal(s["diverging"].sum(1), res.n_divergent)
    np.testing.assert_allclose(s["acceptance_rate"].mean(1), res.accept_rate, rtol=1e-12)
    np.testing.assert_array_equal(s["reflections"].sum(1), res.n_reflections)
    np.testing.assert_array_equal(s["n_steps"], 4)
    assert (s["acceptance_rate"][s["diverging"]] == 0).all()
    # lp is the log density of the draw, energy = -lp + K(p) with K >= 0
    np.testing.assert_array_equal(s["lp"], gauss(torch.from_numpy(res.samples)).numpy())
    assert (s["energy"] >= -s["lp"]).all() and np.isfinite(s["energy"]).all()


@pytest.mark.parametrize("mass", ["identity", "diag"])
def test_transition_energy_is_the_hamiltonian_of_the_kept_state(mass):
    C = 64
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(C, 2, generator=gen, dtype=D) * torch.tensor(HI - LO) + torch.tensor(LO)
    logp, grad = log_prob_and_grad(gauss, x)
    inv_mass = None if mass == "identity" else torch.tensor([0.5, 2.0], dtype=D)
    step = torch.full((C,), 0.6, dtype=D)
    box = Box(LO, HI)
    state = gen.get_state()
    out = hmc_transition(x, logp, grad, step, 3, gauss, box, inv_mass, 50, gen)
    gen.set_state(state)  # redo it by hand from the same momenta
    z = torch.randn(C, 2, generator=gen, dtype=D)
    p0 = z if inv_mass is None else z / inv_mass.sqrt()
    x1, p1, lp1, _, _, _ = reflective_leapfrog(x, p0, logp, grad, step, 3, gauss, box,
                                               inv_mass, 50)
    h0 = kinetic_energy(p0, inv_mass) - logp
    h1 = kinetic_energy(p1, inv_mass) - lp1
    acc = out["accepted"]
    assert 0 < int(acc.sum()) < C  # both branches are checked
    torch.testing.assert_close(out["energy"], torch.where(acc, h1, h0), rtol=0, atol=0)
    torch.testing.assert_close(out["energy"][~acc], kinetic_energy(p0, inv_mass)[~acc]
                               - out["logp"][~acc], rtol=0, atol=0)


def test_thinning_keeps_every_divergence_and_sums_the_skipped_transitions():
    res = sampler(step_size=1.5, max_reflections=2, jitter=False).sample(
        60, n_chains=3, warmup=0, thin=3)
    s = res.sample_stats
    # a draw is "diverging" if any of its 3 transitions diverged
    assert 0 < s["diverging"].sum() <= res.n_divergent.sum()
    assert (s["diverging"].sum(1) >= np.ceil(res.n_divergent / 3)).all()
    np.testing.assert_array_equal(s["n_steps"], 12)
    np.testing.assert_array_equal(s["reflections"].sum(1), res.n_reflections)
    np.testing.assert_allclose(s["acceptance_rate"].mean(1), res.accept_rate, rtol=1e-12)
    np.testing.assert_array_equal(s["lp"], gauss(torch.from_numpy(res.samples)).numpy())
    # thin=3 diverges on the same chain as thin=1 does: the divergences are not dropped
    one = sampler(step_size=1.5, max_reflections=2, jitter=False).sample(
        180, n_chains=3, warmup=0)
    np.testing.assert_array_equal(one.samples[:, 2::3], res.samples)
    div3 = one.sample_stats["diverging"].reshape(3, 60, 3).any(-1)
    np.testing.assert_array_equal(div3, s["diverging"])


def test_support_stats_follow_the_kept_draws():
    support = Region(lambda x: x[:, 0] < 0.6)
    res = sampler(support=support).sample(40, n_chains=3, warmup=30, thin=2)
    s = res.sample_stats
    assert all(s[k].shape == (3, 40) for k in NAMES)
    np.testing.assert_array_equal(s["lp"], gauss(torch.from_numpy(res.samples)).numpy())
    assert (s["n_steps"] % 8 == 0).all() and (s["n_steps"] >= 8).all()
    # the states skipped (outside S) before a kept draw count: more steps than draws * 8
    assert (s["n_steps"].sum(1) <= res.n_iterations * 4).all()
    assert s["n_steps"].sum() > 3 * 40 * 8
    assert (s["reflections"].sum(1) <= res.n_reflections).all()
    assert s["diverging"].sum() <= res.n_divergent.sum()


def test_concat_and_resume_keep_the_stats_aligned():
    long = sampler().sample(50, n_chains=2, warmup=30)
    first = sampler().sample(20, n_chains=2, warmup=30)
    second = sampler().sample(30, resume=pickle.loads(pickle.dumps(first)))
    both = first.concat(second)
    np.testing.assert_array_equal(both.samples, long.samples)
    for k in NAMES:
        np.testing.assert_array_equal(both.sample_stats[k], long.sample_stats[k], err_msg=k)
    # a part without statistics (an older result): the join has none, and still converts
    old = SampleResult(**{**{f: getattr(first, f) for f in SampleResult.__dataclass_fields__},
                          "sample_stats": None})
    assert old.concat(second).sample_stats is None


def test_pickle_round_trip_and_old_results(divergent_run):
    back = pickle.loads(pickle.dumps(divergent_run))
    for k in NAMES:
        np.testing.assert_array_equal(back.sample_stats[k], divergent_run.sample_stats[k])
    # a result pickled before the field existed has no instance attribute: reads None
    old = pickle.loads(pickle.dumps(divergent_run))
    del old.__dict__["sample_stats"]
    assert old.sample_stats is None
    assert old.concat(sampler(step_size=1.5, max_reflections=2, jitter=False).sample(
        5, resume=old)).sample_stats is None


def test_inference_data_has_arviz_stats(divergent_run):
    az = pytest.importorskip("arviz")
    idata = divergent_run.to_inference_data()
    st = idata.sample_stats
    for k in (*NAMES, "step_size"):
        assert st[k].dims == ("chain", "draw") and st[k].shape == (3, 150), k
        if k != "step_size":
            np.testing.assert_array_equal(st[k].values, divergent_run.sample_stats[k])
    assert st["diverging"].dtype == bool
    bfmi = az.bfmi(idata)
    assert bfmi.shape == (3,) and np.isfinite(bfmi).all() and (bfmi > 0).all()
    # a result without statistics (built by hand / older version) still converts
    plain = SampleResult(**{f: getattr(divergent_run, f)
                            for f in SampleResult.__dataclass_fields__ if f != "sample_stats"})
    assert list(plain.to_inference_data().sample_stats.data_vars) == ["step_size"]


def test_stiefel_result_carries_the_stats():
    res = StiefelSampler(None, n=3, k=2, n_leapfrog=3, random_state=0).sample(
        20, n_chains=2, warmup=20)
    s = res.sample_stats
    assert all(s[k].shape == (2, 20) for k in NAMES)
    X = res.X.reshape(2, 20, -1)
    np.testing.assert_allclose(s["lp"], -0.5 * (X ** 2).sum(-1), rtol=1e-12)
    more = StiefelSampler(None, n=3, k=2, n_leapfrog=3, random_state=0).sample(5, resume=res)
    assert more.sample_stats["lp"].shape == (2, 5)
    assert res.concat(more).sample_stats["energy"].shape == (2, 25)
