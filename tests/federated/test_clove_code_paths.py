"""Paths of the clove package found by reading it with branch coverage (session 19):
the MSE targets of a new client (``assign``) and of a Flower node, now encoded by one
function (``_data.mse_targets``) and checked against the models' outputs."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from mlpapers.federated import CLoVE

G = np.random.default_rng(0)
X = G.normal(size=(30, 3))
ONE = [(X, X @ [1.0, 2.0, 3.0] + 0.1 * G.normal(size=30)) for _ in range(4)]
TWO = [(X, np.c_[X @ [1.0, 2.0, 3.0], X[:, 0]]) for _ in range(4)]


@pytest.fixture(scope="module")
def fitted():
    return {k: CLoVE(n_clusters=2, n_rounds=1, random_state=0).fit(c)
            for k, c in (("one", ONE), ("two", TWO))}


def test_assign_refuses_targets_of_another_width(fitted):
    """assign with y of another number of outputs than fit's: the squared error
    broadcast (n, 1) outputs against (n, 2) targets and picked a model silently."""
    with pytest.raises(ValueError, match=r"y has 2 output\(s\) per sample, but CLoVE was "
                                         r"fitted on 1"):
        fitted["one"].assign(X, np.c_[X[:, 0], X[:, 1]])
    with pytest.raises(ValueError, match=r"y has 1 output\(s\) per sample, but CLoVE was "
                                         r"fitted on 2"):
        fitted["two"].assign(X, X[:, 0])
    with pytest.raises(ValueError, match="loss='mse' needs numeric targets y"):
        fitted["one"].assign(X, np.array(list("abc") * 10))


@pytest.mark.parametrize("bad_x, bad_y, match", [
    (X[:, :2], None, r"^X has samples of shape \(2,\) \(2 features\), but CLoVE expects \(3,\)"),
    (np.where(X == X[0, 0], np.nan, X), None, r"^Input X contains NaN"),
    (X, "short", r"^y must have shape \(30,\)"),
    (X, "nan", r"^Input y contains NaN"),
    (__import__("scipy.sparse").sparse.csr_matrix(X), None, r"^X is a scipy sparse"),
])
def test_assign_errors_name_its_arguments_not_a_client_list(fitted, bad_x, bad_y, match):
    """assign(X, y) takes one client's data as arguments: its errors named
    "clients[0]", a list the caller never passed (session 23)."""
    y = {None: ONE[0][1], "short": ONE[0][1][:5], "nan": np.r_[np.nan, ONE[0][1][1:]]}[bad_y]
    with pytest.raises((ValueError, TypeError), match=match) as err:
        fitted["one"].assign(bad_x, y)
    assert "clients" not in str(err.value)


def test_assign_is_the_argmin_of_the_loss_vector_from_the_definition(fitted):
    """assign's loss of each model, from the definition (mean squared error of the
    model's outputs, float64 reference), and its argmin; a (n, 1) y is a 1-D y."""
    est = fitted["two"]
    g = np.random.default_rng(7)  # (a module-level generator made the data order-dependent)
    Xn, y = g.normal(size=(12, 3)), g.normal(size=(12, 2))
    with torch.no_grad():
        ref = [float(((m(torch.as_tensor(Xn, dtype=torch.float32)).double().numpy()
                       - y) ** 2).mean()) for m in est.models_]
    np.testing.assert_allclose(est._client_loss_vector(Xn, y), ref, rtol=1e-5)
    assert est.assign(Xn, y) == int(np.argmin(ref))
    one = fitted["one"]
    y1 = g.normal(size=12)
    assert one.assign(Xn, y1[:, None]) == one.assign(Xn, y1)


def _node_reply(model_fn, X, y, kind="train.losses", loss="mse"):
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from mlpapers.federated.clove._flower import make_client_app

    app = make_client_app(model_fn, lambda ctx: (X, y), loss=loss)
    meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                    reply_to_message_id="", group_id="1", created_at=time.time(),
                    ttl=3600.0, message_type=kind)
    records = {"m0": ArrayRecord(model_fn().state_dict())}
    msg = Message(content=RecordDict({**records, "config": ConfigRecord({"seed": 0})}),
                  metadata=meta)
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    return app(msg, ctx)


class _Flat(torch.nn.Module):
    """A regression model returning (batch,) instead of (batch, 1)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.lin(x)[:, 0]


class _Pair(torch.nn.Module):
    """A model returning a tuple (its output and a hidden value)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.lin(x), x


def _batch_stats_net():
    return torch.nn.Sequential(torch.nn.Linear(3, 4),
                               torch.nn.BatchNorm1d(4, track_running_stats=False),
                               torch.nn.Linear(4, 2))


