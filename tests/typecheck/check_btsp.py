"""The BTSP-MSR node assignment and the decentralized-SGD simulator, as typed user code."""

from typing import assert_type

import numpy as np
import torch
from torch import nn

from mlpapers.decentralized import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    is_biconnected,
    make_delay_matrix,
    metric_closure,
    mixing_matrices,
    multiplier_relabel,
)


def check() -> None:
    D = make_delay_matrix(8, random_state=0)
    assert_type(D, np.ndarray)
    assert_type(make_delay_matrix(8, "backbone", return_positions=True, random_state=0),
                tuple[np.ndarray, np.ndarray, np.ndarray])
    assert_type(metric_closure(D), np.ndarray)
    assert_type(is_biconnected(D < 60), bool)
    assert_type(biconnected_threshold(D), float)
    assert_type(circulant_schedule(8, "ring"), list[list[int]])
    assert_type(mixing_matrices(8), np.ndarray)

    perm, bcd, bound = bottleneck_tsp(D, random_state=0)
    assert_type(perm, np.ndarray)
    assert_type(bcd, float)
    assert_type(bottleneck_delay(D, perm, "ring"), float)
    assert_type(bottleneck_delay(D, perm, reduce="none"), np.ndarray)
    assert_type(multiplier_relabel(perm, 3), np.ndarray)
    assert_type(best_multiplier(D, perm), tuple[int, np.ndarray, float])

    assigner = BottleneckNodeAssigner(random_state=0)
    assert_type(assigner.fit(D), BottleneckNodeAssigner)
    assert_type(assigner.bcd(D), float)
    assert_type(assigner.bcd(D, reduce="sum"), float)
    assert_type(assigner.bcd(D, reduce="none"), np.ndarray)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 3))
    y = (X[:, 0] > 0).astype(int)
    clf = DecentralizedSGD(delays=D, n_rounds=2, eval_every=1, random_state=0)
    assert_type(clf.fit(X, y, eval_set=(X, y)), DecentralizedSGD)
    assert_type(clf.predict(X), np.ndarray)
    assert_type(clf.predict_proba(X), np.ndarray)

    # explicit skip sets as lists, tuples or arrays (the functions' ``topology`` too)
    assert_type(circulant_schedule(8, np.array([[1], [2]])), list[list[int]])
    assert_type(mixing_matrices(8, [np.array([1, 2]), np.array([3])]), np.ndarray)
    assert_type(bottleneck_delay(D, perm, (1, 2)), float)
    assert_type(best_multiplier(D, perm, [[1], [2, 4]]), tuple[int, np.ndarray, float])

    # the constructors' documented non-default values (unions, sequences, modules)
    for topology in ([[1], [2, 3]], [1, 3], (1, 2), np.array([1, 3]), "one-peer exponential"):
        est = BottleneckNodeAssigner(topology=topology, method="annealing", msr=True,
                                     n_iter=20, refine_iter=5,
                                     random_state=np.random.default_rng(0))
        assert_type(est.fit(D), BottleneckNodeAssigner)
    assert_type(BottleneckNodeAssigner(method="exact", msr=None, directed=True,
                                       metric_closure=True,
                                       random_state=np.random.RandomState(0)),
                BottleneckNodeAssigner)
    dsgd = DecentralizedSGD(model=nn.Linear(3, 2), topology=[[1], [2]],
                            assignment=assigner.assignment_, delays=D, partition="dirichlet",
                            alpha=1.0, n_rounds=2, eval_every=1, device=torch.device("cpu"),
                            random_state=np.random.RandomState(0))
    assert_type(dsgd.fit(X, y), DecentralizedSGD)
    assert_type(DecentralizedSGD(model="mlp", topology=np.array([1, 2]),
                                 assignment=[1, 0, 2, 3], delays=D.tolist(), n_nodes=4,
                                 random_state=np.random.default_rng(0)), DecentralizedSGD)
    assert_type(DecentralizedSGD(assignment=torch.arange(8), delays=torch.as_tensor(D),
                                 partition="iid", device="cpu"), DecentralizedSGD)
