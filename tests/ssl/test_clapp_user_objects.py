"""The objects users hand the self-supervised encoders: ``augment`` callables and
``architecture`` lists.

Contract (docs/user_guide/clapp.rst, "Your own augmentation"): the augment is called as
``augment(x, generator)`` twice per batch, each time on its own float32 copy of the
batch, under ``torch.no_grad`` and with the global torch RNG forked and seeded from the
estimator's ``random_state``; its output is checked (tensor, floating, ``(N, C, h, w)``,
two views of one size that fits the architecture, finite) and cast to float32.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    DefaultAugment,
    GlobalSSLEncoder,
    training_step_activation_bytes,
    update_similarity,
)
from tests._ambient import check_state_untouched, run_in_threads
from tests.ssl.test_clapp_ambient import IMAGES, SMALL  # the same small setting

ENCODERS = {"clapp": CLAPPEncoder, "global": GlobalSSLEncoder}


def noise_from_global_rng(x, generator=None):
    """A user augment that ignores ``generator`` and draws from torch's global RNG."""
    return x + 0.1 * torch.randn_like(x)


def scale_from_generator(x, generator=None):
    """An augment drawing from the generator it is given (a module-level function:
    picklable)."""
    return x * (0.5 + torch.rand(x.shape[0], 1, 1, 1, generator=generator))


def scale_in_place(x, generator=None):
    """The same draws as :func:`scale_from_generator`, applied in place."""
    return x.mul_(0.5 + torch.rand(x.shape[0], 1, 1, 1, generator=generator))


def _outputs(enc) -> list:
    return [enc.transform(IMAGES), enc.encoder_.state_dict(), enc.heads_.state_dict()]


def _assert_same(a, b) -> None:
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=0)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_augment_drawing_from_the_global_rng_is_seeded_by_random_state(kind):
    """Regression: an augment using torch.randn (not the generator) made fits with one
    random_state differ and advanced the caller's global RNG."""
    cls = ENCODERS[kind]
    torch.manual_seed(1)
    first = check_state_untouched(
        lambda: _outputs(cls(**{**SMALL, "augment": noise_from_global_rng}).fit(IMAGES)))
    torch.manual_seed(2)  # another global state: the same fit
    _assert_same(first, _outputs(cls(**{**SMALL, "augment": noise_from_global_rng})
                                 .fit(IMAGES)))
    other = cls(**{**SMALL, "augment": noise_from_global_rng, "random_state": 1}).fit(IMAGES)
    assert not np.array_equal(other.transform(IMAGES), first[0])  # the seed matters


def test_analysis_functions_seed_a_global_rng_augment_too():
    enc = CLAPPEncoder(**{**SMALL, "augment": noise_from_global_rng}).fit(IMAGES)
    torch.manual_seed(3)
    a = check_state_untouched(lambda: update_similarity(enc, IMAGES, n_batches=2,
                                                        random_state=0))
    torch.manual_seed(4)
    assert update_similarity(enc, IMAGES, n_batches=2, random_state=0) == a
    check_state_untouched(lambda: training_step_activation_bytes(enc, IMAGES))


def test_fits_with_a_global_rng_augment_in_threads_give_the_sequential_result():
    """The forked-and-seeded global RNG is held by one fit at a time: two fits in
    threads would otherwise restore each other's RNG state and mix their draws."""
    def fit():
        return _outputs(CLAPPEncoder(**{**SMALL, "augment": noise_from_global_rng})
                        .fit(IMAGES))

    expected = fit()
    state = torch.random.get_rng_state()
    for got in run_in_threads([fit, fit, fit]):
        _assert_same(expected, got)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_generator_draws_are_unchanged_by_the_seeding(kind):
    """The seeding does not advance the estimator's generator: DefaultAugment passed as
    a callable trains exactly as augment="default" (same generator stream)."""
    cls = ENCODERS[kind]
    _assert_same(_outputs(cls(**{**SMALL, "augment": "default"}).fit(IMAGES)),
                 _outputs(cls(**{**SMALL, "augment": DefaultAugment()}).fit(IMAGES)))


