"""The loss-vector messages of ``CLoVEStrategy.start``, without a deployment.

Step 1 of a CLoVE round (paper note, "every client evaluates all K models"): the
server sends every node all K current cluster models, as one ``train.losses``
message per node holding an ArrayRecord per model under ``m0 .. m{K-1}``. Only the
slow end-to-end Flower test exercised these messages; the other strategy tests
replace ``Message`` by an empty object. Here a fake grid records the messages'
arguments (needs the flower extra, skipped without it).
"""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    Metadata,
    RecordDict,
)

from mlpapers.federated.clove import _flower  # noqa: E402
from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app  # noqa: E402

K = 3
NODES = [14, 3, 27, 8, 21, 5]  # as the grid lists them (start sorts them)
SIZES = {nid: 10 + nid for nid in NODES}  # the nodes' num-examples
D = 2


def _arrays(record):
    """A record's arrays by name, as float64 copies (a snapshot)."""
    return {k: np.array(a, dtype=np.float64)
            for k, a in zip(record.keys(), record.to_numpy_ndarrays())}


def _initial_models():
    g = torch.Generator().manual_seed(0)
    return [ArrayRecord({"weight": torch.randn(1, D, generator=g),
                         "bias": torch.randn(1, generator=g)}) for _ in range(K)]


def _record_messages(monkeypatch):
    """Replace the server's ``Message`` by a recorder of its arguments (a real one needs a
    running Flower app); the client's replies (``reply_to=``) stay real messages."""
    def message(content, **kw):
        if "reply_to" in kw:
            return Message(content, **kw)
        return SimpleNamespace(content=content, **kw)

    monkeypatch.setattr(_flower, "Message", message)


class FakeGrid:
    """A grid answering the pushed messages at once: ``losses`` and ``train`` give the
    replies to ``train.losses`` and ``train`` messages. Every pushed batch is kept with
    a snapshot of the message arrays and of the strategy's models and labels."""

    def __init__(self, strategy, losses, train):
        self.strategy, self.losses, self.train = strategy, losses, train
        self.batches, self.pending, self.count = [], {}, 0

    def get_node_ids(self):
        return list(NODES)

    def push_messages(self, msgs):
        msgs = list(msgs)
        self.batches.append(SimpleNamespace(
            msgs=msgs,
            arrays=[{k: _arrays(r) for k, r in m.content.array_records.items()}
                    for m in msgs],
            models=[_arrays(m) for m in self.strategy.models_],
            labels=dict(self.strategy.labels_)))
        ids = []
        for m in msgs:
            self.count += 1
            mid = f"msg{self.count}"
            answer = self.losses if m.message_type == "train.losses" else self.train
            self.pending[mid] = answer(m, mid)
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.pending.pop(mid) for mid in ids if mid in self.pending]


def _reply(nid, mid, content):
    return SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid, reply_to_message_id=mid),
                           has_error=lambda: False, content=content)


def _delta(nid, rnd):
    return 0.05 * nid + rnd  # what a node adds to its model in a round (fake training)


def _train_reply(m, mid):
    """A node's fake training: the received model plus ``_delta`` (float32)."""
    nid, rnd = m.dst_node_id, int(m.group_id)
    new = {k: torch.from_numpy((a + _delta(nid, rnd)).astype(np.float32))
           for k, a in _arrays(m.content["arrays"]).items()}
    return _reply(nid, mid, {"arrays": ArrayRecord(new),
                             "metrics": {"num-examples": SIZES[nid]}})


