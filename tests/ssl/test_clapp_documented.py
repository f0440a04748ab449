"""What the public docstrings of ``mlpapers.ssl.clapp`` promise (session 15, API contract).

``training_step_activation_bytes`` documents ``random_state`` as an int seed and a batch
of at least two images; other values used to fail inside torch with errors that name no
parameter (``manual_seed expected a long``, ``negatives need at least 2 images``), numpy
ints included. ``patch_prediction_loss`` documents ``skip >= 0``; a negative one gave a
wrong loss without an error. ``PatchPredictor`` takes positive int sizes.
"""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    GlobalSSLEncoder,
    PatchPredictor,
    patch_prediction_loss,
    training_step_activation_bytes,
)


@pytest.fixture(scope="module")
def fitted():
    X, _ = make_shifted_digits(n_samples=12, random_state=0)
    return CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X), X


@pytest.mark.parametrize("random_state, error", [
    (None, TypeError), (1.5, TypeError), (True, TypeError), (np.random.RandomState(0),
                                                              TypeError),
    (-1, ValueError), (2 ** 70, ValueError),
])
def test_activation_bytes_refuses_a_seed_that_is_not_a_non_negative_int(
        fitted, random_state, error):
    enc, X = fitted
    with pytest.raises(error, match="random_state"):
        training_step_activation_bytes(enc, X, batch_size=4, random_state=random_state)


@pytest.mark.parametrize("batch_size, n", [(1, 12), (None, 1)])
def test_activation_bytes_needs_a_batch_of_two_images(fitted, batch_size, n):
    enc, X = fitted
    with pytest.raises(ValueError, match="batch of >= 2 images"):
        training_step_activation_bytes(enc, X[:n], batch_size=batch_size)


def test_activation_bytes_refuses_an_object_that_is_not_an_encoder(fitted):
    with pytest.raises(TypeError, match="encoder must be a CLAPPEncoder"):
        training_step_activation_bytes("encoder", fitted[1])


def test_activation_bytes_accepts_numpy_ints_and_is_reproducible(fitted):
    enc, X = fitted
    a = training_step_activation_bytes(enc, X, batch_size=4, random_state=np.int64(3))
    assert a == training_step_activation_bytes(enc, X, batch_size=4, random_state=3) > 0


def test_layer_local_step_keeps_fewer_activations_than_backprop(fitted):
    # the module's claim: block-by-block backward passes free each block's graph
    enc, X = fitted
    bp = GlobalSSLEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X)
    assert (training_step_activation_bytes(enc, X, batch_size=6)
            < training_step_activation_bytes(bp, X, batch_size=6))


@pytest.mark.parametrize("skip", [-1, -2, 1.5, True])
def test_patch_prediction_loss_refuses_a_skip_that_is_not_a_non_negative_int(skip):
    # skip=-2 used to broadcast a one-row slice against every context row: a wrong loss
    z = torch.randn(2, 4, 5, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="skip must be a non-negative int"):
        patch_prediction_loss(z, z, torch.zeros(1, 4, 4), torch.tensor([1, 0]), skip=skip)


@pytest.mark.parametrize("skip", [0, 1, 2])
def test_patch_prediction_loss_matches_its_formula_for_every_skip(skip):
    # float64 reference written from the docstring's definition
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 4, 6, 2, generator=g, dtype=torch.float64)
    c = torch.randn(3, 5, 6, 2, generator=g, dtype=torch.float64)
    w = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    neg = torch.tensor([2, 0, 1])
    steps = []
    for k in range(1, 3):
        terms = []
        for b in range(3):
            for y in range(6 - k - skip):
                for x in range(2):
                    pred = w[k - 1] @ c[b, :, y, x]
                    u_pos = z[b, :, y + k + skip, x] @ pred
                    u_neg = z[neg[b], :, y + k + skip, x] @ pred
                    terms.append(torch.relu(1 - u_pos) + torch.relu(1 + u_neg))
        steps.append(torch.stack(terms).mean())
    expected = torch.stack(steps).mean()
    got = patch_prediction_loss(z, c, w, neg, skip=skip)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim, n_steps, name", [
    (0, 2, "dim"), (4.5, 2, "dim"), (True, 2, "dim"), (4, 0, "n_steps"), (4, -1, "n_steps"),
])
def test_patch_predictor_refuses_sizes_that_are_not_positive_ints(dim, n_steps, name):
    # used to fail with ZeroDivisionError / torch errors, or build (K=0) empty predictors
    with pytest.raises((TypeError, ValueError), match=name):
        PatchPredictor(dim, n_steps)
