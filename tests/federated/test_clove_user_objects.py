"""CLoVE / IFCA / FedAvg and the Flower client with the user's own model factory: train
and eval modes, dropout (per-client loop and vmap), frozen and tied parameters, modules
without parameters, output contracts, the factory's calls, persistence and threads."""

import pickle
import re
import time

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import IFCA, CLoVE, FedAvg
from tests._ambient import check_state_untouched, check_thread_safe

CLIENTS, TRUTH, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=40, n_features=5, random_state=0)
CLIENTS6 = make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=30,
                                 n_features=5, random_state=1)[0]
KW = dict(n_rounds=3, batch_size=16, lr=0.05, random_state=0)


def dropout_net(n_features, n_outputs, p=0.5):
    return nn.Sequential(nn.Linear(n_features, 12), nn.Dropout(p), nn.ReLU(),
                         nn.Linear(12, n_outputs))


def no_dropout_net(n_features, n_outputs):
    return dropout_net(n_features, n_outputs, p=0.0)


def bn_net(n_features, n_outputs):
    return nn.Sequential(nn.Linear(n_features, 8), nn.BatchNorm1d(8), nn.ReLU(),
                         nn.Linear(8, n_outputs))


FIXED = torch.randn(8, 5, generator=torch.Generator().manual_seed(7))


class FrozenFirst(nn.Module):
    """A fixed (frozen) first layer, the same whatever the seed, and a trained head."""

    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.a, self.b = nn.Linear(n_features, 8), nn.Linear(8, n_outputs)
        with torch.no_grad():
            self.a.weight.copy_(FIXED)
        self.a.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Tied(nn.Module):
    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.a, self.c, self.d = (nn.Linear(n_features, 6), nn.Linear(6, 6),
                                  nn.Linear(6, 6))
        self.d.weight = self.c.weight
        self.head = nn.Linear(6, n_outputs)

    def forward(self, x):
        return self.head(torch.tanh(self.d(torch.tanh(self.c(torch.tanh(self.a(x)))))))


def _states(est):
    return {k: v.numpy() for k, v in est._states.items()}


def _fit(cls=CLoVE, clients=CLIENTS, **kw):
    params = dict(KW, **({"n_clusters": 2} if cls is not FedAvg else {}))
    params.update(kw)
    return cls(**params).fit(clients)


def _loss_reference(est):
    """float64 mean squared error of every model (eval mode) on every client."""
    out = np.empty((len(CLIENTS), len(est.models_)))
    for j, model in enumerate(est.models_):
        model64 = pickle.loads(pickle.dumps(model)).double().eval()
        for i, (X, y) in enumerate(CLIENTS):
            with torch.no_grad():
                pred = model64(torch.as_tensor(X, dtype=torch.float64))[:, 0].numpy()
            out[i, j] = np.mean((pred - y) ** 2)
    return out


