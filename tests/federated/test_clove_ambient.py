"""CLoVE / IFCA / FedAvg and the assignment functions under the caller's ambient torch
state: grad and inference mode, default dtype, deterministic algorithms, anomaly
detection, global RNGs, threads and the user's own objects."""

import copy
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated.clove import (
    IFCA,
    CLoVE,
    FedAvg,
    choose_n_clusters,
    clove_assign,
    ifca_assign,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    check_ambient,
    check_one_numpy_seed,
    check_state_untouched,
    check_thread_safe,
    run_in_threads,
)


@pytest.fixture(scope="module")
def clients():
    data, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=20,
                                       n_features=4, random_state=0)
    return data


@pytest.fixture(scope="module", autouse=True)
def _warm_up(clients):
    # torch imports some modules lazily on first use of torch.func (sympy adds a warnings
    # filter then): a one-time process effect, not a call's
    CLoVE(n_rounds=1, random_state=0).fit(clients)


@pytest.fixture(scope="module")
def class_clients(clients):
    return [(X, (y > np.median(y)).astype(np.int64)) for X, y in clients]


def _user_model(n_features, n_outputs):
    # a factory drawing its initial weights from torch's global RNG and its dtype from
    # the default dtype, as user code does
    return torch.nn.Sequential(torch.nn.Linear(n_features, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, n_outputs))


# name -> (estimator class, parameters, whether the clients have class labels)
CASES = {
    "clove_linear": (CLoVE, {}, False),
    "clove_callable_loop": (CLoVE, {"model": _user_model}, False),
    "ifca_logistic": (IFCA, {"model": "logistic"}, True),
    "fedavg_mlp_loop": (FedAvg, {"model": "mlp", "hidden_layer_sizes": (4,),
                                 "vectorize": False}, True),
}


def _data(case, clients, class_clients):
    return class_clients if CASES[case][2] else clients


def _fit_all(case, data, random_state=0):
    cls, params, _ = CASES[case]
    est = cls(n_rounds=1, batch_size=8, random_state=random_state, **params).fit(data)
    X0, y0 = data[0]
    out = {"predict": est.predict(X0, client=0), "loss_vectors": est.loss_vectors_,
           "labels": est.labels_, "score": est.score(data), "assign": est.assign(X0, y0),
           "states": dict(est._states)}
    if hasattr(est, "predict_proba"):
        out["proba"] = est.predict_proba(X0, client=0)
    return out


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("case", list(CASES))
def test_fit_predict_indifferent_to_ambient_state(case, context, clients, class_clients):
    # fit used to fail inside no_grad (loop path) and inference_mode ("element 0 of
    # tensors does not require grad"), and advanced the global torch RNG
    data = _data(case, clients, class_clients)
    check_ambient(lambda: _fit_all(case, data), context)


@pytest.mark.parametrize("case", list(CASES))
def test_fit_leaves_global_state_untouched(case, clients, class_clients):
    # the model template (and, with a callable, the models) were built from the global
    # torch RNG outside any fork: every fit advanced it
    check_state_untouched(lambda: _fit_all(case, _data(case, clients, class_clients)))


def test_random_state_none_draws_one_seed_and_never_reseeds(clients):
    check_one_numpy_seed(lambda: CLoVE(n_rounds=1, model=_user_model,
                                       random_state=None).fit(clients))


class _MeetingFactory:
    """A model factory whose builds running at once in threads meet halfway, as builds
    yielding the GIL while they draw weights (file or device access) interleave."""

    def __init__(self, n_threads):
        self.barrier = threading.Barrier(n_threads, timeout=0.3)

    def __call__(self, n_features, n_outputs):
        first = torch.nn.Linear(n_features, 5)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:  # builds run one at a time
            pass
        return torch.nn.Sequential(first, torch.nn.Tanh(), torch.nn.Linear(5, n_outputs))


@pytest.mark.parametrize("model", ["linear", "meeting_factory"])
def test_fit_is_thread_safe(model, clients):
    # the initial models were drawn after torch.manual_seed on the global RNG: threads
    # reseeded each other's fork and got other initial models (and the forks restored
    # each other's states, leaving the global RNG changed)
    def fit(seed=0, model=model):
        return CLoVE(n_rounds=1, model=model, random_state=seed).fit(clients)._states

    if model == "linear":
        fit()  # first use imports lazily loaded modules (sympy adds a warnings filter)
        check_state_untouched(lambda: check_thread_safe(fit))
        return
    # simultaneous fits with different seeds each get their own initial models
    expected = [fit(seed, _MeetingFactory(1)) for seed in range(3)]
    factory = _MeetingFactory(3)
    actual = check_state_untouched(
        lambda: run_in_threads([lambda s=seed: fit(s, factory) for seed in range(3)]))
    assert_same_result(expected, actual)


