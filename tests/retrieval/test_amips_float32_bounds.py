"""Loss weights and the activation's beta beyond float32, and a training loss that
stops being finite, get errors naming what to change (they used to train nothing, or
fail inside torch)."""

import numpy as np
import pytest

from mlpapers.retrieval import AmortizedMIPS

RNG = np.random.default_rng(0)
KEYS = RNG.normal(size=(50, 8))
SMALL = dict(depth=2, hidden_dim=16, n_steps=40, batch_size=64, random_state=0)


@pytest.mark.parametrize("name", ["score_weight", "target_weight", "beta"])
def test_values_beyond_float32_are_refused_naming_the_parameter(name):
    # score_weight=1e39 trained nothing (loss inf at every step, score 0.035 against
    # 0.57); beta=1e39 failed inside softplus ("cannot be converted to type float")
    with pytest.raises(ValueError, match=rf"{name} must be at most 3.4e\+38"):
        AmortizedMIPS(**{name: 1e39}, **SMALL).fit(KEYS)


@pytest.mark.parametrize("name", ["score_weight", "target_weight", "beta"])
def test_float32_max_itself_passes_validation(name):
    est = AmortizedMIPS(**{name: float(np.finfo(np.float32).max)}, **SMALL)
    try:
        est.fit(KEYS)
    except FloatingPointError as err:   # a weight this large may overflow the loss
        assert name in str(err)


def test_a_non_finite_training_loss_raises_naming_the_weights_and_lr():
    with pytest.raises(FloatingPointError, match=r"not finite.*target_weight \(now 3e\+38\)"):
        AmortizedMIPS(target_weight=3e38, **SMALL).fit(KEYS)
    with pytest.raises(FloatingPointError, match=r"lr \(now 1e\+30\)"):
        AmortizedMIPS(lr=1e30, **SMALL).fit(KEYS)


def test_default_weights_train_with_finite_losses():
    est = AmortizedMIPS(**SMALL).fit(KEYS)
    assert all(np.isfinite(h["loss"]) for h in est.history_)