# ---------------------------------------------------------------------- dropout -----
@pytest.mark.parametrize("vectorize", ["auto", True])
def test_dropout_trains_reproducibly_without_touching_the_global_rng(vectorize):
    # the per-client loop drew the masks from the global RNG (advanced it, and the fit
    # was not reproducible under random_state); vmap raised "randomness error mode"
    first = check_state_untouched(lambda: _states(_fit(model=dropout_net,
                                                       vectorize=vectorize)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(999)
        again = _states(_fit(model=dropout_net, vectorize=vectorize))
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    other = _states(_fit(model=dropout_net, vectorize=vectorize, random_state=1))
    assert any(not np.array_equal(first[k], other[k]) for k in first)
    plain = _states(_fit(model=no_dropout_net, vectorize=vectorize))  # dropout is active
    assert any(not np.array_equal(first[k], plain[k]) for k in first)


@pytest.mark.parametrize("vectorize", [False, True])
def test_loss_vectors_are_eval_mode_losses(vectorize):
    est = _fit(model=dropout_net, vectorize=vectorize)
    np.testing.assert_allclose(est.loss_vectors_, _loss_reference(est), rtol=1e-4)
    X = CLIENTS[0][0]
    pred = check_state_untouched(lambda: est.predict(X, client=0))
    np.testing.assert_array_equal(pred, est.predict(X, client=0))


def test_flower_client_dropout_is_reproducible_and_leaves_the_node_rng():
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from mlpapers.federated.clove._flower import make_client_app

    X, y = CLIENTS[0]
    app = make_client_app(lambda: dropout_net(5, 1), lambda ctx: (X, y), batch_size=8,
                          local_epochs=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        arrays = ArrayRecord(dropout_net(5, 1).state_dict())

    def train(seed):
        meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                        reply_to_message_id="", group_id="1", created_at=time.time(),
                        ttl=3600.0, message_type="train")
        msg = Message(content=RecordDict({"arrays": arrays,
                                          "config": ConfigRecord({"seed": seed})}),
                      metadata=meta)
        ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
        reply = app(msg, ctx)
        assert not reply.has_error()
        return {k: v.numpy() for k, v in reply.content["arrays"].to_torch_state_dict().items()}

    first = check_state_untouched(lambda: train(3))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        again = train(3)
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    other = train(4)
    assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_dropout_fits_are_thread_safe():
    check_thread_safe(lambda: _states(_fit(model=dropout_net, n_rounds=2)))


# --------------------------------------------------------------------- batchnorm -----
def test_batchnorm_predicts_in_eval_mode_and_pickles():
    est = _fit(FedAvg, model=bn_net)
    X = CLIENTS[1][0]
    whole = est.predict(X[:10])
    rows = np.concatenate([est.predict(X[i:i + 1]) for i in range(10)])
    np.testing.assert_allclose(whole, rows, rtol=1e-5, atol=1e-6)
    assert est._states["1.running_var"].shape == (1, 8)  # averaged with the weights
    back = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    with pytest.raises(ValueError, match="vectorize=True needs a model without buffers"):
        _fit(FedAvg, model=bn_net, vectorize=True)


def test_lambda_factory_does_not_pickle_and_save_is_refused(tmp_path):
    est = _fit(FedAvg, model=lambda d, k: nn.Linear(d, k), n_rounds=1)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(est)
    with pytest.raises(TypeError, match="pickle"):
        est.save(tmp_path / "fedavg.pt")


# ------------------------------------------------------------ frozen / tied / none -----
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("cls", [CLoVE, IFCA, FedAvg])
def test_frozen_parameters_stay_exactly_as_built(cls, vectorize):
    # vmap trained them (moved by 0.03); the per-client loop rounded them in the average
    # (client weights 1/3 are not exact in float32)
    est = _fit(cls, CLIENTS6, model=FrozenFirst, vectorize=vectorize, optimizer="sgd")
    for model in est.models_:
        assert torch.equal(model.a.weight, FIXED)
        assert not model.a.weight.requires_grad
    assert est.history_[-1]["loss"] < est.history_[0]["loss"]  # the head did train


def test_frozen_model_agrees_between_vmap_and_loop():
    loop, vmap = (_fit(FedAvg, model=FrozenFirst, vectorize=v, optimizer="sgd")
                  for v in (False, True))
    for k, v in loop._states.items():
        torch.testing.assert_close(vmap._states[k], v, rtol=1e-4, atol=1e-6)


def test_tied_weights_vectorize_and_agree_with_the_loop():
    # vectorize=True raised "functional_call got multiple values for keys [...] tied"
    loop, vmap = (_fit(FedAvg, model=Tied, vectorize=v, optimizer="sgd")
                  for v in (False, True))
    for k, v in loop._states.items():
        torch.testing.assert_close(vmap._states[k], v, rtol=1e-4, atol=1e-6)
    for est in (loop, vmap):
        m = est.models_[0]
        assert m.c.weight is m.d.weight
        assert torch.equal(est._states["c.weight"], est._states["d.weight"])


@pytest.mark.parametrize("vectorize", [False, True])
def test_model_without_trainable_parameters_is_refused(vectorize):
    class NoParams(nn.Module):
        def __init__(self, d, k):
            super().__init__()
            self.lin = nn.Linear(d, k).requires_grad_(False)

        def forward(self, x):
            return self.lin(x)

    # was torch's "optimizer got an empty parameter list"
    with pytest.raises(ValueError, match="without trainable parameters"):
        _fit(FedAvg, model=NoParams, vectorize=vectorize)


# ---------------------------------------------------------------- output contract -----
class _Out(nn.Module):
    def __init__(self, d, k, kind):
        super().__init__()
        self.lin, self.kind = nn.Linear(d, k), kind

    def forward(self, x):
        out = self.lin(x)
        return {"int": out.long(), "bool": out > 0, "nan": out * float("nan"),
                "float64": out.double(), "tuple": (out,)}[self.kind]


@pytest.mark.parametrize("kind", ["int", "bool"])
def test_non_float_output_is_named(kind):
    # was "element 0 of tensors does not require grad and does not have a grad_fn"
    with pytest.raises(TypeError, match="floating-point tensor"):
        _fit(FedAvg, model=lambda d, k: _Out(d, k, kind))


def test_non_finite_output_is_named_before_training():
    # was reported as a diverged model in round 0 ("lower lr")
    with pytest.raises(ValueError, match="non-finite output"):
        _fit(FedAvg, model=lambda d, k: _Out(d, k, "nan"))


def test_tuple_output_is_named_and_float64_output_works():
    with pytest.raises(TypeError, match="model must return a tensor, got tuple"):
        _fit(FedAvg, model=lambda d, k: _Out(d, k, "tuple"))
    est = _fit(FedAvg, model=lambda d, k: _Out(d, k, "float64"))
    assert np.isfinite(est.loss_vectors_).all()


# ---------------------------------------------------------------------- the factory -----
@pytest.mark.parametrize("init", ["random", "same"])
def test_factory_calls_as_documented(init):
    calls = []

    def factory(n_features, n_outputs):
        calls.append((n_features, n_outputs))
        return nn.Linear(n_features, n_outputs)

    _fit(CLoVE, model=factory, init=init, n_clusters=2)
    # the template, the initial models (one for "same"), the fitted models_
    assert len(calls) == 1 + (2 if init == "random" else 1) + 2
    assert all(type(d) is int and type(k) is int for d, k in calls)
    assert set(calls) == {(5, 1)}


class Doubling(nn.Module):
    def __init__(self, d, k):
        super().__init__()
        self.lin = nn.Linear(d, k)

    def forward(self, x):
        x.mul_(2.0)  # careless in-place preprocessing
        return self.lin(x)


class CleanDoubling(Doubling):
    def forward(self, x):
        return self.lin(2.0 * x)


@pytest.mark.parametrize("vectorize", [False, True])
def test_model_modifying_its_input_in_place_corrupts_nothing(vectorize):
    """The loss matrix ran the model on views of the stored client data (and the probe on
    the first client's first sample), so an in-place forward doubled the training data
    and the caller's tensors; the model now gets copies: the run equals one of a model
    that doubles a copy."""
    clients = [(torch.tensor(X), y) for X, y in CLIENTS]
    est = _fit(CLoVE, clients, model=Doubling, vectorize=vectorize)
    for (Xt, _), (X, _) in zip(clients, CLIENTS):
        np.testing.assert_array_equal(Xt.numpy(), X)
    clean = _fit(CLoVE, model=CleanDoubling, vectorize=vectorize)
    for k, v in clean._states.items():
        torch.testing.assert_close(est._states[k], v, rtol=1e-6, atol=1e-7)
    X0 = CLIENTS[0][0].copy()
    pred = est.predict(X0, client=0)
    np.testing.assert_array_equal(X0, CLIENTS[0][0])
    np.testing.assert_array_equal(est.predict(X0, client=0), pred)
    assert est.assign(X0, CLIENTS[0][1]) == est.assign(X0, CLIENTS[0][1])


def test_flower_client_batchnorm_never_trains_on_one_sample():
    # (session 18) a node of 21 samples with batch_size=10 ended each epoch on a batch of
    # one, and BatchNorm replied "Expected more than 1 value per channel when training";
    # the lone sample now joins the batch before it, and a node of one sample is refused
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from mlpapers.federated.clove._flower import make_client_app

    X, y = CLIENTS[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        arrays = ArrayRecord(bn_net(5, 1).state_dict())

    def train(n_rows):
        app = make_client_app(lambda: bn_net(5, 1), lambda ctx: (X[:n_rows], y[:n_rows]),
                              batch_size=10)
        meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                        reply_to_message_id="", group_id="1", created_at=time.time(),
                        ttl=3600.0, message_type="train")
        msg = Message(content=RecordDict({"arrays": arrays,
                                          "config": ConfigRecord({"seed": 0})}),
                      metadata=meta)
        ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
        return app(msg, ctx)

    reply = train(21)
    assert not reply.has_error(), reply.error.reason
    trained = reply.content["arrays"].to_torch_state_dict()
    assert all(bool(torch.isfinite(v).all()) for v in trained.values()
               if v.is_floating_point())
    # (a deployed node replies with the error; called directly, the app raises it)
    # (the node itself, not "node(s) [0]", an index within the node)
    with pytest.raises(ValueError, match=r"^this node holds a single sample"):
        train(1)


# -- (session 18, review) BatchNorm rules per model, vmap errors, unused parameters ------
class PlainBatchNorm(nn.Module):
    """``F.batch_norm`` with BatchNorm's state and update (momentum 0.1, eps 1e-5), but
    no ``_BatchNorm`` subclass: the reference a BatchNorm that gets several values per
    channel must train like (no batch of the epoch merged or refused)."""

    def __init__(self, c):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.num_batches_tracked.add_(1)
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                        self.bias, self.training, 0.1, 1e-5)


def conv2d_net(bn):
    return lambda d, o: nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), bn(3), nn.ReLU(),
                                      nn.Flatten(), nn.Linear(48, o))


