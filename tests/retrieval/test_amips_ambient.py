"""Amortized MIPS under the caller's ambient torch state: grad/inference mode, default
dtype, deterministic algorithms, anomaly detection; global state, user inputs and threads.

Every public entry point (:class:`AmortizedMIPS` fit/predict/kneighbors/value/
predict_key/score and save/load, :class:`ExactMIPS`, the networks, :func:`amips_loss`,
the search kernels and metrics, :class:`GaussianMixtureQuerySampler`) must give the
bitwise same result inside each context of ``AMBIENT`` as outside it, and leave the
process state as it found it.
"""

from __future__ import annotations

import os
import random
import tempfile
import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    ExactMIPS,
    GaussianMixtureQuerySampler,
    Homogenize,
    KeyNet,
    SupportNet,
    amips_loss,
    build_faiss_ivf,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    rank_by_key,
    recall_at_k,
    soft_leaky_relu,
    solve_width,
    support_function,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    check_ambient,
    check_state_untouched,
    check_thread_safe,
)

_rng = np.random.default_rng(0)
KEYS = _rng.standard_normal((40, 6)).astype(np.float32)
Q = _rng.standard_normal((15, 6)).astype(np.float32)
ANCHORS = KEYS[:4] / np.linalg.norm(KEYS[:4], axis=1, keepdims=True)

#: estimator configurations and their training queries (tiny: the file stays fast)
CONFIGS = {
    "keynet": (dict(arch="keynet", resnet=True, retrieval="l2", n_candidates=3), None),
    "supportnet": (dict(arch="supportnet"), GaussianMixtureQuerySampler(ANCHORS, 0.1)),
    "supportnet-plain": (dict(arch="supportnet", homogenize=False, wx_inject=1), Q),
}


def _amips(**kw) -> AmortizedMIPS:
    params = dict(depth=2, hidden_dim=16, n_steps=4, batch_size=32, random_state=0)
    params.update(kw)
    return AmortizedMIPS(**params)


def _results(est: AmortizedMIPS):
    return (est.predict(Q), est.kneighbors(Q, 3), est.value(Q), est.predict_key(Q),
            est.score(Q), [h["loss"] for h in est.history_], dict(est.model_.state_dict()))


def _fit_and_predict(config: str):
    params, queries = CONFIGS[config]
    return _results(_amips(**params).fit(KEYS, queries=queries))


@pytest.fixture(scope="module")
def fitted() -> dict[str, AmortizedMIPS]:
    out = {name: _amips(**params).fit(KEYS, queries=queries)
           for name, (params, queries) in CONFIGS.items()}
    out["exact"] = ExactMIPS().fit(KEYS)
    return out


