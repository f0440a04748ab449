"""Option interactions of BottleneckNodeAssigner, DecentralizedSGD and the BTSP
functions (session 18, combinatorial testing).

Pairwise covering arrays over the options that select a code path (every pair of
values of every two options appears in at least one configuration; the deterministic
greedy search of ``tests._pairwise``) are run on tiny inputs, each checked against the
invariants that hold whatever the options: the reported BCDs equal
:func:`bottleneck_delay` of the assignment on the (closed) delays, the lower bound
holds, the multiplier step and the refinement are never worse, ``exact`` is optimal,
reproducibility, pickle; for the simulator, the round delays, the simulated clock, the
recorded rounds and the predictions' types.
"""

import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from torch import nn

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    metric_closure,
    mixing_matrices,
)
from tests._pairwise import covering_array, uncovered_pairs


def _ids(cfg):
    return "-".join(map(str, cfg.values()))


def _delays(kind, n, seed=0):
    """Delays of ``n`` nodes: planar distances, asymmetric random, ties, a missing link
    (``inf``, only with ``metric_closure``), or the planar ones as a tensor / lists."""
    rng = np.random.default_rng(seed)
    if kind == "asymmetric":
        D = 10 * rng.random((n, n))
    elif kind == "ties":
        D = np.ones((n, n))
        D[0, 1] = D[1, 0] = 2.0
    else:
        pts = rng.random((n, 2))
        D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    np.fill_diagonal(D, 0.0)
    if kind == "missing_link" and n > 3:
        D[0, 2] = D[2, 0] = np.inf
    return {"tensor": torch.as_tensor(D), "lists": D.tolist()}.get(kind, D)


def _topology(name, n):
    return ([[1], [min(3, n - 1)]] if n > 2 else [[1]]) if name == "explicit" else name


ASSIGNER_OPTIONS = {
    "topology": ["exponential", "ring", "one_peer_exponential", "sparse_exponential",
                 "explicit"],
    "method": ["btsp_msr", "btsp", "identity", "random", "greedy", "annealing", "exact"],
    "msr": [None, True, False],
    "directed": [False, True],
    "metric_closure": [False, True],
    "n_random": [5, 1],
    "n_iter": [None, 3],
    "refine_iter": [0, 15],
    "n": [2, 3, 7, 8],
    "delays": ["planar", "asymmetric", "ties", "tensor", "lists", "missing_link"],
}


