"""CLAPP pieces called directly: the augmentation steps, empty batches and PatchPredictor's
generator get the checks their usual callers give them."""

import pytest
import torch

from mlpapers.ssl.clapp import (
    DefaultAugment,
    PatchPredictor,
    clapp_layer_loss,
    patch_prediction_loss,
    three_factor_grad,
)

STEPS = ("crop_flip", "color", "blur")


def _images():
    return torch.rand(4, 3, 12, 12, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kw, match", [
    (dict(jitter=(-3, 0, 0), jitter_p=1), "jitter must be three strengths >= 0"),
    (dict(flip=5), "flip must be a probability"),
    (dict(ratio=(4 / 3, 3 / 4)), r"ratio must be \(min, max\) with 0 < min <= max"),
    (dict(sigma=None), r"sigma must be a \(min, max\) pair"),
    (dict(scale=(0.0, 1.0)), r"scale must be \(min, max\) with 0 < min <= max"),
])
def test_augment_steps_check_the_settings_as_call_does(step, kw, match):
    """Regression: the public steps skipped __call__'s check of the settings (a negative
    jitter inverted the images, a reversed ratio or a flip of 5 passed, sigma=None was
    a TypeError from unpacking)."""
    aug = DefaultAugment(**kw)
    with pytest.raises(ValueError, match=match):
        aug(_images(), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=match):
        getattr(aug, step)(_images(), torch.Generator().manual_seed(0))


def test_augment_steps_compose_to_call():
    aug = DefaultAugment()
    x = _images()
    gen = torch.Generator().manual_seed(1)
    steps = aug.blur(aug.color(aug.crop_flip(x, gen), gen), gen)
    assert torch.equal(steps, aug(x, torch.Generator().manual_seed(1)))


def test_augment_step_alone_equals_call_with_only_that_step():
    # a colour step that never fires only advances the generator (and rounds: x - mean
    # + mean), a blur that never fires returns its input
    aug = DefaultAugment(jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    x = _images()
    got = aug.crop_flip(x, torch.Generator().manual_seed(2))
    torch.testing.assert_close(got, aug(x, torch.Generator().manual_seed(2)))
    assert not torch.equal(got, x)


@pytest.mark.parametrize("step", STEPS)
def test_augment_steps_are_deterministic_under_a_seed(step):
    aug = DefaultAugment(jitter_p=1.0, gray_p=0.5, blur_p=1.0)
    x = _images()
    first = getattr(aug, step)(x, torch.Generator().manual_seed(3))
    again = getattr(aug, step)(x, torch.Generator().manual_seed(3))
    assert first.shape == x.shape
    assert torch.equal(first, again)


def test_clapp_layer_loss_refuses_an_empty_batch():
    """Regression: no rows gave a NaN loss (infonce_loss already refused them)."""
    with pytest.raises(ValueError, match=r"^z must have shape \(N, D\) with N >= 1"):
        clapp_layer_loss(torch.zeros(0, 3), torch.zeros(0, 2), torch.zeros(3, 2),
                         torch.zeros(0, dtype=torch.long))


def test_three_factor_grad_refuses_an_empty_batch():
    """Regression: no rows gave a NaN gradient."""
    with pytest.raises(ValueError, match=r"^x must have shape \(N, K_in\) with N >= 1"):
        three_factor_grad(torch.zeros(0, 3), torch.zeros(2, 3), torch.zeros(0, 2),
                          torch.zeros(2, 2), torch.zeros(0, dtype=torch.long))


def test_patch_prediction_loss_refuses_an_empty_batch():
    """Regression: no images gave a NaN loss."""
    with pytest.raises(ValueError, match=r"^z must have shape \(N, D, n_y, n_x\) with N >= 1"):
        patch_prediction_loss(torch.zeros(0, 4, 5, 3), torch.zeros(0, 4, 5, 3),
                              torch.zeros(2, 4, 4), torch.zeros(0, dtype=torch.long))


def test_losses_on_one_row_still_work():
    z, c = torch.ones(1, 3), torch.ones(1, 2)
    assert float(clapp_layer_loss(z, c, torch.zeros(3, 2), torch.tensor([0]))) == 2.0
    grad = three_factor_grad(z, torch.ones(2, 3), c, torch.ones(2, 2), torch.tensor([0]))
    assert grad.shape == (2, 3) and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("generator", [5, "seed", torch.Generator])
def test_patch_predictor_refuses_a_generator_that_is_not_one(generator):
    """Regression: an int was an AttributeError ("'int' object has no attribute
    'device')."""
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None"):
        PatchPredictor(4, 2, generator=generator)


def test_patch_predictor_with_a_generator_is_reproducible():
    one = PatchPredictor(4, 2, generator=torch.Generator().manual_seed(0))
    two = PatchPredictor(4, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(one.weight, two.weight) and torch.equal(one.mirror, two.mirror)
