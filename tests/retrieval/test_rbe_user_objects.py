"""The heavy ranker as a user object: how ``relevance_fn`` is called, what it may return,
what it may do to its arguments, and persistence without it.

The retrievers call an arbitrary ``relevance_fn(queries, items)``; these tests pin the
documented contract (call budget, argument types, copies, coercion of its output).
"""

import pickle
import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import AdaCURRetriever, AnnCURRetriever, RelevanceBasedRetriever
from tests.retrieval._counting import CountingRelevance

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((60, 4))
ITEMS = RNG.standard_normal((40, 4))


def heavy(q, i):
    """A module-level (picklable) heavy ranker of full rank on these data."""
    return np.tanh(np.asarray(q) @ np.asarray(i).T) + 0.1 * np.asarray(q)[:, :1] ** 2


def scaling_in_place(q, i):
    """The same scores, then uses its arguments as scratch space (doubles them in place)."""
    out = heavy(q, i)
    for a in (q, i):
        if isinstance(a, np.ndarray):
            a *= 2.0
        elif isinstance(a, torch.Tensor):
            a.mul_(2.0)
        elif isinstance(a, list):
            a.reverse()  # a list modified in place: the order the caller sees changes
    return out


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # greedy early stop on tiny data
        return fn(*args, **kwargs)


FACTORIES = {
    "rbe": lambda fn, bs: RelevanceBasedRetriever(fn, n_support=8, n_rerank=5, batch_size=bs),
    "rbe_mlp": lambda fn, bs: RelevanceBasedRetriever(
        fn, n_support=6, head="mlp", mlp_hidden=4, max_iter=3, eval_every=1,
        batch_size=bs, random_state=0),
    "anncur": lambda fn, bs: AnnCURRetriever(fn, n_support=8, n_rerank=5, batch_size=bs,
                                             random_state=0),
    "adacur": lambda fn, bs: AdaCURRetriever(fn, n_calls=12, n_rounds=3, batch_size=bs,
                                             random_state=0),
}


# -- a relevance_fn that modifies its arguments (regression) --------------------------
@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("batch_size", [4, 1024])  # chunked and single-call searches
@pytest.mark.parametrize("container", ["array", "tensor", "list"])
def test_in_place_relevance_fn_changes_no_prediction(kind, batch_size, container):
    # Regression: the support items were handed to relevance_fn as the estimator's own
    # support_items_ (a ranker scaling them in place changed every later prediction),
    # and the caller's queries as given to the first heavy call of a search, so the
    # rerank / next ADACUR round read modified queries (and only when the queries fit
    # in one batch_size chunk).
    conv = {"array": np.array, "tensor": torch.tensor,
            "list": lambda a: [tuple(r) for r in a]}[container]
    R = heavy(Q[:50], ITEMS)
    clean = _quiet(FACTORIES[kind](heavy, batch_size).fit, Q[:50], ITEMS, R)
    dirty = _quiet(FACTORIES[kind](scaling_in_place, batch_size).fit, conv(Q[:50]),
                   conv(ITEMS), R)
    want_s = clean.predict(Q[50:])
    want_k = clean.kneighbors(Q[50:], 3)
    for _ in range(2):  # and again: nothing the first search did may carry over
        np.testing.assert_allclose(dirty.predict(conv(Q[50:])), want_s, rtol=1e-12)
        got = dirty.kneighbors(conv(Q[50:]), 3)
        np.testing.assert_array_equal(got[1], want_k[1])
        np.testing.assert_allclose(got[0], want_k[0], rtol=1e-12)


def test_support_items_unchanged_by_in_place_relevance_fn():
    rbe = _quiet(RelevanceBasedRetriever(scaling_in_place, n_support=8).fit,
                 Q[:50], ITEMS, heavy(Q[:50], ITEMS))
    before = rbe.support_items_.copy()
    rbe.transform_queries(Q[50:])
    np.testing.assert_array_equal(rbe.support_items_, before)
    np.testing.assert_array_equal(rbe.support_items_, ITEMS[rbe.support_indices_])


