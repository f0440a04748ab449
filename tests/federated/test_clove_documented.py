"""What the federated docstrings promise (session 15): ``CLoVEStrategy``'s Flower hooks
and ``start``'s keywords, the assignment rules' ties, and ``predict``'s shapes."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import FedAvg, ifca_assign

try:  # the optional flower extra: the tests of the estimators run without it
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    from mlpapers.federated.clove import _flower
    from mlpapers.federated.flower import CLoVEStrategy
    HAS_FLWR = True
except ImportError:
    HAS_FLWR = False

needs_flwr = pytest.mark.skipif(not HAS_FLWR, reason="needs the flower extra (flwr)")

NO_NODES = SimpleNamespace(get_node_ids=lambda: [])


def _init():
    torch.manual_seed(0)
    return ArrayRecord(torch.nn.Linear(3, 1).state_dict())


@needs_flwr
def test_start_rejects_a_misspelt_keyword():
    # start(**_) swallowed any keyword: num_round=20 ran the default 3 rounds silently
    with pytest.raises(TypeError, match="num_round"):
        CLoVEStrategy(n_clusters=2).start(NO_NODES, _init(), timeout=0.0, num_round=20)


@needs_flwr
@pytest.mark.parametrize("name", ["evaluate_fn", "evaluate_config"])
def test_start_warns_that_it_runs_no_evaluation(name):
    # an evaluate_fn was accepted and never called, without a word
    kw = ({"evaluate_fn": lambda rnd, arrays: None} if name == "evaluate_fn"
          else {"evaluate_config": ConfigRecord({"x": 1})})
    strategy = CLoVEStrategy(n_clusters=2, poll_interval=0.001)
    with pytest.warns(UserWarning, match=f"{next(iter(kw))} ignored"), \
            pytest.raises(TimeoutError, match="fewer than 2 nodes"):
        strategy.start(NO_NODES, _init(), timeout=0.0, **kw)


@needs_flwr
def test_start_without_evaluation_keywords_does_not_warn():
    strategy = CLoVEStrategy(n_clusters=2, poll_interval=0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TimeoutError):
            strategy.start(NO_NODES, _init(), timeout=0.0, evaluate_config=None,
                           evaluate_fn=None)


@needs_flwr
def test_min_nodes_is_at_least_the_number_of_models():
    assert CLoVEStrategy(n_clusters=3, min_nodes=2).min_nodes == 3
    assert CLoVEStrategy(n_clusters=2, min_nodes=5).min_nodes == 5


@needs_flwr
def test_flower_hooks_do_what_their_docstrings_say(monkeypatch):
    # (a real Message needs a running Flower app: its arguments are recorded instead)
    monkeypatch.setattr(_flower, "Message",
                        lambda content, **kw: SimpleNamespace(content=content, **kw))
    strategy = CLoVEStrategy(n_clusters=2)
    a, b = _init(), _init()
    strategy.models_ = [a, b]
    strategy.node_ids_ = [7, 9]
    strategy.labels_ = {7: 1, 9: 0}
    config = ConfigRecord({"seed": 3})
    # configure_train ignores arrays and grid: one message per node with its model
    msgs = strategy.configure_train(4, None, config, None)
    assert [m.dst_node_id for m in msgs] == [7, 9]
    assert [m.content["arrays"] for m in msgs] == [b, a]  # models_[labels_[node]]
    assert all(m.group_id == "4" and m.message_type == "train" for m in msgs)
    reply = SimpleNamespace(metadata=SimpleNamespace(src_node_id=9),
                            content={"metrics": {"num-examples": 5}, "arrays": b})
    arrays, metrics = strategy.aggregate_train(4, [reply])
    assert arrays is None and isinstance(metrics, MetricRecord)
    assert metrics["models-updated"] == 1
    assert strategy.models_[1] is b  # no node trained model 1: it keeps its weights
    assert strategy.configure_evaluate(4, a, config, None) == []
    assert strategy.aggregate_evaluate(4, []) is None
    assert strategy.summary() is None


def test_ifca_ties_go_to_the_lowest_index():
    L = np.array([[1.0, 1.0, 2.0], [3.0, 0.5, 0.5]])
    np.testing.assert_array_equal(ifca_assign(L), [0, 1])
    np.testing.assert_array_equal(ifca_assign(torch.from_numpy(L)), [0, 1])


def test_predict_shapes_follow_the_targets():
    clients, _, _ = make_federated_linear(n_clusters=1, n_clients_per_cluster=2,
                                          n_samples=20, n_features=3, random_state=0)
    est = FedAvg(n_rounds=1, random_state=0).fit(clients)
    assert est.predict(clients[0][0]).shape == (20,)  # 1D targets: 1D predictions
    two_d = [(X, y[:, None]) for X, y in clients]
    assert FedAvg(n_rounds=1, random_state=0).fit(two_d).predict(clients[0][0]).shape == (20, 1)
