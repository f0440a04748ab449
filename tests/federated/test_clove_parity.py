"""Parity between CLoVE code paths that claim to agree.

Each test names the paths it compares: the Flower client's loss vector vs the
estimator's ``loss_vectors_`` (and ``assign``'s), the client's local training vs the
estimator's engine, the strategy's averaging vs the estimator's
``weighted_model_average``, and the client's data checks vs the estimator's.
The Flower tests need the ``flower`` extra (skipped without it).
"""

import time

import numpy as np
import pytest
import torch

from mlpapers.federated import IFCA, CLoVE, FedAvg
from mlpapers.federated.clove._engine import ClientData, Engine
from mlpapers.federated.clove._kernels import weighted_model_average

try:  # the optional flower extra; the tests without Flower run anyway
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app
except ImportError:
    HAS_FLOWER = False
else:
    HAS_FLOWER = True

needs_flower = pytest.mark.skipif(not HAS_FLOWER, reason="needs the flower extra (flwr)")

RNG = np.random.default_rng(0)
D_IN = 3


class Net(torch.nn.Module):
    """A module-level factory (the estimator pickles it) for every loss."""

    def __init__(self, n_features=D_IN, n_outputs=1):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(n_features, 5), torch.nn.Tanh(),
                                        torch.nn.Linear(5, n_outputs))

    def forward(self, x):
        return self.body(x)


def _message(kind, records, group="1", seed=3):
    meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                    reply_to_message_id="", group_id=group, created_at=time.time(),
                    ttl=3600.0, message_type=kind)
    return Message(content=RecordDict({**records, "config": ConfigRecord({"seed": seed})}),
                   metadata=meta)


def _context():
    return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})


def _client_losses(app, models):
    records = {f"m{j}": ArrayRecord(m.state_dict()) for j, m in enumerate(models)}
    return np.array(app(_message("train.losses", records), _context())
                    .content["metrics"]["losses"])


def _clients(loss, n_clients=4):
    out = []
    for i in range(n_clients):
        X = RNG.normal(size=(9 + 3 * i, D_IN))  # unequal sizes, float64
        if loss == "mse":
            out.append((X, X @ np.array([1.0, -2.0, 0.5]) * (-1) ** i))
        elif loss == "cross_entropy":
            out.append((X, np.arange(len(X)) % 3))  # every class on every client
        else:
            out.append((X, None))
    return out


@needs_flower
@pytest.mark.parametrize("loss, n_out", [("mse", 1), ("cross_entropy", 3),
                                         ("reconstruction", D_IN)])
@pytest.mark.parametrize("vectorize", [False, True])
def test_flower_client_losses_equal_the_estimators_loss_vectors(loss, n_out, vectorize):
    """The Flower client's ``train.losses`` reply vs ``CLoVE.loss_vectors_`` (and the loss
    vector ``assign`` ranks) for the same data and models: bit for bit against the
    per-client loop, to float32 rounding against the vectorised loss matrix."""
    clients = _clients(loss)
    est = CLoVE(n_clusters=2, n_rounds=2, model=Net, loss=loss, batch_size=5,
                vectorize=vectorize, random_state=0).fit(clients)
    for i, (X, y) in enumerate(clients):
        app = make_client_app(lambda: Net(D_IN, n_out), lambda ctx, X=X, y=y: (X, y),
                              loss=loss)
        got = _client_losses(app, est.models_)
        exact = est._client_loss_vector(X, y)
        np.testing.assert_array_equal(got, exact.astype(np.float64))
        if vectorize:
            np.testing.assert_allclose(got, est.loss_vectors_[i], rtol=1e-5)
        else:
            np.testing.assert_array_equal(got, est.loss_vectors_[i])


@needs_flower
@pytest.mark.parametrize("batch_size", [1, 4, None, 100])
def test_flower_client_training_is_the_estimators_engine(batch_size):
    """The client's ``train`` reply vs the estimator's Engine (per-client loop, with the
    generator the message's seed and round define): bit for bit; and vs the vectorised
    engine to float32 rounding (the same mini-batches)."""
    X, y = _clients("mse")[1]
    app = make_client_app(lambda: Net(), lambda ctx: (X, y), loss="mse", local_epochs=2,
                          lr=0.05, batch_size=batch_size)
    start = Net()
    reply = app(_message("train", {"arrays": ArrayRecord(start.state_dict())}, group="4",
                         seed=7), _context())
    got = reply.content["arrays"].to_torch_state_dict()
    assert reply.content["metrics"]["num-examples"] == len(X)
    data = ClientData.from_lists([torch.as_tensor(X, dtype=torch.float32)],
                                 [torch.as_tensor(y, dtype=torch.float32)[:, None]],
                                 torch.device("cpu"))
    states = {k: v[None].clone() for k, v in start.state_dict().items()}
    for vectorize in (False, True):
        engine = Engine(Net(), "mse", vectorize=vectorize, optimizer="adam", lr=0.05,
                        batch_size=batch_size, local_epochs=2, user_model=True)
        gen = torch.Generator().manual_seed(7 * 100003 + 4)
        want = engine.local_train(states, torch.zeros(1, dtype=torch.long), data, gen)
        for k in got:
            if vectorize:
                torch.testing.assert_close(got[k], want[k][0], rtol=1e-5, atol=1e-6)
            else:
                torch.testing.assert_close(got[k], want[k][0], rtol=0, atol=0)
    assert not torch.equal(got["body.0.weight"], start.state_dict()["body.0.weight"])