@pytest.mark.parametrize("loss", ["mse", "cross_entropy", "reconstruction"])
def test_flower_node_refuses_batchnorm_without_running_statistics_as_fit_does(loss):
    """A node's model with a BatchNorm built with track_running_stats=False: its
    one-sample output probe failed with torch's "Expected more than 1 value per channel
    when training" (the MSE node accepted it before the width check, with loss vectors
    that depend on the batching); now fit's clear refusal, naming the layer, for every
    loss (CLoVE's fit refuses it for every loss)."""
    y = {"mse": np.c_[X[:, 0], X[:, 1]], "cross_entropy": np.arange(30) % 2,
         "reconstruction": None}[loss]
    model_fn = (_batch_stats_net if loss != "reconstruction" else lambda: torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, track_running_stats=False),
        torch.nn.Linear(4, 3)))
    with pytest.raises(ValueError, match=r"model_fn\(\)'s BatchNorm1d '1' has no running "
                                         r"statistics .*build it with "
                                         r"track_running_stats=True"):
        _node_reply(model_fn, X, y, loss=loss)
    # the refusing hooks are removed when the probe raises; a BatchNorm with running
    # statistics (the default) passes the probe, which reports its width
    from mlpapers.federated.clove._flower import _output_width

    Xt = torch.as_tensor(X, dtype=torch.float32)
    net = _batch_stats_net()
    with pytest.raises(ValueError, match="track_running_stats=True"):
        _output_width(net, Xt)
    assert not any(m._forward_pre_hooks for m in net.modules())
    ok = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert _output_width(ok, Xt) == (2, "shape (1, 2)")


def test_flower_node_refuses_targets_of_another_width():
    """A node's y against its model's outputs (the estimator's fit checks the same):
    (n, 1) outputs against (n, 2) targets, or (n,) outputs against (n, 1) targets,
    broadcast to a loss of the wrong shape without an error."""
    y2 = np.c_[X[:, 0], X[:, 1]]
    with pytest.raises(ValueError, match=r"make_client_app: loss='mse'.*got 2 per sample "
                                         r"and an output of 1"):
        _node_reply(lambda: torch.nn.Linear(3, 1), X, y2)
    with pytest.raises(ValueError, match=r"output of shape \(batch, n_outputs\), as CLoVE's "
                                         r"fit does, got shape \(1,\) for a batch of one"):
        _node_reply(_Flat, X, X[:, 0])
    # a 3-D output or a tuple is described as what it is (not as "a 1-D output")
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 1\) for a batch of one"):
        _node_reply(lambda: torch.nn.Sequential(torch.nn.Linear(3, 1),
                                                torch.nn.Unflatten(1, (1, 1))), X, X[:, 0])
    with pytest.raises(ValueError, match=r"got a tuple for a batch of one"):
        _node_reply(_Pair, X, X[:, 0])
    with pytest.raises(ValueError, match="make_client_app: loss='mse' needs numeric"):
        _node_reply(lambda: torch.nn.Linear(3, 1), X, np.array(list("abc") * 10))


def test_flower_node_data_errors_name_x_and_y():
    """A node's data from data_fn is one client: its errors named "clients[0]"."""
    Xnan = np.where(X == X[0, 0], np.nan, X)
    with pytest.raises(ValueError, match=r"data_fn: Input X contains NaN") as err:
        _node_reply(lambda: torch.nn.Linear(3, 1), Xnan, X[:, 0])
    assert "clients" not in str(err.value)
    with pytest.raises(ValueError, match=r"data_fn: y must have shape \(30,\)"):
        _node_reply(lambda: torch.nn.Linear(3, 1), X, X[:5, 0])


