"""Regressions of the Flower node and the strategy's reply polling (review fixes).

* a node's ``partition-id`` node config was reported through ``int(pid)``: a string id
  (``"site-a"``) failed every message, ``0.5`` was truncated to ``0`` (so ``partitions_``
  got ids the nodes do not have, shared by two nodes);
* the node skipped CLoVE's checks of a user model: without trainable parameters every
  train message failed with torch's "optimizer got an empty parameter list" (after a
  losses round that went through), a ``(batch,)`` output under the cross-entropy with a
  raw torch ``RuntimeError``;
* ``CLoVEStrategy._exchange`` stopped at the deadline without a last pull: a reply that
  came after the last poll was reported missing, and ``timeout=0`` always failed.

The server runs without a deployment: an in-process grid hands the strategy's messages
to the real ClientApp (needs the flower extra, skipped without it).
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    Metadata,
    RecordDict,
)

from mlpapers.federated.clove import _flower  # noqa: E402
from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app  # noqa: E402

D = 3


def _data(ctx):
    rng = np.random.default_rng(ctx.node_id)
    X = rng.normal(size=(12, D))
    return X, X @ np.arange(1.0, D + 1)


def _class_data(ctx):
    X, _ = _data(ctx)
    return X, np.arange(len(X)) % 2


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(1, D, generator=g), "bias": torch.randn(1, generator=g)}


def _call(app, content, message_type, node_config=None, node_id=3):
    meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=node_id,
                    reply_to_message_id="", group_id="1", created_at=0.0, ttl=3600.0,
                    message_type=message_type)
    ctx = Context(run_id=1, node_id=node_id, node_config=node_config or {},
                  state=RecordDict(), run_config={})
    return app(Message(content=RecordDict(content), metadata=meta), ctx)


class SimGrid:
    """A grid delivering the strategy's messages to a real ClientApp in process: the
    replies are ready when ``push_messages`` returns; a node's exception becomes its
    error reply, as a deployment sends it."""

    def __init__(self, app, node_config):
        self.app, self.node_config = app, dict(node_config)
        self.pending, self.count = {}, 0

    def get_node_ids(self):
        return list(self.node_config)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            self.count += 1
            mid = f"msg{self.count}"
            meta = Metadata(run_id=1, message_id=mid, src_node_id=0,
                            dst_node_id=m.dst_node_id, reply_to_message_id="",
                            group_id=m.group_id, created_at=0.0, ttl=3600.0,
                            message_type=m.message_type)
            msg = Message(content=m.content, metadata=meta)
            ctx = Context(run_id=1, node_id=m.dst_node_id,
                          node_config=self.node_config[m.dst_node_id],
                          state=RecordDict(), run_config={})
            try:
                reply = self.app(msg, ctx)
            except Exception as exc:  # (what the node sends back)
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"),
                                reply_to=msg)
            self.pending[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.pending.pop(mid) for mid in ids if mid in self.pending]


def _server_messages(monkeypatch):
    """The strategy's own messages as their arguments (a real one needs a running app:
    SimGrid builds it); the nodes' replies (``reply_to=``) stay real messages."""
    def message(content, **kw):
        if "reply_to" in kw:
            return Message(content, **kw)
        return SimpleNamespace(content=content, **kw)

    monkeypatch.setattr(_flower, "Message", message)


# -- 1. partition-id ---------------------------------------------------------------------

@pytest.mark.parametrize("pid, reported", [
    (7, 7), (0, 0), (2.0, 2), (np.int64(4), 4),
    ("site-a", None), ("3", None), (0.5, None), (2.5, None), (True, None), (False, None),
    (math.nan, None), (math.inf, None), (2**70, None),
])
def test_node_reports_only_integer_partition_ids(pid, reported):
    # int(pid) crashed every message of a node with a string id and truncated 0.5 to 0
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    for content, kind in [({"m0": ArrayRecord(_state(0)), "m1": ArrayRecord(_state(1))},
                           "train.losses"),
                          ({"arrays": ArrayRecord(_state(0)),
                            "config": ConfigRecord({"seed": 0})}, "train")]:
        metrics = _call(app, content, kind, {"partition-id": pid}).content["metrics"]
        assert metrics["num-examples"] == 12
        if reported is None:
            assert "partition-id" not in metrics
        else:
            value = metrics["partition-id"]
            assert value == reported and type(value) is int