def _target(nid, rnd):
    """The model a node's fake loss vector favours in a round (rotating with the round)."""
    return (sorted(NODES).index(nid) // 2 + rnd) % K


def _losses_reply(m, mid):
    nid, rnd = m.dst_node_id, int(m.group_id)
    i = sorted(NODES).index(nid)
    L = [0.1 + 0.01 * i if j == _target(nid, rnd) else 3.0 + 0.5 * j + 0.01 * i
         for j in range(K)]
    return _reply(nid, mid, {"metrics": {"losses": L, "num-examples": SIZES[nid]}})


def test_every_node_gets_all_k_current_models_once_per_round(monkeypatch):
    """Each round every sampled node receives exactly one ``train.losses`` message with
    keys m0..m{K-1} holding the K current cluster models (the averages of the previous
    rounds, recomputed here by hand), so every node evaluates every model (the loss
    vector of the paper's step 1)."""
    _record_messages(monkeypatch)
    strategy = CLoVEStrategy(n_clusters=K, min_nodes=len(NODES), random_state=0,
                             poll_interval=0.0)
    grid = FakeGrid(strategy, _losses_reply, _train_reply)
    init = _initial_models()
    config = ConfigRecord({"seed": 4})
    n_rounds = 3
    strategy.start(grid, init, num_rounds=n_rounds, timeout=10, train_config=config)

    assert strategy.node_ids_ == sorted(NODES)
    assert len(grid.batches) == 2 * n_rounds  # a loss exchange, then training, per round
    expected = [_arrays(r) for r in init]  # the cluster models, tracked by hand
    for rnd in range(1, n_rounds + 1):
        batch, train = grid.batches[2 * rnd - 2], grid.batches[2 * rnd - 1]
        # one losses message per node of the grid, none twice, for this round
        assert Counter(m.dst_node_id for m in batch.msgs) == Counter(NODES)
        assert all(m.message_type == "train.losses" for m in batch.msgs)
        assert all(m.group_id == str(rnd) for m in batch.msgs)
        for m, arrays in zip(batch.msgs, batch.arrays):
            assert set(m.content.keys()) == {f"m{j}" for j in range(K)} | {"config"}
            assert set(arrays) == {f"m{j}" for j in range(K)}
            assert m.content["config"] is config
            for j in range(K):
                for key in ("weight", "bias"):
                    # the models the strategy holds at this round, and the hand-made ones
                    np.testing.assert_array_equal(arrays[f"m{j}"][key], batch.models[j][key])
                    np.testing.assert_allclose(arrays[f"m{j}"][key], expected[j][key],
                                               rtol=1e-6, atol=1e-5)
        # the round's training (the assignment follows the reported loss vectors)
        labels = {nid: _target(nid, rnd) for nid in NODES}
        assert train.labels == labels
        assert all(m.message_type == "train" for m in train.msgs)
        for j in range(K):
            members = [nid for nid in NODES if labels[nid] == j]
            w = np.array([SIZES[n] for n in members], dtype=np.float64)
            new = {}
            for key, a in expected[j].items():
                trained = [(a.astype(np.float32) + _delta(n, rnd)).astype(np.float32)
                           .astype(np.float64) for n in members]
                avg = sum(wi * t for wi, t in zip(w, trained)) / w.sum()
                new[key] = avg.astype(np.float32).astype(np.float64)
            expected[j] = new
    for j in range(K):  # and the models after the last round
        got = _arrays(strategy.models_[j])
        for key in ("weight", "bias"):
            np.testing.assert_allclose(got[key], expected[j][key], rtol=1e-6, atol=1e-5)


def _node_data(nid):
    rng = np.random.default_rng(nid)
    X = rng.normal(size=(6 + nid % 5, D))
    return X, X @ np.array([1.0, -2.0]) * (-1) ** nid + 0.1 * rng.normal(size=len(X))


def test_the_client_app_evaluates_the_server_losses_message(monkeypatch):
    """The server's ``train.losses`` content, handed to the real ClientApp, gives each
    node's mean squared error under each of the K current models (in m0..m{K-1} order):
    the strategy's loss matrix is the matrix of the models it holds in that round."""
    _record_messages(monkeypatch)
    app = make_client_app(lambda: torch.nn.Linear(D, 1), lambda ctx: _node_data(ctx.node_id),
                          loss="mse", local_epochs=1, lr=0.05, batch_size=None)

    def client_losses(m, mid):
        nid = m.dst_node_id
        meta = Metadata(run_id=1, message_id=mid, src_node_id=1, dst_node_id=nid,
                        reply_to_message_id="", group_id=m.group_id, created_at=0.0,
                        ttl=3600.0, message_type=m.message_type)
        ctx = Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(),
                      run_config={})
        return app(Message(content=m.content, metadata=meta), ctx)

    strategy = CLoVEStrategy(n_clusters=K, min_nodes=len(NODES), random_state=0,
                             poll_interval=0.0)
    grid = FakeGrid(strategy, client_losses, _train_reply)
    seen = []  # the loss matrix of every round, with the models of that round
    real_assign = _flower.clove_assign

    def assign(L, *args, **kw):
        seen.append((np.array(L), grid.batches[-1].models))
        return real_assign(L, *args, **kw)

    monkeypatch.setattr(_flower, "clove_assign", assign)
    strategy.start(grid, _initial_models(), num_rounds=2, timeout=10)
    assert len(seen) == 2
    for L, models in seen:
        want = np.empty((len(NODES), K))
        for i, nid in enumerate(sorted(NODES)):
            X, y = _node_data(nid)
            for j, m in enumerate(models):
                pred = X @ m["weight"][0] + m["bias"][0]
                want[i, j] = np.mean((pred - y) ** 2)
        np.testing.assert_allclose(L, want, rtol=1e-5)
    assert not np.allclose(seen[0][0], seen[1][0])  # round 2 saw the trained models
