"""ReflectiveHMC.sample(resume=result): continuing a finished run."""

import pickle
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from mlpapers.sampling import Box, ReflectiveHMC, SampleResult
from tests.sampling._ks import assert_ks_ess

pytestmark = pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")  # short runs
D = torch.float64
MU, SD = np.array([0.9, 0.0]), np.array([0.3, 2.0])
LO, HI = np.array([0.0, -1.0]), np.array([1.0, 1.0])


def trunc_gauss(x):
    mu, sd = torch.as_tensor(MU, dtype=x.dtype), torch.as_tensor(SD, dtype=x.dtype)
    return -0.5 * (((x - mu) / sd) ** 2).sum(-1)


def truncnorm_cdf(j, lo=LO, hi=HI):
    a, b = (lo[j] - MU[j]) / SD[j], (hi[j] - MU[j]) / SD[j]
    return stats.truncnorm(a, b, loc=MU[j], scale=SD[j]).cdf


@pytest.mark.parametrize("kw", [
    dict(n_leapfrog=5),
    dict(mass="diag", n_leapfrog=4, thin=2),
    dict(),  # step size and ChEES trajectory length adapted, Halton-jittered lengths
    dict(n_leapfrog=5, grad_log_prob=lambda x: -(x - torch.as_tensor(MU, dtype=x.dtype))
         / torch.as_tensor(SD, dtype=x.dtype) ** 2),
])
def test_resume_is_the_same_chain_as_one_long_run(kw):
    kw = dict(kw)
    thin = kw.pop("thin", 1)

    def make():
        return ReflectiveHMC(trunc_gauss, Box(LO, HI), random_state=5, **kw)

    long = make().sample(90, n_chains=3, warmup=60, thin=thin)
    first = make().sample(40, n_chains=3, warmup=60, thin=thin)
    np.testing.assert_array_equal(first.last_state, first.samples[:, -1])
    first = pickle.loads(pickle.dumps(first))  # a result saved and loaded
    hmc = make()
    second = hmc.sample(50, resume=first, thin=thin)
    np.testing.assert_array_equal(np.concatenate([first.samples, second.samples], 1),
                                  long.samples)
    # the tuning is reused exactly, not re-adapted
    np.testing.assert_array_equal(second.step_size, first.step_size)
    np.testing.assert_array_equal(second.inv_mass, first.inv_mass)
    np.testing.assert_array_equal(hmc.step_size_, first.step_size)
    assert second.trajectory_length == first.trajectory_length
    assert second.samples.shape == (3, 50, 2) and second.n_iterations == 50 * thin


def test_resume_is_deterministic_and_ignores_random_state():
    a = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=4, random_state=0).sample(
        30, n_chains=2, warmup=30)
    r1 = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=4, random_state=1).sample(
        20, resume=a)
    r2 = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=4, random_state=None).sample(
        20, resume=a)
    np.testing.assert_array_equal(r1.samples, r2.samples)
    # chained resumes continue the stream: a third segment differs from the second
    r3 = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=4).sample(20, resume=r1)
    assert not np.array_equal(r3.samples, r1.samples)
    assert r3.sampler_state["n_transitions"] == 30 + 30 + 20 + 20  # warm-up and draws


def test_resumed_halves_have_the_truncated_gaussian_law():
    # two resumed halves, concatenated, against the exact truncated normal marginals
    hmc = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=5, random_state=11)
    a = hmc.sample(400, n_chains=4, warmup=200)
    b = hmc.sample(400, resume=a)
    x = np.concatenate([a.samples, b.samples], 1)
    for j in range(2):
        assert_ks_ess(x[..., j], truncnorm_cdf(j))


def test_resume_with_a_support_starts_from_the_final_states():
    # container plus thinning: chains end anywhere in the container, maybe outside S
    s_hi = np.array([0.7, 1.0])
    hmc = ReflectiveHMC(trunc_gauss, Box(LO, HI), support=Box(LO, s_hi), n_leapfrog=5,
                        random_state=2)
    a = hmc.sample(250, n_chains=4, warmup=150)
    assert a.last_state.shape == (4, 2)
    assert bool(Box(LO, HI).contains(torch.from_numpy(a.last_state)).all())
    b = hmc.sample(250, resume=a)
    x = np.concatenate([a.samples, b.samples], 1)
    assert (x[..., 0] <= 0.7).all()
    np.testing.assert_array_equal(b.step_size, a.step_size)
    assert_ks_ess(x[..., 0], truncnorm_cdf(0, hi=s_hi))


def test_resume_with_warmup_adapts_afresh_from_the_final_states():
    hmc = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=4, random_state=0)
    a = hmc.sample(20, n_chains=2, warmup=20)
    b = hmc.sample(20, resume=a, warmup=50)
    c = hmc.sample(20, resume=a, warmup=50)
    np.testing.assert_array_equal(b.samples, c.samples)
    assert not np.array_equal(b.step_size, a.step_size)


