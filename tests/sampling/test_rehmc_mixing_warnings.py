"""The run-level warnings of ReflectiveHMC beyond R-hat: the ChEES length at its cap and
few effective draws.

A Gaussian in a box far wider in one coordinate than the other mixes slowly with the
identity mass (the step follows the narrow side, ChEES asks for long trajectories along
the wide one) while the split R-hat stays below 1.1: such runs were silent. The
warnings must stay quiet on healthy runs (4 chains and the many-chain regime of ChEES)
and on a fixed ``n_leapfrog`` equal to the cap (the user's choice, not an adapted
length).
"""

import dataclasses
import re
import warnings

import numpy as np
import pytest

from mlpapers.sampling import Box, ReflectiveHMC
from mlpapers.sampling.rehmc._diagnostics import (
    _ess_basic,
    _split,
    split_ess_classic,
    split_rhat_classic,
)
from mlpapers.sampling.rehmc._warmup import MAX_LEAPFROG

CAP = "n_leapfrog='auto': the adapted trajectory length is at the cap"
FEW = "few effective draws"


def normal(x):
    return -0.5 * (x ** 2).sum(-1)


def grad(x):
    return -x


def quiet(fn, *messages):
    """Run ``fn`` with the given warnings (message starts) turned into errors."""
    with warnings.catch_warnings():
        for m in messages:
            warnings.filterwarnings("error", message=re.escape(m), category=RuntimeWarning)
        return fn()


@pytest.mark.parametrize("phi", [0.0, 0.6, 0.95])
def test_split_ess_classic_is_the_geyer_ess_of_the_split_chains(phi):
    """The vectorised ESS of the warning equals the per-dimension reference
    (``_ess_basic`` of the split chains, written from Vehtari et al.'s definition) up to
    the last even-lag refinement it leaves out, on AR(1) chains of known correlation."""
    rng = np.random.default_rng(1)
    e = rng.standard_normal((4, 600, 3))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    for t in range(1, e.shape[1]):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi ** 2) * e[:, t]
    ref = [_ess_basic(_split(x[:, :, j])) for j in range(3)]
    np.testing.assert_allclose(split_ess_classic(x), ref, rtol=0.02)
    # undefined: too few draws, a constant or a non-finite dimension
    assert np.isnan(split_ess_classic(x[:, :7])).all()
    assert np.isfinite(split_ess_classic(x[:, :8])).all()  # 4 per split half: defined
    # the R-hat of the warning is defined from 4 draws per chain, as the public rhat
    assert np.isnan(split_rhat_classic(x[:, :3, :1])).all()
    assert np.isfinite(split_rhat_classic(x[:, :4, :1])).all()
    x[:, :, 1] = 2.0
    x[0, 5, 2] = np.nan
    got = split_ess_classic(x)
    assert np.isnan(got[1:]).all() and np.isfinite(got[0])


def test_wide_thin_box_with_identity_mass_warns_of_few_effective_draws():
    """N(0, I) in [0, 0.05] x [-3, 3] with 10 leapfrog steps: the identity mass's step
    follows the narrow side, so the wide coordinate random-walks. Split R-hat about 1.08
    (no R-hat warning, and silent before this warning) but about 50 effective draws of
    2000 (2.7%); ``mass="diag"`` on the same target is quiet."""
    box = Box([0.0, -3.0], [0.05, 3.0])
    kw = {"grad_log_prob": grad, "n_leapfrog": 10, "random_state": 0}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = ReflectiveHMC(normal, box, **kw).sample(500, warmup=200)
    assert [str(w.message) for w in rec if FEW in str(w.message)], "no ESS warning"
    assert not [w for w in rec if "R-hat" in str(w.message)]  # the case R-hat misses
    assert np.nanmin(split_ess_classic(res.samples)) < 0.1 * res.samples[..., 0].size
    res = quiet(lambda: ReflectiveHMC(normal, box, mass="diag", **kw).sample(
        500, warmup=200), FEW, CAP)
    assert np.nanmin(split_ess_classic(res.samples)) >= 400


def test_short_runs_of_a_healthy_sampler_are_quiet():
    """2 chains of 200 draws of a truncated normal (ESS about 150 < 200, but 40% of the
    draws): the user's choice of length, not slow mixing."""
    res = quiet(lambda: ReflectiveHMC(normal, Box([0.0, 0.0], [1.0, 2.0]), grad_log_prob=grad,
                                      random_state=0).sample(200, n_chains=2, warmup=100),
                FEW, CAP)
    assert np.nanmin(split_ess_classic(res.samples)) < 200  # the rstan rule alone warns


