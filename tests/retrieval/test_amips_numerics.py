"""Numerical robustness of exact and amortized MIPS: scale, overflow, underflow.

References are float64 brute-force searches written from the definition on the
float32 values the estimators store.
"""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from torch.utils._python_dispatch import TorchDispatchMode

from mlpapers.retrieval import AmortizedMIPS, ExactMIPS, match_rate, mips_topk
from mlpapers.retrieval.amips._kernels import _topk_lowest_index, gather_dot

FAST = dict(depth=2, hidden_dim=16, n_steps=30, batch_size=32, random_state=0)


def _brute(Q, K, k):
    """Top-k of float64 inner products, ties by lowest index (stable sort)."""
    S = np.asarray(Q, np.float64) @ np.asarray(K, np.float64).T
    idx = np.argsort(-S, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(S, idx, 1), idx


@pytest.mark.parametrize("scale", [2.0**-75, 2.0**-62, 2.0**60])
@pytest.mark.parametrize("k", [1, 4])
def test_exact_search_is_exact_whatever_the_scale(scale, k):
    # regression: products below ~1e-38 were subnormal or flushed to 0 in float32, so
    # keys and queries of norm ~2**-75 tied everywhere and index 0 came back
    rng = np.random.default_rng(0)
    K = (rng.standard_normal((30, 5)) * scale).astype(np.float32)
    Q = (rng.standard_normal((12, 5)) * scale).astype(np.float32)
    idx = ExactMIPS(batch_size=5).fit(K).kneighbors(Q, k, return_distance=False)
    np.testing.assert_array_equal(idx, _brute(Q, K, k)[1])
    np.testing.assert_array_equal(mips_topk(torch.from_numpy(Q), torch.from_numpy(K), k)[1],
                                  idx)


def test_mixed_row_scales_are_ranked_exactly():
    # each key and query row has its own scale over 60 orders of magnitude
    rng = np.random.default_rng(1)
    K = rng.standard_normal((40, 4)) * 10.0 ** rng.uniform(-30, 15, (40, 1))
    Q = rng.standard_normal((25, 4)) * 10.0 ** rng.uniform(-30, 15, (25, 1))
    K, Q = K.astype(np.float32), Q.astype(np.float32)
    idx = ExactMIPS().fit(K).kneighbors(Q, 3, return_distance=False)
    best, _ = _brute(Q, K, 3)
    got = np.take_along_axis(np.asarray(Q, np.float64) @ np.asarray(K, np.float64).T, idx, 1)
    np.testing.assert_allclose(got, best, rtol=1e-5)


def test_an_overflowed_product_never_hides_the_maximum():
    # regression: 1e20 * 3e18 + 1e20 * 3e18 - 1e20 * 4e18 = 2e38 fits float32, but a
    # partial product overflowed to -inf: the true maximum was ranked last and index 0
    # returned without an error (or, when the sum came out NaN, a needless error)
    K = np.array([[1.0, 0.0, 0.0], [3e18, 3e18, -4e18], [-1.0, 0.0, 0.0]], np.float32)
    q = np.full((1, 3), 1e20, np.float32)
    exact = ExactMIPS().fit(K)
    assert exact.predict(q)[0] == 1
    sims, idx = exact.kneighbors(q, 3)
    ref_s, ref_i = _brute(q, K, 3)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sims, ref_s, rtol=1e-6)
    # the similarities of AmortizedMIPS are gathered products: no NaN either
    got = gather_dot(torch.from_numpy(K), torch.tensor([[1, 0]]), torch.from_numpy(q))
    np.testing.assert_allclose(got.numpy(), ref_s[:, :2], rtol=1e-6)


def test_products_beyond_float32_raise_in_exact_search():
    # the documented limit: similarities that do not fit float32 cannot be returned
    rng = np.random.default_rng(0)
    K = rng.standard_normal((6, 3)).astype(np.float32) * 1e20
    with pytest.raises(ValueError, match="overflow float32"):
        ExactMIPS().fit(K).kneighbors(K, 2)
    # the kernel still ranks them exactly, with infinite scores
    s, i = mips_topk(torch.from_numpy(K), torch.from_numpy(K), 2)
    np.testing.assert_array_equal(i.numpy(), _brute(K, K, 2)[1])
    assert bool(torch.isinf(s).any())


