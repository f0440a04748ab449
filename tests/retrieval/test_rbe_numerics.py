"""Numerical robustness of relevance-based embeddings: conditioning, scale, precision.

References are float64 least-squares fits written from the definition (numpy lstsq).
"""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    RelevanceBasedRetriever,
    fit_linear_embeddings,
    select_support,
)


def _mse_drops(R, S, center):
    """Decrease of the training MSE of the (affine if ``center``) least-squares
    reconstruction of R from its columns S, pick by pick (float64, from the definition)."""
    X = R - R.mean(axis=0) if center else R

    def resid(cols):
        if not cols:
            return float((X**2).mean())
        A = X[:, cols]
        coef = np.linalg.lstsq(A, X, rcond=None)[0]
        return float(((X - A @ coef) ** 2).mean())

    out, prev = [], resid([])
    for t in range(len(S)):
        cur = resid(list(S[:t + 1]))
        out.append(prev - cur)
        prev = cur
    return np.array(out)


def _graded(decay, offset, n=30, N=25, seed=1):
    """Relevance with singular values from 1 down to ``decay**2`` plus an offset."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((n, n)))[0][:, :N]
    V = np.linalg.qr(rng.standard_normal((N, N)))[0]
    return (U * decay ** (np.arange(N) / (N - 1) * 2)) @ V.T + offset


@pytest.mark.parametrize("greedy_method", ["lowrank", "gram"])
@pytest.mark.parametrize("decay, offset, center", [(1e-2, 5.0, False), (1e-3, 0.0, True),
                                                    (1e-3, 5.0, False), (1e-4, 0.0, True)])
def test_greedy_gains_are_the_mse_drops_on_ill_conditioned_relevance(
        greedy_method, decay, offset, center):
    # regression: "lowrank" recorded a_j / d_j with a_j = ||G_j||^2 kept by updates that
    # cancel at the scale of |R|**4; on these matrices its gains were off by factors of
    # 60 to 5000 (sometimes far from any MSE drop), the "gram" ones by 1e-5
    R = _graded(decay, offset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # may stop early: fewer picks, still checked
        S, gains = select_support(R, 20, "greedy", center=center,
                                  greedy_method=greedy_method, return_scores=True)
    ref = _mse_drops(R, S, center)
    np.testing.assert_allclose(gains, ref, rtol=1e-3, atol=0)
    assert (gains > 0).all()


def test_a_support_column_of_rounding_noise_does_not_erase_the_fit():
    # regression: the pseudo-inverse cutoff was 2 eps sqrt(n k) max_j(|R_j| / sigma_j),
    # so one support column taking the values 5 and the next float (sigma ~ 4e-16)
    # dropped every singular value and linear RBE predicted the item means
    rng = np.random.default_rng(0)
    n, N = 50, 30
    R = rng.standard_normal((n, 4)) @ rng.standard_normal((4, N)) + 5.0
    R[:, 0] = np.where(rng.random(n) < 0.5, 5.0, np.nextafter(5.0, 6.0))
    S = [0, 1, 2, 3, 4]
    out = fit_linear_embeddings(torch.tensor(R[:, S]), torch.tensor(R))
    U = (torch.tensor(R[:, S]) - out["mean"]) / out["scale"]
    pred = (U @ out["embeddings"].T + out["offsets"]).numpy()
    # rank 4 + intercept: the healthy supports 1..4 reproduce every item
    np.testing.assert_allclose(pred[:, 1:], R[:, 1:], atol=1e-9)


@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("gap", [1e-4, 1e-8])
def test_nearly_collinear_supports_give_the_least_squares_fit(standardize, gap):
    # predictions on the training queries are the (affine) least-squares projection,
    # whatever the basis; reached to about cond * eps
    rng = np.random.default_rng(0)
    n, N = 50, 30
    R = rng.standard_normal((n, 4)) @ rng.standard_normal((4, N))
    R[:, 0] = R[:, 1] + gap * rng.standard_normal(n)
    S = [0, 1, 2, 3, 4]
    out = fit_linear_embeddings(torch.tensor(R[:, S]), torch.tensor(R),
                                standardize=standardize)
    U = (torch.tensor(R[:, S]) - out["mean"]) / out["scale"]
    pred = (U @ out["embeddings"].T + out["offsets"]).numpy()
    X = np.c_[R[:, S], np.ones(n)] if standardize else R[:, S]
    ref = X @ np.linalg.lstsq(X, R, rcond=None)[0]
    np.testing.assert_allclose(pred, ref, atol=1e-6 * np.abs(R).max() * (1e-4 / gap) ** 0.5)


@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_greedy_gains_scale_with_the_relevance(scale):
    R = _graded(1e-2, 0.0)
    S0, g0 = select_support(R, 10, "greedy", return_scores=True)
    S, g = select_support(R * scale, 10, "greedy", return_scores=True)
    np.testing.assert_array_equal(S, S0)
    np.testing.assert_allclose(g / scale**2, g0, rtol=1e-9)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1e150, 1e300])
def test_greedy_picks_scale_with_one_signed_relevance(scale, sign):
    # all entries of one sign (an offset of 5): the scale statistic is the largest
    # magnitude whichever sign holds it; the gains, in squared units, are compared
    # where their square fits float64
    R = sign * _graded(1e-2, 5.0)
    assert (sign * R > 0).all()
    S0, g0 = select_support(R, 10, "greedy", return_scores=True)
    S, g = select_support(R * scale, 10, "greedy", return_scores=True)
    np.testing.assert_array_equal(S, S0)
    if 1e-200 < scale < 1e200:
        np.testing.assert_allclose(g / scale**2, g0, rtol=1e-9)


@pytest.mark.filterwarnings("ignore:greedy support selection stopped")
@pytest.mark.parametrize("cast", [
    lambda a: a.astype(np.float16),
    lambda a: np.round(8 * a).astype(np.int64),
    lambda a: torch.tensor(a).bfloat16(),
    lambda a: [[np.float32(v) for v in row] for row in a],
])
def test_low_precision_relevance_fn_outputs_are_read_exactly(cast):
    # the scores are converted to float64 as given: the retriever equals one fitted
    # on the float64 values of the same low-precision scores
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((60, 4)), rng.standard_normal((40, 4))

    def heavy(q, i):
        return cast(np.asarray(q) @ np.asarray(i).T)

    def heavy64(q, i):
        out = heavy(q, i)
        return (out.double().numpy() if isinstance(out, torch.Tensor)
                else np.asarray(out, dtype=np.float64))

    a = RelevanceBasedRetriever(heavy, n_support=6, random_state=0).fit(Q[:50], items)
    b = RelevanceBasedRetriever(heavy64, n_support=6, random_state=0).fit(Q[:50], items)
    np.testing.assert_array_equal(a.support_indices_, b.support_indices_)
    np.testing.assert_array_equal(a.predict(Q[50:]), b.predict(Q[50:]))


def test_all_supports_reproduce_the_training_relevance():
    # n_support == n_items (rank-deficient R_tr[:, S]): the pseudo-inverse fit is exact
    rng = np.random.default_rng(0)
    R = rng.standard_normal((20, 3)) @ rng.standard_normal((3, 12))
    for standardize in (True, False):
        out = fit_linear_embeddings(torch.tensor(R), torch.tensor(R), standardize=standardize)
        U = (torch.tensor(R) - out["mean"]) / out["scale"]
        pred = (U @ out["embeddings"].T + out["offsets"]).numpy()
        np.testing.assert_allclose(pred, R, atol=1e-12)


def _heavy_problem(n_queries=80, n_items=60, dim=6):
    """Queries, items and a tanh-of-inner-product heavy ranker (also used elsewhere)."""
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((n_queries, dim)), rng.standard_normal((n_items, dim))

    def heavy(q, i):
        return np.tanh(np.asarray(q) @ np.asarray(i).T)
    return Q, items, heavy


@pytest.mark.parametrize("scale", [2.0**-560, 2.0**560])
@pytest.mark.parametrize("kw", [dict(), dict(ridge=1e-3), dict(support="random",
                                                               random_state=0)])
def test_standardised_rbe_is_invariant_to_the_scale_of_relevance(scale, kw):
    # regression: the support std was computed from squares, which overflow for
    # |R| ~ 1e168 (std inf: NaN embeddings or item means) and underflow for 1e-168
    # (std 0: U left unscaled, swamped by the ridge; HitRate 0.75 -> 0.2)
    Q, items, heavy = _heavy_problem()
    ref = RelevanceBasedRetriever(heavy, n_support=12, **kw).fit(Q[:60], items)
    est = RelevanceBasedRetriever(lambda q, i: heavy(q, i) * scale, n_support=12,
                                  **kw).fit(Q[:60], items)
    np.testing.assert_array_equal(est.support_indices_, ref.support_indices_)
    np.testing.assert_array_equal(est.query_scale_, ref.query_scale_ * scale)
    np.testing.assert_allclose(est.predict(Q[60:]), ref.predict(Q[60:]) * scale,
                               rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_array_equal(est.kneighbors(Q[60:], 10, return_distance=False),
                                  ref.kneighbors(Q[60:], 10, return_distance=False))


@pytest.mark.parametrize("scale", [2.0**-560, 2.0**560])
@pytest.mark.parametrize("rcond", [None, 1e-3])
def test_adacur_is_invariant_to_the_scale_of_relevance(scale, rcond):
    # regression: the anchor Gram C C^T underflowed for |R| ~ 1e-168 (every direction
    # dropped: HitRate 0.66 -> 0.31) and overflowed for 1e168 (LinAlgError from eigh)
    Q, items, heavy = _heavy_problem()
    kw = dict(n_calls=12, n_rounds=3, rcond=rcond, random_state=0)
    ref = AdaCURRetriever(heavy, **kw).fit(Q[:60], items)
    est = AdaCURRetriever(lambda q, i: heavy(q, i) * scale, **kw).fit(Q[:60], items)
    s_ref, i_ref = ref.kneighbors(Q[60:], 10)
    s, i = est.kneighbors(Q[60:], 10)
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(s / scale, s_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale", [2.0**-200, 2.0**200])
@pytest.mark.parametrize("standardize", [True, False])
def test_neural_head_is_invariant_to_the_scale_of_relevance(scale, standardize, tmp_path):
    # regression: the float32 head took the relevance as it was: 1.6e60 overflowed
    # (NaN scores, arbitrary neighbours) and 6e-61 flushed to 0
    Q, items, heavy = _heavy_problem()

    def heavy15(q, i):  # largest |R| in [1, 2): the reference trains in its own units
        return 1.5 * heavy(q, i)

    kw = dict(n_support=12, head="mlp", max_iter=20, eval_every=10, mlp_hidden=8,
              standardize=standardize, random_state=0)
    ref = RelevanceBasedRetriever(heavy15, **kw).fit(Q[:60], items)
    est = RelevanceBasedRetriever(lambda q, i: heavy15(q, i) * scale, **kw).fit(Q[:60], items)
    assert est.head_units_[1] == scale and ref.head_units_[1] == 1.0
    # (the reference's scores are float32: scaled in float64)
    np.testing.assert_allclose(est.predict(Q[60:]),
                               ref.predict(Q[60:]).astype(np.float64) * scale,
                               rtol=1e-6, atol=1e-6 * scale)
    idx = est.kneighbors(Q[60:], 10, return_distance=False)
    np.testing.assert_array_equal(idx, ref.kneighbors(Q[60:], 10, return_distance=False))
    est.save(tmp_path / "rbe.pt")
    back = RelevanceBasedRetriever.load(tmp_path / "rbe.pt",
                                        relevance_fn=lambda q, i: heavy15(q, i) * scale,
                                        items=items)
    np.testing.assert_array_equal(back.kneighbors(Q[60:], 10, return_distance=False), idx)


@pytest.mark.parametrize("scale", [2.0**-560, 2.0**560])
def test_adacur_ridge_beyond_the_float64_range_of_the_relevance_raises(scale):
    # regression: the Gram is formed in units of the relevance, where the ridge is
    # ridge / unit**2: it overflowed (a cryptic "ridge must be >= 0, got inf") or
    # underflowed to 0 (silently the unregularised rcond branch)
    Q, items, heavy = _heavy_problem()
    est = AdaCURRetriever(lambda q, i: heavy(q, i) * scale, n_calls=12, n_rounds=3,
                          ridge=1e-3, random_state=0)
    with pytest.raises(ValueError, match=r"ridge=0\.001 is out of range.*relevance"):
        est.fit(Q[:60], items).kneighbors(Q[60:], 10)


@pytest.mark.parametrize("scale", [2.0**-400, 2.0**400])
def test_adacur_ridge_scaled_with_the_relevance_gives_the_same_neighbours(scale):
    # ridge acts on the Gram of the relevance: scaled by scale**2 it is the same fit
    Q, items, heavy = _heavy_problem()
    kw = dict(n_calls=12, n_rounds=3, random_state=0)
    ref = AdaCURRetriever(heavy, ridge=1e-3, **kw).fit(Q[:60], items)
    est = AdaCURRetriever(lambda q, i: heavy(q, i) * scale, ridge=1e-3 * scale**2,
                          **kw).fit(Q[:60], items)
    np.testing.assert_array_equal(est.kneighbors(Q[60:], 10, return_distance=False),
                                  ref.kneighbors(Q[60:], 10, return_distance=False))


def test_mlp_head_gives_a_support_constant_on_the_training_queries_unit_scale():
    # a support item whose relevance is the same for every training query (here 0: a
    # ReLU ranker) had its query-tower scale floored at 1e-12, so a test query's
    # deviation there was multiplied by 1e12 (scores of 1e12, HitRate@5 0.24 vs 0.35
    # for the linear head); the linear solve gives such a column unit scale
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((80, 4)), rng.standard_normal((30, 4))
    Q[:60, 0], Q[60:, 0] = np.abs(Q[:60, 0]), -np.abs(Q[60:, 0])
    items[0] = [-1.0, 0.0, 0.0, 0.0]  # relevance 0 on all training queries, > 0 on tests

    def heavy(q, i):
        return np.maximum(np.asarray(q) @ np.asarray(i).T, 0.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = RelevanceBasedRetriever(heavy, support=[0, 1, 2, 3, 4, 5], head="mlp",
                                        max_iter=200, validation_fraction=0.0,
                                        random_state=0).fit(Q[:60], items)
    assert model.query_scale_[0] == 1.0
    assert float(model.head_.query_scale[0]) == 1.0
    R_test = heavy(Q[60:], items)
    assert np.abs(R_test[:, 0]).max() > 0  # the test queries do deviate there
    assert np.abs(model.predict(Q[60:])).max() < 100 * np.abs(R_test).max()


def test_neural_head_refuses_a_zero_query_scale():
    from mlpapers.retrieval.rbe import NeuralRBEHead

    E, v, pop = torch.randn(5, 2), torch.zeros(5), torch.rand(5)
    with pytest.raises(ValueError, match="query_scale must hold finite values > 0"):
        NeuralRBEHead(E, v, pop, torch.zeros(2), torch.tensor([1.0, 0.0]), 4)
    with pytest.raises(ValueError, match="query_scale"):
        NeuralRBEHead(E, v, pop, torch.zeros(2), torch.tensor([1.0, float("nan")]), 4)


def test_linear_embeddings_need_a_training_query():
    with pytest.raises(ValueError, match="at least one training query"):
        fit_linear_embeddings(torch.zeros(0, 2), torch.zeros(0, 5))  # (a torch IndexError)


@pytest.mark.parametrize("offset", [1e8, -3e12])
@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("max_iter", [0, 20])
def test_neural_head_keeps_the_linear_heads_quality_under_a_common_offset(
        offset, standardize, max_iter):
    # regression: the float32 head took relevance 1e8 + O(1) as it was (resolution 8):
    # HitRate@10 0.1 against 0.89 for the linear head, even untrained (max_iter=0)
    from mlpapers.retrieval.rbe import hit_rate

    Q, items, heavy = _heavy_problem()
    shifted = lambda q, i: heavy(q, i) + offset  # noqa: E731
    # (random supports: this is about the head; the selection has its own offset tests
    # in test_rbe_greedy_refresh.py)
    kw = dict(n_support=12, support="random", max_iter=max_iter, eval_every=10,
              mlp_hidden=8, standardize=standardize, random_state=0)
    lin = RelevanceBasedRetriever(shifted, head="linear", **kw).fit(Q[:60], items)
    est = RelevanceBasedRetriever(shifted, head="mlp", **kw).fit(Q[:60], items)
    assert abs(est.head_shift_[1] - offset) < 1.0
    assert est.head_shift_[0] == (0.0 if standardize else est.head_shift_[1])
    truth = heavy(Q[60:], items)
    hits = [hit_rate(truth, m.kneighbors(Q[60:], 10, return_distance=False))
            for m in (lin, est)]
    # (trained, the head fits a fifth fewer queries: +-0.06 from seed to seed)
    assert hits[1] >= hits[0] - (0.05 if max_iter == 0 else 0.1), hits
    P = est.predict(Q[60:])
    assert P.dtype == np.float64
    if max_iter == 0:  # the untrained head is the linear head, to float32 rounding
        # (both are float64 values near the offset: a few of its ulps apart at most,
        # 5e-4 at 3e12, as BLAS kernels round differently from machine to machine)
        np.testing.assert_allclose(P - offset, lin.predict(Q[60:]) - offset,
                                   atol=1e-4 + 4 * np.spacing(abs(offset)))
    if standardize:  # as good as without the offset, with scores in the same units
        ref = RelevanceBasedRetriever(heavy, head="mlp", **kw).fit(Q[:60], items)
        assert (ref.head_shift_ == 0.0).all()
        ref_hit = hit_rate(truth, ref.kneighbors(Q[60:], 10, return_distance=False))
        assert hits[1] >= ref_hit - 0.1
        np.testing.assert_allclose(P - offset, ref.predict(Q[60:]), atol=0.05)


def test_neural_head_keeps_its_fitted_shifts_after_set_params_standardize():
    # regression: the query shift was read from the current standardize parameter:
    # set_params(standardize=False) after fit moved the scores by 2e3
    Q, items, heavy = _heavy_problem()
    for head in ("linear", "mlp"):
        m = RelevanceBasedRetriever(lambda q, i: heavy(q, i) + 1e3, n_support=6, head=head,
                                    max_iter=0).fit(Q[:60], items)
        before = m.predict(Q[60:])
        np.testing.assert_array_equal(m.set_params(standardize=False).predict(Q[60:]), before)


@pytest.mark.parametrize("offset, spread", [(1e300, 1e290), (-1e300, 1e290)])
def test_neural_head_shift_survives_a_spread_beyond_the_float64_square_range(offset, spread):
    # regression: the variance of a spread of 1e290 overflowed (std = inf) and the shift
    # was dropped: float32 targets could not tell the items apart
    Q, items, heavy = _heavy_problem()
    kw = dict(n_support=12, support="random", max_iter=0, random_state=0)
    rel = lambda q, i: heavy(q, i) * spread + offset  # noqa: E731
    lin = RelevanceBasedRetriever(rel, head="linear", **kw).fit(Q[:60], items)
    est = RelevanceBasedRetriever(rel, head="mlp", **kw).fit(Q[:60], items)
    assert est.head_shift_[1] == pytest.approx(offset, rel=1e-6)
    np.testing.assert_array_equal(est.kneighbors(Q[60:], 5, return_distance=False),
                                  lin.kneighbors(Q[60:], 5, return_distance=False))


def test_neural_heads_shift_is_saved_and_a_linear_refit_forgets_it(tmp_path):
    Q, items, heavy = _heavy_problem()
    est = RelevanceBasedRetriever(lambda q, i: heavy(q, i) + 1e8, n_support=6, head="mlp",
                                  max_iter=0).fit(Q[:60], items)
    est.save(tmp_path / "rbe.pt")
    back = RelevanceBasedRetriever.load(tmp_path / "rbe.pt",
                                        relevance_fn=lambda q, i: heavy(q, i) + 1e8,
                                        items=items)
    np.testing.assert_array_equal(back.head_shift_, est.head_shift_)
    np.testing.assert_array_equal(back.predict(Q[60:]), est.predict(Q[60:]))
    assert est.set_params(head="linear").fit(Q[:60], items).head_shift_ is None
