"""CLoVEStrategy's server-side averaging, without a deployment (needs the flower extra)."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord  # noqa: E402

from mlpapers.federated.clove._flower import CLoVEStrategy  # noqa: E402


def _reply(node_id, n_examples, state):
    return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node_id),
                           content={"metrics": {"num-examples": n_examples},
                                    "arrays": ArrayRecord(dict(state))})


def test_aggregate_train_matches_arrays_by_name():
    # The average was paired with the initial record's keys by position: an initial
    # model listing its arrays in another order than the nodes' state dicts got
    # layers swapped silently (same shapes) or mislabelled.
    torch.manual_seed(0)
    sd = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)).state_dict()
    init = ArrayRecord({k: sd[k] for k in ["1.weight", "1.bias", "0.weight", "0.bias"]})
    strategy = CLoVEStrategy(n_clusters=3)
    strategy.models_ = [init, init, init]
    strategy.labels_ = {10: 0, 11: 0, 12: 1}
    states = {nid: {k: torch.randn_like(v) for k, v in sd.items()} for nid in (10, 11, 12)}
    strategy.aggregate_train(1, [_reply(10, 1, states[10]), _reply(11, 3, states[11]),
                                 _reply(12, 2, states[12])])
    avg0 = strategy.models_[0].to_torch_state_dict()
    avg1 = strategy.models_[1].to_torch_state_dict()
    for k in sd:
        torch.testing.assert_close(avg0[k], (states[10][k] + 3 * states[11][k]) / 4)
        torch.testing.assert_close(avg1[k], states[12][k])
    assert strategy.models_[2] is init  # a model without nodes keeps its weights
    with pytest.raises(ValueError, match="replied with arrays"):
        strategy.aggregate_train(2, [_reply(10, 1, {"0.weight": sd["0.weight"]})])


def test_aggregate_train_keeps_dtypes_counters_and_0d_arrays():
    # BatchNorm's num_batches_tracked is a 0-d int64 array: dividing it by a float gave a
    # numpy scalar, which torch.from_numpy refused (TypeError in round 1), and every
    # array was averaged and stored as float32, counters included. Integer counters now
    # take their maximum (as the CLoVE estimator), floats keep their own dtype.
    bn = torch.nn.BatchNorm1d(3).state_dict()
    base = {**bn, "scale": torch.tensor(2.0, dtype=torch.float64)}
    strategy = CLoVEStrategy(n_clusters=1)
    strategy.models_ = [ArrayRecord(dict(base))]
    strategy.labels_ = {1: 0, 2: 0}
    g = torch.Generator().manual_seed(0)
    states = {nid: {k: (torch.tensor(c) if k == "num_batches_tracked"
                        else torch.randn(v.shape, generator=g, dtype=v.dtype))
                    for k, v in base.items()} for nid, c in ((1, 3), (2, 5))}
    strategy.aggregate_train(1, [_reply(1, 1, states[1]), _reply(2, 3, states[2])])
    out = strategy.models_[0].to_torch_state_dict()
    assert out["num_batches_tracked"].dtype == torch.int64
    assert out["num_batches_tracked"].item() == 5
    assert out["scale"].dtype == torch.float64 and out["scale"].dim() == 0
    for k in ("weight", "bias", "running_mean", "running_var", "scale"):
        want = (states[1][k].double() + 3 * states[2][k].double()) / 4
        torch.testing.assert_close(out[k].double(), want.to(out[k].dtype).double())


def test_history_loss_is_weighted_by_the_nodes_examples(monkeypatch):
    # history_'s loss was a plain mean over nodes; the estimator's (and Flower's own
    # metric aggregation) weights by the nodes' num-examples
    from mlpapers.federated.clove import _flower

    sizes = {1: 10, 2: 1000, 3: 10, 4: 1000}
    losses = {1: [1.0, 5.0], 2: [0.1, 5.1], 3: [5.0, 2.0], 4: [5.2, 0.2]}
    sd = torch.nn.Linear(2, 1).state_dict()
    calls = []

    def exchange(grid, msgs, timeout):
        calls.append(len(msgs))
        if len(calls) % 2:  # the loss round trip, then the training one
            return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid), content={
                "metrics": {"losses": losses[nid], "num-examples": sizes[nid]}})
                for nid in sizes]
        return [_reply(nid, sizes[nid], sd) for nid in sizes]

    monkeypatch.setattr(_flower, "Message", lambda *a, **kw: SimpleNamespace())  # no run
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=4, random_state=0)
    strategy._exchange = exchange
    grid = SimpleNamespace(get_node_ids=lambda: list(sizes))
    strategy.start(grid, [ArrayRecord(dict(sd))] * 2, num_rounds=1)
    assigned = {nid: losses[nid][strategy.labels_[nid]] for nid in sizes}
    assert assigned == {1: 1.0, 2: 0.1, 3: 2.0, 4: 0.2}
    want = sum(sizes[n] * assigned[n] for n in sizes) / sum(sizes.values())
    assert strategy.history_[0]["loss"] == pytest.approx(want, rel=1e-12)