@pytest.mark.parametrize("n_candidates", [1, 3])
@pytest.mark.parametrize("center_keys", [False, True])
def test_amortized_similarities_beyond_float32_raise_as_in_exact_search(n_candidates,
                                                                       center_keys):
    """Keys and queries of norm ~1e20: products ~1e40 cannot be returned in float32.
    ExactMIPS raises a ValueError; AmortizedMIPS.kneighbors returned inf (with
    n_candidates > 1 with only numpy's "overflow encountered in cast" warning, silently
    otherwise). It now raises the same error; the indices (return_distance=False) and
    predict, which need no float32 similarity, still answer."""
    rng = np.random.default_rng(0)
    K = (rng.standard_normal((8, 3)) * 1e20).astype(np.float32)
    m = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=2, random_state=0,
                      n_candidates=n_candidates, center_keys=center_keys).fit(K)
    with pytest.raises(ValueError, match="overflow float32"):
        ExactMIPS().fit(K).kneighbors(K, 2)
    with pytest.raises(ValueError, match="overflow float32"):
        m.kneighbors(K, 2)
    mixed = K / np.float32(1e20)  # products ~1e20 fit float32 ...
    mixed[0] = K[0]               # ... but one query's do not: still an error
    with pytest.raises(ValueError, match="overflow float32"):
        m.kneighbors(mixed, 2)
    idx = m.kneighbors(K, 2, return_distance=False)
    assert idx.shape == (8, 2) and idx.dtype == np.int64
    pred = m.predict(K)
    if n_candidates == 3:  # re-ranked in float64: the best of the first 3 by true product
        P = np.asarray(K, np.float64) @ np.asarray(K, np.float64).T  # finite in float64
        cand = clone(m).set_params(n_candidates=1).fit(K).kneighbors(
            K, 3, return_distance=False)
        best = cand[np.arange(8), np.take_along_axis(P, cand, 1).argmax(1)]
        np.testing.assert_array_equal(pred, best)
    # the same data scaled into float32 range (2**-40 each side): similarities come back
    small = K * np.float32(2.0**-40)
    sims, idx = clone(m).fit(small).kneighbors(small, 2)
    P = small.astype(np.float64) @ small.astype(np.float64).T
    np.testing.assert_allclose(sims, np.take_along_axis(P, idx, 1), rtol=1e-6)


def test_topk_keeps_k_columns_with_nan_scores():
    # regression: NaN (inf - inf) ranked first by topk was not counted above the k-th
    # value, so with ties at the k-th place the reshape to k columns failed
    nan = float("nan")
    sim = torch.tensor([[1.0, nan, 5.0, nan, 5.0, 5.0]])
    s, i = _topk_lowest_index(sim, 3)
    assert i.tolist() == [[1, 3, 2]]
    assert bool(torch.isnan(s[0, :2]).all()) and s[0, 2] == 5.0


@pytest.mark.parametrize("block", [1, 7, 2**22])
def test_topk_of_crowded_rows_in_blocks_is_the_stable_sort(monkeypatch, block):
    # crowded rows (ties straddling the k-th place) are resolved in blocks of rows whose
    # copies stay within BLOCK_ELEMENTS; any blocking gives the stable-sort order
    from mlpapers.retrieval.amips import _kernels

    monkeypatch.setattr(_kernels, "BLOCK_ELEMENTS", block * 50)
    g = torch.Generator().manual_seed(0)
    sim = torch.randint(0, 4, (23, 50), generator=g).float()  # many ties
    s, i = _topk_lowest_index(sim, 5)
    ref = torch.from_numpy(np.argsort(-sim.numpy(), axis=1, kind="stable")[:, :5])
    assert torch.equal(i, ref)
    assert torch.equal(s, sim.gather(1, ref))


@pytest.mark.parametrize("kq", [(1e-160, 1e-160), (1e160, 1.0), (1e200, 1e100),
                                (1e-300, 1e-300)])
def test_tie_aware_match_rate_at_extreme_float64_scales(kq):
    # regression: the products underflowed (everything tied) or the norms in the
    # tolerance overflowed (an infinite tolerance): wrong answers counted as hits
    sk, sq = kq
    rng = np.random.default_rng(0)
    K, Q = rng.standard_normal((30, 4)), rng.standard_normal((50, 4))
    truth = np.argmax(Q @ K.T, axis=1)
    wrong = np.argmin(Q @ K.T, axis=1)
    assert match_rate(None, truth, queries=Q * sq, database=K * sk) == 1.0
    assert match_rate(None, wrong, queries=Q * sq, database=K * sk) == 0.0