def conv1d_net(bn):
    return lambda d, o: nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), bn(3), nn.ReLU(),
                                      nn.Flatten(), nn.Linear(15, o))


class UnusedBatchNorm(nn.Module):
    def __init__(self, d, o, with_bn=True):
        super().__init__()
        self.a = nn.Linear(d, o)
        if with_bn:
            self.bn = nn.BatchNorm1d(d)  # built, never called

    def forward(self, x):
        return self.a(x)


BN_MODELS = {  # (model, its reference without a _BatchNorm, a client's input shape)
    "BatchNorm2d": (conv2d_net(nn.BatchNorm2d), conv2d_net(PlainBatchNorm), (1, 4, 4)),
    "Conv1d+BatchNorm1d": (conv1d_net(nn.BatchNorm1d), conv1d_net(PlainBatchNorm), (2, 5)),
    "unused": (UnusedBatchNorm, lambda d, o: UnusedBatchNorm(d, o, with_bn=False), (4,)),
}


@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("name", list(BN_MODELS))
def test_batchnorm_with_several_values_per_channel_trains_any_batch(name, batch_size):
    # the lone-sample rules (refuse batch_size=1 and clients of one sample, merge a lone
    # last sample) turned on for any BatchNorm class, but torch refuses only one value
    # per channel: these fits were refused (batch_size=1, a client of one sample), or
    # trained other batches (batch_size=2: odd clients' lone last samples were merged)
    model, reference, shape = BN_MODELS[name]
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(m, *shape)).astype(np.float32), rng.integers(0, 2, m))
               for m in ((5, 7, 1, 6) if batch_size == 1 else (5, 7, 3, 6))]
    kw = dict(n_rounds=2, batch_size=batch_size, random_state=0, vectorize=False)
    est = FedAvg(model=model, **kw).fit(clients)
    ref = FedAvg(model=reference, **kw).fit(clients)
    X0 = clients[0][0]
    np.testing.assert_array_equal(est.predict_proba(X0), ref.predict_proba(X0))
    np.testing.assert_array_equal(est.loss_vectors_, ref.loss_vectors_)
    if name != "unused":  # the same state, bit for bit
        assert est._states.keys() == ref._states.keys()
        for k, v in est._states.items():
            torch.testing.assert_close(v, ref._states[k], rtol=0, atol=0)