def test_chees_length_at_the_cap_warns():
    """A run whose frozen ChEES length sits at the 1000-step cap (the thin box
    [0, 1e-3] x [-10, 10] reaches it after a 1000-iteration warm-up, in minutes; here
    a short run's length is set there and the run resumed for 3 transitions) warns and
    says what to do; the same resumed run below the cap does not."""
    box = Box([0.0, -10.0], [1e-3, 10.0])
    hmc = ReflectiveHMC(normal, box, grad_log_prob=grad, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short run's own R-hat warning
        res = hmc.sample(20, warmup=50)
    step = float(np.mean(res.step_size))
    # the thin box's own run froze T at 999.87 steps (an iterate average pinned at the cap)
    capped = dataclasses.replace(res, trajectory_length=999.87 * step)
    with pytest.warns(RuntimeWarning, match=re.escape(CAP)) as rec:
        more = hmc.sample(3, resume=capped)
    assert more.trajectory_length == pytest.approx(999.87 * step)
    msg = str(next(w.message for w in rec if CAP in str(w.message)))
    assert "mass='diag'" in msg and "warm-up" in msg
    below = dataclasses.replace(res, trajectory_length=0.9 * MAX_LEAPFROG * step)
    quiet(lambda: hmc.sample(3, resume=below), CAP)


def test_fixed_n_leapfrog_at_the_cap_does_not_warn():
    """``n_leapfrog=1000`` is the user's choice: no cap warning."""
    hmc = ReflectiveHMC(normal, Box([-3.0, -3.0], [3.0, 3.0]), grad_log_prob=grad,
                        n_leapfrog=MAX_LEAPFROG, step_size=0.05, random_state=0)
    res = quiet(lambda: hmc.sample(3, n_chains=2, warmup=0), CAP)
    assert res.mean_leapfrog == MAX_LEAPFROG


@pytest.mark.parametrize(("n_chains", "n_samples", "warmup"), [(4, 300, 300), (64, 20, 150)])
def test_healthy_runs_are_quiet(n_chains, n_samples, warmup):
    """A standard normal in a box, with the defaults: 4 chains, and 64 short chains (the
    many-chain regime of ChEES, judged on the total ESS, not 100 per chain)."""
    res = quiet(lambda: ReflectiveHMC(normal, Box([-3.0, -2.0], [2.0, 3.0]),
                                      grad_log_prob=grad, random_state=0).sample(
        n_samples, n_chains=n_chains, warmup=warmup), FEW, CAP, "the chains disagree")
    assert np.nanmin(split_ess_classic(res.samples)) >= 400


def test_thinning_keeps_the_verdict_of_the_same_transitions():
    """The ratio is per transition: ``thin=5`` over the same 2500 transitions of the thin
    box kept the same ESS (about 310) at 15% of its kept draws instead of 3% of the
    transitions, and the warning went silent. A healthy target thinned by 10 (its ESS
    capped by its kept draws, 10% of its transitions at best) stays quiet."""
    box = Box([0.0, -3.0], [0.05, 3.0])
    kw = {"grad_log_prob": grad, "n_leapfrog": 10, "random_state": 0}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = ReflectiveHMC(normal, box, **kw).sample(500, warmup=200, thin=5)
    assert [str(w.message) for w in rec if FEW in str(w.message)], "no ESS warning"
    assert np.nanmin(split_ess_classic(res.samples)) > 0.1 * res.samples[..., 0].size
    low = []
    for seed in range(4):  # 4 chains x 100 kept draws of 1000 transitions each
        res = quiet(lambda s=seed: ReflectiveHMC(
            normal, Box([0.0, 0.0], [1.0, 2.0]), grad_log_prob=grad,
            random_state=s).sample(100, warmup=100, thin=10), FEW, CAP)
        low.append(np.nanmin(split_ess_classic(res.samples)))
    # (measured 417, 413, 454, 389: the last is below both 400 and 10% of the 4000
    # transitions, so judging per transition alone would have warned)
    assert min(low) > 0.75 * 400
    with warnings.catch_warnings(record=True) as rec:  # thin=20: 0.52 of the kept draws
        warnings.simplefilter("always")
        ReflectiveHMC(normal, box, **kw).sample(125, warmup=200, thin=20)
    assert [str(w.message) for w in rec if FEW in str(w.message)], "no ESS warning"


def test_few_chains_are_judged_on_100_effective_draws_per_chain():
    """The bar is ``min(100 * chains, 400)``: 2 chains of 180 slowly varying draws (each
    split half is one full period of +-sin, with the same mean and variance: split R-hat
    0.99, so no R-hat warning preempts this one) have 360 draws, above the 200 two chains
    need: judged, and an ESS of about 12 warns. A bar of 400 would have let this run pass
    unjudged."""
    t = np.arange(180)
    wave = np.sin(2 * np.pi * t / 90)
    rng = np.random.default_rng(0)
    draws = np.stack([wave, -wave])[:, :, None] + 0.01 * rng.standard_normal((2, 180, 1))
    ess = np.nanmin(split_ess_classic(draws))
    assert ess < 0.1 * draws.size  # slow mixing by the ratio rule too
    hmc = ReflectiveHMC(normal, Box([-3.0], [3.0]), grad_log_prob=grad, random_state=0)
    res = quiet(lambda: hmc.sample(5, n_chains=2, warmup=5), FEW)  # too short: not judged
    slow = dataclasses.replace(res, samples=draws, n_iterations=180)
    with pytest.warns(RuntimeWarning, match=FEW):
        slow._warn_if_unconverged()