def test_caller_queries_unchanged_whatever_batch_size():
    # the same search never modifies the caller's queries through relevance_fn, with
    # one heavy call or several chunks (it did only in the single-call case)
    for bs in (4, 1024):
        rbe = _quiet(RelevanceBasedRetriever(scaling_in_place, n_support=8,
                                             n_rerank=5, batch_size=bs).fit,
                     Q[:50], ITEMS, heavy(Q[:50], ITEMS))
        q = Q[50:].copy()
        rbe.kneighbors(q, 3)
        np.testing.assert_array_equal(q, Q[50:])


class ReusedBuffer:
    """Returns its scores in one buffer reused at every call, as CUDA-graph replays
    (``torch.compile(mode="reduce-overhead")``) and I/O-binding runtimes do."""

    def __init__(self, as_tensor=False):
        self.buf = torch.empty(256, 256, dtype=torch.float64) if as_tensor else np.empty((256, 256))

    def __call__(self, q, i):
        out = self.buf[:len(q), :len(i)]
        out[...] = torch.as_tensor(heavy(q, i)) if isinstance(out, torch.Tensor) else heavy(q, i)
        return out


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("as_tensor", [False, True])
def test_relevance_fn_reusing_its_output_buffer(kind, as_tensor):
    # Regression: the rerank stacked views of the returned rows (all read the last
    # query's scores once the buffer was reused) and ADACUR kept the first round's
    # scores as returned (overwritten by the next rounds' calls): wrong neighbours
    R = heavy(Q[:50], ITEMS)
    clean = _quiet(FACTORIES[kind](heavy, 1024).fit, Q[:50], ITEMS, R)
    reused = _quiet(FACTORIES[kind](ReusedBuffer(as_tensor), 1024).fit, Q[:50], ITEMS, R)
    np.testing.assert_allclose(reused.predict(Q[50:]), clean.predict(Q[50:]), rtol=1e-12)
    got, want = reused.kneighbors(Q[50:], 3), clean.kneighbors(Q[50:], 3)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_fit_and_search_with_a_reused_buffer_equal_fresh_outputs():
    for kind in ("rbe", "adacur"):
        a = _quiet(FACTORIES[kind](heavy, 1024).fit, Q[:50], ITEMS)
        b = _quiet(FACTORIES[kind](ReusedBuffer(), 1024).fit, Q[:50], ITEMS)
        np.testing.assert_allclose(b.predict(Q[50:]), a.predict(Q[50:]), rtol=1e-12)


@pytest.mark.parametrize("source", ["relevance_matrix", "relevance_fn"])
def test_adacur_keeps_its_own_copy_of_a_one_query_matrix(source):
    # Regression: with one training query R.T is already contiguous, so
    # anchor_relevance_ was the caller's matrix (or relevance_fn's buffer) itself
    fn = ReusedBuffer()
    R = heavy(Q[:1], ITEMS)
    ada = AdaCURRetriever(fn, n_calls=4, n_rounds=2, random_state=0)
    ada.fit(Q[:1], ITEMS, R if source == "relevance_matrix" else None)
    held = R if source == "relevance_matrix" else fn.buf
    assert not np.shares_memory(ada.anchor_relevance_, held)
    np.testing.assert_array_equal(ada.anchor_relevance_, R)