def test_in_place_augment_gets_its_own_copy_per_view():
    """Regression: an augment working in place got the same batch tensor for both
    views, so the two views of a pair were one tensor (the second draw applied on top
    of the first to both): training differed from the out-of-place augment with the
    same draws."""
    expected = _outputs(CLAPPEncoder(**{**SMALL, "augment": scale_from_generator})
                        .fit(IMAGES))
    X = torch.as_tensor(IMAGES).clone()
    got = _outputs(CLAPPEncoder(**{**SMALL, "augment": scale_in_place}).fit(X))
    _assert_same(expected, got)
    np.testing.assert_array_equal(X.numpy(), IMAGES)  # the caller's images untouched


def test_each_call_gets_a_float32_batch_and_the_generator():
    seen = []

    def spy(x, generator):
        seen.append((x.dtype, tuple(x.shape), isinstance(generator, torch.Generator),
                     torch.is_grad_enabled()))
        return x

    CLAPPEncoder(**{**SMALL, "augment": spy}).fit(IMAGES.astype(np.float64))
    # 2 calls per batch of 3 images, 2 batches
    assert seen == [(torch.float32, (3, 1, 8, 8), True, False)] * 4


def test_identity_augment_in_another_float_dtype_equals_identical_views():
    """Documented coercion: floating views are cast to float32; a float64 identity
    augment trains exactly as augment=None."""
    _assert_same(_outputs(CLAPPEncoder(**{**SMALL, "augment": None}).fit(IMAGES)),
                 _outputs(CLAPPEncoder(**{**SMALL, "augment": lambda x, g: x.double()})
                          .fit(IMAGES)))


def _views_of_alternating_sizes():
    calls = [0]

    def aug(x, generator):
        calls[0] += 1
        return torch.nn.functional.interpolate(x, size=8 + calls[0] % 2)
    return aug


@pytest.mark.parametrize("augment, error, match", [
    (lambda x, g: (x * 255).to(torch.uint8), TypeError, "floating-point images"),
    (lambda x, g: x > 0.5, TypeError, "floating-point images"),
    (lambda x, g: x * float("nan"), ValueError, "augment returned NaN"),
    (lambda x, g: x.double() * 1e300, ValueError, "augment returned NaN or infinite"),
    (_views_of_alternating_sizes, ValueError, "views of different sizes"),
    (lambda x, g: x[..., :1, :1], ValueError, "augment returned views of size 1x1, too small"),
    (lambda x, g: x.numpy(), TypeError, "must return a torch.Tensor"),
    (lambda x, g: x[:1], ValueError, r"shape \(N, C, h, w\)"),
    (lambda: None, TypeError, "augment must be callable as augment"),
])
def test_wrong_augment_outputs_are_named(augment, error, match):
    """Regression for the first six: uint8/bool views trained silently on another scale,
    NaN views were reported as a divergence of the images, and views of two sizes or
    too small failed inside torch."""
    if augment is _views_of_alternating_sizes:
        augment = augment()
    with pytest.raises(error, match=match):
        CLAPPEncoder(**{**SMALL, "augment": augment}).fit(IMAGES)


def test_clapp2021_views_must_keep_the_image_size():
    """Regression: the patch grid is fixed by the image size; smaller views failed in a
    reshape."""
    params = dict(SMALL, variant="clapp2021", patch_size=2, patch_stride=1,
                  architecture=[(3,), (4,)])
    CLAPPEncoder(**params, augment=lambda x, g: x + 0).fit(IMAGES)
    with pytest.raises(ValueError, match="clapp2021' needs views of the input size 8x8"):
        CLAPPEncoder(**params, augment=lambda x, g: x[..., :7, :7]).fit(IMAGES)


def test_smaller_views_that_fit_the_architecture_are_accepted():
    """Views of another size are allowed when every block's map still covers its grid
    (random crops that are not resized back)."""
    enc = CLAPPEncoder(**{**SMALL, "augment": lambda x, g: x[..., 1:7, 1:7]}).fit(IMAGES)
    assert enc.transform(IMAGES).shape == (6, 3 * 4 + 4 * 4)


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_save_and_load_with_a_default_augment_instance(kind, tmp_path):
    """Regression: a DefaultAugment(...) instance (a documented value) made save raise
    "cannot save a parameter['augment'] of type DefaultAugment"."""
    cls = ENCODERS[kind]
    aug = DefaultAugment(scale=(0.5, 1.0), flip=0.0)
    enc = cls(**{**SMALL, "augment": aug}).fit(IMAGES)
    path = os.fspath(tmp_path / "enc.pt")
    enc.save(path)
    assert enc.augment is aug
    loaded = cls.load(path)
    assert type(loaded.augment) is DefaultAugment and vars(loaded.augment) == vars(aug)
    np.testing.assert_array_equal(loaded.transform(IMAGES), enc.transform(IMAGES))
    # refitting the loaded encoder repeats the fit
    _assert_same(_outputs(loaded.fit(IMAGES)), _outputs(cls(**{**SMALL, "augment": aug})
                                                        .fit(IMAGES)))