@pytest.mark.parametrize("cfg", covering_array(ASSIGNER_OPTIONS), ids=_ids)
def test_assigner_option_pairs(cfg):
    n = cfg["n"]
    D = _delays(cfg["delays"], n)
    S = _topology(cfg["topology"], n)
    est = BottleneckNodeAssigner(
        topology=S, method=cfg["method"], msr=cfg["msr"], directed=cfg["directed"],
        metric_closure=cfg["metric_closure"], n_random=cfg["n_random"],
        n_iter=cfg["n_iter"], refine_iter=cfg["refine_iter"], random_state=0)
    if cfg["delays"] == "missing_link" and n > 3 and not cfg["metric_closure"]:
        with pytest.raises(ValueError, match="infinity.*metric_closure"):
            est.fit(D)  # refused, naming the option that accepts it
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # worse than random: tiny n
        est.fit(D)
    Dn = np.asarray(D, dtype=float)
    if cfg["metric_closure"]:
        Dn = metric_closure(Dn)
    directed = cfg["directed"]
    assert sorted(est.assignment_.tolist()) == list(range(n))
    assert est.schedule_ == circulant_schedule(n, S)
    np.testing.assert_array_equal(
        est.bcd_per_round_, bottleneck_delay(Dn, est.assignment_, S, reduce="none",
                                             directed=directed))
    assert est.bcd_ == bottleneck_delay(Dn, est.assignment_, S, directed=directed)
    assert est.bcd_total_ == bottleneck_delay(Dn, est.assignment_, S, reduce="sum",
                                              directed=directed)
    assert est.bcd(D) == est.bcd_  # the same treatment of the delays as in fit
    assert est.lower_bound_ <= est.bcd_
    msr = cfg["method"] == "btsp_msr" if cfg["msr"] is None else cfg["msr"]
    base = bottleneck_delay(Dn, est.base_assignment_, S, directed=directed)
    if msr or cfg["refine_iter"]:
        assert est.bcd_ <= base  # never worse than the method's own assignment
    if msr and not cfg["refine_iter"]:
        c = est.multiplier_
        assert math.gcd(c, n) == 1
        np.testing.assert_array_equal(est.assignment_,
                                      est.base_assignment_[(c * np.arange(n)) % n])
    if not msr and not cfg["refine_iter"]:
        np.testing.assert_array_equal(est.assignment_, est.base_assignment_)
        assert est.multiplier_ == 1
    assert (est.ring_tour_ is not None) == (cfg["method"] in ("btsp", "btsp_msr"))
    assert est.edges_.shape == (n * sum(map(len, est.schedule_)), 3)
    if cfg["method"] == "exact":  # optimal: no other method does better
        for other in ("btsp_msr", "greedy", "identity"):
            alt = clone(est).set_params(method=other, msr=None, refine_iter=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                assert est.bcd_ <= alt.fit(D).bcd_
    again = clone(est).fit(D)
    np.testing.assert_array_equal(again.assignment_, est.assignment_)
    assert again.random_bcd_ == est.random_bcd_
    copy = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(copy.assignment_, est.assignment_)
    assert copy.bcd(D) == est.bcd_


FUNCTION_OPTIONS = {
    "method": ["2approx", "exact"],
    "directed": [False, True],
    "metric": [None, True, False],
    "metric_closure": [False, True],
    "restarts": [4, 1],
    "n": [2, 3, 7, 8],
    "delays": ["planar", "asymmetric", "ties", "tensor", "lists"],
    "topology": ["exponential", "ring", "one_peer_exponential", "sparse_exponential",
                 "explicit"],
    "reduce": ["mean", "sum", "none"],
}


@pytest.mark.parametrize("cfg", covering_array(FUNCTION_OPTIONS), ids=_ids)
def test_function_option_pairs(cfg):
    n, directed = cfg["n"], cfg["directed"]
    D = _delays(cfg["delays"], n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 2 theta* on non-metric delays
        tour, b, theta = bottleneck_tsp(D, method=cfg["method"], directed=directed,
                                        metric=cfg["metric"],
                                        metric_closure=cfg["metric_closure"],
                                        restarts=cfg["restarts"], random_state=0)
    Dn = np.asarray(D, dtype=float)
    if cfg["metric_closure"]:
        Dn = metric_closure(Dn)
    assert sorted(tour.tolist()) == list(range(n))
    # the tour's bottleneck is the ring BCD of the tour, at least theta*, at least optimal
    assert b == bottleneck_delay(Dn, tour, "ring", directed=directed)
    assert theta <= b
    assert bottleneck_tsp(Dn, method="exact", directed=directed)[1] <= b
    S = _topology(cfg["topology"], n)
    c, new, bcd = best_multiplier(Dn, tour, S, directed=directed)
    assert math.gcd(c, n) == 1
    assert bcd == bottleneck_delay(Dn, new, S, directed=directed)
    assert bcd <= bottleneck_delay(Dn, tour, S, directed=directed)
    tau = len(circulant_schedule(n, S))
    out = bottleneck_delay(Dn, new, S, reduce=cfg["reduce"], directed=directed)
    if cfg["reduce"] == "none":
        assert out.shape == (tau,) and math.isclose(out.mean(), bcd)
    elif cfg["reduce"] == "sum":
        assert math.isclose(out, tau * bcd)
    W = mixing_matrices(n, S)
    assert W.shape == (tau, n, n)
    np.testing.assert_allclose(W.sum(1), 1.0)
    np.testing.assert_allclose(W.sum(2), 1.0)


class _BatchNormNet(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, n_classes)

    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x))))


DSGD_OPTIONS = {
    "model": ["logistic", "mlp", "batchnorm", "dropout"],
    "topology": ["exponential", "ring", "one_peer_exponential", "explicit"],
    "assignment": [None, "permutation"],
    "delays": [None, "planar"],
    "compute_time": [1.5, 0.0],
    "momentum": [0.0, 0.5],
    "weight_decay": [0.0, 0.1],
    "batch_size": [4, 1, 200],
    "partition": ["iid", "dirichlet"],
    "nodes": [None, "labels", "shards"],
    "eval_set": [False, True],
    "eval_every": [3, 1, 100],
    "directed": [False, True],
    "X": ["float64", "tensor", "DataFrame"],
    "y": ["int", "str", "3 classes"],
}


