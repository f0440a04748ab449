"""DecentralizedSGD: gossip identities, simulated time, learning, contract."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs
from sklearn.exceptions import NotFittedError

from mlpapers.decentralized import BottleneckNodeAssigner, DecentralizedSGD
from mlpapers.decentralized.btsp import (
    TOPOLOGIES,
    bottleneck_delay,
    make_delay_matrix,
    mixing_matrices,
)
from mlpapers.decentralized.btsp._dsgd import consensus_distance, mix


@pytest.fixture(scope="module")
def blobs():
    X, y = make_blobs(300, n_features=5, centers=3, random_state=0)
    return (X - X.mean(0)) / X.std(0), y


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_mixing_preserves_average_and_contracts(topology):
    n = 12
    x = {"w": torch.randn(n, 3, 2, dtype=torch.float64),
         "b": torch.randn(n, 4, dtype=torch.float64)}
    avg = {k: v.mean(0) for k, v in x.items()}
    d0 = consensus_distance(x)
    for W in mixing_matrices(n, topology):
        x = mix(x, torch.as_tensor(W))
        for k in x:
            torch.testing.assert_close(x[k].mean(0), avg[k])
    assert consensus_distance(x) < d0


def test_one_peer_period_reaches_exact_consensus():
    n = 16
    x = {"w": torch.randn(n, 5, dtype=torch.float64)}
    for W in mixing_matrices(n, "one_peer_exponential"):
        x = mix(x, torch.as_tensor(W))
    assert consensus_distance(x) < 1e-20


def test_constant_delays_give_linear_time(blobs):
    X, y = blobs
    n, c, d = 8, 0.5, 3.0
    D = np.full((n, n), d)
    for topology in ("ring", "one_peer_exponential"):
        clf = DecentralizedSGD(delays=D, topology=topology, compute_time=c, n_rounds=25,
                               eval_every=5, random_state=0).fit(X, y)
        assert clf.sim_time_ == pytest.approx(25 * (c + d))
        times = [h["sim_time"] for h in clf.history_]
        assert times == pytest.approx([r * (c + d) for r in (5, 10, 15, 20, 25)])


def test_sim_time_uses_round_bottlenecks(blobs):
    X, y = blobs
    D = make_delay_matrix(8, "backbone", random_state=0)
    perm = np.random.default_rng(0).permutation(8)
    clf = DecentralizedSGD(delays=D, assignment=perm, topology="one_peer_exponential",
                           compute_time=2.0, n_rounds=7, random_state=0).fit(X, y)
    rounds = bottleneck_delay(D, perm, "one_peer_exponential", reduce="none")
    np.testing.assert_allclose(clf.round_delays_, rounds)
    want = sum(2.0 + rounds[t % 3] for t in range(7))
    assert clf.sim_time_ == pytest.approx(want)


def test_learns_and_consensus_shrinks(blobs):
    X, y = blobs
    clf = DecentralizedSGD(n_nodes=8, n_rounds=150, lr=0.5, partition="dirichlet", alpha=0.2,
                           eval_every=10, random_state=0).fit(X, y)
    assert clf.score(X, y) > 0.9
    cons = [h["consensus"] for h in clf.history_]
    assert cons[-1] < cons[0] * 2 and all(np.isfinite(cons))
    assert clf.predict_proba(X).shape == (300, 3)
    np.testing.assert_allclose(clf.predict_proba(X).sum(1), 1.0, rtol=1e-5)
    stacked = clf.node_params_["weight"]
    assert stacked.shape == (8, 3, 5)


def test_btsp_assignment_reaches_accuracy_sooner():
    """Same rounds, shorter simulated wall clock with the BTSP-MSR assignment."""
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    D = make_delay_matrix(32, "backbone", random_state=0)
    kw = dict(delays=D, topology="one_peer_exponential", compute_time=5.0, n_rounds=60,
              lr=0.5, eval_every=20, partition="dirichlet", alpha=0.5, random_state=0)
    btsp = BottleneckNodeAssigner(topology="one_peer_exponential", random_state=0).fit(D)
    rand = np.random.default_rng(0).permutation(32)
    a = DecentralizedSGD(assignment=btsp.assignment_, **kw).fit(X, y)
    b = DecentralizedSGD(assignment=rand, **kw).fit(X, y)
    assert a.sim_time_ < 0.8 * b.sim_time_
    assert a.history_[-1]["accuracy"] > 0.8 and b.history_[-1]["accuracy"] > 0.8


def test_mlp_custom_module_nodes_and_eval_set(blobs):
    X, y = blobs
    clf = DecentralizedSGD(model="mlp", hidden=16, n_nodes=4, n_rounds=40, lr=0.3,
                           momentum=0.5, weight_decay=1e-4, random_state=0)
    nodes = np.arange(len(y)) % 4
    clf.fit(X, y, nodes=nodes, eval_set=(X[:50], y[:50]))
    assert clf.score(X, y) > 0.8
    np.testing.assert_array_equal(clf.node_of_, nodes)
    module = torch.nn.Sequential(torch.nn.Linear(5, 3))
    clf2 = DecentralizedSGD(model=module, n_nodes=4, n_rounds=25, lr=0.5, random_state=0)
    assert clf2.fit(X, y).score(X, y) > 0.8
    assert pickle.loads(pickle.dumps(clf2)).score(X, y) == clf2.score(X, y)


def test_nodes_without_data(blobs):
    X, y = blobs
    clf = DecentralizedSGD(n_nodes=6, n_rounds=30, lr=0.5, random_state=0)
    clf.fit(X, y, nodes=np.zeros(len(y), dtype=int))  # all data on node 0
    assert np.isfinite(clf.history_[-1]["loss"])


def test_nodes_as_a_list_of_shards(blobs):
    # a user's own split (np.array_split of a permutation, one index array per node)
    # used to fail inside numpy ("inhomogeneous shape"); it equals the per-sample labels
    X, y = blobs
    shards = np.array_split(np.random.default_rng(0).permutation(len(y)), 4)
    labels = np.empty(len(y), dtype=int)
    for i, s in enumerate(shards):
        labels[s] = i
    kw = dict(n_nodes=4, n_rounds=10, lr=0.3, random_state=0)
    a = DecentralizedSGD(**kw).fit(X, y, nodes=shards)
    b = DecentralizedSGD(**kw).fit(X, y, nodes=labels)
    for k in a.params_:
        torch.testing.assert_close(a.params_[k], b.params_[k], rtol=0, atol=0)
    with pytest.raises(ValueError, match="one index array per node"):
        DecentralizedSGD(**kw).fit(X, y, nodes=shards[:3])
    with pytest.raises(ValueError, match="exactly once"):
        DecentralizedSGD(**kw).fit(X, y, nodes=[shards[0], shards[0], shards[2], shards[3]])
    with pytest.raises(ValueError, match="list of 4 index arrays"):
        DecentralizedSGD(**kw).fit(X, y, nodes=np.zeros((len(y), 2), dtype=int))


def test_determinism_and_save_load(blobs, tmp_path):
    X, y = blobs
    kw = dict(n_nodes=4, n_rounds=20, lr=0.3, random_state=7)
    a = DecentralizedSGD(**kw).fit(X, y)
    b = DecentralizedSGD(**kw).fit(X, y)
    for k in a.params_:
        torch.testing.assert_close(a.params_[k], b.params_[k])
    a.save(tmp_path / "dsgd.pt")
    c = DecentralizedSGD.load(tmp_path / "dsgd.pt")
    np.testing.assert_allclose(c.predict_proba(X), a.predict_proba(X), rtol=1e-6)
    assert c.history_ == a.history_


def test_bad_parameters(blobs):
    X, y = blobs
    with pytest.raises(NotFittedError):
        DecentralizedSGD().predict(X)
    D = make_delay_matrix(6, random_state=0)
    with pytest.raises(ValueError, match="disagree"):
        DecentralizedSGD(delays=D, n_nodes=5).fit(X, y)
    with pytest.raises(ValueError, match="permutation"):
        DecentralizedSGD(delays=D, assignment=[0, 0, 1, 2, 3, 4]).fit(X, y)
    for scalar in ("bogus", 3):  # no length to compare with n_nodes
        with pytest.raises(ValueError, match="assignment must be None or a 1D"):
            DecentralizedSGD(assignment=scalar).fit(X, y)
    with pytest.raises(ValueError, match="model"):
        DecentralizedSGD(model="cnn").fit(X, y)
    with pytest.raises(ValueError, match="momentum"):
        DecentralizedSGD(momentum=1.0).fit(X, y)
    with pytest.raises(ValueError, match="lr"):
        DecentralizedSGD(lr=0.0).fit(X, y)
    with pytest.raises(ValueError, match="partition"):
        DecentralizedSGD(partition="shards").fit(X, y)
    with pytest.raises(ValueError, match="topology"):
        DecentralizedSGD(topology="star").fit(X, y)
    with pytest.raises(ValueError, match="nodes"):
        DecentralizedSGD(n_nodes=4).fit(X, y, nodes=np.full(len(y), 9))


def test_score_sample_weight_is_routable(blobs):
    # score applies sample_weight, so metadata routing must be able to request it
    import sklearn
    from sklearn.model_selection import cross_validate

    X, y = blobs
    w = np.random.default_rng(0).uniform(0.0, 3.0, len(y))
    with sklearn.config_context(enable_metadata_routing=True):
        est = DecentralizedSGD(n_nodes=4, n_rounds=10, random_state=0)
        est.set_score_request(sample_weight=True)
        res = cross_validate(est, X, y, cv=3, params={"sample_weight": w},
                             return_estimator=True, return_indices=True)
    for fitted, test, score in zip(res["estimator"], res["indices"]["test"],
                                   res["test_score"]):
        assert score == pytest.approx(fitted.score(X[test], y[test], sample_weight=w[test]))