def test_callable_returning_the_same_module_gives_independent_models(clients):
    # all K models were the user's one module: models_ held K references to it (every
    # cluster predicting with the last model's weights) and the fit overwrote the user's
    # weights; a shared layer (a user's backbone) was likewise shared by all models
    with torch.random.fork_rng(devices=[]):  # fixed weights: the test must not be flaky
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        backbone = torch.nn.Linear(4, 3)
    before = [copy.deepcopy(m.state_dict()) for m in (net, backbone)]
    X0 = clients[0][0]
    for model in (lambda nf, no: net,
                  lambda nf, no: torch.nn.Sequential(backbone, torch.nn.Linear(3, no))):
        est = CLoVE(n_rounds=2, model=model, init="same", random_state=0).fit(clients)
        assert est.models_[0] is not est.models_[1]
        for j in range(2):  # each model holds its own trained weights
            reference = est._template
            reference.load_state_dict({k: v[j] for k, v in est._states.items()})
            with torch.no_grad():
                want = reference(torch.as_tensor(X0)).numpy()
            np.testing.assert_array_equal(est.predict(X0, cluster=j), want[:, 0])
        assert not np.array_equal(est.predict(X0, cluster=0), est.predict(X0, cluster=1))
    for m, state in zip((net, backbone), before):
        assert m.training
        for k, v in m.state_dict().items():
            assert torch.equal(v, state[k])


def test_user_template_left_untouched(clients):
    template = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.1),
                                   torch.nn.Linear(3, 1)).double().eval()
    template[0].weight.requires_grad_(False)
    template.register_forward_hook(lambda *args: None)
    snapshot = copy.deepcopy(template.state_dict())
    est = CLoVE(n_rounds=2, model=lambda nf, no: template,  # the user's own object
                random_state=0).fit(clients)
    assert not template.training
    assert [p.requires_grad for p in template.parameters()] == [False, True, True, True]
    assert all(p.dtype == torch.float64 for p in template.parameters())
    assert len(template._forward_hooks) == 1
    for k, v in template.state_dict().items():
        assert torch.equal(v, snapshot[k])
    # the models are float32 copies (the data's dtype) holding the initial weights cast
    assert all(p.dtype == torch.float32 for m in est.models_ for p in m.parameters())


def test_callable_builds_in_float32_under_any_default(clients):
    # a factory ran under the caller's default dtype: under float16 its initial weights
    # were drawn in half precision and then cast (precision silently lost)
    def fit():
        est = CLoVE(n_rounds=1, model=_user_model, random_state=0).fit(clients)
        return est._states

    expected = fit()
    for context in ("default_float16", "default_bfloat16", "default_float64"):
        with AMBIENT[context]():
            assert_same_result(expected, fit())


def test_inputs_not_mutated_and_odd_tensors_accepted(clients):
    arrays = [(X.copy(), y.copy()) for X, y in clients]
    for X, y in arrays:
        X.flags.writeable = False
        y.flags.writeable = False
    expected = _fit_all("clove_linear", clients)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read-only arrays: no "not writable" warning
        assert_same_result(expected, _fit_all("clove_linear", arrays))
    for (X, y), (X0, y0) in zip(arrays, clients):
        np.testing.assert_array_equal(X, X0)
        np.testing.assert_array_equal(y, y0)
    # tensors requiring grad, and inference tensors made by the caller's evaluation code
    grads = [(torch.tensor(X, requires_grad=True), torch.tensor(y)) for X, y in clients]
    with torch.inference_mode():
        inference = [(torch.tensor(X), torch.tensor(y)) for X, y in clients]
    for data in (grads, inference):
        est = CLoVE(n_rounds=1, batch_size=8, random_state=0).fit(data)
        for v in est._states.values():
            assert not v.requires_grad and v.grad_fn is None and not v.is_inference()
        for p in est.models_[0].parameters():
            assert p.grad is None and not p.is_inference()
        np.testing.assert_array_equal(est.loss_vectors_, expected["loss_vectors"])
    assert all(X.grad is None for X, _ in grads)


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "default_float64",
                                     "default_float16"])