@needs_flower
def test_strategy_average_equals_the_estimators_weighted_model_average():
    """CLoVEStrategy.aggregate_train (float64 sums) vs the estimator's
    weighted_model_average (float32) on the same client states, assignment and sizes:
    equal to float32 rounding; a model without nodes keeps its weights in both."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    K, sizes, assignment = 3, [5, 17, 1, 9, 30], [0, 2, 0, 2, 0]
    old = {k: torch.randn(K, *v.shape, generator=g) for k, v in Net().state_dict().items()}
    client = {k: torch.randn(len(sizes), *v.shape[1:], generator=g) for k, v in old.items()}
    want = weighted_model_average(client, torch.tensor(assignment),
                                  torch.tensor(sizes, dtype=torch.float64), old)
    strategy = CLoVEStrategy(n_clusters=K)
    strategy.models_ = [ArrayRecord({k: v[j].clone() for k, v in old.items()}) for j in range(K)]
    strategy.labels_ = dict(enumerate(assignment))
    strategy.aggregate_train(1, [SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=i),
        content={"metrics": {"num-examples": n},
                 "arrays": ArrayRecord({k: v[i].clone() for k, v in client.items()})})
        for i, n in enumerate(sizes)])
    for j in range(K):
        got = strategy.models_[j].to_torch_state_dict()
        for k in old:
            torch.testing.assert_close(got[k], want[k][j], rtol=2e-6, atol=1e-6)
    for k in old:  # model 1 had no node
        assert torch.equal(strategy.models_[1].to_torch_state_dict()[k], old[k][1])


@pytest.mark.parametrize("cls, loss, kw", [
    (IFCA, "cross_entropy", dict(batch_size=1, participation=0.6)),
    (FedAvg, "reconstruction", dict(batch_size=None, local_epochs=2)),
    (CLoVE, "cross_entropy", dict(batch_size=4, init="same", optimizer="sgd")),
])
def test_vectorised_and_loop_paths_agree_for_every_loss_and_estimator(cls, loss, kw):
    """vectorize=True (vmapped steps, batched Adam/SGD) vs vectorize=False (a loop over
    clients with torch.optim) for IFCA, FedAvg and CLoVE beyond the squared error:
    the same assignments, models and loss vectors to float32 rounding."""
    clients = [(X, np.array(["a", "b", "c"])[y]) if y is not None else X
               for X, y in _clients(loss, n_clients=5)]
    if cls is not FedAvg:
        kw = {**kw, "n_clusters": 2}
    a, b = (cls(model="mlp", loss=loss, n_rounds=2, vectorize=v, random_state=0, **kw)
            .fit(clients) for v in (True, False))
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.loss_vectors_, b.loss_vectors_, rtol=1e-5, atol=1e-6)
    for ma, mb in zip(a.models_, b.models_):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def _reply_error(app, msg_kind, records):
    with pytest.raises(ValueError) as info:
        app(_message(msg_kind, records), _context())
    return str(info.value)


@needs_flower
@pytest.mark.parametrize("kind", ["train.losses", "train"])
def test_flower_client_checks_its_data_as_the_estimator_does(kind):
    """The client's data handling vs the estimator's: a supervised loss without ``y``,
    labels the estimator refuses or cannot read as classes, and mismatched lengths
    raise ``ValueError`` at the node (they trained against ``X`` itself, were truncated
    to class indices, or failed deep in torch)."""
    X = RNG.normal(size=(8, D_IN))
    model = Net(D_IN, 2)
    records = ({"m0": ArrayRecord(model.state_dict())} if kind == "train.losses"
               else {"arrays": ArrayRecord(model.state_dict())})

    def app(y, loss):
        return make_client_app(lambda: Net(D_IN, 2), lambda ctx: (X, y), loss=loss)

    assert "needs targets" in _reply_error(app(None, "mse"), kind, records)
    assert "needs targets" in _reply_error(app(None, "cross_entropy"), kind, records)
    assert "integer class indices" in _reply_error(
        app(np.arange(8) % 2 + 0.5, "cross_entropy"), kind, records)
    assert "integer class indices" in _reply_error(
        app(np.array(list("abababab")), "cross_entropy"), kind, records)
    assert "1D class labels" in _reply_error(
        app((np.arange(8) % 2)[:, None], "cross_entropy"), kind, records)
    assert "[0, 2)" in _reply_error(app(np.arange(8) % 3, "cross_entropy"), kind, records)
    assert "from -1 to 0" in _reply_error(app(-(np.arange(8) % 2), "cross_entropy"), kind,
                                          records)
    assert "to match X" in _reply_error(app(np.ones(5), "mse"), kind, records)
    bad = X.copy()
    bad[0, 0] = np.nan
    msg = _reply_error(make_client_app(lambda: Net(D_IN, 2), lambda ctx: (bad, None),
                                       loss="reconstruction"), kind, records)
    assert "NaN" in msg
    # integral float labels are class indices, as int labels
    good = make_client_app(lambda: Net(D_IN, 2),
                           lambda ctx: (X, (np.arange(8) % 2).astype(float)),
                           loss="cross_entropy")
    ints = make_client_app(lambda: Net(D_IN, 2), lambda ctx: (X, np.arange(8) % 2),
                           loss="cross_entropy")
    np.testing.assert_array_equal(_client_losses(good, [model]), _client_losses(ints, [model]))


class _Scalar(torch.nn.Module):
    """One feature per sample, given as a 1-D X (the module adds the feature axis)."""

    def __init__(self, *shape):  # the estimator passes (input shape, n_outputs)
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def forward(self, x):
        return self.lin(x[:, None])


def test_a_tuple_of_two_1d_arrays_is_an_x_y_pair():
    """CLoVE client as ``(X, y)`` with a 1-D X vs the same data with X as a column: the
    same fit. Regression: a tuple of two 1-D arrays of one length read as a 2-row X
    without targets ("needs targets y"); only a 2-element list may be an X's rows."""
    g = np.random.default_rng(3)
    clients = [(x, 2 * x + 0.1 * g.normal(size=10)) for x in g.normal(size=(4, 10))]
    flat = CLoVE(model=_Scalar, n_clusters=1, n_rounds=2, random_state=0).fit(clients)
    assert flat.loss_vectors_.shape == (4, 1)
    from mlpapers.federated.clove._data import _split_client

    X, y = clients[0]
    assert _split_client((X, y))[1] is y
    assert _split_client((X, list(y)))[1] == list(y)   # one array in the tuple suffices
    assert _split_client([[1.0, 2.0], [3.0, 4.0]])[1] is None    # a 2-row X


