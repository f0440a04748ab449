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