def test_flower_node_loss_is_the_mean_squared_error():
    """The node's loss vector from the definition (float64 reference) for 2 outputs."""
    y2 = np.c_[X[:, 0], X[:, 1]]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = torch.nn.Linear(3, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def factory():
        m = torch.nn.Linear(3, 2)
        m.load_state_dict(state)
        return m

    reply = _node_reply(factory, X, y2)
    with torch.no_grad():
        ref = float(((model(torch.as_tensor(X, dtype=torch.float32)).double().numpy()
                      - y2) ** 2).mean())
    assert reply.content["metrics"]["losses"][0] == pytest.approx(ref, rel=1e-5)


# -- error paths of the public API that the suite did not reach ------------------------
def test_assignment_rules_refuse_bad_shapes():
    from mlpapers.federated.clove import clove_assign, ifca_assign
    from mlpapers.federated.clove._assign import match_clusters

    with pytest.raises(ValueError, match="non-empty"):
        ifca_assign(np.zeros((0, 2)))
    with pytest.raises(ValueError, match="exceeds the number of models 2"):
        match_clusters(np.ones((3, 2)), [0, 1, 2], 3)
    L = np.array([[0.1, 2.0], [0.2, 2.1], [3.0, 0.1], [2.9, 0.2]])
    with pytest.raises(ValueError, match="match_losses must have the shape"):
        clove_assign(L, 2, match_losses=L[:, :1])
    # n_clusters=None is n_models (the documented default)
    assert clove_assign(L, random_state=0).tolist() == clove_assign(L, 2, random_state=0).tolist()


def test_fit_refuses_bad_targets():
    g = np.random.default_rng(1)
    Xc = g.normal(size=(10, 3))
    with pytest.raises(ValueError, match="loss='mse' needs targets y"):
        CLoVE(loss="mse", n_rounds=1).fit([Xc, Xc])
    with pytest.raises(ValueError, match="needs 1D class labels"):
        CLoVE(model="logistic", n_rounds=1).fit([(Xc, np.zeros((10, 2), int))] * 2)
    with pytest.raises(ValueError, match="different numbers of outputs"):
        CLoVE(n_rounds=1).fit([(Xc, Xc[:, 0]), (Xc, Xc[:, :2])])
    with pytest.raises(ValueError, match="loss='mse' needs numeric targets y"):
        CLoVE(loss="mse", n_rounds=1).fit([(Xc, np.array(list("ab") * 5))] * 2)


def test_an_integer_hidden_layer_size_is_one_layer():
    clients = [(X, y) for X, y in ONE]
    a = CLoVE(model="mlp", hidden_layer_sizes=4, n_clusters=1, n_rounds=1,
              random_state=0).fit(clients)
    b = CLoVE(model="mlp", hidden_layer_sizes=(4,), n_clusters=1, n_rounds=1,
              random_state=0).fit(clients)
    np.testing.assert_array_equal(a.loss_vectors_, b.loss_vectors_)
    with pytest.raises(ValueError, match="non-empty for model='autoencoder'"):
        CLoVE(model="autoencoder", hidden_layer_sizes=(), n_rounds=1).fit([X, X])


def test_a_callable_model_must_build_a_module():
    with pytest.raises(TypeError, match="must return a torch.nn.Module"):
        CLoVE(model=lambda d, k: "not a module", n_rounds=1).fit(ONE)


def test_inference_argument_errors(fitted):
    est = fitted["one"]
    with pytest.raises(ValueError, match="either client= or cluster="):
        est.predict(X, client=0, cluster=0)
    with pytest.raises(ValueError, match="fitted with targets y"):
        est.score([X] * 4)
    with pytest.raises(TypeError, match="clients must be a list"):
        est.score(X)
    clf = CLoVE(model="logistic", n_clusters=1, n_rounds=1, random_state=0).fit(
        [(X, np.arange(30) % 2)] * 2)
    with pytest.raises(ValueError, match="labels not seen in fit"):
        clf.assign(X, np.arange(30) % 3)


def test_a_list_of_two_1d_tensors_is_an_x_and_a_list_with_a_matrix_a_pair():
    """The client rule: a 2-element *list* of 1-D tensors is an X of two rows; a list
    holding a 2-D tensor and its targets is an (X, y) pair."""
    from mlpapers.federated.clove._data import _split_client

    rows = [torch.ones(3), torch.zeros(3)]
    assert _split_client(rows) == (rows, None)
    Xt, yt = torch.ones(4, 3), torch.zeros(4)
    x, y = _split_client([Xt, yt])
    assert x is Xt and y is yt


def test_flower_exchange_errors_and_timeouts():
    """The strategy's message exchange: a node's error reply is raised naming the node;
    replies that never come raise TimeoutError; replies are matched to messages."""
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from mlpapers.federated.clove._flower import CLoVEStrategy

    def reply(mid, nid, error=None):
        return SimpleNamespace(
            metadata=SimpleNamespace(reply_to_message_id=mid, src_node_id=nid),
            has_error=lambda: error is not None, error=SimpleNamespace(reason=error))

    strategy = CLoVEStrategy(n_clusters=1, poll_interval=0.0)
    ok = SimpleNamespace(push_messages=lambda msgs: ["a", "b"],
                         pull_messages=lambda ids: [reply(i, 7) for i in ids])
    assert sorted(r.metadata.reply_to_message_id
                  for r in strategy._exchange(ok, [None, None], 1.0)) == ["a", "b"]
    bad = SimpleNamespace(push_messages=lambda msgs: ["a"],
                          pull_messages=lambda ids: [reply("a", 7, "boom")])
    with pytest.raises(RuntimeError, match="node 7 failed: boom"):
        strategy._exchange(bad, [None], 1.0)
    silent = SimpleNamespace(push_messages=lambda msgs: ["a", "b"],
                             pull_messages=lambda ids: [reply("a", 7)])
    with pytest.raises(TimeoutError, match=r"1 node\(s\) did not reply"):
        strategy._exchange(silent, [None, None], 0.01)


def test_flower_start_argument_errors():
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from flwr.app import ArrayRecord

    from mlpapers.federated.clove._flower import CLoVEStrategy

    rec = ArrayRecord(torch.nn.Linear(3, 1).state_dict())
    with pytest.raises(ValueError, match="initial_arrays must hold 2 models, got 3"):
        CLoVEStrategy(n_clusters=2).start(None, [rec] * 3)
    none = SimpleNamespace(get_node_ids=lambda: [1])
    with pytest.raises(TimeoutError, match="fewer than 2 nodes connected"):
        CLoVEStrategy(n_clusters=2, poll_interval=0.0).start(none, rec, timeout=0.01)


def test_flower_history_without_sizes_is_the_plain_mean(monkeypatch):
    """Nodes that report no num-examples with their losses: history_'s loss is the
    unweighted mean of the assigned losses; reported partition ids are recorded."""
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from flwr.app import ArrayRecord

    from mlpapers.federated.clove import _flower

    losses = {1: [1.0, 5.0], 2: [0.1, 5.1], 3: [5.0, 2.0], 4: [5.2, 0.2]}
    sd = torch.nn.Linear(2, 1).state_dict()
    calls = []

    def exchange(grid, msgs, timeout):
        calls.append(1)
        if len(calls) % 2:
            return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid), content={
                "metrics": {"losses": losses[nid], "partition-id": 10 * nid}})
                for nid in losses]
        return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid), content={
            "metrics": {"num-examples": 5}, "arrays": ArrayRecord(dict(sd))})
            for nid in losses]

    monkeypatch.setattr(_flower, "Message", lambda *a, **kw: SimpleNamespace())
    strategy = _flower.CLoVEStrategy(n_clusters=2, min_nodes=4, random_state=0)
    strategy._exchange = exchange
    strategy.start(SimpleNamespace(get_node_ids=lambda: list(losses)),
                   [ArrayRecord(dict(sd))] * 2, num_rounds=1)
    assigned = [losses[nid][strategy.labels_[nid]] for nid in losses]
    assert strategy.history_[0]["loss"] == pytest.approx(np.mean(assigned), rel=1e-12)
    assert strategy.partitions_ == {nid: 10 * nid for nid in losses}


