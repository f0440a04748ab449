"""Retrieval estimators in the user's ecosystem: pandas, model selection, memory bounds."""

import warnings
import weakref

import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV
from torch.overrides import TorchFunctionMode

from mlpapers.datasets._relevance import make_relevance_problem
from mlpapers.retrieval import (
    AdaCURRetriever,
    AmortizedMIPS,
    AnnCURRetriever,
    ExactMIPS,
    RelevanceBasedRetriever,
)
from mlpapers.retrieval.amips import _kernels


@pytest.fixture(scope="module")
def relevance():
    Q, I, f = make_relevance_problem(120, 50, random_state=0)
    return Q, I, f


def test_score_on_a_dataframe_emits_no_feature_name_warning():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    cols = [f"f{j}" for j in range(4)]
    keys = pd.DataFrame(rng.standard_normal((30, 4)), columns=cols)
    queries = pd.DataFrame(rng.standard_normal((12, 4)), columns=cols)
    models = [ExactMIPS().fit(keys),
              AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, batch_size=16,
                            n_candidates=2, random_state=0).fit(keys)]
    for model in models:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "X does not have valid feature names"
            score = model.score(queries)
            pred = model.predict(queries)
        assert 0.0 <= score <= 1.0 and pred.shape == (12,)


class _MatmulSizes(TorchFunctionMode):
    """Records the number of elements of every matrix product's result, and how many
    earlier results are still alive when the next product starts."""

    def __init__(self):
        super().__init__()
        self.sizes, self.alive, self._outputs = [], [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        is_matmul = getattr(func, "__name__", "") in ("matmul", "__matmul__")
        if is_matmul:
            self.alive.append(sum(ref() is not None for ref in self._outputs))
        out = func(*args, **(kwargs or {}))
        if is_matmul:
            self.sizes.append(out.numel())
            self._outputs.append(weakref.ref(out))
        return out


def test_exact_search_chunks_are_bounded_by_scores_not_only_queries(monkeypatch):
    """The default ``batch_size=8192`` queries x 1M keys would be a 32 GB chunk."""
    rng = np.random.default_rng(0)
    keys, queries = rng.standard_normal((40, 3)), rng.standard_normal((25, 3))
    model = ExactMIPS().fit(keys)  # default batch_size: one chunk of 25 x 40 before
    expected = model.kneighbors(queries, 4)
    monkeypatch.setattr(_kernels, "CHUNK_SCORES", 120)  # 3 queries x 40 keys per chunk
    with _MatmulSizes() as spy:
        got = model.kneighbors(queries, 4)
    assert max(spy.sizes) <= 120
    assert max(spy.alive) == 0  # one chunk of scores at a time, not two
    # the same neighbours; the scores to float32 rounding (a 3 x 3 chunk and the whole
    # 25 x 3 batch may run different BLAS kernels: 1 ulp apart on an AVX2 machine)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=0)
    assert model.score(queries) == 1.0
    assert _kernels.search_rows(8192, 10**6) == 1 and _kernels.search_rows(2, 10) == 2


def _read_only(a):
    a = np.array(a)
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_read_only_heavy_scores_are_accepted_without_warning(relevance, dtype):
    Q, I, f = relevance
    heavy = lambda q, i: _read_only(f(q, i).astype(dtype))  # noqa: E731  (a cached matrix)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch: "The given NumPy array is not writable"
        est = RelevanceBasedRetriever(heavy, n_support=5).fit(Q[:100], I)
        idx = est.kneighbors(Q[100:], 3, return_distance=False)
    ref = RelevanceBasedRetriever(f, n_support=5).fit(Q[:100], I)
    np.testing.assert_array_equal(idx, ref.kneighbors(Q[100:], 3, return_distance=False))


def test_transposed_heavy_scores_are_named_in_the_error(relevance):
    Q, I, f = relevance
    with pytest.raises(ValueError, match="transposed"):
        RelevanceBasedRetriever(lambda q, i: f(q, i).T, n_support=5).fit(Q[:100], I)


@pytest.mark.parametrize("cls, params", [
    (RelevanceBasedRetriever, {"n_support": 4}),
    (AnnCURRetriever, {"n_support": 4, "random_state": 0}),
    (AdaCURRetriever, {"n_calls": 8, "n_rounds": 2, "random_state": 0}),
])
def test_score_without_relevance_asks_the_heavy_ranker(relevance, cls, params):
    Q, I, f = relevance
    est = cls(f, batch_size=7, **params).fit(Q[:100], I)  # score chunks of 7 queries
    # integer hits summed over the chunks: exactly the value of the whole matrix
    assert est.score(Q[100:], n_neighbors=5) == est.score(Q[100:], f(Q[100:], I),
                                                          n_neighbors=5)


def test_grid_search_over_n_support_with_the_estimators_score(relevance):
    """``GridSearchCV(...).fit(queries, items=...)`` splits queries, keeps the catalogue."""
    Q, I, f = relevance
    gs = GridSearchCV(RelevanceBasedRetriever(f), {"n_support": [2, 20]}, cv=2)
    gs.fit(Q, items=I, relevance_matrix=f(Q, I))  # the cached matrix is split by rows
    assert gs.best_params_ == {"n_support": 20}
    scores = gs.cv_results_["mean_test_score"]
    assert scores[1] > scores[0] and gs.best_estimator_.n_items_ == len(I)


class _LargeOutputs(TorchFunctionMode):
    """Counts the torch calls that allocate a new storage of at least ``nbytes``
    (views of their inputs do not count)."""

    def __init__(self, nbytes):
        super().__init__()
        self.nbytes, self.count = nbytes, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.untyped_storage().nbytes() >= self.nbytes:
            inputs = [a for a in (*args, *(kwargs or {}).values())
                      if isinstance(a, torch.Tensor)]
            ptr = out.untyped_storage().data_ptr()
            if all(a.untyped_storage().data_ptr() != ptr for a in inputs):
                self.count += 1
        return out


@pytest.mark.parametrize("support, max_copies", [(np.arange(6), 0), ("greedy", 1)])
def test_fit_does_not_copy_the_relevance_matrix_several_times(relevance, support, max_copies):
    """At 5k queries x 20k items the matrix is 800 MB: the linear fit makes no
    (n_queries, n_items) temporary, greedy selection only its centred item vectors."""
    Q, I, f = relevance
    R = f(Q[:100], I)
    est = RelevanceBasedRetriever(f, n_support=6, support=support)
    with _LargeOutputs(R.nbytes) as spy:
        est.fit(Q[:100], I, relevance_matrix=R)
    assert spy.count <= max_copies
    ref = RelevanceBasedRetriever(f, n_support=6, support=est.support_indices_)
    A = np.c_[R[:, est.support_indices_], np.ones(100)]
    coef, *_ = np.linalg.lstsq(A, R, rcond=None)
    np.testing.assert_allclose(est.predict(Q[100:]), ref.fit(Q[:100], I).predict(Q[100:]))
    np.testing.assert_allclose(est.predict(Q[100:]), np.c_[f(Q[100:], I)[:, est.support_indices_],
                                                          np.ones(20)] @ coef, atol=1e-8)


def test_adacur_keeps_one_copy_of_the_anchor_matrix(relevance, tmp_path):
    import pickle

    Q, I, f = relevance
    R = f(Q[:100], I)
    est = AdaCURRetriever(f, n_calls=8, n_rounds=2, random_state=0).fit(Q[:100], I,
                                                                       relevance_matrix=R)
    assert not np.shares_memory(est.anchor_relevance_, R)  # the caller may change R
    size = len(pickle.dumps(est))
    idx = est.kneighbors(Q[100:], 3, return_distance=False)
    assert len(pickle.dumps(est)) == size  # no transposed copy cached in the pickle
    est.save(tmp_path / "ada.pt")
    loaded = AdaCURRetriever.load(tmp_path / "ada.pt", relevance_fn=f, items=I)
    _, A, At, _ = loaded._anchor_cache()
    assert np.shares_memory(At.numpy(), loaded.anchor_relevance_)
    np.testing.assert_array_equal(loaded.kneighbors(Q[100:], 3, return_distance=False), idx)


def test_amips_queries_reach_fit_with_metadata_routing_on():
    # queries was marked UNUSED: with routing on, GridSearchCV refused to pass it on and
    # AmortizedMIPS had no set_fit_request to opt in
    import sklearn

    from mlpapers.retrieval.amips import GaussianMixtureQuerySampler

    K = np.random.default_rng(0).normal(size=(60, 6)).astype(np.float32)
    sampler = GaussianMixtureQuerySampler(np.eye(6), 0.3)

    def search(est):
        return GridSearchCV(est, {"depth": [1, 2]}, cv=2).fit(K, queries=sampler)

    off = search(AmortizedMIPS(n_steps=5, batch_size=16, random_state=0))
    with sklearn.config_context(enable_metadata_routing=True):
        on = search(AmortizedMIPS(n_steps=5, batch_size=16, random_state=0)
                    .set_fit_request(queries=True))
    np.testing.assert_array_equal(on.cv_results_["mean_test_score"],
                                  off.cv_results_["mean_test_score"])
