"""ReflectiveHMC's results at user scale: the diagnostics of GBs of draws stay bounded.

A run of 64 chains x 10^4 draws x d = 200 holds 1 GB of float64 draws; every pass over
all of them (the convergence check at the end of ``sample``, ``summary``, ``ess``,
``rhat``) must work in blocks of dimensions instead of holding copies of the draws.
"""

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

from mlpapers.sampling.rehmc import _diagnostics
from mlpapers.sampling.rehmc._diagnostics import (
    BLOCK_ELEMENTS,
    _average_ranks,
    _ess_basic,
    _rhat_basic,
    _split,
    dim_blocks,
    ess,
    rhat,
    split_ess_classic,
    split_rhat_classic,
)
from mlpapers.sampling.rehmc._result import SampleResult
from tests._scale import peak_mb, requires_peak_rss

SMALL_BLOCK = 1 << 20  # the children use 8 MB blocks, so that the draws can be small
BLOCK_MB = SMALL_BLOCK * 8 / 2**20
assert SMALL_BLOCK < BLOCK_ELEMENTS


def _result_src(shape, dtype="float64", stub_rank_diagnostics=False) -> str:
    # draws from rng.random: the cheapest to make (their values do not matter for memory)
    return f"""
import numpy as np
from mlpapers.sampling.rehmc import _diagnostics
from mlpapers.sampling.rehmc._result import SampleResult
_diagnostics.BLOCK_ELEMENTS = {SMALL_BLOCK}
x = np.random.default_rng(0).random({shape}).astype(np.{dtype}, copy=False)
C, d = x.shape[0], x.shape[-1]
res = SampleResult(samples=x, accept_rate=np.ones(C), n_reflections=np.zeros(C, int),
                   n_divergent=np.zeros(C, int), kept_fraction=np.ones(C), step_size=np.ones(C),
                   inv_mass=np.ones(d), n_iterations=x.shape[1], n_leapfrog=3)
if {stub_rank_diagnostics}:  # per dimension (bounded), and slow at this size
    SampleResult.ess = lambda self, kind="bulk": np.zeros(d)
    SampleResult.rhat = lambda self: np.zeros(d)
"""


def _result(x):
    C, d = x.shape[0], x.shape[-1]
    return SampleResult(samples=x, accept_rate=np.ones(C), n_reflections=np.zeros(C, int),
                        n_divergent=np.zeros(C, int), kept_fraction=np.ones(C),
                        step_size=np.ones(C), inv_mass=np.ones(d), n_iterations=x.shape[1],
                        n_leapfrog=3)


# ------------------------------------------------------------------ memory ---------
@requires_peak_rss
def test_convergence_check_of_long_chains_stays_within_its_blocks():
    # a chain longer than a block: the ESS pass finishes each group of dimensions (its
    # summed spectra, autocovariances and Geyer sums are a whole chain per dimension)
    # before the next; summing all dimensions' spectra first held several float64
    # copies of a whole chain (2 x 200000 x 40 float32 draws, 61 MB: about 170 MB)
    src = _result_src((2, 200_000, 40), dtype="float32")
    assert peak_mb(src, "res._warn_if_unconverged()") < 3 * BLOCK_MB


@requires_peak_rss
def test_convergence_check_of_sample_holds_no_copy_of_the_draws():
    # sample() ends with a split R-hat over all draws: the split halves were concatenated
    # (a copy) and their variance took another, with 8 x 2000 x 400 float64 draws
    # (51 MB) about 97 MB. Blocked: a split copy and the deviations of one block of
    # dimensions (2 x 8 MB); bound 3 blocks.
    assert peak_mb(_result_src((8, 2000, 400)), "res._warn_if_unconverged()") < 3 * BLOCK_MB


@requires_peak_rss
def test_summary_moments_and_quantiles_hold_no_copy_of_the_draws():
    # np.quantile (a partitioned copy) and std (the deviations) over all 51 MB of draws
    # at once took about 49 MB; in blocks of dimensions one block's copy (8 MB) at a
    # time; bound 2 blocks.
    src = _result_src((8, 2000, 400), stub_rank_diagnostics=True)
    assert peak_mb(src, "res.summary()") < 2 * BLOCK_MB


@requires_peak_rss
def test_ess_of_float32_draws_converts_one_dimension_at_a_time():
    # float32 draws (2 x 4000 x 500 = 16 MB) were converted to float64 all at once
    # (32 MB) before the per-dimension loop; one dimension's copy is 64 kB. Bound: half
    # the float32 draws.
    src = _result_src((2, 4000, 500), dtype="float32")
    assert peak_mb(src, "res.ess()") < 0.5 * 2 * 4000 * 500 * 4 / 2**20