# -- call budget, exactly -------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [3, 7, 1024])
def test_heavy_calls_match_the_documented_budget(batch_size):
    n_fit, n_test, N = 50, 10, len(ITEMS)
    f = CountingRelevance(heavy)
    rbe = _quiet(RelevanceBasedRetriever(f, n_support=8, n_rerank=5,
                                         batch_size=batch_size).fit, Q[:n_fit], ITEMS)
    assert f.pairs == rbe.n_heavy_calls_ == n_fit * N
    assert f.calls == -(-n_fit // batch_size)  # ceil: one call per chunk of queries
    k = len(rbe.support_indices_)
    for call, per_query in [(rbe.transform_queries, k), (rbe.predict, k),
                            (lambda q: rbe.kneighbors(q, 3), k + 5)]:
        f.pairs = 0
        call(Q[n_fit:])
        assert f.pairs == n_test * per_query, call
    assert rbe.n_calls_per_query_ == k + 5
    f.pairs = 0
    rbe.score(Q[n_fit:], n_neighbors=3)  # search + ground truth of every item
    assert f.pairs == n_test * (k + 5 + N)
    f.pairs = 0
    rbe.score(Q[n_fit:], heavy(Q[n_fit:], ITEMS), n_neighbors=3)
    assert f.pairs == n_test * (k + 5)


@pytest.mark.parametrize("batch_size", [3, 1024])
def test_adacur_spends_exactly_n_calls_per_query(batch_size):
    f = CountingRelevance(heavy)
    ada = AdaCURRetriever(f, n_calls=13, n_rounds=4, batch_size=batch_size,
                          random_state=0).fit(Q[:50], ITEMS)
    assert f.pairs == ada.n_heavy_calls_ == 50 * len(ITEMS)
    seen = []

    def recording(q, i):
        seen.extend((tuple(np.asarray(r)), tuple(np.asarray(c))) for r in q for c in i)
        return heavy(q, i)

    ada.set_params(relevance_fn=recording)
    _, anchors = ada.predict(Q[50:], return_anchors=True)
    assert len(seen) == 10 * 13 == anchors.size
    # no pair is scored twice: the budget is 13 distinct items per query
    assert len(set(seen)) == len(seen)
    assert all(len(set(row)) == 13 for row in anchors)


# -- arguments and return values ------------------------------------------------------
@pytest.mark.parametrize("container,kind", [
    (np.asarray, np.ndarray), (torch.as_tensor, torch.Tensor),
    (lambda a: [tuple(r) for r in a], list)])
def test_relevance_fn_gets_the_callers_container_type(container, kind):
    types = set()

    def typed(q, i):
        types.update({type(q), type(i)})
        return heavy(q, i)

    for bs in (4, 1024):
        rbe = _quiet(RelevanceBasedRetriever(typed, n_support=5, n_rerank=4,
                                             batch_size=bs).fit,
                     container(Q[:20]), container(ITEMS))
        rbe.kneighbors(container(Q[50:]), 2)
        rbe.score(container(Q[50:]), n_neighbors=2)
    assert types == {kind}


def test_pandas_queries_reach_relevance_fn_as_positional_rows():
    pd = pytest.importorskip("pandas")
    got = []

    def framed(q, i):
        got.append(type(q))
        return heavy(q.to_numpy(), i)

    df = pd.DataFrame(Q, index=np.arange(60)[::-1])  # labels differ from positions
    rbe = _quiet(RelevanceBasedRetriever(framed, n_support=5).fit, df.iloc[:50], ITEMS)
    np.testing.assert_allclose(rbe.predict(df.iloc[50:]),
                               _quiet(RelevanceBasedRetriever(heavy, n_support=5).fit,
                                      Q[:50], ITEMS).predict(Q[50:]), rtol=1e-12)
    assert set(got) == {pd.DataFrame}


def _as_float32_tensor_with_grad(q, i):
    t = torch.as_tensor(heavy(q, i), dtype=torch.float32)
    return (t * torch.ones((), requires_grad=True))


@pytest.mark.parametrize("convert", [
    lambda r: r.astype(np.float32),
    lambda r: torch.as_tensor(r, dtype=torch.float32),
    lambda r: torch.as_tensor(r, dtype=torch.float32) * torch.ones((), requires_grad=True),
    lambda r: r.tolist(),
])
def test_numeric_outputs_are_cast_to_float64_exactly(convert):
    ref = _quiet(RelevanceBasedRetriever(lambda q, i: heavy(q, i).astype(np.float32)
                                         .astype(np.float64), n_support=6).fit, Q[:50], ITEMS)
    rbe = _quiet(RelevanceBasedRetriever(lambda q, i: convert(heavy(q, i).astype(np.float32)
                                                              .astype(np.float64)),
                                         n_support=6).fit, Q[:50], ITEMS)
    np.testing.assert_array_equal(rbe.predict(Q[50:]), ref.predict(Q[50:]))
    assert rbe.predict(Q[50:]).dtype == np.float64


@pytest.mark.parametrize("bad,err,match", [
    (lambda q, i: heavy(q, i).T, ValueError, "transposed"),
    (lambda q, i: heavy(q, i)[:, :, None], ValueError, "expected"),
    (lambda q, i: np.full((len(q), len(i)), np.nan), ValueError, "NaN"),
    (lambda q, i: heavy(q, i).astype(object), TypeError, "real numeric"),
    (lambda q, i: heavy(q, i).astype(complex), TypeError, "real numeric"),
    (lambda q, i: None, TypeError, "real numeric"),
])
def test_bad_outputs_raise_naming_relevance_fn(bad, err, match):
    with pytest.raises(err, match=match) as info:
        RelevanceBasedRetriever(bad, n_support=3).fit(Q[:5], ITEMS)
    assert "relevance_fn" in str(info.value)


def test_raising_relevance_fn_leaves_a_fitted_retriever_as_it_was():
    rbe = _quiet(RelevanceBasedRetriever(heavy, n_support=8).fit, Q[:50], ITEMS)
    want = rbe.predict(Q[50:])
    attrs = {k: getattr(rbe, k) for k in ("support_indices_", "item_embeddings_", "n_items_")}
    calls = []

    def fails_on_second_chunk(q, i):
        calls.append(len(q))
        if len(calls) == 2:
            raise RuntimeError("ranker down")
        return heavy(q, i)

    rbe.set_params(relevance_fn=fails_on_second_chunk, batch_size=10)
    with pytest.raises(RuntimeError, match="ranker down"):
        rbe.fit(Q[:50], ITEMS[:30])
    for k, v in attrs.items():
        np.testing.assert_array_equal(getattr(rbe, k), v)
    rbe.set_params(relevance_fn=heavy)
    np.testing.assert_array_equal(rbe.predict(Q[50:]), want)


def test_relevance_fn_runs_in_the_callers_grad_mode_also_for_the_neural_head():
    modes = []

    def recording(q, i):
        modes.append(torch.is_grad_enabled())
        return heavy(q, i)

    with torch.no_grad():
        rbe = _quiet(FACTORIES["rbe_mlp"](recording, 1024).fit, Q[:50], ITEMS)
    rbe.predict(Q[50:])
    assert modes == [False, True]
    assert rbe.head_ is not None and not rbe.head_.training


# -- persistence ------------------------------------------------------------------------
def test_pickle_with_a_module_level_relevance_fn_round_trips():
    rbe = _quiet(FACTORIES["rbe_mlp"](heavy, 1024).fit, Q[:50], ITEMS)
    back = pickle.loads(pickle.dumps(rbe))
    assert back.relevance_fn is heavy
    np.testing.assert_array_equal(back.predict(Q[50:]), rbe.predict(Q[50:]))


def test_save_stores_no_callable_and_load_needs_it(tmp_path):
    rbe = _quiet(RelevanceBasedRetriever(lambda q, i: heavy(q, i), n_support=8).fit,
                 Q[:50], ITEMS)
    # a local lambda cannot be pickled (Python's own error names it) ...
    with pytest.raises((pickle.PicklingError, AttributeError), match="pickle"):
        pickle.dumps(rbe)
    rbe.save(tmp_path / "r.pt")  # ... but save() never stores it
    with pytest.raises(TypeError, match="relevance_fn"):
        RelevanceBasedRetriever.load(tmp_path / "r.pt")
    back = RelevanceBasedRetriever.load(tmp_path / "r.pt", relevance_fn=heavy, items=ITEMS)
    np.testing.assert_array_equal(back.predict(Q[50:]), rbe.predict(Q[50:]))
    back.set_params(relevance_fn=None)
    with pytest.raises(TypeError, match="relevance_fn must be set"):
        back.predict(Q[50:])


def test_a_refit_without_validation_drops_the_previous_validation_score():
    # best_validation_hit_rate_ was set only when a neural head validated, so a refit
    # with a linear head (or no validation) kept the previous fit's value beside it
    est = _quiet(FACTORIES["rbe_mlp"](heavy, 256).fit, Q, ITEMS)
    assert hasattr(est, "best_validation_hit_rate_")
    _quiet(est.set_params(head="linear").fit, Q, ITEMS)
    assert est.best_validation_hit_rate_ is None and est.head_ is None


@pytest.mark.parametrize("kind, name", [("rbe", "support_indices_"),
                                        ("anncur", "support_indices_"),
                                        ("adacur", "initial_anchors_")])
def test_load_refuses_damaged_item_indices(tmp_path, kind, name):
    # an index past the catalogue failed in load's take (or at the first query) with an
    # IndexError; a float or repeated one the same way or later
    est = _quiet(FACTORIES[kind](heavy, 256).fit, Q, ITEMS)
    path = tmp_path / "r.pt"
    est.save(path)
    good = np.asarray(getattr(est, name))
    for bad in (np.r_[good[:-1], len(ITEMS)], np.r_[good[:-1], -1], good.astype(np.float64),
                np.r_[good[:-1], good[0]], good[None]):
        payload = torch.load(path, weights_only=True)
        payload["state"][name] = {"__mlpapers_ndarray__": torch.as_tensor(bad)}
        torch.save(payload, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match=f"bad.pt.*not a valid.*{name} must hold distinct "
                                             r"item indices in \[0, 40\)"):
            type(est).load(tmp_path / "bad.pt", relevance_fn=heavy, items=ITEMS)
    back = type(est).load(path, relevance_fn=heavy, items=ITEMS)
    np.testing.assert_array_equal(back.predict(Q[:5]), est.predict(Q[:5]))


def test_neural_head_buffers_are_detached_from_their_inputs():
    # the buffers kept the graph of inputs that required grad: a user's own training
    # loop failed at its second backward, and deepcopy refused the head
    import copy

    from mlpapers.retrieval.rbe import NeuralRBEHead

    g = torch.Generator().manual_seed(0)
    E, v, pop = (torch.randn(6, 3, generator=g), torch.randn(6, generator=g),
                 torch.randn(6, generator=g))
    w = torch.randn(3, 3, requires_grad=True)
    u = torch.randn(4, 3, generator=g) @ w
    head = NeuralRBEHead(E.requires_grad_(True), v, pop, u.mean(0), u.std(0), hidden=8,
                         generator=g)
    assert all(not b.requires_grad for b in head.buffers())
    opt = torch.optim.Adam(head.parameters(), 1e-3)
    for _ in range(2):
        loss = head(u.detach()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert w.grad is None and E.grad is None
    copy.deepcopy(head)


def test_a_diverged_neural_head_without_validation_raises():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((300, 5)), rng.standard_normal((200, 5))

    def tanh_ranker(q, i):
        return np.tanh(np.asarray(q) @ np.asarray(i).T)

    est = RelevanceBasedRetriever(tanh_ranker, n_support=5, head="mlp", loss="mse", lr=1e6,
                                  max_iter=50, validation_fraction=0, random_state=0)
    with pytest.raises(FloatingPointError, match="the neural head diverged"):
        _quiet(est.fit, A[:250], B)
