"""Relevance-based embeddings under the caller's ambient torch state: grad/inference
mode, default dtype, deterministic algorithms, anomaly detection; global state, user
inputs (including a relevance_fn that depends on the default dtype) and threads.

Every public entry point (:class:`RelevanceBasedRetriever` with the linear and the
neural head and every support method, :class:`AnnCURRetriever`,
:class:`AdaCURRetriever`: fit/kneighbors/predict/transform_queries/score and save/load;
:class:`NeuralRBEHead` and the public kernels) must give the bitwise same result inside
each context of ``AMBIENT`` as outside it, and leave the process state as it found it.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    AnnCURRetriever,
    NeuralRBEHead,
    RelevanceBasedRetriever,
    cur_query_weights,
    fit_linear_embeddings,
    greedy_selection,
    hit_rate,
    select_support,
    softmax_signed_loss,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    check_ambient,
    check_state_untouched,
    check_thread_safe,
)

_rng = np.random.default_rng(0)
QUERIES = _rng.standard_normal((50, 4))
ITEMS = _rng.standard_normal((30, 4))
TRAIN, TEST = QUERIES[:40], QUERIES[40:]


def heavy(q, i):
    return np.tanh(np.asarray(q) @ np.asarray(i).T)


R_TRAIN = heavy(TRAIN, ITEMS)
MLP = dict(head="mlp", max_iter=6, eval_every=3, mlp_hidden=8)

#: retriever factories (tiny: the file stays fast)
RETRIEVERS = {
    **{f"linear-{s}": (lambda s=s, fn=heavy: RelevanceBasedRetriever(
        fn, n_support=5, support=s, random_state=0))
       for s in ("greedy", "random", "popular", "kmeans", "farthest")},
    "mlp": lambda fn=heavy: RelevanceBasedRetriever(fn, n_support=5, random_state=0, **MLP),
    "mlp-mse-rerank": lambda fn=heavy: RelevanceBasedRetriever(
        fn, n_support=5, n_rerank=4, loss="mse", random_state=0, **MLP),
    "anncur": lambda fn=heavy: AnnCURRetriever(fn, n_support=5, random_state=0),
    "adacur": lambda fn=heavy: AdaCURRetriever(fn, n_calls=6, n_rounds=3, random_state=0),
}


def _results(est):
    out = [est.kneighbors(TEST, 3), est.predict(TEST), est.score(TEST, n_neighbors=3)]
    if isinstance(est, RelevanceBasedRetriever):
        out.append(est.transform_queries(TEST))
        out.append(est.item_embeddings_)
        if est.head_ is not None:
            out += [dict(est.head_.state_dict()), [h["loss"] for h in est.history_]]
    return out


def _fit_and_predict(name, fn=heavy, **fit_kw):
    return _results(RETRIEVERS[name](fn=fn).fit(TRAIN, ITEMS, **fit_kw))


@pytest.fixture(scope="module")
def fitted():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # greedy may stop early on this tiny problem
        return {name: make().fit(TRAIN, ITEMS) for name, make in RETRIEVERS.items()}


# -- ambient contexts ------------------------------------------------------------------
@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(RETRIEVERS))
def test_fit_and_predict_ambient(name, context):
    # the neural head failed to train under no_grad/inference_mode ("element 0 of
    # tensors does not require grad") and drew other initial towers under a float64,
    # float16 or bfloat16 default dtype (another trained head)
    check_ambient(lambda: _fit_and_predict(name), context)


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", ["linear-greedy", "mlp-mse-rerank", "adacur"])
def test_inference_ambient(fitted, name, context):
    est = fitted[name]
    check_ambient(lambda: (est.kneighbors(TEST, 4), est.predict(TEST)), context)


def _kernels():
    R = torch.from_numpy(R_TRAIN)
    C = R.T[:5].unsqueeze(0).repeat(2, 1, 1)
    return ([select_support(R_TRAIN, 4, m, random_state=0, return_scores=True)
             for m in ("greedy", "random", "popular", "kmeans", "farthest")],
            greedy_selection(R.T.clone(), 4, method="gram"),
            fit_linear_embeddings(R[:, :4], R), fit_linear_embeddings(R[:, :4], R, ridge=0.1),
            cur_query_weights(C, R[:2, :5].clone()),
            hit_rate(R_TRAIN, np.tile(np.arange(3), (40, 1))),
            softmax_signed_loss(R.float(), R.float().flip(1)))


@pytest.mark.parametrize("context", list(AMBIENT))
def test_kernels_ambient(context):
    check_ambient(_kernels, context)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_neural_head_ambient(context):
    def call():
        E = torch.from_numpy(np.random.default_rng(3).standard_normal((30, 5))).float()
        with torch.device("cpu"):  # built on the CPU whatever the context's default device
            head = NeuralRBEHead(E, E[:, 0], E[:, 1], E.mean(0), E.std(0), 8,
                                 generator=torch.Generator().manual_seed(2))
        return dict(head.state_dict()), head(E[:7, :5])

    check_ambient(call, context)


# -- a user relevance_fn that depends on the default dtype -------------------------------
def _heavy_in_default_dtype(q, i):
    """The user's ranker, computed in torch's default dtype (float16 rounds it)."""
    return torch.as_tensor(heavy(q, i), dtype=torch.get_default_dtype())


@pytest.mark.parametrize("context", ["default_float64", "default_float16", "default_bfloat16"])
@pytest.mark.parametrize("name", ["linear-greedy", "mlp", "adacur"])
def test_relevance_fn_in_default_dtype(name, context):
    # whatever dtype the relevance comes in, it is cast to float64 exactly: the result
    # equals that of the same numbers given as float64 outside the context (no crash,
    # no further rounding, and float64 relevance keeps its precision)
    with AMBIENT[context]():
        dtype = torch.get_default_dtype()
        got = check_state_untouched(lambda: _fit_and_predict(name, _heavy_in_default_dtype))

    def same_numbers(q, i):
        return torch.as_tensor(heavy(q, i), dtype=dtype).double()

    assert_same_result(_fit_and_predict(name, same_numbers), got)
    if dtype == torch.float64:
        assert_same_result(_fit_and_predict(name), got)


# -- the library's own training switches autograd on; user-called functions do not -----
def test_loss_and_kernels_respect_grad_mode():
    logits = torch.from_numpy(R_TRAIN).float().requires_grad_()
    R = torch.from_numpy(R_TRAIN).requires_grad_()
    with torch.no_grad():
        assert softmax_signed_loss(logits, logits.detach()).grad_fn is None
        assert fit_linear_embeddings(R[:, :3], R)["embeddings"].grad_fn is None
    loss = softmax_signed_loss(logits, logits.detach())
    loss.backward()
    # -mean(sign * softmax): the gradient sums to zero over each row (softmax)
    torch.testing.assert_close(logits.grad.sum(1), torch.zeros(40), atol=1e-7, rtol=0)
    assert fit_linear_embeddings(R[:, :3], R)["embeddings"].grad_fn is not None


def test_relevance_fn_runs_in_the_callers_grad_mode():
    # the neural head trains with autograd on, but the user's heavy ranker is called
    # in the caller's mode (no graph built for nothing under no_grad)
    modes = []

    def spy(q, i):
        modes.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return heavy(q, i)

    for context, expected in (("no_grad", (False, False)), ("inference_mode", (False, True))):
        modes.clear()
        with AMBIENT[context]():
            RelevanceBasedRetriever(spy, n_support=5, random_state=0, **MLP).fit(TRAIN, ITEMS)
        assert set(modes) == {expected}


# -- global state ----------------------------------------------------------------------
def test_fit_never_seeds_the_global_rng(monkeypatch):
    # the neural head's towers were drawn inside fork_rng + torch.manual_seed: the global
    # RNG is shared by every thread, so simultaneous fits drew each other's towers
    expected = _fit_and_predict("mlp")

    def forbidden(*args, **kwargs):
        raise AssertionError("the global torch RNG was seeded or restored")

    for owner in (torch, torch.random):
        monkeypatch.setattr(owner, "manual_seed", forbidden)
        monkeypatch.setattr(owner, "set_rng_state", forbidden)
    assert_same_result(expected, check_state_untouched(lambda: _fit_and_predict("mlp")))


@pytest.mark.parametrize("name", ["mlp", "adacur", "linear-kmeans"])
def test_load_and_save_leave_global_state_untouched(fitted, name):
    # loading the neural head built its towers with torch's global RNG (advancing it)
    est = fitted[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rbe.pt")
        check_state_untouched(lambda: est.save(path))
        loaded = check_state_untouched(lambda: type(est).load(path, heavy, ITEMS))
        check_ambient(lambda: _results(type(est).load(path, heavy, ITEMS)), "inference_mode")
    assert_same_result(_results(est), _results(loaded))


@pytest.mark.parametrize("method", ["greedy", "popular", "farthest"])
def test_deterministic_selection_leaves_numpy_global_stream_untouched(method):
    # random_state=None drew a seed from numpy's global RNG even for the deterministic
    # methods (advancing the caller's stream: seen only in the Mersenne Twister position)
    np.random.seed(0)
    before = np.random.get_state()
    select_support(R_TRAIN, 3, method)
    after = np.random.get_state()
    assert before[2] == after[2] and np.array_equal(before[1], after[1])
    with pytest.raises(TypeError, match="random_state"):
        select_support(R_TRAIN, 3, method, random_state="0")
    with pytest.raises(ValueError, match="random_state must be a non-negative"):
        select_support(R_TRAIN, 3, method, random_state=-1)  # as the random methods


def test_head_generator_matches_global_seed():
    # a generator gives the towers of the global RNG after manual_seed, without it
    E = torch.from_numpy(np.random.default_rng(5).standard_normal((20, 4))).float()
    args = (E, E[:, 0], E[:, 1], E.mean(0), E.std(0), 6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(9)
        expected = NeuralRBEHead(*args).state_dict()
    state = torch.random.get_rng_state()
    got = NeuralRBEHead(*args, generator=torch.Generator().manual_seed(9)).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert_same_result(dict(expected), dict(got))


# -- user objects ----------------------------------------------------------------------
def test_inputs_not_mutated_and_no_warnings():
    R = R_TRAIN.copy()
    R.flags.writeable = False
    queries, items = TRAIN.copy(), ITEMS.copy()
    queries.flags.writeable = items.flags.writeable = False

    def read_only(q, i):
        out = heavy(q, i)
        out.flags.writeable = False
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("linear-random", "mlp", "adacur"):
            est = RETRIEVERS[name](fn=read_only).fit(queries, items, relevance_matrix=R)
            assert_same_result(_results(RETRIEVERS[name]().fit(TRAIN, ITEMS)), _results(est))
        select_support(R, 3, "kmeans", random_state=0)
        hit_rate(R, np.zeros((40, 2), dtype=int))
    np.testing.assert_array_equal(R, R_TRAIN)
    np.testing.assert_array_equal(queries, TRAIN)
    np.testing.assert_array_equal(items, ITEMS)


def test_inputs_that_require_grad():
    queries = torch.from_numpy(TRAIN).requires_grad_()
    items = torch.from_numpy(ITEMS).requires_grad_()
    X = torch.from_numpy(R_TRAIN.T.copy()).requires_grad_()
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once per process otherwise
    try:
        with warnings.catch_warnings():
            # greedy_selection read an X that requires grad as a Python float: warned
            warnings.simplefilter("error")
            picks = greedy_selection(X, 4)
            ests = [RETRIEVERS[n](fn=lambda q, i: torch.tanh(q @ i.T)).fit(queries, items)
                    for n in ("linear-greedy", "mlp", "adacur")]
    finally:
        torch.set_warn_always(previous)
    assert picks[1].grad_fn is None
    assert_same_result(greedy_selection(X.detach(), 4), picks)
    assert queries.grad is None and items.grad is None
    for est in ests:
        # support_items_ was a slice of the items with a graph (grad_fn) attached
        for key, value in vars(est).items():
            if isinstance(value, torch.Tensor) and key != "items_":
                assert value.grad_fn is None and not value.requires_grad, key
        head = getattr(est, "head_", None)
        if head is not None:  # fitted state: no leftover gradients, none recorded
            assert all(p.grad is None and not p.requires_grad for p in head.parameters())


def test_inference_tensors_in_a_normal_fit():
    with torch.inference_mode():
        R = torch.from_numpy(R_TRAIN).clone()
    for name in ("linear-greedy", "mlp", "adacur"):
        got = _fit_and_predict(name, relevance_matrix=R)
        assert_same_result(_fit_and_predict(name, relevance_matrix=R_TRAIN), got)


def test_loaded_in_inference_mode_is_a_normal_model(fitted):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rbe.pt")
        fitted["mlp"].save(path)
        with torch.inference_mode():
            loaded = RelevanceBasedRetriever.load(path, heavy, ITEMS)
    tensors = [*loaded.head_.parameters(), *loaded.head_.buffers()]
    assert not any(t.is_inference() for t in tensors)
    assert_same_result(_results(fitted["mlp"]), _results(loaded))


def test_fit_in_inference_mode_then_predict_outside(fitted):
    for name in ("mlp", "adacur"):
        with torch.inference_mode():
            est = RETRIEVERS[name]().fit(TRAIN, ITEMS)
        assert_same_result(_results(fitted[name]), _results(est))


# -- threads ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "linear-kmeans", "adacur"])
def test_fit_thread_safe(name):
    check_thread_safe(lambda: _fit_and_predict(name))


def test_shared_estimators_thread_safe(fitted):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ada.pt")
        fitted["adacur"].save(path)
        ada = AdaCURRetriever.load(path, heavy, ITEMS)  # empty caches, filled by threads
    check_thread_safe(lambda: ada.kneighbors(TEST, 3))
    mlp = fitted["mlp-mse-rerank"]
    check_thread_safe(lambda: (mlp.kneighbors(TEST, 3), mlp.predict(TEST)))


@pytest.mark.parametrize("name", ["mlp", "adacur"])
def test_save_leaves_the_estimator_usable_meanwhile(fitted, name):
    # save set ``relevance_fn = None`` on the estimator itself while writing the file: a
    # kneighbors running meanwhile in another thread failed ("relevance_fn must be set").
    # The path's __fspath__, read while the file is written, plays that other thread.
    est = fitted[name]
    expected = est.kneighbors(TEST, 3)
    seen = []

    class Path:
        def __init__(self, path):
            self.path = path

        def __fspath__(self):
            seen.append(est.kneighbors(TEST, 3))
            return self.path

    with tempfile.TemporaryDirectory() as tmp:
        est.save(Path(os.path.join(tmp, "rbe.pt")))
        loaded = type(est).load(os.path.join(tmp, "rbe.pt"), heavy, ITEMS)
    assert seen and est.relevance_fn is heavy
    assert_same_result([expected] * (len(seen) + 1), [*seen, loaded.kneighbors(TEST, 3)])


class _NoFilterSwap:
    """``warnings`` without ``catch_warnings``: the process-wide filter swap it does is
    not thread-safe (two overlapping blocks can leave "ignore every warning" installed)."""

    def __getattr__(self, name):
        if name == "catch_warnings":
            raise AssertionError("the library swapped the process-wide warning filters")
        return getattr(warnings, name)


@pytest.mark.parametrize("make", [
    lambda: AdaCURRetriever(heavy, n_calls=12, n_rounds=2, init="greedy", random_state=0),
    lambda: AdaCURRetriever(heavy, n_calls=6, n_rounds=2, init="kmeans", random_state=0),
    lambda: RelevanceBasedRetriever(heavy, n_support=5, support="kmeans", random_state=0),
], ids=["adacur-greedy", "adacur-kmeans", "rbe-kmeans"])
def test_fits_never_swap_the_warning_filters(make, monkeypatch):
    # ADACUR silenced greedy's early stop, and k-means scikit-learn's duplicate-point
    # warning, with catch_warnings: simultaneous fits in threads left "ignore" for every
    # warning in the global filters (seen in 8 of 30 runs of three threads)
    low_rank = R_TRAIN[:, :4] @ np.random.default_rng(1).standard_normal((4, 30))
    expected = make().fit(TRAIN, ITEMS, relevance_matrix=low_rank).kneighbors(TEST, 3)
    from mlpapers.retrieval.rbe import _baselines, _selection

    for module in (_baselines, _selection):
        monkeypatch.setattr(module, "warnings", _NoFilterSwap(), raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # greedy's early stop is filled in, not warned
        est = check_state_untouched(
            lambda: make().fit(TRAIN, ITEMS, relevance_matrix=low_rank))
    assert_same_result(expected, est.kneighbors(TEST, 3))


def test_greedy_early_stop_still_warns():
    # the per-thread switch silences ADACUR's own call only
    low_rank = R_TRAIN[:, :4] @ np.random.default_rng(1).standard_normal((4, 30))
    with pytest.warns(UserWarning, match="stopped after 4 of 6"):
        select_support(low_rank, 6, "greedy", center=False)


def test_kmeans_with_fewer_distinct_items_than_supports():
    # the documented limit: scikit-learn's warning for duplicate points is silenced with
    # catch_warnings in this degenerate case only (distinct supports are still returned)
    R = np.repeat(np.random.default_rng(7).standard_normal((6, 3)), 4, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S = select_support(R, 6, "kmeans", random_state=0)
    assert len(set(S.tolist())) == 6


@pytest.mark.parametrize("context", ["inference_mode", "default_float16"])
def test_cli_demo_ambient(context):
    from mlpapers.retrieval.rbe._demo import demo

    check_ambient(lambda: [(r.value, r.baseline_value) for r in demo(True)], context)
