"""The BTSP-MSR node assignment and the decentralized-SGD simulator, as typed user code."""

from typing import assert_type

import numpy as np

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