def test_tie_aware_match_rate_scales_each_query_on_its_own():
    """Queries of very different norms in one call: one common unit (that of the
    largest query) underflowed the products of the smallest to 0, all tied, so a wrong
    answer counted as a hit (mutation audit: rows=False survived)."""
    rng = np.random.default_rng(0)
    K, Q = rng.standard_normal((30, 4)), rng.standard_normal((50, 4))
    Q[::2] *= 1e-200
    Q[1::2] *= 1e200
    wrong = np.argmin(Q @ K.T, axis=1)
    truth = np.argmax(Q @ K.T, axis=1)
    assert match_rate(None, truth, queries=Q, database=K) == 1.0
    assert match_rate(None, wrong, queries=Q, database=K) == 0.0


@pytest.mark.parametrize("query_scale", [2.0**-100, 2.0**66])
def test_amortized_search_trains_on_tiny_and_huge_queries(query_scale):
    # regression: the float32 norm of a query of 1e-30 underflows, so the queries were
    # rejected as zero; for 1e20 it overflowed in the augmentation of the first batch
    # (NaN units: training in the data's units, match rate 0)
    rng = np.random.default_rng(0)
    keys, Q = rng.standard_normal((20, 3)), rng.standard_normal((60, 3))
    ref = AmortizedMIPS(**FAST).fit(keys, queries=Q)
    model = AmortizedMIPS(**FAST).fit(keys, queries=Q * query_scale)
    assert model.query_scale_ == ref.query_scale_ * query_scale
    np.testing.assert_array_equal(model.predict(Q * query_scale), ref.predict(Q))
    np.testing.assert_array_equal(model.kneighbors(Q * query_scale, 4)[1],
                                  ref.kneighbors(Q, 4)[1])
    assert model.score(Q * query_scale) == ref.score(Q)


def test_amortized_search_ranks_subnormal_keys():
    # regression: ranking by <k_hat / s**2, k_j> with the key unit s = 2**-138
    # overflowed float32 (inf, then NaN scores and arbitrary answers)
    rng = np.random.default_rng(0)
    keys = rng.integers(-8, 9, (20, 3)).astype(np.float64)
    keys[np.abs(keys).sum(1) == 0, 0] = 1.0
    Q = rng.standard_normal((60, 3))
    ref = AmortizedMIPS(**FAST).fit(keys, queries=Q)
    tiny = keys * 2.0**-140  # exact float32 subnormals
    model = AmortizedMIPS(**FAST).fit(tiny, queries=Q)
    assert model.key_scale_ == ref.key_scale_ * 2.0**-140
    np.testing.assert_array_equal(model.predict(Q), ref.predict(Q))
    np.testing.assert_array_equal(model.kneighbors(Q, 4)[1], ref.kneighbors(Q, 4)[1])


def test_zero_queries_are_still_rejected():
    keys = np.eye(3)
    model = AmortizedMIPS(**dict(FAST, n_steps=2)).fit(keys)
    with pytest.raises(ValueError, match="zero norm"):
        model.predict([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="zero norm"):
        AmortizedMIPS(**dict(FAST, n_steps=2)).fit(keys, queries=[[0.0, 0.0, 0.0]])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32])
def test_low_precision_and_integer_inputs_match_float64_search(dtype):
    # inputs are converted to float32 (exact for these values) before the search
    rng = np.random.default_rng(0)
    K = torch.from_numpy(np.round(rng.standard_normal((30, 4)) * 4)).to(dtype)
    Q = torch.from_numpy(np.round(rng.standard_normal((10, 4)) * 4)).to(dtype)
    idx = ExactMIPS().fit(K).kneighbors(Q, 30, return_distance=False)
    np.testing.assert_array_equal(idx, _brute(Q.double().numpy(), K.double().numpy(), 30)[1])


