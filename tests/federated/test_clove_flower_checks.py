"""What CLoVEStrategy and make_client_app refuse, and what a new run starts from.

Each case here gave a silent wrong result or a raw numpy/torch error before (needs the
flower extra). The server side runs without a deployment (``_exchange`` replaced), the
client side through the real ClientApp on hand-made messages.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict  # noqa: E402

from mlpapers.federated.clove import _flower  # noqa: E402
from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app  # noqa: E402

D = 3


def _state(seed=0, out=1):
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(out, D, generator=g), "bias": torch.randn(out, generator=g)}


def _reply(node_id, content):
    return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node_id), content=content)


def _train_reply(node_id, n_examples, state):
    return _reply(node_id, {"metrics": {"num-examples": n_examples},
                            "arrays": ArrayRecord(dict(state))})


def _strategy(labels, models=None):
    strategy = CLoVEStrategy(n_clusters=2)
    strategy.models_ = models or [ArrayRecord(_state(0)), ArrayRecord(_state(1))]
    strategy.labels_ = dict(labels)
    return strategy


# -- the server's averaging -------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -2, float("nan"), float("inf"), True, "5", None])
def test_aggregate_train_refuses_a_weight_that_is_no_positive_count(n):
    # 0 or a negative num-examples gave a NaN/inf model with only numpy's warning
    strategy = _strategy({1: 0, 2: 0})
    replies = [_train_reply(1, 3, _state(2)), _train_reply(2, n, _state(3))]
    with pytest.raises(ValueError, match=r"node 2 .*num-examples"):
        strategy.aggregate_train(1, replies)
    strategy = _strategy({1: 0})
    with pytest.raises(ValueError, match="num-examples"):
        strategy.aggregate_train(1, [_reply(1, {"arrays": ArrayRecord(_state(2))})])


def test_aggregate_train_refuses_arrays_that_do_not_fit_the_model():
    strategy = _strategy({1: 0, 2: 0, 3: 1})
    before = [dict(zip(m.keys(), m.to_numpy_ndarrays())) for m in strategy.models_]
    wide = _state(4, out=2)  # weight (2, 3), bias (2,): not the model's (1, 3) and (1,)
    # one node: its arrays replaced the model; with others: broadcast into the average
    for replies in ([_train_reply(3, 5, wide)],
                    [_train_reply(1, 5, _state(5)), _train_reply(2, 5, wide)]):
        with pytest.raises(ValueError, match=r"array 'weight' of shape \(2, 3\)"):
            strategy.aggregate_train(1, replies)
    # integers sent back for a float model took the maximum instead of the average
    ints = {k: v.round().to(torch.int64) for k, v in _state(6).items()}
    with pytest.raises(ValueError, match="dtype int64"):
        strategy.aggregate_train(1, [_train_reply(1, 5, ints)])
    with pytest.raises(ValueError, match="without its trained model"):
        strategy.aggregate_train(1, [_reply(1, {"metrics": {"num-examples": 5}})])
    for m, old in zip(strategy.models_, before):  # nothing was changed
        for k, a in zip(m.keys(), m.to_numpy_ndarrays()):
            np.testing.assert_array_equal(a, old[k])


def test_aggregate_train_stores_the_models_dtype():
    # nodes compute in float32; a float64 model stays float64 (the average of the replies)
    model = ArrayRecord({k: v.double() for k, v in _state(0).items()})
    strategy = _strategy({1: 0, 2: 0}, models=[model, model])
    a, b = _state(1), _state(2)
    strategy.aggregate_train(1, [_train_reply(1, 1, a), _train_reply(2, 3, b)])
    out = strategy.models_[0].to_torch_state_dict()
    for k in a:
        assert out[k].dtype == torch.float64
        torch.testing.assert_close(out[k], (a[k].double() + 3 * b[k].double()) / 4)


def test_replies_and_messages_need_a_run():
    with pytest.raises(ValueError, match="node 9 has no assigned model"):
        _strategy({1: 0}).aggregate_train(1, [_train_reply(9, 5, _state(2))])
    fresh = CLoVEStrategy(n_clusters=2)
    with pytest.raises(RuntimeError, match="call start"):
        fresh.aggregate_train(1, [_train_reply(1, 5, _state(2))])
    with pytest.raises(RuntimeError, match="call start"):
        fresh.configure_train(1, None, ConfigRecord(), SimpleNamespace())


# -- start ------------------------------------------------------------------------------

class _NoGrid:
    """A grid that must not be reached: the arguments are checked before the wait."""

    def get_node_ids(self):
        raise AssertionError("start waited for the nodes before checking its arguments")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_rounds": "3"}, TypeError, "num_rounds"),
    ({"num_rounds": 2.0}, TypeError, "num_rounds"),
    ({"num_rounds": 0}, ValueError, "num_rounds"),
    ({"num_rounds": -1}, ValueError, "num_rounds"),
    ({"timeout": float("nan")}, ValueError, "timeout"),
    ({"timeout": -1}, ValueError, "timeout"),
    ({"timeout": "60"}, TypeError, "timeout"),
    ({"train_config": {"seed": 1}}, TypeError, "train_config"),
    ({"initial_arrays": _state(0)}, TypeError, "initial_arrays"),
    ({"initial_arrays": [_state(0), _state(1)]}, TypeError, "initial_arrays"),
    ({"initial_arrays": [ArrayRecord(_state(0))] * 3}, ValueError, "2 models"),
    ({"initial_arrays": [ArrayRecord(_state(0)), ArrayRecord(_state(1, out=2))]},
     ValueError, "model 1 has other arrays"),
    ({"initial_arrays": [ArrayRecord(_state(0)), ArrayRecord({"weight": torch.ones(1, D)})]},
     ValueError, "model 1 has other arrays"),
    # a NaN weight was sent out; a node then reported a "non-finite loss" after a
    # whole exchange, advising a lower lr
    ({"initial_arrays": [ArrayRecord(_state(0)),
                         ArrayRecord({**_state(1), "bias": torch.tensor([math.nan])})]},
     ValueError, r"model 1 holds NaN or infinite values in \['bias'\]"),
])
def test_start_checks_its_arguments_first(kwargs, error, match):
    args = {"initial_arrays": ArrayRecord(_state(0)), **kwargs}
    with pytest.raises(error, match=match):
        CLoVEStrategy(n_clusters=2).start(_NoGrid(), **args)


def _losses_exchange(losses, sizes, state):
    """A fake ``_exchange``: the loss round trip, then the training one, per round."""
    calls = []

    def exchange(grid, msgs, timeout):
        calls.append(len(msgs))
        if len(calls) % 2:
            return [_reply(nid, {"metrics": {"losses": losses[nid], "num-examples": sizes[nid],
                                             "partition-id": 10 * nid}})
                    for nid in sizes]
        return [_train_reply(nid, sizes[nid], state) for nid in sizes]
    return exchange


def _run(strategy, losses, sizes, rounds, monkeypatch):
    monkeypatch.setattr(_flower, "Message", lambda *a, **kw: SimpleNamespace())  # no run
    strategy._exchange = _losses_exchange(losses, sizes, _state(0))
    grid = SimpleNamespace(get_node_ids=lambda: list(sizes))
    return strategy.start(grid, ArrayRecord(_state(0)), num_rounds=rounds, timeout=math.inf)


def test_a_new_start_forgets_the_previous_run(monkeypatch):
    # history_, partitions_ and labels_ of the first run were carried into the second
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2, random_state=0)
    _run(strategy, {1: [0.1, 2.0], 2: [2.0, 0.1], 3: [0.2, 2.0]}, {1: 5, 2: 5, 3: 5}, 3,
         monkeypatch)
    assert len(strategy.history_) == 3 and set(strategy.partitions_) == {1, 2, 3}
    _run(strategy, {4: [0.1, 2.0], 5: [2.0, 0.1]}, {4: 5, 5: 5}, 2, monkeypatch)
    assert [h["round"] for h in strategy.history_] == [1, 2]
    assert strategy.partitions_ == {4: 40, 5: 50}
    assert set(strategy.labels_) == {4, 5} and strategy.loss_vectors_.shape == (2, 2)


@pytest.mark.parametrize("bad", [[0.1, 0.2, 0.3], [0.1], "0.1,0.2", None, [0.1, "x"]])
def test_loss_vectors_of_another_length_are_refused(bad, monkeypatch):
    # three values from every node (for K=2) were clustered silently; ragged ones gave
    # numpy's "inhomogeneous shape" error
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2, random_state=0)
    with pytest.raises(ValueError, match=r"node 2 .*'losses' metric of 2 numbers"):
        _run(strategy, {1: [0.1, 2.0], 2: bad, 3: [0.2, 2.0]}, {1: 5, 2: 5, 3: 5}, 1,
             monkeypatch)
    with pytest.raises(ValueError, match=r"node 1 .*'losses' metric of 2 numbers"):
        _run(strategy, {1: bad, 2: bad}, {1: 5, 2: 5}, 1, monkeypatch)


# -- the client app ---------------------------------------------------------------------

def _data(ctx):
    rng = np.random.default_rng(ctx.node_id)
    X = rng.normal(size=(12, D))
    return X, X @ np.arange(1.0, D + 1)


def _call(app, content, message_type, group_id="1", node_id=3):
    meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=node_id,
                    reply_to_message_id="", group_id=group_id, created_at=0.0, ttl=3600.0,
                    message_type=message_type)
    ctx = Context(run_id=1, node_id=node_id, node_config={}, state=RecordDict(),
                  run_config={})
    return app(Message(content=RecordDict(content), metadata=meta), ctx)


def _trained(reply):
    return reply.content["arrays"].to_torch_state_dict()


def test_large_seeds_train_and_bad_seeds_are_refused():
    # seed * 100003 overflowed torch's seed for seeds above ~1.8e14
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    model = ArrayRecord(_state(0))

    def train(seed):
        return _trained(_call(app, {"arrays": model, "config": ConfigRecord({"seed": seed})},
                              "train"))

    big = train(10**15)
    assert all(torch.isfinite(v).all() for v in big.values())
    torch.testing.assert_close(train(10**15), big, rtol=0, atol=0)  # deterministic
    torch.testing.assert_close(train(7), train(7.0), rtol=0, atol=0)
    for bad in (1.5, "seven", True):
        with pytest.raises(ValueError, match="'seed' must be an integer"):
            train(bad)


def test_the_node_refuses_models_that_do_not_fit_model_fn():
    # a missing array was a bare KeyError: 'bias'; a wrong shape torch's load_state_dict
    # error; a losses message without models torch.stack's "expects a non-empty" error
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    cases = [({"arrays": ArrayRecord({"weight": torch.ones(1, D)})}, "train",
              r"missing \['bias'\]"),
             ({"arrays": ArrayRecord(_state(0, out=2))}, "train", r"shapes \(sent, expected\)"),
             ({"config": ConfigRecord()}, "train", "under 'arrays'"),
             ({"config": ConfigRecord()}, "train.losses", r"m0 \.\. m\{K-1\}"),
             ({"m0": ArrayRecord(_state(0)), "m2": ArrayRecord(_state(1))}, "train.losses",
              r"m0 \.\. m\{K-1\}"),
             ({"m0": ArrayRecord(_state(0)), "m1": ArrayRecord({"w": torch.ones(1)})},
              "train.losses", "'m1' does not fit")]
    for content, kind, match in cases:
        with pytest.raises(ValueError, match=match):
            _call(app, content, kind)
    reply = _call(app, {"m1": ArrayRecord(_state(1)), "m0": ArrayRecord(_state(0))},
                  "train.losses")
    X, y = _data(SimpleNamespace(node_id=3))
    want = [float(np.mean((X @ s["weight"][0].double().numpy()
                           + s["bias"].double().numpy() - y) ** 2))
            for s in (_state(0), _state(1))]
    np.testing.assert_allclose(reply.content["metrics"]["losses"], want, rtol=1e-5)


def test_the_reconstruction_node_checks_the_output_size():
    # CLoVE's fit refuses an autoencoder whose output is not the input size; the node
    # failed in a raw reshape
    app = make_client_app(lambda: torch.nn.Linear(D, D + 1), lambda ctx: (_data(ctx)[0], None),
                          loss="reconstruction")
    with pytest.raises(ValueError, match=r"loss='reconstruction' needs .* 3 values per sample"):
        _call(app, {"m0": ArrayRecord(torch.nn.Linear(D, D + 1).state_dict())}, "train.losses")


def test_huge_labels_are_reported_as_given():
    # 1e20 cast to int64 first was reported as "labels from -9223372036854775808"
    def data(ctx):
        X, _ = _data(ctx)
        return X, np.r_[np.zeros(len(X) - 1), 1e20]
    app = make_client_app(lambda: torch.nn.Linear(D, 2), data, loss="cross_entropy")
    with pytest.raises(ValueError, match=r"\[0, 2\) .* from 0 to 1e\+20"):
        _call(app, {"m0": ArrayRecord(torch.nn.Linear(D, 2).state_dict())}, "train.losses")


def test_model_fn_must_be_a_function():
    # a module instance is callable: it failed in forward() at the first message
    with pytest.raises(TypeError, match="model_fn must be a function"):
        make_client_app(torch.nn.Linear(D, 1), _data)
    with pytest.raises(TypeError, match="data_fn must be a function"):
        make_client_app(lambda: torch.nn.Linear(D, 1), _data(SimpleNamespace(node_id=1)))
    app = make_client_app(lambda: "not a module", _data)
    with pytest.raises(TypeError, match="must return a torch.nn.Module"):
        _call(app, {"m0": ArrayRecord(_state(0))}, "train.losses")


def test_the_node_refuses_integer_weights_for_floating_parameters():
    # integer initial arrays were trained in float32 and sent back: the server then
    # refused every node's reply as "of dtype float32, expected int64"
    app = make_client_app(lambda: torch.nn.Linear(D, 1), _data, lr=0.05)
    ints = ArrayRecord({k: v.long() for k, v in _state(0).items()})
    with pytest.raises(ValueError, match=r"holds \['bias', 'weight'\] as torch.int64 where "
                                         r"model_fn\(\)'s are torch.float32"):
        _call(app, {"m0": ints}, "train.losses")


@pytest.mark.parametrize("returned, got", [
    (lambda X, y: (X, y, None), "3 items"),
    (lambda X, y: None, "NoneType"),
    (lambda X, y: {"X": X, "y": y}, "dict"),
])
def test_data_fn_must_return_a_pair(returned, got):
    # a triple or None failed as a bare unpacking error; a dict unpacked its keys
    app = make_client_app(lambda: torch.nn.Linear(D, 1), lambda ctx: returned(*_data(ctx)))
    with pytest.raises(TypeError, match=rf"data_fn\(context\) must return a pair .* got {got}"):
        _call(app, {"m0": ArrayRecord(_state(0))}, "train.losses")
    as_list = make_client_app(lambda: torch.nn.Linear(D, 1), lambda ctx: list(_data(ctx)))
    assert len(_call(as_list, {"m0": ArrayRecord(_state(0))},
                     "train.losses").content["metrics"]["losses"]) == 1


def test_a_missing_flower_names_the_extra(monkeypatch):
    import importlib
    import sys

    real_import = __import__

    def no_flwr(name, *args, **kwargs):
        if name.split(".")[0] == "flwr":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith("mlpapers.federated.flower")
                or m == "mlpapers.federated.clove._flower"]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr("builtins.__import__", no_flwr)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'mlpapers\[flower\]'") as err:
        importlib.import_module("mlpapers.federated.flower")
    assert err.value.name == "flwr"  # (code skipping a missing extra by name still does)