def test_batchnorm_on_one_value_per_channel_still_refuses_batches_of_one():
    with pytest.raises(ValueError, match=r"batch_size=1 .*one value per channel"):
        FedAvg(model=bn_net, batch_size=1, n_rounds=1).fit(CLIENTS)


class TrainBug(nn.Module):
    """A genuine model bug in train mode (a shape error), whatever vmap does."""

    def __init__(self, d, o):
        super().__init__()
        self.a, self.b = nn.Linear(d, o), nn.Linear(d + 1, o)

    def forward(self, x):
        return self.b(x) if self.training else self.a(x)


class EvalBug(TrainBug):
    """A bug in eval mode on batches of several rows (the one-row output check passes):
    the loss matrix fails."""

    def forward(self, x):
        return self.a(x) if self.training or len(x) == 1 else self.b(x)


@pytest.mark.parametrize("Model", [TrainBug, EvalBug])
def test_model_bug_under_vmap_raises_its_own_error(Model):
    # every RuntimeError under vectorize=True was rewritten as "use vectorize=False",
    # which does not cure a model that fails outside vmap too: its own error now
    with pytest.raises(RuntimeError) as info:
        CLoVE(model=Model, n_clusters=2, n_rounds=1, vectorize=True, random_state=0).fit(
            CLIENTS)
    assert type(info.value) is RuntimeError and "vectorize" not in str(info.value)