def test_results_do_not_depend_on_the_chunking(monkeypatch):
    # chunk bounds around the score budget (CHUNK_SCORES // n_keys queries per chunk)
    import mlpapers.retrieval.amips._kernels as kernels

    rng = np.random.default_rng(0)
    K = rng.standard_normal((40, 6)).astype(np.float32)
    Q = rng.standard_normal((9, 6)).astype(np.float32)
    # a row searched again (rescaled) inside a chunk: its products ~2**-140 are
    # subnormal in float32 (2**-80 never reached the rescue)
    Q[3] *= 2.0**-140
    ref = _brute(Q, K, 7)[1]
    calls = []
    rescue = kernels._rescaled_topk
    monkeypatch.setattr(kernels, "_rescaled_topk",
                        lambda q, *a: calls.append(len(q)) or rescue(q, *a))
    for budget in (1, 39, 40, 41, 80, 81):
        monkeypatch.setattr(kernels, "CHUNK_SCORES", budget)
        for bs in (1, 2, 8, 9):
            calls.clear()
            idx = ExactMIPS(batch_size=bs).fit(K).kneighbors(Q, 7, return_distance=False)
            np.testing.assert_array_equal(idx, ref)
            assert calls == [1]  # row 3, and only it, was rescued


def test_float64_keys_closer_than_float32_rounding_tie_as_documented():
    # the documented limit: the database is stored in float32, so these two keys are
    # equal there and the lowest index wins, although key 1 is larger in float64
    keys = np.array([[1.0, 0.0], [1.0 + 1e-9, 0.0], [0.0, 1.0]])
    exact = ExactMIPS().fit(keys)
    assert np.argmax(keys @ [1.0, 0.0]) == 1
    assert exact.predict([[1.0, 0.0]])[0] == 0
    assert exact.kneighbors([[1.0, 0.0]], 2, return_distance=False).tolist() == [[0, 1]]


def test_similarities_below_the_float32_range_flush_as_documented():
    # indices exact (tested above), similarities rounded to float32: 2**-160 -> 0
    keys = np.array([[2.0**-80, 0.0], [0.0, 2.0**-80]])
    sims, idx = ExactMIPS().fit(keys).kneighbors([[0.0, 2.0**-80]], 2)
    assert idx.tolist() == [[1, 0]]
    assert sims.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("scale", [2.0**-90, 1.0, 2.0**70])
def test_l2_ranking_by_predicted_key_at_any_scale(scale):
    # regression: ||k_j||^2 of the augmented keys overflowed float32 for keys of 1e21
    # and underflowed for 1e-27 (2% and 10% of the ranks right)
    from mlpapers.retrieval import rank_by_key

    rng = np.random.default_rng(0)
    K, H = rng.standard_normal((30, 4)), rng.standard_normal((10, 4))
    K32, H32 = (K * scale).astype(np.float32), (H * scale).astype(np.float32)
    d2 = ((H32[:, None].astype(np.float64) - K32[None].astype(np.float64)) ** 2).sum(-1)
    ref = np.argsort(d2, axis=1, kind="stable")[:, :5]
    idx = rank_by_key(torch.from_numpy(H32), torch.from_numpy(K32), 5, metric="l2")
    np.testing.assert_array_equal(idx.numpy(), ref)


class _Recorder(TorchDispatchMode):
    """Dtypes and sizes of the outputs of every torch op run under it."""

    def __init__(self):
        super().__init__()
        self.outs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.outs.append((t.dtype, t.numel()))
        return out


def _count_rescues(monkeypatch):
    import mlpapers.retrieval.amips._kernels as kernels

    calls = []
    rescue = kernels._rescaled_topk
    monkeypatch.setattr(kernels, "_rescaled_topk",
                        lambda q, *a: calls.append(len(q)) or rescue(q, *a))
    return calls


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_tensors_are_searched_as_before(dtype):
    # regression: torch.finfo() of an integer dtype raised in the rescue thresholds
    from mlpapers.retrieval import rank_by_key, support_function

    g = torch.Generator().manual_seed(0)
    K = torch.randint(-3, 4, (20, 4), generator=g, dtype=dtype)
    Q = torch.randint(-3, 4, (6, 4), generator=g, dtype=dtype)
    ref_s, ref_i = _brute(Q.numpy(), K.numpy(), 5)
    s, i = mips_topk(Q, K, 5)
    assert s.dtype == dtype
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_array_equal(s.numpy(), ref_s)
    v, a = support_function(Q, K)
    np.testing.assert_array_equal(a.numpy(), ref_i[:, 0])
    np.testing.assert_array_equal(v.numpy(), ref_s[:, 0])
    np.testing.assert_array_equal(rank_by_key(Q, K, 3).numpy(), ref_i[:, :3])
    # the l2 ranking too: nearest keys, ties to the lower index (it failed with a matmul
    # of mixed dtypes: the -||k||^2 / 2 column is not an integer)
    d2 = ((Q.numpy()[:, None, :] - K.numpy()[None, :, :]).astype(np.int64) ** 2).sum(-1)
    np.testing.assert_array_equal(rank_by_key(Q, K, 3, metric="l2").numpy(),
                                  np.argsort(d2, axis=1, kind="stable")[:, :3])


