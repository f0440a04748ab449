"""A divergence caused by weight decay names weight_decay (the message blamed the pixel
scale, of images already in [0, 1], and lr)."""

import pytest

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder

X = make_shifted_digits(n_samples=64, random_state=0)[0]


def test_divergence_under_a_large_weight_decay_names_it():
    with pytest.raises(FloatingPointError, match=r"weight_decay \(now 1000000.0\)"):
        CLAPPEncoder(architecture="tiny", n_epochs=2, weight_decay=1e6,
                     random_state=0).fit(X)


def test_divergence_without_weight_decay_does_not_mention_it():
    with pytest.raises(FloatingPointError, match=r"lr \(now 1000000.0\)") as info:
        CLAPPEncoder(architecture="tiny", n_epochs=2, lr=1e6, weight_decay=0.0,
                     random_state=0).fit(X * 1e3)
    assert "weight_decay" not in str(info.value)