class ItemNet(nn.Module):
    """Control flow on a value (``.item()``): runs in a loop, not under vmap."""

    def __init__(self, d, o):
        super().__init__()
        self.a = nn.Linear(d, o)

    def forward(self, x):
        return self.a(x) * float(x.sum().item() > -1e30)


def test_vmap_only_failure_names_vectorize_and_chains_the_error():
    with pytest.raises(ValueError) as info:
        FedAvg(model=ItemNet, n_rounds=1, vectorize=True, random_state=0).fit(CLIENTS)
    msg = str(info.value)
    assert msg.startswith("model failed with vectorize=True")
    assert re.search(r"\.item\(\).*\w\. It runs outside vmap: use vectorize=False", msg,
                     re.S)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__).rstrip(". ") in msg


class Spare(nn.Module):
    def __init__(self, d, o):
        super().__init__()
        self.a, self.spare = nn.Linear(d, o), nn.Linear(d, o)  # spare: never used

    def forward(self, x):
        return self.a(x)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_unused_parameter_trains_vectorized_like_the_loop(optimizer):
    # torch.autograd.grad refused the unused parameter under vectorize=True ("appears to
    # not have been used in the graph"); the loop path trains it as untouched
    kw = dict(model=Spare, n_clusters=2, n_rounds=2, optimizer=optimizer, lr=0.05,
              batch_size=16, random_state=0)
    vec = CLoVE(vectorize=True, **kw).fit(CLIENTS)
    loop = CLoVE(vectorize=False, **kw).fit(CLIENTS)
    np.testing.assert_array_equal(vec.labels_, loop.labels_)
    np.testing.assert_allclose(vec.loss_vectors_, loop.loss_vectors_, rtol=1e-4, atol=1e-6)
    for k, v in vec._states.items():
        torch.testing.assert_close(v, loop._states[k], rtol=1e-4, atol=1e-6)


_LABEL_TENSORS = ["requires_grad", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("where", _LABEL_TENSORS)
def test_cluster_labels_may_be_a_tensor_numpy_cannot_read(where):
    # typing audit: fit's cluster_labels is array-like or a tensor, but np.asarray
    # refused a tensor on the GPU (TypeError) or one that requires grad (RuntimeError)
    clients, truth, _ = make_federated_linear(
        n_clusters=2, n_clients_per_cluster=2, n_samples=20, n_features=3, random_state=0)
    labels = (torch.tensor(truth, dtype=torch.float32, requires_grad=True)
              if where == "requires_grad" else torch.tensor(truth, device="cuda"))
    kw = dict(n_clusters=2, n_rounds=2, local_epochs=5, lr=0.05, random_state=0)
    with_tensor = CLoVE(**kw).fit(clients, cluster_labels=labels)
    with_array = CLoVE(**kw).fit(clients, cluster_labels=truth)
    assert [h["ari"] for h in with_tensor.history_] == [h["ari"] for h in with_array.history_]
