"""The public SCENT kernels as their docstrings promise them: parameters outside their
documented range raise a ``ValueError`` naming them (they gave NaN, a ``math domain
error`` or a silent wrong step), and the documented values stay exact."""

import math

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    asgd_update,
    log_mean_exp,
    objective,
    softplus_dual_ratio,
    sox_update,
    spmd_gamma,
    spmd_update,
    umax_update,
)

NU = torch.tensor([0.0, -1.0], dtype=torch.float64)
L = torch.tensor([1.0, 2.0], dtype=torch.float64)


@pytest.mark.parametrize("call, match", [
    (lambda: sox_update(NU, L, 0.0), "gamma must be"),       # gave nu unchanged / NaN
    (lambda: sox_update(NU, L, -0.5), "gamma must be"),      # gave NaN
    (lambda: asgd_update(NU, L, -0.1), "dual_lr must be"),   # an ascent step
    (lambda: umax_update(NU, L, 0.1, -1.0), "delta must be"),
    (lambda: spmd_update(NU, L, float("nan")), "log_alpha must be"),  # gave NaN
    (lambda: spmd_gamma(NU, float("nan")), "log_alpha must be"),
    (lambda: softplus_dual_ratio(torch.zeros(2, 3), torch.zeros(2), 0.0), "rho must be"),
    (lambda: objective(torch.zeros(2, 3), temperature=0.0), "temperature must be"),
])
def test_out_of_range_step_parameters_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_softplus_dual_ratio_refuses_shapes_it_would_broadcast():
    # 1D scores (B,) broadcast against nu[:, None] to (B, B): a wrong ratio, silently
    with pytest.raises(ValueError, match=r"scores must have shape \(B, k\)"):
        softplus_dual_ratio(torch.zeros(3), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="nu must have shape"):
        softplus_dual_ratio(torch.zeros(2, 3), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="mask must have the shape of scores"):
        softplus_dual_ratio(torch.zeros(2, 3), torch.zeros(2), 1.0,
                            mask=torch.ones(2, 2, dtype=torch.bool))


def test_tensor_step_parameters_must_not_enlarge_the_update():
    # a (B, 1) log_alpha made the (B,) update (B, B) silently; a (5,) one beside B = 2
    # failed inside torch; tensors that broadcast to the update's shape still work
    col, five = torch.zeros(2, 1, dtype=torch.float64), torch.full((5,), 0.5)
    for call, name in [(lambda: spmd_update(NU, L, col), "log_alpha"),
                       (lambda: spmd_gamma(NU, col), "log_alpha"),
                       (lambda: sox_update(NU, L, five), "gamma"),
                       (lambda: asgd_update(NU, L, five), "dual_lr")]:
        with pytest.raises(ValueError, match=rf"^{name} of shape .* must broadcast to the "
                                             r"update's shape \(2,\)"):
            call()
    per_row = torch.tensor([0.0, 30.0], dtype=torch.float64)
    assert torch.equal(spmd_update(NU, L, per_row),
                       torch.stack([spmd_update(NU[:1], L[:1], 0.0)[0],
                                    spmd_update(NU[1:], L[1:], 30.0)[0]]))
    # a scalar nu beside (B,) minibatch values: the update has shape (B,)
    assert spmd_update(torch.zeros(()), L, per_row).shape == (2,)


def test_loss_and_log_mean_exp_arguments_are_refused_by_name():
    # a NaN tensor log_alpha filled the dual table with NaN for good; a string nu_init
    # failed in math.isfinite; an out-of-range dim gave torch's bare IndexError
    with pytest.raises(ValueError, match="^log_alpha must hold finite values"):
        EntropicRiskLoss(5, log_alpha=torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="^nu_init must be a finite float or None"):
        EntropicRiskLoss(3, nu_init="0")
    with pytest.raises(ValueError, match=r"^log_mean_exp: dim must be in \[-2, 2\)"):
        log_mean_exp(torch.zeros(2, 3), dim=2)
    assert torch.equal(log_mean_exp(torch.zeros(2, 3), dim=-2), torch.zeros(3))