# ------------------------------------------------- same values as before -----------
def _ranks_by_definition(x):
    """Average ranks from their definition: ``#{y < x} + (#{y == x} + 1) / 2``."""
    flat = x.ravel()
    below = (flat[None, :] < flat[:, None]).sum(axis=1)
    equal = (flat[None, :] == flat[:, None]).sum(axis=1)
    return (below + (equal + 1) / 2).reshape(x.shape)


def test_average_ranks_are_the_average_ranks_bit_for_bit():
    # compared with the definition, not with the installed scipy: scipy 1.11 (the oldest
    # declared) ranks a sample holding +-inf as all NaN, recent scipy as numbers
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((6, 50)), np.round(rng.standard_normal((4, 37)) * 2),
             np.array([[1.0, 1.0, 1.0]]), np.array([[np.inf, -np.inf, 0.0, np.inf]]),
             np.array([[0.0, -0.0, 1.0]]), rng.integers(0, 3, (3, 11)).astype(float)]
    for x in cases:
        np.testing.assert_array_equal(_average_ranks(x), _ranks_by_definition(x))
    finite = cases[:3] + cases[4:]
    for x in finite:  # and scipy's, where every version agrees
        np.testing.assert_array_equal(_average_ranks(x),
                                      rankdata(x, method="average").reshape(x.shape))
    x = rng.standard_normal((3, 9))
    x[1, 4] = np.nan  # as rankdata's nan_policy="propagate": all NaN, never finite ranks
    assert np.isnan(_average_ranks(x)).all()
    assert np.isnan(rankdata(x)).all()


@pytest.mark.parametrize("budget", [2 * 61 * 9, 61 * 9, 61 * 2, 1])
def test_blocked_split_diagnostics_equal_the_whole_array_computation(monkeypatch, budget):
    # blocks of 2 chains, of 1 chain, of 1 chain and 2 dimensions, of 1 chain and 1
    # dimension: the same R-hat and ESS as the whole split array at once
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 61, 9)).cumsum(axis=1)
    x[:, :, 3] = 2.0  # constant: NaN
    x[2, 7, 5] = np.inf  # non-finite: NaN
    x[:2, :, 6] += 3.0  # chains disagree
    expected_rhat = _rhat_basic(_split(x))
    expected_ess = split_ess_classic(x)  # one block (the default budget)
    # and the ESS of the split chains by definition (no blocks, no spectra summed over
    # chains) where that is defined; it adds a last even-lag refinement the warning
    # leaves out, which moves these short random walks' ESS by up to 12%
    reference = np.array([_ess_basic(_split(x[:, :, j])) for j in range(9)])
    np.testing.assert_allclose(expected_ess, reference, rtol=0.15)
    monkeypatch.setattr(_diagnostics, "BLOCK_ELEMENTS", budget)
    np.testing.assert_allclose(split_rhat_classic(x), expected_rhat, rtol=1e-13)
    monkeypatch.setattr(_diagnostics, "BLOCK_ELEMENTS", 8 * budget)  # ESS blocks are 1/8
    np.testing.assert_allclose(split_ess_classic(x), expected_ess, rtol=1e-13)


