"""Every estimator that trains float32 weights refuses a learning rate its optimiser
cannot apply, by name and before training (torch raised "value cannot be converted to
type float without overflow" at the first step, naming no parameter)."""

import re

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.decentralized.btsp import DecentralizedSGD
from mlpapers.federated import CLoVE
from mlpapers.retrieval.amips import AmortizedMIPS
from mlpapers.retrieval.rbe import RelevanceBasedRetriever

F32_MAX = float(torch.finfo(torch.float32).max)
ADAM_MAX = F32_MAX * (1 - 0.9)  # Adam's first step is lr / (1 - beta1)


def _tanh(queries, items):
    return np.tanh(queries @ items.T)


def _fit(name, lr):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    if name == "AmortizedMIPS":
        return AmortizedMIPS(n_steps=2, lr=lr, random_state=0).fit(X)
    if name == "RelevanceBasedRetriever":
        return RelevanceBasedRetriever(_tanh, n_support=3, head="mlp", lr=lr).fit(X[:20], X[20:])
    if name.startswith("CLoVE"):
        clients, _, _ = make_federated_linear(n_clusters=2, random_state=0)
        return CLoVE(n_clusters=2, n_rounds=1, lr=lr, optimizer=name.split("-")[1],
                     random_state=0).fit(clients)
    return DecentralizedSGD(n_nodes=4, n_rounds=1, lr=lr, random_state=0).fit(
        X, (X[:, 0] > 0).astype(int))


@pytest.mark.parametrize("name, bound", [
    ("AmortizedMIPS", ADAM_MAX), ("RelevanceBasedRetriever", ADAM_MAX),
    ("CLoVE-adam", ADAM_MAX), ("CLoVE-sgd", F32_MAX), ("DecentralizedSGD", F32_MAX)])
def test_learning_rates_beyond_the_optimisers_float32_step_are_refused(name, bound):
    for lr in (1e39, bound * (1 + 1e-12)):
        with pytest.raises(ValueError, match=re.escape(f"lr must be at most {bound:.4g}")):
            _fit(name, lr)


def test_amips_bounds_the_peak_of_a_rising_schedule():
    """``end_lr_ratio > 1`` makes the schedule rise to ``lr * end_lr_ratio``: with
    ``n_steps=1`` the only step used it, past the check of ``lr`` alone."""
    X = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    est = AmortizedMIPS(lr=1e37, n_steps=1, warmup=0.0, end_lr_ratio=4.0, random_state=0)
    with pytest.raises(ValueError, match=re.escape("lr * end_lr_ratio must be at most")):
        est.fit(X)
    est.set_params(end_lr_ratio=1.0).fit(X)  # the bound itself is usable