def _sparse_cases():
    rng = np.random.default_rng(0)
    sparse = ((rng.random((300, 8)) < 0.2) * rng.random((300, 8))).astype(np.float32)
    neg = -np.abs(rng.standard_normal((20, 8))).astype(np.float32)
    eye = np.eye(8, dtype=np.float32)
    onehot_k, onehot_q = eye[rng.integers(0, 8, 300)], eye[rng.integers(0, 8, 20)]
    gauss = rng.standard_normal((300, 8)).astype(np.float32)
    gauss[17] = 0.0
    zero_q = rng.standard_normal((20, 8)).astype(np.float32)
    zero_q[::3] = 0.0
    return [(neg, sparse, 10), (onehot_q, onehot_k, 60), (gauss[:20], gauss, 300),
            (zero_q, gauss, 5)]


@pytest.mark.parametrize("case", range(4))
def test_exact_zero_products_are_not_searched_twice(case, monkeypatch):
    # regression: top-k lists holding genuine exact zeros (sparse non-negative keys and
    # negative queries, one-hot data with k above the matches, a zero key with k=N,
    # zero queries) were all searched again (2x the cost), though no rescaling
    # changes an exact zero: a rescue is needed only where a product can underflow
    Q, K, k = _sparse_cases()[case]
    calls = _count_rescues(monkeypatch)
    s, i = mips_topk(torch.from_numpy(Q), torch.from_numpy(K), k)
    ref_s, ref_i = _brute(Q, K, k)
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_allclose(s.numpy(), ref_s, rtol=1e-6, atol=1e-6)
    assert calls == []
    exact = ExactMIPS().fit(K)
    np.testing.assert_array_equal(exact.kneighbors(Q, k, return_distance=False), ref_i)
    assert calls == []


def test_underflowing_products_of_sparse_data_are_still_rescued(monkeypatch):
    # the other side of the criterion: nonzero products below the float32 normal range
    rng = np.random.default_rng(1)
    K = ((rng.random((50, 6)) < 0.3) * rng.random((50, 6)) * 2.0**-70).astype(np.float32)
    Q = (-np.abs(rng.standard_normal((8, 6))) * 2.0**-70).astype(np.float32)
    Q[:, 0] = 2.0**-70  # a few positive products of ~2**-140 (subnormal in float32)
    calls = _count_rescues(monkeypatch)
    i = mips_topk(torch.from_numpy(Q), torch.from_numpy(K), 4)[1]
    np.testing.assert_array_equal(i.numpy(), _brute(Q, K, 4)[1])
    assert sum(calls) == 8