@needs_flower
@pytest.mark.parametrize("kind", ["train.losses", "train"])
def test_flower_client_accepts_1d_x(kind):
    """The node's data vs the estimator's: a 1-D X (one feature per sample) with its y
    trains and scores at the node. Regression: the node's new data check read the pair
    as a 2-row X without targets and failed with a TypeError."""
    g = np.random.default_rng(4)
    X = g.normal(size=10)
    app = make_client_app(_Scalar, lambda ctx: (X, 2 * X), loss="mse", lr=0.05)
    model = _Scalar()
    records = ({"m0": ArrayRecord(model.state_dict())} if kind == "train.losses"
               else {"arrays": ArrayRecord(model.state_dict())})
    reply = app(_message(kind, records), _context())
    assert reply.content["metrics"]["num-examples"] == 10
    if kind == "train.losses":
        with torch.no_grad():
            want = float(((model(torch.as_tensor(X, dtype=torch.float32))[:, 0]
                           - torch.as_tensor(2 * X, dtype=torch.float32)) ** 2).mean())
        assert reply.content["metrics"]["losses"][0] == pytest.approx(want, rel=1e-6)


@needs_flower
def test_flower_client_class_probe_holds_the_librarys_rng_lock(monkeypatch):
    """The node's cross-entropy class-count probe vs a seeded fit in another thread: the
    probe forks the global RNG inside the library's lock, so the fork's restore cannot
    rewind another thread's seeded draws (it used an unlocked fork)."""
    import threading

    from mlpapers._utils._ambient import _DEFAULT_DTYPE_LOCK
    from mlpapers.federated.clove import _flower

    held = []
    real = _flower.probe_module

    def probe(*args, **kwargs):
        other = []
        t = threading.Thread(target=lambda: other.append(
            _DEFAULT_DTYPE_LOCK.acquire(blocking=False)))
        t.start()
        t.join()
        if other[0]:
            _DEFAULT_DTYPE_LOCK.release()
        held.append(not other[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(_flower, "probe_module", probe)
    X = RNG.normal(size=(6, D_IN))
    app = make_client_app(lambda: Net(D_IN, 2), lambda ctx: (X, np.arange(6) % 2),
                          loss="cross_entropy")
    _client_losses(app, [Net(D_IN, 2)])
    assert held and all(held)


def test_a_tuple_of_rows_is_still_an_x_for_assign_fit_and_score():
    """assign/fit with X given as a tuple of two rows of numbers vs the same X as an
    array: the same result (the pair rule applies to tuples holding arrays only)."""
    g = np.random.default_rng(5)
    est = CLoVE(n_clusters=1, model="linear", n_rounds=1, random_state=0).fit(
        [g.normal(size=(8, 3)) for _ in range(4)])
    rows = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    assert est.assign(rows) == est.assign(np.array(rows))
    assert CLoVE(n_clusters=1, model="linear", n_rounds=1, random_state=0).fit(
        [rows] * 3).n_clients_ == 3
