"""The public AMIPS kernels and ``build_faiss_ivf`` as their docstrings promise them:
bad input raises a ``ValueError``/``TypeError`` naming the parameter, before any work
(they failed with torch or faiss C++ traces, or gave silent wrong answers), and valid
input still gives the exact answer."""

import math

import numpy as np
import pytest
import torch

from mlpapers.retrieval.amips import (
    build_faiss_ivf,
    match_rate,
    mips_topk,
    rank_by_key,
    recall_at_k,
    support_function,
)


def _data(n=4, N=6, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(N, d, generator=g)


@pytest.mark.parametrize("call, exc, match", [
    (lambda q, K: mips_topk(q, K, k=0), ValueError, "k must be > 0"),
    (lambda q, K: mips_topk(q, K, k=7), ValueError, "k must be <= the number of keys"),
    (lambda q, K: mips_topk(q, K, k=1.5), TypeError, "k must be an integer"),
    (lambda q, K: mips_topk(q, K, batch_size=0), ValueError, "batch_size must be > 0"),
    (lambda q, K: mips_topk(q, K[:, :2]), ValueError, "same number of features"),
    (lambda q, K: mips_topk(q, K.double()), TypeError, "same dtype"),
    # bool matmul failed inside torch ("addmm_impl_cpu_" not implemented for 'Bool')
    (lambda q, K: mips_topk(q > 0, K > 0), TypeError, "real numbers .* torch.bool"),
    (lambda q, K: support_function(q > 0, K > 0), TypeError, "real numbers"),
    (lambda q, K: mips_topk(q.to(torch.complex64), K.to(torch.complex64)), TypeError,
     "real numbers .* torch.complex64"),
    (lambda q, K: mips_topk(q[0], K), ValueError, r"queries must have shape \(n, d\)"),
    (lambda q, K: support_function(q, K[:0]), ValueError, "keys is empty"),
    (lambda q, K: rank_by_key(q, K, 0), ValueError, "k must be > 0"),
    (lambda q, K: rank_by_key(q, K, 2.0, metric="l2"), TypeError, "k must be an integer"),
    (lambda q, K: rank_by_key(q, K, 9), ValueError, "k must be <= the number of keys"),
])
def test_search_kernels_refuse_bad_input_by_name(call, exc, match):
    q, K = _data()
    with pytest.raises(exc, match=match):
        call(q, K)


def test_search_kernels_still_exact_on_valid_input():
    q, K = _data(n=5, N=40, d=4, seed=1)
    s, i = mips_topk(q, K, k=np.int64(3), batch_size=2)  # numpy integers are integers
    ref = (q.double() @ K.double().T).argsort(dim=1, descending=True)[:, :3]
    assert torch.equal(i, ref)
    assert torch.allclose(s, (q @ K.T).gather(1, ref))
    value, index = support_function(q, K)
    assert torch.equal(index, ref[:, 0])
    assert torch.equal(rank_by_key(q, K, 3), ref)


def test_metrics_refuse_a_negative_rtol_a_float_k_and_a_missing_y_true():
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    # a negative tolerance counted the exact answer as a miss: 0.0, silently
    assert match_rate(None, [0], queries=[[1.0, 0.0]], database=keys) == 1.0
    with pytest.raises(ValueError, match="rtol must be >= 0"):
        match_rate(None, [0], queries=[[1.0, 0.0]], database=keys, rtol=-1.0)
    with pytest.raises(ValueError, match="y_true is required"):
        match_rate(None, [0])
    with pytest.raises(TypeError, match="k must be an integer"):
        recall_at_k([0], [[0, 1]], k=1.5)
    assert recall_at_k([1], [[0, 1]], k=np.int64(2)) == 1.0


def test_metrics_refuse_a_y_true_that_is_not_one_integer_index_per_query():
    y_pred = [[3, 0, 1], [2, 1, 0]]
    # a float y_true was truncated (0.9 read as 0: a hit), a bool one read as 0/1, and
    # an (n, m) one flattened into n m "rows" (an error counting 4 rows for 2 queries)
    with pytest.raises(TypeError, match="y_true must hold integer indices"):
        recall_at_k([0.9, 0.0], y_pred, k=2)
    with pytest.raises(TypeError, match="y_true must hold integer indices"):
        match_rate([True, False], [3, 2])
    with pytest.raises(ValueError, match=r"y_true must have shape \(n,\).*got \(2, 2\)"):
        recall_at_k([[0, 1], [0, 1]], y_pred, k=2)
    # one index per query, as a column or integral floats, still gives the exact answer
    for y_true in ([0, 0], [[0], [0]], np.array([0.0, 0.0])):
        assert recall_at_k(y_true, y_pred, k=2) == 0.5


def test_build_faiss_ivf_refuses_bad_n_lists_and_database():
    pytest.importorskip("faiss")
    keys = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    # n_lists=0 built an empty index silently; 2.5 was truncated to 2; more lists than
    # keys, NaN keys and a 1D database failed with faiss C++ traces
    with pytest.raises(ValueError, match="n_lists must be > 0"):
        build_faiss_ivf(keys, n_lists=0)
    with pytest.raises(TypeError, match="n_lists must be an integer"):
        build_faiss_ivf(keys, n_lists=2.5)
    with pytest.raises(ValueError, match="n_lists must be <= the number of keys"):
        build_faiss_ivf(keys, n_lists=21)
    bad = keys.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="database contains NaN"):
        build_faiss_ivf(bad)
    with pytest.raises(ValueError, match="Expected 2D array"):
        build_faiss_ivf(keys[0])