@pytest.mark.parametrize("key_scale", [1.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_are_searched_once_as_before(dtype, key_scale, monkeypatch):
    # regression: the thresholds came from float16's own range (2**-1 and 2**7), so
    # every row of ordinary unit-norm data was searched twice; the results are those
    # of the plain search in the input dtype
    from mlpapers.retrieval.amips._kernels import _topk_rows

    g = torch.Generator().manual_seed(0)
    unit = torch.nn.functional.normalize
    K = (unit(torch.randn(400, 384, generator=g), dim=1) * key_scale).to(dtype)
    Q = unit(torch.randn(30, 384, generator=g), dim=1).to(dtype)
    calls = _count_rescues(monkeypatch)
    for k in (1, 10):
        s, i = mips_topk(Q, K, k)
        ref_s, ref_i = _topk_rows(Q @ K.T, k)
        assert s.dtype == dtype
        assert torch.equal(i, ref_i) and torch.equal(s, ref_s)
    assert calls == []


def test_float16_products_below_its_range_are_rescued_in_float32(monkeypatch):
    # products ~2**-24 are subnormal or 0 in float16: searched again in float32, where
    # the products of float16 values are exact
    rng = np.random.default_rng(2)
    K = torch.from_numpy(rng.standard_normal((40, 4)) * 2.0**-12).half()
    Q = torch.from_numpy(rng.standard_normal((6, 4)) * 2.0**-12).half()
    calls = _count_rescues(monkeypatch)
    s, i = mips_topk(Q, K, 3)
    assert s.dtype == torch.float16 and sum(calls) == 6
    np.testing.assert_array_equal(i.numpy(), _brute(Q.double().numpy(), K.double().numpy(), 3)[1])


def test_the_rescue_of_float32_rows_needs_no_float64():
    # MPS has no float64: the exponents of the rescue are small integers, held in float32
    rng = np.random.default_rng(3)
    K = torch.from_numpy((rng.standard_normal((30, 5)) * 2.0**-75).astype(np.float32))
    Q = torch.from_numpy((rng.standard_normal((7, 5)) * 2.0**-75).astype(np.float32))
    with _Recorder() as rec:
        i = mips_topk(Q, K, 3)[1]
    np.testing.assert_array_equal(i.numpy(), _brute(Q.numpy(), K.numpy(), 3)[1])
    assert {dt for dt, _ in rec.outs if dt.is_floating_point} == {torch.float32}


def test_gather_dot_recomputes_overflowed_rows_in_bounded_chunks(monkeypatch):
    # regression: when every row overflowed, the float64 recompute gathered all
    # n x k x d keys at once; it now runs in the chunks of the float32 pass
    import mlpapers.retrieval.amips._kernels as kernels

    rng = np.random.default_rng(4)
    # 3e38 + 3e38 - 4e38 = 2e38: every row's partial sums overflow float32
    K = np.stack([rng.uniform(2.9, 3.1, 50), rng.uniform(2.9, 3.1, 50),
                  rng.uniform(-4.1, -3.9, 50)], 1).astype(np.float32) * np.float32(1e18)
    Q = rng.uniform(0.99, 1.01, (40, 3)).astype(np.float32) * np.float32(1e20)
    idx = torch.from_numpy(rng.integers(0, 50, (40, 3)))
    budget = 36  # 4 queries (4 x 3 x 3 gathered values) per chunk
    monkeypatch.setattr(kernels, "CHUNK_SCORES", budget)
    with _Recorder() as rec:
        out = gather_dot(torch.from_numpy(K), idx, torch.from_numpy(Q))
    ref = np.einsum("nkd,nd->nk", K.astype(np.float64)[idx.numpy()], Q.astype(np.float64))
    assert np.isfinite(ref.astype(np.float32)).all()
    np.testing.assert_allclose(out.numpy(), ref.astype(np.float32), rtol=1e-6)
    sizes = [n for dt, n in rec.outs if dt == torch.float64]
    assert sizes and max(sizes) <= budget


def test_predict_does_not_rescan_the_database(monkeypatch):
    # regression: each predict recomputed max|k_ij| of the keys (two passes over the
    # database, one more for "l2"): a single-query predict cost 3x the search
    rng = np.random.default_rng(5)
    K = rng.standard_normal((200, 4)).astype(np.float32)
    Q = rng.standard_normal((5, 4)).astype(np.float32)
    scans = []

    def spy(name, orig):
        def f(x, *a, **kw):
            if isinstance(x, torch.Tensor) and x.ndim == 2 and x.shape[0] == 200 \
                    and x.shape[1] >= 4:  # the keys (200, 4), or the "l2" ones (200, 5)
                scans.append(name)
            return orig(x, *a, **kw)
        return f

    for retrieval in ("ip", "l2"):
        est = AmortizedMIPS(**dict(FAST, n_steps=3), retrieval=retrieval).fit(K, queries=Q)
        exact = ExactMIPS().fit(K)
        with monkeypatch.context() as m:
            m.setattr(torch, "aminmax", spy("aminmax", torch.aminmax))
            m.setattr(torch.Tensor, "max", spy("max", torch.Tensor.max))
            m.setattr(torch.Tensor, "min", spy("min", torch.Tensor.min))
            est.predict(Q[:1])
            est.kneighbors(Q, 3)
            exact.predict(Q[:1])
        assert scans == []


@pytest.mark.parametrize("arch", ["keynet", "supportnet"])
def test_value_at_large_but_representable_scales_is_finite_and_matches_float64(arch):
    """Keys and queries of ~1e19: the key and query units are 2**64 each, and their
    product 2**128 alone overflows float32 although every estimate (~1e38) fits. value
    returned inf; it now applies the units one at a time and equals the float64
    rescaling of the network's estimate (an overflow proper raises, as kneighbors)."""
    rng = np.random.default_rng(0)
    K = rng.standard_normal((10, 3)) * 1e19
    Qtr, Q = rng.standard_normal((50, 3)) * 1e19, rng.standard_normal((5, 3)) * 1e19
    m = AmortizedMIPS(arch=arch, depth=2, hidden_dim=8, n_steps=3, random_state=0).fit(
        K, queries=Qtr)
    q = torch.as_tensor(Q, dtype=torch.float32) / m.query_scale_
    with torch.no_grad():
        raw = m.model_.score_and_key(q)[0].double().numpy()
    expected = raw * float(m.key_scale_) * float(m.query_scale_)
    if np.abs(expected).max() < np.finfo(np.float32).max:  # keynet here: about 1e38
        np.testing.assert_allclose(m.value(Q), expected, rtol=1e-6)
    else:  # this short supportnet fit estimates beyond float32: a clear error, not inf
        with pytest.raises(ValueError, match="overflow float32"):
            m.value(Q)
    with pytest.raises(ValueError, match="overflow float32"):
        m.value(Q * 1e3)


def test_value_of_tiny_keys_is_one_rounding_of_the_rescaled_estimate():
    """Keys of 1e-42 with queries of 1e36: the units multiply to a float32 number, so
    value rescales in one multiplication (bit for bit the float64 product rounded
    once); applying the tiny unit first lost bits below float32's normal range."""
    rng = np.random.default_rng(0)
    K = np.clip(rng.standard_normal((10, 3)), -3, 3) * 1e-42
    Qtr, Q = rng.standard_normal((50, 3)) * 1e36, rng.standard_normal((6, 3)) * 1e36
    m = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, random_state=0).fit(K, queries=Qtr)
    q = torch.as_tensor(Q, dtype=torch.float32) / m.query_scale_
    with torch.no_grad():
        raw = m.model_.score_and_key(q)[0].double().numpy()
    expected = (raw * (float(m.key_scale_) * float(m.query_scale_))).astype(np.float32)
    np.testing.assert_array_equal(m.value(Q), expected)


def test_keys_near_the_float32_maximum_get_a_finite_unit_and_exact_answers():
    """Keys of RMS norm ~3e38 rounded their unit up to 2**128 (inf in float32): every
    scaled key became 0 and predict answered key 0 for every query (predict_key was
    NaN). The unit is capped at 2**127."""
    rng = np.random.default_rng(0)
    K = np.sign(rng.standard_normal((10, 3))) * 2e38
    K[:, 0] *= rng.uniform(0.5, 1.0, 10)
    Q = rng.standard_normal((6, 3))
    m = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, random_state=0, n_candidates=10)
    m.fit(K.astype(np.float32))
    assert m.key_scale_ == 2.0**127                      # finite in float32
    best = (Q @ K.astype(np.float32).astype(np.float64).T).argmax(1)   # all keys re-ranked
    np.testing.assert_array_equal(m.predict(Q), best)