def test_partitions_hold_the_integer_ids_of_a_run(monkeypatch):
    # a node with a string id failed the run ("invalid literal for int()"); 0.5 and 0
    # were both reported as partition 0
    _server_messages(monkeypatch)
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    grid = SimGrid(app, {11: {"partition-id": "site-a"}, 12: {"partition-id": 0.5},
                         13: {"partition-id": 0}, 14: {"partition-id": 3.0}, 15: {}})
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2, random_state=0, poll_interval=0)
    strategy.start(grid, [ArrayRecord(_state(0)), ArrayRecord(_state(1))], num_rounds=1,
                   timeout=math.inf)
    assert strategy.partitions_ == {13: 0, 14: 3}
    assert set(strategy.labels_) == {11, 12, 13, 14, 15}


# -- 2. the node's model checks ----------------------------------------------------------

def _frozen():
    model = torch.nn.Linear(D, 1)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class _Nan(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, 1)

    def forward(self, x):
        return self.lin(x) * math.nan


def _flat_logits():
    return torch.nn.Sequential(torch.nn.Linear(D, 1), torch.nn.Flatten(0))


@pytest.mark.parametrize("model_fn, data_fn, loss, match", [
    (_frozen, _data, "mse", r"make_client_app: model_fn\(\) builds a module without "
                            r"trainable parameters"),
    (torch.nn.Identity, lambda ctx: (_data(ctx)[0], None), "reconstruction",
     "without trainable parameters"),
    (_flat_logits, _class_data, "cross_entropy",
     r"make_client_app: model_fn\(\) must build a module whose output has shape "
     r"\(batch, 2\) for loss='cross_entropy', got \(1,\)"),
    (_Nan, _data, "mse", r"make_client_app: model_fn\(\) returned a non-finite output"),
])
@pytest.mark.parametrize("kind", ["train.losses", "train"])
def test_node_checks_the_model_as_clove_does(model_fn, data_fn, loss, match, kind):
    # the losses round went through (the frozen model, NaN outputs) and training failed
    # in torch ("optimizer got an empty parameter list", "Expected floating point type
    # for target"); now CLoVE's fit's refusal, at every message
    app = make_client_app(model_fn, data_fn, loss=loss)
    state = ArrayRecord(model_fn().state_dict())
    content = ({"m0": state} if kind == "train.losses"
               else {"arrays": state, "config": ConfigRecord({"seed": 0})})
    with pytest.raises(ValueError, match=match):
        _call(app, content, kind)


def test_node_model_errors_stop_the_run_at_the_losses_round(monkeypatch):
    # the strategy raises the node's error at its first exchange, naming the node,
    # before any training (and without waiting for the timeout)
    _server_messages(monkeypatch)
    app = make_client_app(_frozen, _data)
    grid = SimGrid(app, {21: {}, 22: {}})
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2, random_state=0)
    sent = []
    push = grid.push_messages
    grid.push_messages = lambda msgs: sent.append([m.message_type for m in msgs]) or push(msgs)
    with pytest.raises(RuntimeError, match=r"node 2[12] failed: ValueError: .*without "
                                           r"trainable parameters"):
        strategy.start(grid, ArrayRecord(_state(0)), num_rounds=1, timeout=math.inf)
    assert sent == [["train.losses", "train.losses"]]


# -- 3. the last pull at the deadline ----------------------------------------------------