def _no_global_seeding(monkeypatch) -> None:
    """Make any seeding or restoring of torch's global RNG fail the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the global torch RNG was seeded or restored")

    for owner in (torch, torch.random):
        monkeypatch.setattr(owner, "manual_seed", forbidden)
        monkeypatch.setattr(owner, "set_rng_state", forbidden)


# -- ambient contexts ------------------------------------------------------------------
@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fit_and_predict_ambient(config, context):
    # fit crashed under no_grad/inference_mode ("element 0 of tensors does not require
    # grad") and under a float64/float16/bfloat16 default dtype (float32 inputs against
    # parameters of the default dtype)
    check_ambient(lambda: _fit_and_predict(config), context)


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", [*CONFIGS, "exact"])
def test_inference_ambient(fitted, name, context):
    est = fitted[name]
    check_ambient(lambda: (est.predict(Q), est.kneighbors(Q, 4), est.score(Q)), context)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_exact_fit_ambient(context):
    check_ambient(lambda: (lambda m: (m.kneighbors(Q, 3), m.score(Q)))(ExactMIPS().fit(KEYS)),
                  context)


def _kernels():
    q, k = torch.from_numpy(Q), torch.from_numpy(KEYS)
    truth = support_function(q, k)[1]
    ranked = rank_by_key(q, k, 3)
    return (mips_topk(q, k, 3), truth, ranked, rank_by_key(q, k, 3, metric="l2"),
            recall_at_k(truth, ranked, 2), mean_reciprocal_rank(truth, ranked),
            match_rate(None, ranked[:, 0], queries=Q, database=KEYS),
            recall_at_k(None, ranked, 3, queries=q, database=k),
            soft_leaky_relu(q), solve_width(1000.0, 6, 6, 3),
            GaussianMixtureQuerySampler(ANCHORS, 0.2)(7, np.random.default_rng(1)))


@pytest.mark.parametrize("context", list(AMBIENT))
def test_kernels_ambient(context):
    check_ambient(_kernels, context)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_networks_ambient(context):
    # public modules: built in the default dtype, like torch.nn layers, unless ``dtype``
    # is given; with a generator the initialisation is the same in every context
    def call():
        gen = torch.Generator().manual_seed(3)
        with torch.device("cpu"):  # built on the CPU whatever the context's default device
            nets = [KeyNet(6, [8, 8], generator=gen, dtype=torch.float32),
                    Homogenize(SupportNet(6, [8, 8], generator=gen, dtype=torch.float32))]
        x = torch.from_numpy(Q)
        return [(dict(n.state_dict()), n.score_and_key(x)) for n in nets]

    check_ambient(call, context)


# -- a user query sampler that depends on the default dtype ------------------------------
def _sampler_in_default_dtype(n, rng):
    """The user's sampler, returning its queries in torch's default dtype."""
    return torch.as_tensor(GaussianMixtureQuerySampler(ANCHORS, 0.2)(n, rng),
                           dtype=torch.get_default_dtype())


@pytest.mark.parametrize("context", ["default_float64", "default_float16", "default_bfloat16"])
def test_sampler_in_default_dtype(context):
    # what the sampler returns is cast to float32 exactly: the fit equals the fit on the
    # same numbers given outside the context (no crash, no further rounding)
    with AMBIENT[context]():
        dtype = torch.get_default_dtype()
        est = check_state_untouched(
            lambda: _amips(arch="supportnet").fit(KEYS, queries=_sampler_in_default_dtype))
        got = _results(est)

    def same_numbers(n, rng):
        return torch.as_tensor(GaussianMixtureQuerySampler(ANCHORS, 0.2)(n, rng), dtype=dtype)

    assert_same_result(_results(_amips(arch="supportnet").fit(KEYS, queries=same_numbers)), got)


# -- the library's own training switches autograd on; user-called functions do not -----
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_score_and_key_respects_grad_mode(context):
    # create_graph=True built a graph under no_grad (a leak the caller did not ask for)
    # and failed under inference_mode; KeyNet never built one there
    torch.manual_seed(0)
    net = Homogenize(SupportNet(6, [8, 8]))
    x = torch.from_numpy(Q)
    expected = net.score_and_key(x)
    with AMBIENT[context]():
        value, key = net.score_and_key(x, create_graph=True)
    assert value.grad_fn is None and key.grad_fn is None
    assert_same_result(expected, (value, key))


def test_score_and_key_graph_on_inference_tensor():
    # an input made under inference_mode cannot require grad: it is copied
    torch.manual_seed(0)
    net = Homogenize(SupportNet(6, [8, 8]))
    with torch.inference_mode():
        x = torch.from_numpy(Q).clone()
    value, key = net.score_and_key(x, create_graph=True)
    assert key.requires_grad  # double-backprop ready, as asked
    assert_same_result(net.score_and_key(torch.from_numpy(Q)), (value.detach(), key.detach()))


def test_amips_loss_respects_grad_mode():
    pred_key = torch.from_numpy(Q).requires_grad_()
    pred_score = pred_key.sum(1)
    target = torch.zeros(15), torch.zeros(15, 6)
    with torch.no_grad():
        assert all(t.grad_fn is None for t in amips_loss(pred_score, pred_key, *target))
    total, _, _ = amips_loss(pred_score, pred_key, *target)
    total.backward()  # the caller's graph, outside no_grad
    # d/dk of target_weight * mean((k - 0)^2) + score_weight * mean((sum k)^2)
    score = pred_score.detach()[:, None]
    expected = 2 * pred_key.detach() / pred_key.numel() + 0.01 * 2 * score / len(score)
    torch.testing.assert_close(pred_key.grad, expected)


# -- global state ----------------------------------------------------------------------
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fit_never_seeds_the_global_rng(config, monkeypatch):
    # the initialisation was drawn inside fork_rng + torch.manual_seed: the global RNG
    # is shared by every thread, so simultaneous fits drew each other's weights and
    # could leave the global RNG at a seeded state
    expected = _fit_and_predict(config)
    _no_global_seeding(monkeypatch)
    assert_same_result(expected, check_state_untouched(lambda: _fit_and_predict(config)))


def test_load_and_save_leave_global_state_untouched(fitted):
    # load built the network with torch's global RNG (advancing it) before loading
    # the weights
    est = fitted["supportnet"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "amips.pt")
        check_state_untouched(lambda: est.save(path))
        for context in AMBIENT:
            check_ambient(lambda: _results(AmortizedMIPS.load(path)), context)
        loaded = check_state_untouched(lambda: AmortizedMIPS.load(path))
    assert_same_result(_results(est)[:5], _results(loaded)[:5])


def test_exact_fit_leaves_numpy_global_stream_untouched():
    # ExactMIPS has no randomness, yet its fit drew a seed from numpy's global RNG
    # (advancing the caller's stream by one draw: seen only in the position of the
    # Mersenne Twister state, not in its key)
    np.random.seed(0)
    before = np.random.get_state()
    ExactMIPS().fit(KEYS)
    after = np.random.get_state()
    assert before[2] == after[2] and np.array_equal(before[1], after[1])


def test_random_state_none_does_not_reseed():
    # random_state=None draws one seed from numpy's global RNG (scikit-learn's
    # convention) and leaves torch's and Python's generators alone
    torch_state, py_state = torch.random.get_rng_state(), random.getstate()
    np.random.seed(5)
    a = _amips(random_state=None).fit(KEYS).predict(Q)
    np.random.seed(5)
    b = _amips(random_state=None).fit(KEYS).predict(Q)
    np.testing.assert_array_equal(a, b)
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert random.getstate() == py_state


def test_network_generator_matches_global_seed():
    # a generator gives the values of the global RNG after manual_seed, without it
    for make in (lambda **kw: KeyNet(5, [7, 7, 7], wx_inject=2, **kw),
                 lambda **kw: SupportNet(5, [7, 7], wx_inject=True, **kw)):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(11)
            expected = make().state_dict()
        state = torch.random.get_rng_state()
        got = make(generator=torch.Generator().manual_seed(11)).state_dict()
        assert torch.equal(torch.random.get_rng_state(), state)
        assert_same_result(dict(expected), dict(got))


@pytest.mark.parametrize("context", ["default_float64", "default_float16"])
def test_network_dtype_argument(context):
    with AMBIENT[context]():
        default = torch.get_default_dtype()
        assert {p.dtype for p in KeyNet(4, [8]).parameters()} == {default}
        assert {p.dtype for p in SupportNet(4, [8], dtype=torch.float32).parameters()} == {
            torch.float32}


# -- user objects ----------------------------------------------------------------------
def test_inputs_not_mutated_and_no_warnings():
    keys, queries = KEYS.copy(), Q.copy()
    keys.flags.writeable = False
    queries.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = _amips(arch="supportnet").fit(keys, queries=queries)
        expected = _results(est)
        ExactMIPS().fit(keys).kneighbors(queries, 2)
        recall_at_k(None, est.kneighbors(queries, 3, return_distance=False), 2,
                    queries=queries, database=keys)
    np.testing.assert_array_equal(keys, KEYS)
    np.testing.assert_array_equal(queries, Q)
    assert_same_result(expected, _results(_amips(arch="supportnet").fit(KEYS, queries=Q)))


def test_inputs_that_require_grad():
    keys = torch.from_numpy(KEYS).clone().requires_grad_()
    queries = torch.from_numpy(Q).clone().requires_grad_()
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once per process otherwise
    try:
        with warnings.catch_warnings():
            # mips_topk read a key tensor that requires grad as a Python float: warned
            warnings.simplefilter("error")
            est = _amips(arch="supportnet").fit(keys, queries=queries)
            got = _results(est)
            s, i = mips_topk(queries, keys, 3)
            rank_by_key(queries, keys, 2, metric="l2")
    finally:
        torch.set_warn_always(previous)
    assert keys.grad is None and queries.grad is None
    assert all(not p.requires_grad and p.grad_fn is None for p in est.model_.parameters())
    assert_same_result(got, _results(_amips(arch="supportnet").fit(KEYS, queries=Q)))
    assert_same_result((s.detach(), i), mips_topk(torch.from_numpy(Q), torch.from_numpy(KEYS), 3))


def test_inference_tensors_in_a_normal_fit():
    with torch.inference_mode():
        keys, queries = torch.from_numpy(KEYS).clone(), torch.from_numpy(Q).clone()
    for params, _ in CONFIGS.values():
        got = _results(_amips(**params).fit(keys, queries=queries))
        assert_same_result(_results(_amips(**params).fit(KEYS, queries=Q)), got)


def test_fit_in_inference_mode_then_predict_outside(fitted):
    with torch.inference_mode():
        exact = ExactMIPS().fit(KEYS)
        est = _amips(**CONFIGS["keynet"][0]).fit(KEYS)
    assert_same_result(fitted["exact"].kneighbors(Q, 3), exact.kneighbors(Q, 3))
    assert_same_result(_results(fitted["keynet"]), _results(est))


def test_loaded_estimator_in_inference_mode_then_outside(fitted):
    # the key cache is rebuilt lazily after load: inside inference_mode it is an
    # inference tensor, which later normal calls must still be able to use
    est = fitted["supportnet"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "amips.pt")
        est.save(path)
        loaded = AmortizedMIPS.load(path)
    with torch.inference_mode():
        inside = _results(loaded)[:5]
    assert_same_result(_results(est)[:5], inside)
    assert_same_result(_results(est)[:5], _results(loaded)[:5])


def test_loaded_in_inference_mode_is_a_normal_model(fitted):
    # a model built inside inference_mode has inference-tensor parameters, which can
    # never be fine-tuned (requires_grad_ fails) outside it
    est = fitted["supportnet"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "amips.pt")
        est.save(path)
        with torch.inference_mode():
            loaded = AmortizedMIPS.load(path)
    assert not any(p.is_inference() for p in loaded.model_.parameters())
    assert_same_result(_results(est)[:5], _results(loaded)[:5])


def test_faiss_index_ambient():
    pytest.importorskip("faiss")

    def call():
        index = build_faiss_ivf(KEYS, 4)
        index.nprobe = 4
        return index.search(Q, 3)

    for context in ("no_grad", "default_float64"):
        check_ambient(call, context)


# -- threads ---------------------------------------------------------------------------
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fit_thread_safe(config):
    check_thread_safe(lambda: _fit_and_predict(config))


def test_shared_estimators_thread_safe(fitted):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "amips.pt")
        fitted["keynet"].save(path)
        loaded = AmortizedMIPS.load(path)  # empty key caches: filled by racing threads
    check_thread_safe(lambda: (loaded.kneighbors(Q, 3), loaded.score(Q)))
    exact = fitted["exact"]
    check_thread_safe(lambda: (exact.kneighbors(Q, 3), exact.score(Q)))
    sampler = GaussianMixtureQuerySampler(ANCHORS, 0.3)
    check_thread_safe(lambda: sampler(9, np.random.default_rng(4)))