def test_resume_errors():
    box = Box(LO, HI)
    hmc = ReflectiveHMC(trunc_gauss, box, n_leapfrog=3, random_state=0)
    res = hmc.sample(10, n_chains=2, warmup=10)
    with pytest.raises(TypeError, match="SampleResult"):
        hmc.sample(5, resume=res.samples)
    with pytest.raises(ValueError, match="either x0 or resume"):
        hmc.sample(5, x0=[0.5, 0.0], resume=res)
    with pytest.raises(ValueError, match="2 chains but n_chains=3"):
        hmc.sample(5, n_chains=3, resume=res)
    hmc.sample(5, n_chains=2, resume=res)  # the same count is fine
    three = ReflectiveHMC(lambda x: -(x ** 2).sum(-1), Box([0, 0, 0], [1, 1, 1]), n_leapfrog=3)
    with pytest.raises(ValueError, match="dimension 2 but the container has dimension 3"):
        three.sample(5, resume=res)
    small = ReflectiveHMC(trunc_gauss, Box([0.0, -1.0], [1e-3, 1e-3]), n_leapfrog=3)
    with pytest.raises(ValueError, match="outside the container"):
        small.sample(5, resume=res)
    auto = ReflectiveHMC(trunc_gauss, box, n_leapfrog="auto")
    with pytest.raises(ValueError, match="fixed n_leapfrog=3"):
        auto.sample(5, resume=res)
    auto.sample(5, resume=res, warmup=20)  # adapting afresh is fine
    by_hand = SampleResult(samples=res.samples, accept_rate=res.accept_rate,
                           n_reflections=res.n_reflections, n_divergent=res.n_divergent,
                           kept_fraction=res.kept_fraction, step_size=res.step_size,
                           inv_mass=res.inv_mass, n_iterations=10, n_leapfrog=3)
    with pytest.raises(ValueError, match="no final chain state"):
        hmc.sample(5, resume=by_hand)


def test_resume_honours_a_numeric_step_size_and_read_only_results():
    box = Box(LO, HI)
    res = ReflectiveHMC(trunc_gauss, box, n_leapfrog=3, step_size=0.05,
                        random_state=0).sample(10, n_chains=2, warmup=0)
    # the new sampler's explicit step size is a setting, like a fixed n_leapfrog
    fixed = ReflectiveHMC(trunc_gauss, box, n_leapfrog=3, step_size=0.2)
    np.testing.assert_array_equal(fixed.sample(5, resume=res).step_size, [0.2, 0.2])
    # "auto" takes the result's frozen step sizes
    auto = ReflectiveHMC(trunc_gauss, box, n_leapfrog=3)
    np.testing.assert_array_equal(auto.sample(5, resume=res).step_size, res.step_size)
    # a result whose arrays are read-only (e.g. memory-mapped by joblib) resumes quietly
    for arr in (res.last_state, res.step_size, res.inv_mass, res.sampler_state["rng_state"]):
        arr.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "the chains disagree")  # 5 draws: expected
        auto.sample(5, resume=res)
    bad = pickle.loads(pickle.dumps(res))
    bad.sampler_state["rng_state"] = bad.sampler_state["rng_state"][:100]
    with pytest.raises(ValueError, match="sampler_state is malformed"):
        auto.sample(5, resume=bad)


def test_concat_weights_the_kept_fraction_by_recorded_states():
    half = Box(LO, np.array([0.5, 1.0]))  # a support: kept fractions below 1
    hmc = ReflectiveHMC(trunc_gauss, Box(LO, HI), support=half, n_leapfrog=3, random_state=0)
    first = hmc.sample(20, warmup=20)  # thin=1
    more = hmc.sample(20, resume=first, thin=3)
    r1, r2 = first.n_iterations, more.n_iterations // 3  # recorded states per chain
    both = first.concat(more)
    pooled = (first.kept_fraction * r1 + more.kept_fraction * r2) / (r1 + r2)
    np.testing.assert_allclose(both.kept_fraction, pooled, rtol=1e-12)
    assert both.sampler_state["n_recorded"] == r1 + r2
    again = both.concat(hmc.sample(5, resume=both))  # a joined result joins on
    assert again.sampler_state["n_recorded"] == r1 + r2 + again.n_iterations - both.n_iterations


def test_concat_rejects_parts_that_do_not_follow_one_another():
    hmc = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=3, random_state=0)
    a = hmc.sample(10, warmup=10)
    b = hmc.sample(5, resume=pickle.loads(pickle.dumps(a)))
    c = hmc.sample(5, resume=b)
    full = a.concat(b, c)
    for joined in (a.concat(b).concat(c), a.concat(b.concat(c))):
        np.testing.assert_array_equal(joined.samples, full.samples)
    other = ReflectiveHMC(trunc_gauss, Box(LO, HI), n_leapfrog=3, random_state=1).sample(
        10, warmup=10)
    for bad in ((a, a), (a, c, b), (a, c), (a, other), (other, b),
                (a, hmc.sample(5, resume=other))):
        with pytest.raises(ValueError, match="does not continue"):
            bad[0].concat(*bad[1:])
    a.concat(hmc.sample(5, resume=a, warmup=5))  # a new warm-up continues the chains too
    old = SampleResult(**{**{f: getattr(b, f) for f in SampleResult.__dataclass_fields__},
                          "sampler_state": {k: v for k, v in b.sampler_state.items()
                                            if k != "resumed_from"}})
    assert old.concat(c).n_iterations == 10 and other.concat(old).n_iterations  # unchecked
