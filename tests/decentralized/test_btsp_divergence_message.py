"""A divergence caused by weight decay names weight_decay (the message blamed lr and X)."""

import numpy as np
import pytest

from mlpapers.decentralized import DecentralizedSGD

X = np.random.default_rng(0).normal(size=(40, 3))
Y = (X[:, 0] > 0).astype(int)


def test_divergence_under_a_large_weight_decay_names_it():
    # lr * weight_decay = 10: each step multiplies the weights by about -9
    with pytest.raises(FloatingPointError, match=r"weight_decay \(now 100.0\)"):
        DecentralizedSGD(n_nodes=4, n_rounds=50, weight_decay=100.0, random_state=0).fit(X, Y)


def test_divergence_without_weight_decay_does_not_mention_it():
    with pytest.raises(FloatingPointError, match="diverged") as info:
        DecentralizedSGD(n_nodes=4, n_rounds=50, random_state=0).fit(X * 1e30, Y)
    assert "weight_decay" not in str(info.value)