class _Clock:
    """``time.monotonic`` and ``time.sleep`` of a fake clock (no real waiting)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.now += seconds


class _LateGrid:
    """Replies that come ``delay`` seconds (of ``clock``) after the push."""

    def __init__(self, clock, delay):
        self.clock, self.delay, self.pulls = clock, delay, []

    def push_messages(self, msgs):
        self.ready = self.clock.now + self.delay
        return [f"id{i}" for i, _ in enumerate(msgs)]

    def pull_messages(self, ids):
        self.pulls.append(self.clock.now)
        if self.clock.now < self.ready:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i,
                                                         src_node_id=int(i[2:])),
                                has_error=lambda: False) for i in ids]


@pytest.mark.parametrize("poll_interval", [0.3, 5.0, 100.0])
def test_exchange_pulls_once_more_at_the_deadline(poll_interval, monkeypatch):
    # the loop stopped at the deadline: a reply that came after the last poll (here
    # 2 s after the push, within the 2 s timeout) was reported missing
    clock = _Clock()
    monkeypatch.setattr(_flower, "time", clock)
    strategy = CLoVEStrategy(n_clusters=1, poll_interval=poll_interval)
    grid = _LateGrid(clock, delay=2.0)
    replies = strategy._exchange(grid, [object(), object()], timeout=2.0)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["id0", "id1"]
    assert clock.now == pytest.approx(1002.0)  # no sleep past the deadline
    # a reply later than the timeout is missing, after a last pull at the deadline
    clock = _Clock()
    monkeypatch.setattr(_flower, "time", clock)
    grid = _LateGrid(clock, delay=2.5)
    with pytest.raises(TimeoutError, match=r"2 node\(s\) did not reply within 2.0 s"):
        strategy._exchange(grid, [object(), object()], timeout=2.0)
    assert grid.pulls[0] == 1000.0 and grid.pulls[-1] == pytest.approx(1002.0)


def test_timeout_zero_takes_replies_that_are_ready(monkeypatch):
    # timeout=0 (documented as valid) never pulled: every exchange timed out
    strategy = CLoVEStrategy(n_clusters=1)
    clock = _Clock()
    monkeypatch.setattr(_flower, "time", clock)
    replies = strategy._exchange(_LateGrid(clock, delay=0.0), [object()], timeout=0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id0"]
    grid = _LateGrid(clock, delay=0.5)
    with pytest.raises(TimeoutError, match="1 node"):
        strategy._exchange(grid, [object()], timeout=0)
    assert len(grid.pulls) == 1 and clock.now == 1000.0  # one pull, no sleep


def test_a_run_with_timeout_zero_and_ready_replies(monkeypatch):
    # a whole run through the real ClientApp, whose replies are ready at once
    _server_messages(monkeypatch)
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    grid = SimGrid(app, {n: {"partition-id": i} for i, n in enumerate([31, 32, 33])})
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2, random_state=0)
    strategy.start(grid, [ArrayRecord(_state(0)), ArrayRecord(_state(1))], num_rounds=2,
                   timeout=0)
    assert [h["round"] for h in strategy.history_] == [1, 2]
    assert strategy.partitions_ == {31: 0, 32: 1, 33: 2}


# -- 4. messages the grid does not push; integer buffers -----------------------------------

class _DropTrainGrid(SimGrid):
    """Flower's grids leave out the messages the link state refuses (a node gone), and
    the HTTP grid pushes none of a request that is too large."""

    def push_messages(self, msgs):
        msgs = list(msgs)
        return [] if msgs[0].message_type == "train" else super().push_messages(msgs)


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, 1)
        self.register_buffer("step", torch.tensor(2**40 + 1, dtype=torch.int64))

    def forward(self, x):
        return self.lin(x)


def test_integer_buffers_reach_the_node_and_come_back_exactly():
    # stacked through float32: 2**40 + 1 came back as 2**40
    app = make_client_app(_Counter, _data, lr=0.05)
    state = _Counter().state_dict()
    reply = _call(app, {"arrays": ArrayRecord(state), "config": ConfigRecord({"seed": 0})},
                  "train")
    back = reply.content["arrays"].to_torch_state_dict()
    assert back["step"].dtype == torch.int64 and int(back["step"]) == 2**40 + 1


class _NoneForOneGrid(SimGrid):
    """Flower's HTTP grid gives None in place of each message it could not push."""

    def push_messages(self, msgs):
        msgs = list(msgs)
        ids = super().push_messages(msgs)
        if msgs[0].message_type != "train":
            return ids
        return [None if m.dst_node_id == 12 else i for m, i in zip(msgs, ids)]


@pytest.mark.parametrize("grid_cls, match", [
    (_DropTrainGrid, r"the grid pushed 0 of 3 messages; node\(s\) \[11, 12, 13\] got none"),
    (_NoneForOneGrid, r"the grid pushed 2 of 3 messages; node\(s\) \[12\] got none"),
])
def test_messages_the_grid_did_not_push_stop_the_run_naming_the_nodes(grid_cls, match,
                                                                      monkeypatch):
    # the left-out nodes were silently not trained (a flat history_), or the losses
    # round failed with a bare KeyError; a None id (HTTP grid) was kept as one id by
    # set(), and the run polled for a reply to None until its timeout
    _server_messages(monkeypatch)
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    grid = grid_cls(app, {11: {}, 12: {}, 13: {}})
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=3, random_state=0, poll_interval=0)
    with pytest.raises(RuntimeError, match=match):
        strategy.start(grid, [ArrayRecord(_state(0)), ArrayRecord(_state(1))],
                       num_rounds=1, timeout=0.5)
