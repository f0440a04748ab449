"""Rules of the official CLoVE code that the estimators follow (expected values derived
from the rule as stated in the docstrings, not from the official code's outputs)."""

import numpy as np
import pytest

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import IFCA, CLoVE


@pytest.fixture(scope="module")
def clients():
    return make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=40,
                                 random_state=0)[0]


@pytest.mark.parametrize("freeze_after", [1, 2, 3])
def test_freeze_after_counts_identical_assignments(clients, freeze_after):
    # one model: every recorded assignment is the same, so after freeze_after clustering
    # rounds every client kept its model freeze_after times and the next round is frozen
    est = CLoVE(n_clusters=1, n_rounds=freeze_after + 2, local_epochs=1,
                freeze_after=freeze_after, random_state=0).fit(clients)
    frozen = [h["frozen"] for h in est.history_]
    assert frozen == [False] * freeze_after + [True, True]
    assert ["loss" in h for h in est.history_] == [not f for f in frozen]


def test_freeze_after_is_per_client_under_partial_participation(clients):
    # a client's record only grows in the rounds it takes part in: clients 3-5, new in
    # round 1, have no record at its start, so with freeze_after=1 round 1 still clusters
    # and round 2 (every participant with one record) is the first frozen one
    everyone = np.arange(6)
    schedule = iter([np.array([0, 1, 2]), everyone, everyone, everyone])
    est = IFCA(n_clusters=2, n_rounds=4, freeze_after=1, participation=0.5, random_state=0)
    est._participants = lambda n, M: next(schedule)
    est.fit(clients)
    assert [h["frozen"] for h in est.history_] == [False, False, True, True]