def test_build_faiss_ivf_with_every_list_probed_is_exact():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((50, 6)).astype(np.float32)
    queries = rng.standard_normal((8, 6)).astype(np.float32)
    index = build_faiss_ivf(torch.from_numpy(keys).requires_grad_(True), n_lists=5)
    index.nprobe = 5
    _, found = index.search(queries, 1)
    assert np.array_equal(found[:, 0], np.argmax(queries @ keys.T, axis=1))


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_build_faiss_ivf_refuses_keys_whose_squares_overflow_float32(metric):
    # faiss's k-means threw "invalid cluster assignment" in C++: the process aborted
    pytest.importorskip("faiss")
    keys = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"database has keys of norm up to 4.69e\+19"):
        build_faiss_ivf(keys * np.float32(1e19), n_lists=10, metric=metric)
    index = build_faiss_ivf(keys * np.float32(1e18), n_lists=10, metric=metric)
    assert index.ntotal == 300


@pytest.mark.parametrize("n, want", [(20, 1), (300, 7), (1600, 40), (10_000, 100)])
def test_build_faiss_ivf_default_lists_give_faiss_its_training_keys(n, want, capfd):
    # int(sqrt(n)) lists left fewer than 39 keys per list below 1521 keys, and faiss
    # printed a warning to stderr that Python cannot silence
    pytest.importorskip("faiss")
    keys = np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)
    index = build_faiss_ivf(keys)
    assert index.nlist == want and "WARNING" not in capfd.readouterr().err


def test_query_sampler_refuses_non_finite_anchors():
    from mlpapers.retrieval.amips import GaussianMixtureQuerySampler

    anchors = np.eye(3)
    anchors[1, 2] = np.nan  # every query drawn near it was NaN, silently
    with pytest.raises(ValueError, match="anchors contains NaN"):
        GaussianMixtureQuerySampler(anchors, noise=0.1)
    q = GaussianMixtureQuerySampler(np.eye(3), noise=0.1)(50, np.random.default_rng(0))
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_integer_searches_do_not_wrap_around(dtype):
    # int32 products of 50000 wrapped to -1794967296 and the best key came last; the
    # reference is the search of the same values in float64 (exact at these sizes)
    from mlpapers.retrieval.amips import mips_topk, rank_by_key, support_function

    info = torch.iinfo(dtype)
    big = int(math.isqrt(info.max)) + 2  # big * big > the dtype's max
    q = torch.tensor([[big, 1]], dtype=dtype)
    keys = torch.tensor([[1, 1], [big, 0], [0, 1]], dtype=dtype)
    ref_s, ref_i = mips_topk(q.double(), keys.double(), 3)
    s, i = mips_topk(q, keys, 3)
    assert torch.equal(i, ref_i) and i[0, 0] == 1
    assert torch.equal(s.double(), ref_s)
    assert float(support_function(q, keys)[0][0]) == float(ref_s[0, 0])
    assert torch.equal(rank_by_key(q, keys, 3), ref_i)
    # products in range keep the input's dtype
    small = mips_topk(torch.tensor([[3, 1]], dtype=dtype), torch.tensor([[1, 1], [2, 0]],
                                                                     dtype=dtype), 2)
    assert small[0].dtype == dtype and small[1].tolist() == [[1, 0]]


def test_metrics_refuse_indices_that_are_not_finite_int64_values():
    # inf and floats beyond int64 were cast to one same int64 and counted as hits
    from mlpapers.retrieval.amips import match_rate, mean_reciprocal_rank, recall_at_k

    for y_true, y_pred in (([1e19], [2e19]), ([np.inf], [-np.inf]), ([0], [np.nan])):
        with pytest.raises(TypeError, match="must hold integer indices"):
            match_rate(y_true, y_pred)
    with pytest.raises(TypeError, match="y_pred must hold integer indices"):
        recall_at_k([0], [[-np.inf]], 1)
    for metric in (match_rate, mean_reciprocal_rank):
        with pytest.raises(ValueError, match="y_pred has no column"):
            metric([0], np.zeros((1, 0), dtype=int))
    assert match_rate([3.0], [3]) == 1.0  # integral floats stay accepted