class _ItemInTraining(torch.nn.Module):
    """Runs under vmap in eval mode (the loss matrix) but not in train mode (.item())."""

    def __init__(self, d, k):
        super().__init__()
        self.lin = torch.nn.Linear(d, k)

    def forward(self, x):
        out = self.lin(x)
        if self.training and out.sum().item() > 1e30:  # data-dependent: no vmap
            out = out * 0
        return out


def test_vectorize_true_names_the_way_out_for_a_model_that_fails_only_in_training():
    """The replay outside vmap runs the training step (loss and backward) for a failure
    in local training: it runs, so vectorize=False is named (and then fits)."""
    two = ONE[:2]
    with pytest.raises(ValueError, match="use vectorize=False"):
        CLoVE(model=_ItemInTraining, n_clusters=1, vectorize=True, n_rounds=1,
              random_state=0).fit(two)
    est = CLoVE(model=_ItemInTraining, n_clusters=1, vectorize=False, n_rounds=1,
                random_state=0).fit(two)
    assert np.isfinite(est.loss_vectors_).all()


@pytest.mark.parametrize("kw, error, match", [
    (dict(lr=1e38), ValueError, "lr must be at most 3.403e"),  # Adam: lr / 0.1 overflows
    (dict(lr=1e39, optimizer="sgd"), ValueError, "lr must be at most 3.403e"),
    (dict(optimizer="rmsprop"), ValueError, "optimizer must be one of"),
    (dict(local_epochs=0), ValueError, "local_epochs must be > 0"),
    (dict(batch_size=0), ValueError, "batch_size must be > 0"),
])
def test_flower_node_checks_its_local_training_as_fit_does(kw, error, match):
    """Regression: the node trained with Adam for optimizer='rmsprop', returned the
    weights unchanged for local_epochs=0, and failed inside its train handler with
    ZeroDivisionError (batch_size=0) or torch's float overflow (huge lr)."""
    pytest.importorskip("flwr")
    from mlpapers.federated.clove._flower import make_client_app

    with pytest.raises(error, match=match):
        make_client_app(lambda: torch.nn.Linear(3, 1), lambda context: None, loss="mse", **kw)
