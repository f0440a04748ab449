"""StiefelSampler.sample(resume=result): continuing a run from the final Euclidean states."""

import pickle

import numpy as np
import pytest

from mlpapers.sampling import (
    SampleResult,
    StiefelResult,
    StiefelSampler,
    matrix_von_mises_fisher_log_density,
    polar_factor,
)
from tests.sampling._ks import assert_ks_ess

pytestmark = pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")  # short runs
F = np.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0]])


@pytest.mark.parametrize("kw", [dict(n_leapfrog=4), dict(), dict(n_leapfrog=3, thin=2)])
def test_resume_equals_one_long_run_when_every_state_is_kept(kw):
    # a tiny a and a large b make every recorded X well conditioned (kept_fraction 1):
    # then the inner ReflectiveHMC keeps the same draws as one long call, bit for bit
    kw = dict(kw)
    thin = kw.pop("thin", 1)

    def make():
        return StiefelSampler(matrix_von_mises_fisher_log_density(F), n=3, k=2, a=1e-3, b=20.0,
                              random_state=4, **kw)

    long = make().sample(60, n_chains=3, warmup=40, thin=thin)
    first = make().sample(25, n_chains=3, warmup=40, thin=thin)
    # the result carries the Euclidean final states X (flattened), not Q
    assert first.last_state.shape == (3, 6)
    np.testing.assert_array_equal(first.last_state.reshape(3, 3, 2), first.X[:, -1])
    assert not np.allclose(first.last_state, first.samples[:, -1])  # samples hold Q
    first = pickle.loads(pickle.dumps(first))
    sampler = make()
    second = sampler.sample(35, resume=first, thin=thin)
    assert isinstance(second, StiefelResult) and second.Q.shape == (3, 35, 3, 2)
    for r in (long, first, second):
        np.testing.assert_array_equal(r.kept_fraction, 1.0)
    np.testing.assert_array_equal(np.concatenate([first.X, second.X], 1), long.X)
    np.testing.assert_array_equal(np.concatenate([first.Q, second.Q], 1), long.Q)
    np.testing.assert_array_equal(second.step_size, first.step_size)
    np.testing.assert_array_equal(sampler.step_size_, first.step_size)
    assert second.trajectory_length == first.trajectory_length
    assert sampler.trajectory_length_ == first.trajectory_length


def test_resume_with_active_support_is_deterministic_and_has_the_vmf_law():
    # V(3, 1) with the default bounds: the well-conditioned set {a <= |x| <= b} drops
    # some states, so chains end anywhere in the ball and continue from there. The
    # concatenated halves match the exact law of t = q . mu under a von Mises-Fisher,
    # F(t) = (exp(kappa t) - exp(-kappa)) / (exp(kappa) - exp(-kappa)).
    mu, kappa = np.array([0.0, 1.0, 0.0]), 4.0
    sampler = StiefelSampler(matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3,
                             k=1, n_leapfrog=5, random_state=1)
    first = sampler.sample(200, n_chains=4, warmup=150)
    assert first.kept_fraction.min() < 1  # the support is active
    radius = sampler._bounds()[1]
    assert (np.linalg.norm(first.last_state, axis=1) <= radius).all()
    second = sampler.sample(200, resume=first)
    again = StiefelSampler(matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3,
                           k=1, n_leapfrog=5, random_state=99).sample(200, resume=first)
    np.testing.assert_array_equal(again.Q, second.Q)  # random_state plays no role
    np.testing.assert_array_equal(second.step_size, first.step_size)
    assert second.sampler_state["n_transitions"] == 150 + first.n_iterations + second.n_iterations
    np.testing.assert_allclose(polar_factor(second.X), second.Q, atol=1e-12)
    t = np.concatenate([first.Q, second.Q], 1)[..., 0] @ mu

    def cdf(s):
        return np.expm1(kappa * (s + 1)) / np.expm1(2 * kappa)

    assert_ks_ess(t, cdf)


def test_resume_errors():
    sampler = StiefelSampler(n=3, k=2, n_leapfrog=3, random_state=0)
    res = sampler.sample(5, n_chains=2, warmup=5)
    with pytest.raises(TypeError, match="StiefelResult"):
        sampler.sample(5, resume=res.Q)
    plain = SampleResult(**{f: getattr(res, f) for f in SampleResult.__dataclass_fields__})
    with pytest.raises(TypeError, match="StiefelResult"):
        sampler.sample(5, resume=plain)
    # V(6, 1) has the same Euclidean dimension 6 as V(3, 2): caught by (n, k), not by d
    with pytest.raises(ValueError, match=r"V\(3, 2\).*n=6, k=1"):
        StiefelSampler(n=6, k=1, n_leapfrog=3).sample(5, resume=res)
    with pytest.raises(ValueError, match=r"V\(3, 2\).*n=4, k=2"):
        StiefelSampler(n=4, k=2, n_leapfrog=3).sample(5, resume=res)
    with pytest.raises(ValueError, match="2 chains but n_chains=3"):
        sampler.sample(5, n_chains=3, resume=res)
    sampler.sample(5, n_chains=2, resume=res)  # the same count is fine
    with pytest.raises(ValueError, match="outside the container"):  # a smaller b, ball
        StiefelSampler(n=3, k=2, a=0.1, b=0.5, n_leapfrog=3).sample(5, resume=res)
    with pytest.raises(ValueError, match="fixed n_leapfrog=3"):
        StiefelSampler(n=3, k=2).sample(5, resume=res)
    StiefelSampler(n=3, k=2).sample(5, resume=res, warmup=10)  # adapting afresh is fine
    fields = {f: getattr(res, f) for f in SampleResult.__dataclass_fields__}
    fields.update(last_state=None, sampler_state=None)
    by_hand = StiefelResult(**fields, Q=res.Q, X=res.X)
    with pytest.raises(ValueError, match="no final chain state"):
        sampler.sample(5, resume=by_hand)