def test_spmd_gamma_of_integer_or_array_nu_is_the_sigmoid():
    # an integer nu made log_alpha an integer too: sigmoid(0 + 0) instead of sigmoid(0.5)
    expected = 1.0 / (1.0 + math.exp(-0.5))
    assert float(spmd_gamma(torch.tensor([0]), 0.5)) == pytest.approx(expected, rel=1e-6)
    assert float(spmd_gamma([0.0], 0.5)) == pytest.approx(expected, rel=1e-6)
    out = spmd_gamma(np.zeros(2), 0.5)  # numpy float64 keeps its dtype
    assert out.dtype == torch.float64 and torch.allclose(out, torch.full((2,), expected,
                                                                         dtype=torch.float64))


def test_documented_values_and_limits_are_unchanged():
    # the limits the docstrings name: gamma = 1 jumps to L, log_alpha = +-inf
    torch.testing.assert_close(sox_update(NU, L, 1), L)
    torch.testing.assert_close(sox_update(NU, L, 1.5), L)   # "gamma >= 1 returns L"
    torch.testing.assert_close(asgd_update(NU, L, 0.0), NU)  # a zero step is a no-op
    torch.testing.assert_close(umax_update(NU, L, 0.0, 1.0), torch.where(NU < L - 1.0, L, NU))
    torch.testing.assert_close(spmd_update(NU, L, float("inf")), L)
    torch.testing.assert_close(spmd_update(NU, L, float("-inf")), NU)
    # delta = 0 (the official KL-DRO default) resets every lagging nu to L
    torch.testing.assert_close(umax_update(NU, L, 0.1, 0.0), L)
    # SOX from the definition e^nu' = (1 - g) e^nu + g e^L, in float64
    g = 0.3
    ref = torch.log((1 - g) * NU.exp() + g * L.exp())
    torch.testing.assert_close(sox_update(NU, L, g), ref)
    # ASGD from the definition nu - lr (1 - e^(L - nu)); a numpy scalar step is a number
    torch.testing.assert_close(asgd_update(NU, L, np.float64(0.1)),
                               NU - 0.1 * (1 - torch.exp(L - NU)))
    # a 0-d tensor temperature is still accepted by objective: tau log mean exp(s / tau)
    s = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    expected = 2.0 * math.log((1.0 + math.exp(0.5)) / 2)
    assert float(objective(s, temperature=torch.tensor(2.0))) == pytest.approx(expected)


def test_an_unknown_method_set_after_construction_is_refused_by_forward():
    # regression: any unknown name ran the asgd_softplus branch silently
    loss = EntropicRiskLoss(4)
    loss.method = "scnet"
    with pytest.raises(ValueError, match="method"):
        loss(torch.zeros(2, 3), torch.tensor([0, 1]))
    assert not bool(loss.initialized.any())  # refused before the dual table changed


@pytest.mark.parametrize("name, value, message", [
    ("temperature", -1.0, "temperature must be > 0"),
    ("temperature", -1e-3, "temperature must be > 0"),
    ("temperature", float("nan"), "temperature must be finite"),
    ("gamma", 5.0, "gamma must be in"),
    ("dual_lr", -1.0, "dual_lr must be > 0"),
])
def test_hyper_parameters_set_after_construction_are_checked_by_forward(name, value, message):
    # regression: a negative temperature gave a wrong loss and drove nu to ~2e3 for good
    loss = EntropicRiskLoss(4)
    setattr(loss, name, value)
    with pytest.raises(ValueError, match=message):
        loss(torch.zeros(2, 3), torch.tensor([0, 1]))
    assert not bool(loss.initialized.any()) and not bool(loss.nu.any())


def test_a_tiny_temperature_gives_the_argmax_probabilities():
    # regression: z / 1e-320 overflowed to inf and predict_proba was all NaN; the limit
    # of softmax(z / tau) as tau -> 0 is the one-hot of the best class
    from sklearn.datasets import load_iris

    from mlpapers.optim.scent import SCENTClassifier

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    clf = SCENTClassifier(n_negatives=2, epochs=3, random_state=0).fit(X, y)
    best = clf.decision_function(X).argmax(1)
    clf.set_params(temperature=1e-320)
    P, logP = clf.predict_proba(X), clf.predict_log_proba(X)
    np.testing.assert_array_equal(P, np.eye(3)[best])
    np.testing.assert_array_equal(logP.argmax(1), best)
    assert (logP.max(1) == 0).all() and np.isneginf(logP).sum() == 2 * len(X)