def test_save_load_indifferent_to_ambient_state(context, clients, tmp_path):
    est = CLoVE(n_rounds=2, model="mlp", hidden_layer_sizes=(3,), random_state=0).fit(clients)
    path = tmp_path / "clove.pt"
    with AMBIENT[context]():
        est.save(path)
        loaded = CLoVE.load(path)
    X0 = clients[0][0]
    np.testing.assert_array_equal(loaded.predict(X0, client=0), est.predict(X0, client=0))
    # loaded inside inference_mode, the models are still usable for fine-tuning
    model = loaded.models_[0]
    assert not any(p.is_inference() for p in model.parameters())
    model(torch.as_tensor(X0)).pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


L = np.random.default_rng(0).random((8, 3)) + np.repeat(np.eye(3)[[0, 1]], 4, axis=0)
FUNCTIONS = {
    "clove_assign": lambda L: clove_assign(L, 2, random_state=0, return_centers=True),
    "ifca_assign": ifca_assign,
    "choose_n_clusters": lambda L: choose_n_clusters(L, 4),
}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_assignment_functions_indifferent_to_ambient_state(name, context):
    fn = FUNCTIONS[name]
    check_ambient(lambda: fn(L.copy()), context)
    expected = fn(L)
    # a loss matrix given as a tensor requiring grad, or made under inference_mode
    assert_same_result(expected, fn(torch.tensor(L, requires_grad=True)))
    with torch.inference_mode():
        L_inf = torch.tensor(L)
    assert_same_result(expected, fn(L_inf))
    ro = L.copy()
    ro.flags.writeable = False
    assert_same_result(expected, fn(ro))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_assignment_functions_thread_safe(name):
    check_state_untouched(lambda: FUNCTIONS[name](L))
    check_thread_safe(lambda: FUNCTIONS[name](L))


# -- Flower ---------------------------------------------------------------------------------
def _flower_setup():
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from mlpapers.federated.clove._flower import make_client_app

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3)).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5])
    app = make_client_app(lambda: torch.nn.Linear(3, 1), lambda ctx: (X, y), batch_size=4)
    gen = torch.Generator().manual_seed(0)
    models = [ArrayRecord({"weight": torch.randn(1, 3, generator=gen),
                           "bias": torch.randn(1, generator=gen)}) for _ in range(2)]

    def message(kind, records):
        meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                        reply_to_message_id="", group_id="1", created_at=time.time(),
                        ttl=3600.0, message_type=kind)
        return Message(content=RecordDict({**records, "config": ConfigRecord({"seed": 3})}),
                       metadata=meta)

    def call():
        ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 0},
                      state=RecordDict(), run_config={})
        losses = app(message("train.losses", {"m0": models[0], "m1": models[1]}), ctx)
        trained = app(message("train", {"arrays": models[1]}), ctx)
        assert not losses.has_error() and not trained.has_error()
        return (list(losses.content["metrics"]["losses"]),
                trained.content["arrays"].to_torch_state_dict())

    return call


@pytest.mark.parametrize("context", list(AMBIENT))
def test_flower_client_indifferent_to_ambient_state(context):
    # the node's training failed inside no_grad/inference_mode, and model_fn() advanced
    # the node's global torch RNG on every message
    check_ambient(_flower_setup(), context)


def test_flower_client_thread_safe():
    call = _flower_setup()
    check_state_untouched(call)
    check_state_untouched(lambda: check_thread_safe(call))


@pytest.mark.parametrize("context", list(AMBIENT))
def test_flower_strategy_aggregation_indifferent_to_ambient_state(context):
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from flwr.app import ArrayRecord

    from mlpapers.federated.clove._flower import CLoVEStrategy

    gen = torch.Generator().manual_seed(0)
    states = {nid: {"weight": torch.randn(1, 3, generator=gen),
                    "bias": torch.randn(1, generator=gen)} for nid in (10, 11, 12)}

    def aggregate():
        strategy = CLoVEStrategy(n_clusters=2, random_state=0)
        strategy.models_ = [ArrayRecord(dict(states[10])), ArrayRecord(dict(states[12]))]
        strategy.labels_ = {10: 0, 11: 0, 12: 1}
        replies = [SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid),
                                   content={"metrics": {"num-examples": n},
                                            "arrays": ArrayRecord(dict(states[nid]))})
                   for nid, n in ((10, 1), (11, 3), (12, 2))]
        strategy.aggregate_train(1, replies)
        return [m.to_torch_state_dict() for m in strategy.models_]

    check_ambient(aggregate, context)