def test_a_default_augment_with_an_extra_attribute_saves_its_settings(tmp_path):
    # the file held every attribute (vars), and load rebuilt DefaultAugment(**them): an
    # attribute the user set on the instance made the saved file unloadable
    aug = DefaultAugment(flip=0.0)
    aug.note = "mine"
    enc = CLAPPEncoder(**{**SMALL, "augment": aug}).fit(IMAGES)
    path = os.fspath(tmp_path / "enc.pt")
    enc.save(path)
    loaded = CLAPPEncoder.load(path)
    assert type(loaded.augment) is DefaultAugment and loaded.augment.flip == 0.0
    assert not hasattr(loaded.augment, "note")
    np.testing.assert_array_equal(loaded.transform(IMAGES), enc.transform(IMAGES))


def test_a_default_augment_instance_fits_as_the_string_default():
    # the library's own augment draws from the generator only: used as is (no copy of
    # the batch, no forked global RNG), it trains exactly as augment="default"
    _assert_same(_outputs(CLAPPEncoder(**{**SMALL, "augment": DefaultAugment()}).fit(IMAGES)),
                 _outputs(CLAPPEncoder(**{**SMALL, "augment": "default"}).fit(IMAGES)))


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_save_and_load_with_a_custom_augment(kind, tmp_path):
    """Regression: save raised for any callable augment. The file now holds a marker:
    transform works without the callable, refitting asks for it."""
    cls = ENCODERS[kind]
    enc = cls(**{**SMALL, "augment": scale_from_generator}).fit(IMAGES)
    path = os.fspath(tmp_path / "enc.pt")
    enc.save(path)
    assert enc.augment is scale_from_generator
    loaded = cls.load(path)
    np.testing.assert_array_equal(loaded.transform(IMAGES), enc.transform(IMAGES))
    with pytest.raises(ValueError, match="saved with a custom augment"):
        loaded.fit(IMAGES)
    if kind == "clapp":
        with pytest.raises(ValueError, match="saved with a custom augment"):
            update_similarity(loaded, IMAGES, n_batches=1, random_state=0)
    again = cls.load(path, augment=scale_from_generator)
    _assert_same(_outputs(again.fit(IMAGES)), _outputs(enc.fit(IMAGES)))
    with pytest.raises(TypeError, match="augment must be a callable"):
        cls.load(path, augment="default")
    enc.set_params(augment="light").fit(IMAGES).save(path)
    with pytest.raises(ValueError, match="do not pass augment="):
        cls.load(path, augment=scale_from_generator)


def test_pickle_with_a_module_level_augment_and_the_lambda_limit():
    enc = CLAPPEncoder(**{**SMALL, "augment": scale_from_generator}).fit(IMAGES)
    back = pickle.loads(pickle.dumps(enc))
    assert back.augment is scale_from_generator
    np.testing.assert_array_equal(back.transform(IMAGES), enc.transform(IMAGES))
    _assert_same(_outputs(back.fit(IMAGES)), _outputs(enc.fit(IMAGES)))
    # documented limit: pickle cannot hold a lambda or a local function (save can)
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        pickle.dumps(CLAPPEncoder(**{**SMALL, "augment": lambda x, g: x}).fit(IMAGES))


def test_numpy_integer_architectures_equal_plain_ones():
    """Regression: channel counts from numpy (np.int64) were refused as not ints."""
    arch = [(np.int64(3),), [np.int32(4), "M"]]
    np.testing.assert_array_equal(
        CLAPPEncoder(**{**SMALL, "architecture": arch}).fit(IMAGES).transform(IMAGES),
        CLAPPEncoder(**SMALL).fit(IMAGES).transform(IMAGES))
    assert arch == [(np.int64(3),), [np.int32(4), "M"]]  # the user's list is not changed