@pytest.mark.parametrize("queries, database, name", [
    ([[1 + 0j, 9j]], np.eye(2), "queries"),  # the imaginary part was dropped: a hit
    ([[1.0]], [["a"]], "database"),
    ([[1.0, 0.0]], np.eye(2, dtype=bool), "database"),
])
def test_tie_aware_metrics_refuse_non_real_queries_and_databases(queries, database, name):
    from mlpapers.retrieval.amips import match_rate

    with pytest.raises(TypeError, match=name):
        match_rate(None, [0], queries=queries, database=database)


@pytest.mark.parametrize("n_steps, warmup", [(10, 0.95), (3, 0.9), (20, 0.99), (10, 0.2)])
def test_the_last_update_uses_the_end_learning_rate_whatever_the_warmup(n_steps, warmup):
    # a warm-up rounded to every step never decayed: the last update used the peak lr
    from mlpapers.retrieval import AmortizedMIPS

    keys = np.random.default_rng(0).standard_normal((20, 3))
    model = AmortizedMIPS(depth=1, hidden_dim=8, n_steps=n_steps, batch_size=8,
                          warmup=warmup, random_state=0).fit(keys)
    assert model.history_[-1]["step"] == n_steps - 1  # (0-based: the last step)
    assert model.history_[-1]["lr"] == pytest.approx(model.lr * model.end_lr_ratio, rel=1e-12)


def test_a_sampler_that_returns_zero_rows_is_refused_like_an_array():
    # an array with a zero row was refused, a sampler's zero rows were trained on (every
    # key ties there, so the target was key 0)
    from mlpapers.retrieval import AmortizedMIPS

    keys = np.random.default_rng(0).standard_normal((20, 3))

    def sampler(n, rng):
        q = rng.standard_normal((n, 3))
        q[0] = 0.0
        return q

    model = AmortizedMIPS(depth=1, hidden_dim=8, n_steps=3, batch_size=8, random_state=0)
    with pytest.raises(ValueError, match="the query sampler returned rows with zero norm"):
        model.fit(keys, queries=sampler)
    with pytest.raises(ValueError, match="queries contains rows with zero norm"):
        model.fit(keys, queries=np.vstack([np.zeros(3), np.ones(3)]))
    # tiny but nonzero rows stay accepted (their float32 norm underflows)
    model.fit(keys, queries=lambda n, rng: np.full((n, 3), 1e-23))


@pytest.mark.filterwarnings("ignore:X does not have valid feature names")  # (predict)
def test_training_queries_must_name_the_keys_columns_in_order():
    # regression: DataFrame queries were read by position: columns (c, b, a) against keys
    # (a, b, c) trained on swapped coordinates without a word
    pd = pytest.importorskip("pandas")
    from mlpapers.retrieval.amips import AmortizedMIPS

    rng = np.random.default_rng(0)
    K = pd.DataFrame(rng.standard_normal((50, 3)), columns=list("abc"))
    Q = pd.DataFrame(rng.standard_normal((40, 3)), columns=list("cba"))
    kw = dict(n_steps=3, depth=2, random_state=0)
    with pytest.raises(ValueError, match="feature names of queries should match"):
        AmortizedMIPS(**kw).fit(K, queries=Q)

    def sampler(n, rng):
        return Q.iloc[rng.integers(len(Q), size=n)]
    with pytest.raises(ValueError, match="feature names of queries should match"):
        AmortizedMIPS(**kw).fit(K, queries=sampler)
    # named queries for unnamed keys warn, naming the argument (sklearn's check said "X")
    with pytest.warns(UserWarning, match="^queries has feature names, but AmortizedMIPS"):
        AmortizedMIPS(**kw).fit(K.to_numpy(), queries=Q)
    # the same columns in the keys' order train as the array does
    a = AmortizedMIPS(**kw).fit(K, queries=Q[list("abc")])
    b = AmortizedMIPS(**kw).fit(K, queries=Q[list("abc")].to_numpy())
    np.testing.assert_array_equal(a.predict(K.to_numpy()[:5]), b.predict(K.to_numpy()[:5]))


def test_float32_keys_are_kept_without_a_copy_as_documented():
    # database_ documents the view (no second copy of a large database); other dtypes
    # are converted, so they never alias the caller's array
    from mlpapers.retrieval.amips import AmortizedMIPS, ExactMIPS

    keys = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    for est in (ExactMIPS(), AmortizedMIPS(n_steps=2, depth=2, random_state=0)):
        assert np.shares_memory(est.fit(keys).database_, keys)
        assert not np.shares_memory(est.fit(keys.astype(np.float64)).database_, keys)