def test_constant_dimensions_are_undefined_even_when_their_mean_is_not_exact():
    # 0.1 is not a float: its mean over the draws is off by a rounding error, which left
    # a variance of 1e-34, an R-hat near 1 and an ESS near 8 (a false "few effective
    # draws" warning) where the public rhat/ess say NaN
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1000, 3))
    x[:, :, 1] = 0.1
    for budget in (2**22, 1000, 8):  # one block, blocks of chains, one chain per block
        _diagnostics.BLOCK_ELEMENTS = budget
        try:
            assert np.isnan(split_rhat_classic(x)[1]) and np.isnan(split_ess_classic(x)[1])
            assert np.isfinite(split_rhat_classic(x)[[0, 2]]).all()
        finally:
            _diagnostics.BLOCK_ELEMENTS = BLOCK_ELEMENTS
    assert np.isnan(rhat(x[:, :, 1])) and np.isnan(ess(x[:, :, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _result(x)._warn_if_unconverged()


def test_dim_blocks_cover_every_dimension_in_order():
    blocks = dim_blocks((2, 3, 10), block_elements=1)
    assert [b.start for b in blocks] == list(range(10))


def test_summary_equals_the_statistics_of_the_flattened_draws(monkeypatch):
    rng = np.random.default_rng(2)
    monkeypatch.setattr(_diagnostics, "BLOCK_ELEMENTS", 3 * 5 * 40)  # blocks of 3 dims
    assert len(dim_blocks((5, 40, 7))) == 3
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((5, 40, 7)).astype(dtype)
        s = _result(x).summary()
        flat = x.reshape(-1, 7)
        # float64 accumulators, results in the draws' dtype
        flat64 = flat.astype(np.float64)
        np.testing.assert_array_equal(s["mean"], flat64.mean(0).astype(dtype))
        # a strided block's column sums run in another order: equal to rounding
        rtol = 1e-12 if dtype == np.float64 else 1e-6
        np.testing.assert_allclose(s["sd"], flat64.std(0, ddof=1), rtol=rtol)
        assert s["mean"].dtype == s["sd"].dtype == dtype
        q = np.quantile(flat, [0.05, 0.5, 0.95], axis=0)
        np.testing.assert_array_equal(np.stack([s["q5"], s["median"], s["q95"]]), q)
        # the rank diagnostics of float32 draws are those of their float64 values
        np.testing.assert_array_equal(s["ess_bulk"], ess(x.astype(np.float64)))
        np.testing.assert_array_equal(s["rhat"], rhat(x.astype(np.float64)))


def test_summary_of_float32_draws_accumulates_in_float64():
    # numpy summed float32 draws row by row in float32: over 64 x 10^4 draws of
    # 1000 + N(0, 1) the mean was off by 0.4 (300 Monte Carlo standard errors) and the
    # sd by 8%; here 16 x 20 000 draws in 2 dimensions (strided columns: no pairwise
    # summation), where the float32 mean was off by 1.3 and the sd by 64%
    x = (1000 + np.random.default_rng(4).standard_normal((16, 20000, 2))).astype(np.float32)
    s = _result(x).summary()
    flat64 = x.reshape(-1, 2).astype(np.float64)
    np.testing.assert_allclose(s["mean"], flat64.mean(0), rtol=0, atol=1e-4)  # ulp of 1000
    np.testing.assert_allclose(s["sd"], flat64.std(0, ddof=1), rtol=1e-6)


@pytest.mark.parametrize("kind", ["bulk", "tail"])
def test_ess_per_dimension_equals_the_one_dimensional_ess(kind):
    x = np.random.default_rng(3).standard_normal((3, 80, 4)).astype(np.float32)
    per_dim = [ess(x[:, :, j].astype(np.float64), kind=kind) for j in range(4)]
    np.testing.assert_array_equal(ess(x, kind=kind), per_dim)


# ------------------------------------------------------------------ Stiefel --------
@requires_peak_rss
def test_polar_factors_of_the_draws_hold_a_few_blocks_besides_the_output():
    # StiefelSampler.sample took the polar factors of all the draws at once: a float64
    # copy of them, the SVD's U and the product in float64, then the cast back (float32
    # draws 4 x 5000 x 50 x 10, a 38 MB output: 246 MB in all). In blocks of 2 MB of
    # float64 entries: a block's float64 copy, the SVD's copy and U, the product and its
    # cast (5 blocks), with allocator slack; bound: the output plus 12 blocks.
    block = 1 << 18
    setup = f"""
import torch
from mlpapers.sampling.rehmc import _stiefel
_stiefel.POLAR_BLOCK_ELEMENTS = {block}
_stiefel.polar_draws(torch.rand(1, 2, 50, 10, dtype=torch.float64))  # loads LAPACK's pages
X = torch.rand(4, 5000, 50, 10, dtype=torch.float32)
"""
    out_mb = 4 * 5000 * 50 * 10 * 4 / 2**20
    assert peak_mb(setup, "Q = _stiefel.polar_draws(X)") < out_mb + 12 * block * 8 / 2**20


def test_polar_draws_equal_the_polar_factor_of_every_draw(monkeypatch):
    from mlpapers.sampling.rehmc import _stiefel

    rng = np.random.default_rng(4)
    monkeypatch.setattr(_stiefel, "POLAR_BLOCK_ELEMENTS", 3 * 5 * 2)  # blocks of 3 draws
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((3, 7, 5, 2)).astype(dtype)
        got = _stiefel.polar_draws(torch.from_numpy(x))
        ref = _stiefel.polar_factor(torch.from_numpy(x.astype(np.float64))).numpy()
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_array_equal(got, ref.astype(dtype))
        np.testing.assert_allclose(np.swapaxes(got, -1, -2) @ got,
                                   np.broadcast_to(np.eye(2), (3, 7, 2, 2)),
                                   atol=1e-12 if dtype == np.float64 else 1e-5)