@pytest.mark.parametrize("arch, match", [
    ([(3.0,)], "positive ints"), ([(3, "m")], "positive ints"), ([(np.bool_(True),)],
                                                                 "positive ints"),
    ([("M",)], "at least one convolution"), ([None], "list of blocks"), ([], "non-empty"),
])
def test_bad_architectures_are_named(arch, match):
    with pytest.raises(ValueError, match=match):
        CLAPPEncoder(**{**SMALL, "architecture": arch}).fit(IMAGES)


def test_an_augment_class_is_named():
    """Regression: augment=DefaultAugment (the class) was called as DefaultAugment(x,
    generator), failing with the constructor's own argument error."""
    with pytest.raises(TypeError, match="got the class DefaultAugment; pass an instance"):
        CLAPPEncoder(**{**SMALL, "augment": DefaultAugment}).fit(IMAGES)


def test_an_augment_may_use_autograd_inside_no_grad():
    """Documented: the augment runs under torch.no_grad(); one that needs a gradient
    enables it itself. d/dx sum(x^2) = 2x, so this augment returns 1.02 x."""
    def with_grad(x, generator):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad((x ** 2).sum(), x)
        return x.detach() + 0.01 * grad

    _assert_same(_outputs(CLAPPEncoder(**{**SMALL, "augment": with_grad}).fit(IMAGES)),
                 _outputs(CLAPPEncoder(**{**SMALL, "augment": lambda x, g: x + 0.01 * (2 * x)})
                          .fit(IMAGES)))


class NormDropAugment(torch.nn.Module):
    """An augment module with a BatchNorm and a Dropout, used in train mode."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(1)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x, generator=None):
        return self.drop(self.norm(x))

    def views(self, x, generator=None):
        return self(x, generator)


@pytest.mark.parametrize("bound", [False, True])
def test_an_augment_module_in_train_mode_is_left_as_given(bound):
    """Regression: a BatchNorm in an augment module accumulated running statistics into
    the user's module at every call (the docs promised it is never modified); its
    dropout, drawing from the global RNG, now follows random_state."""
    aug = NormDropAugment().train()
    state = {k: v.clone() for k, v in aug.state_dict().items()}
    fn = aug.views if bound else aug
    first = _outputs(CLAPPEncoder(**{**SMALL, "augment": fn}).fit(IMAGES))
    assert aug.training and aug.norm.training and aug.drop.training
    for k, v in aug.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    _assert_same(first, _outputs(CLAPPEncoder(**{**SMALL, "augment": fn}).fit(IMAGES)))


class BufferedScale:
    """An augment that writes every result into one buffer it keeps and returns it."""

    def __init__(self):
        self.buffer = None

    def __call__(self, x, generator=None):
        if self.buffer is None or self.buffer.shape != x.shape:
            self.buffer = torch.empty_like(x)
        return torch.mul(x, 0.5 + torch.rand(x.shape[0], 1, 1, 1, generator=generator),
                         out=self.buffer)


def test_an_augment_reusing_its_output_buffer_gives_two_views():
    """Regression: the second call overwrote the first view (one buffer), so both views
    of every pair were the second one."""
    _assert_same(_outputs(CLAPPEncoder(**{**SMALL, "augment": scale_from_generator})
                          .fit(IMAGES)),
                 _outputs(CLAPPEncoder(**{**SMALL, "augment": BufferedScale()}).fit(IMAGES)))


@pytest.mark.parametrize("analysis", [
    lambda enc: update_similarity(enc, IMAGES, n_batches=1, random_state=0),
    lambda enc: training_step_activation_bytes(enc, IMAGES),
], ids=["update_similarity", "training_step_activation_bytes"])
def test_analysis_of_a_fitted_encoder_checks_an_augment_set_after_fit(analysis):
    # these run a fitted encoder's training step without fit's parameter checks: an
    # augment set afterwards that is not a callable failed with "'int' object is not
    # callable" from inside the step
    enc = CLAPPEncoder(**SMALL).fit(IMAGES)
    enc.set_params(augment=5)
    with pytest.raises(ValueError, match="augment must be 'default', 'light', None"):
        analysis(enc)
