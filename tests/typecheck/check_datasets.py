"""The dataset generators and the shared persistence, as typed user code."""

import os
import tempfile
from typing import assert_type

import numpy as np

from mlpapers.datasets import (
    make_extreme_classification,
    make_federated_digits,
    make_federated_linear,
    make_mips_problem,
    make_relevance_problem,
    make_shifted_digits,
    make_texture_anomalies,
)
from mlpapers.retrieval.amips import ExactMIPS


def check() -> None:
    X, y = make_extreme_classification(40, 5, 4, random_state=0)
    assert_type(X, np.ndarray)
    assert_type(make_shifted_digits(random_state=np.random.default_rng(0)),
                tuple[np.ndarray, np.ndarray])
    keys, queries, sampler = make_mips_problem(20, 3, n_queries=5, random_state=0)
    assert_type(keys, np.ndarray)
    clients, labels, thetas = make_federated_linear(2, 2, n_samples=6, n_features=3,
                                                    random_state=0)
    assert_type(clients, list[tuple[np.ndarray, np.ndarray]])
    digit_clients, digit_labels = make_federated_digits("rotation", 2, 1, n_samples=4,
                                                       random_state=0)
    assert_type(digit_labels, np.ndarray)
    q, items, relevance_fn = make_relevance_problem(4, 6, random_state=0)
    assert_type(relevance_fn(q, items), np.ndarray)
    images = make_texture_anomalies(2, 2, image_size=16, random_state=0)
    assert_type(images, tuple[np.ndarray, ...])

    index = ExactMIPS().fit(keys)
    assert_type(index, ExactMIPS)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index.pt")
        index.save(path)
        assert_type(ExactMIPS.load(path), ExactMIPS)