def test_a_database_of_subnormal_keys_gets_a_nonzero_unit_and_finite_values():
    """Keys of RMS norm below the smallest float32 subnormal rounded their unit to
    2**-150, which is 0 in float32: the scaled keys were NaN and value returned NaN
    silently. The unit is floored at 2**-149."""
    rng = np.random.default_rng(0)
    Z = np.zeros((40, 4), np.float32)
    Z[0, 0] = 1e-45
    Q = rng.standard_normal((30, 4)).astype(np.float32)
    m = AmortizedMIPS(n_steps=5, batch_size=16, random_state=0).fit(Z, queries=Q)
    assert np.float32(m.key_scale_) > 0
    assert np.isfinite(m.value(Q[:3])).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_l2_ranking_of_half_precision_keys_beyond_sqrt_of_the_float16_range(dtype):
    from mlpapers.retrieval.amips import rank_by_key

    # regression: -||k||^2 / 2 was formed in float16, inf from ||k|| = 362 on: every key
    # tied and the ranking was the index order
    g = torch.Generator().manual_seed(0)
    K = (torch.randn(50, 4, generator=g) * 500).to(dtype)
    q = (torch.randn(6, 4, generator=g) * 500).to(dtype)
    ref = torch.cdist(q.double(), K.double()).argsort(dim=1, stable=True)[:, :5]
    torch.testing.assert_close(rank_by_key(q, K, 5, metric="l2"), ref)
