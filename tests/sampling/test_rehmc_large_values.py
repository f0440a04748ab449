"""Draws beyond 1e154, the Ellipsoid's start and the convergence message.

Regressions: the moments of draws of 1e160 overflowed (squares beyond float64), so the
classic split R-hat was inf (a false "the chains disagree" warning), ``summary()``
reported ``sd = inf`` and numpy's overflow warnings leaked; an Ellipsoid run without
``x0`` made torch warn of a non-writable array; the warning printed "1.1 > 1.1".
"""

import re
import warnings

import numpy as np
import pytest

from mlpapers.sampling import Box, Ellipsoid, ReflectiveHMC
from mlpapers.sampling.rehmc._diagnostics import split_ess_classic, split_rhat_classic


@pytest.mark.parametrize("scale", [2.0**520, 1e300])
def test_classic_diagnostics_do_not_depend_on_the_scale_of_the_draws(scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 200, 3)).cumsum(axis=1)  # autocorrelated chains
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big_rhat, big_ess = split_rhat_classic(x * scale), split_ess_classic(x * scale)
    np.testing.assert_allclose(big_rhat, split_rhat_classic(x), rtol=1e-12)
    np.testing.assert_allclose(big_ess, split_ess_classic(x), rtol=1e-9)


def test_a_huge_box_is_summarised_without_overflow_or_false_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = ReflectiveHMC(lambda x: 0 * x.sum(-1), Box(0.0, 1e160, dim=2),
                            step_size=3e159, n_leapfrog=3, random_state=0
                            ).sample(500, warmup=100)
        sd = res.summary()["sd"]
    ref = (res.samples / 1e160).std(axis=(0, 1), ddof=1) * 1e160
    np.testing.assert_allclose(sd, ref, rtol=1e-9)
    # uniform on [0, 1e160]: sd 1e160 / sqrt(12)
    np.testing.assert_allclose(sd, 1e160 / np.sqrt(12), rtol=0.1)


def test_an_ellipsoid_run_without_x0_makes_no_torch_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Ellipsoid([0., 0.], np.eye(2)),
                            random_state=0).sample(200, warmup=200)
    assert res.samples.shape[-1] == 2


def test_the_convergence_warning_shows_a_value_above_the_threshold():
    with pytest.warns(RuntimeWarning, match="the chains disagree") as rec:
        ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box(-1.0, 1.0, dim=2), n_leapfrog=3,
                      random_state=0).sample(5, x0=[0, 0], warmup=5)
    msg = next(str(w.message) for w in rec if "disagree" in str(w.message))
    shown, threshold = re.search(r"split R-hat (\S+) > (\S+) in", msg).groups()
    assert float(shown) > float(threshold), msg


def test_classic_diagnostics_of_tiny_draws_do_not_underflow():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 200, 3)).cumsum(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny_rhat = split_rhat_classic(x * 1e-170)
    np.testing.assert_allclose(tiny_rhat, split_rhat_classic(x), rtol=1e-12)


def test_tiny_draws_next_to_a_chain_of_zeros_in_another_block(monkeypatch):
    # the draws are read a few chains at a time: the unit is taken from the largest
    # magnitude over every block (a block of zeros, unit 1, hid the tiny draws' unit)
    from mlpapers.sampling.rehmc import _diagnostics

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 200, 3)).cumsum(axis=1)
    x[0] = 0.0
    ref = split_rhat_classic(x)
    monkeypatch.setattr(_diagnostics, "BLOCK_ELEMENTS", 600)  # one chain per block
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = split_rhat_classic(x * 1e-170)
    np.testing.assert_allclose(tiny, ref, rtol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 1e7, 1e9])
def test_a_bounded_polytopes_centre_and_width_do_not_depend_on_its_scale(scale):
    # the Chebyshev radius was capped at 1e6 for every polytope (meant for unbounded
    # ones): the square [0, 1e7]^2 got its centre 1e6 from a corner and width 2e6, and
    # its sampling slowed with the scale (ESS 44 at 1e8 against 700 at 1)
    from mlpapers.sampling import Polytope

    square = Polytope(np.vstack([np.eye(2), -np.eye(2)]), [scale, scale, 0.0, 0.0])
    np.testing.assert_allclose(square.interior_point(), [scale / 2, scale / 2], rtol=1e-9)
    assert square.width() == pytest.approx(scale, rel=1e-9)
    half_plane = Polytope([[1.0, 0.0]], [scale])  # unbounded: still capped
    assert half_plane.width() == pytest.approx(2e6, rel=1e-9)