@pytest.mark.parametrize("cfg", covering_array(DSGD_OPTIONS), ids=_ids)
def test_dsgd_option_pairs(cfg):
    rng = np.random.default_rng(0)
    n, n_rounds = 5, 7
    X = rng.normal(size=(60, 3))
    codes = (X[:, 0] > 0).astype(int) + (cfg["y"] == "3 classes") * (X[:, 1] > 1)
    y = np.array(["u", "v", "w"])[codes] if cfg["y"] == "str" else codes
    n_classes = len(np.unique(codes))
    model = {"batchnorm": _BatchNormNet(n_classes),
             "dropout": nn.Sequential(nn.Linear(3, 5), nn.Dropout(0.3),
                                      nn.Linear(5, n_classes))}.get(cfg["model"], cfg["model"])
    pts = rng.random((n, 2))
    D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    perm = rng.permutation(n)
    Xin = {"tensor": torch.as_tensor(X)}.get(cfg["X"], X)
    if cfg["X"] == "DataFrame":
        Xin = pytest.importorskip("pandas").DataFrame(X, columns=list("abc"))
    topology = [[1], [2]] if cfg["topology"] == "explicit" else cfg["topology"]
    est = DecentralizedSGD(
        model=model, topology=topology, n_nodes=n,
        assignment=perm if cfg["assignment"] else None,
        delays=D if cfg["delays"] else None, compute_time=cfg["compute_time"],
        momentum=cfg["momentum"], weight_decay=cfg["weight_decay"], n_rounds=n_rounds,
        batch_size=cfg["batch_size"], partition=cfg["partition"],
        eval_every=cfg["eval_every"], directed=cfg["directed"], lr=0.3, random_state=0)
    kw = {}
    if cfg["nodes"] == "labels":
        kw["nodes"] = np.arange(60) % n
    elif cfg["nodes"] == "shards":
        kw["nodes"] = np.array_split(rng.permutation(60), n)
    if cfg["eval_set"]:
        kw["eval_set"] = (Xin[:20] if cfg["X"] != "DataFrame" else Xin.iloc[:20], y[:20])
    if cfg["model"] == "batchnorm" and cfg["batch_size"] == 1:
        with pytest.raises(ValueError, match="batch_size"):
            est.fit(Xin, y, **kw)  # BatchNorm cannot train on one sample
        return
    est.fit(Xin, y, **kw)
    pred = est.predict(Xin)
    assert pred.shape == (60,) and set(pred) <= set(y)
    proba = est.predict_proba(Xin)
    assert proba.shape == (60, n_classes) and proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-5)
    S = circulant_schedule(n, topology)
    if cfg["delays"]:
        np.testing.assert_array_equal(est.round_delays_, bottleneck_delay(
            D, perm if cfg["assignment"] else np.arange(n), S, reduce="none",
            directed=cfg["directed"]))
    else:
        assert not est.round_delays_.any()
    want = n_rounds * cfg["compute_time"] + sum(est.round_delays_[t % len(S)]
                                                for t in range(n_rounds))
    assert math.isclose(est.sim_time_, want, rel_tol=1e-12, abs_tol=1e-15)
    every = cfg["eval_every"]
    assert [h["round"] for h in est.history_] == [
        t for t in range(1, n_rounds + 1) if t % every == 0 or t == n_rounds]
    assert all(math.isfinite(h["loss"]) for h in est.history_)
    np.testing.assert_array_equal(clone(est).fit(Xin, y, **kw).predict_proba(Xin), proba)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict_proba(Xin), proba)


@pytest.mark.parametrize("options", [ASSIGNER_OPTIONS, FUNCTION_OPTIONS, DSGD_OPTIONS],
                         ids=["assigner", "functions", "dsgd"])
def test_covering_arrays_cover_every_pair(options):
    assert uncovered_pairs(options, covering_array(options)) == []
