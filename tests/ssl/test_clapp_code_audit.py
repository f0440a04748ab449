"""Code-reading audit (session 19): CLAPP paths that no test reached (branch coverage)."""

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl.clapp import (
    CLAPPEncoder,
    DefaultAugment,
    clapp_layer_loss,
    three_factor_grad,
    update_similarity,
)
from mlpapers.ssl.clapp._augment import takes_generator
from mlpapers.ssl.clapp._networks import check_architecture


@pytest.fixture(scope="module")
def fitted():
    X, _ = make_shifted_digits(n_samples=16, random_state=0)
    return CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X), X


def test_default_augment_repr_rebuilds_the_same_augment():
    aug = DefaultAugment(scale=(0.3, 0.9), ratio=(0.5, 2.0), flip=0.25, jitter=(0.1, 0.2, 0.3),
                         jitter_p=0.5, gray_p=0.4, blur_p=0.6, sigma=(0.2, 1.0))
    again = eval(repr(aug), {"DefaultAugment": DefaultAugment})
    assert repr(again) == repr(aug)
    x = torch.rand(3, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(aug(x, torch.Generator().manual_seed(1)),
                       again(x, torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("kw, match", [
    (dict(scale=(float("nan"), 1.0)), "scale must be a .min, max. pair of finite numbers"),
    (dict(ratio=5), "ratio must be a .min, max. pair of finite numbers"),
    (dict(flip="often"), "flip must be a probability"),
    (dict(jitter=("a", 0.1, 0.1)), "jitter must be three strengths"),
])
def test_default_augment_names_settings_that_are_not_numbers(kw, match):
    with pytest.raises(ValueError, match=match):
        DefaultAugment(**kw)(torch.rand(2, 1, 8, 8))


@pytest.mark.parametrize("sigma", [None, (1.0,), (0.5, 1.0)])
def test_default_augment_without_blur_ignores_sigma(sigma):
    """Regression: blur_p=0 skips the check of sigma, but the blur still read it and
    failed with a Python error for None or a 1-tuple. The draws, and so the views,
    are those of a blur that never fires, whatever sigma is."""
    x = torch.rand(4, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    gen, ref_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    ref_aug = DefaultAugment(blur_p=1e-30, sigma=(0.1, 2.0))  # the full blur, never firing
    got = DefaultAugment(blur_p=0, sigma=sigma)
    for _ in range(2):  # the generators also stay in step
        assert torch.equal(got(x, gen), ref_aug(x, ref_gen))
    no_blur = got.color(got.crop_flip(x, torch.Generator().manual_seed(1)),
                        torch.Generator().manual_seed(1))
    assert torch.equal(got.blur(no_blur, None), no_blur)


@pytest.mark.parametrize("x, gen, error, match", [
    (torch.rand(2, 8, 8), None, ValueError, r"x must be a non-empty \(N, C, H, W\)"),
    (torch.rand(0, 1, 8, 8), None, ValueError, "non-empty"),
    (torch.zeros(2, 1, 8, 8, dtype=torch.uint8), None, TypeError, "x must hold float images"),
    (np.zeros((2, 1, 8, 8), np.float32), None, TypeError, "x must be a torch.Tensor"),
    (torch.rand(2, 1, 8, 8), 0, TypeError, "generator must be a torch.Generator or None"),
])
def test_default_augment_names_inputs_it_cannot_read(x, gen, error, match):
    """Regression: these failed inside torch (affine_grid's "only supports 4D and 5D
    sizes", "Expected theta to have floating point type", rand()'s argument error)."""
    aug = DefaultAugment()
    for call in (lambda: aug(x, gen), lambda: aug.crop_flip(x, gen),
                 lambda: aug.color(x, gen), lambda: aug.blur(x, gen)):
        with pytest.raises(error, match=match):
            call()


def test_takes_generator_on_var_positional_and_unreadable_signatures():
    # fn(*args) and a builtin without a signature get the documented (x, generator) call
    assert takes_generator(lambda *args: args[0])
    assert takes_generator(max)
    assert not takes_generator(lambda x: x)


@pytest.mark.parametrize("bad", ["two", np.array([1, 1, 1])])
def test_save_refuses_a_spatial_pool_set_after_fit_that_is_not_a_grid(fitted, bad, tmp_path):
    # neither resolves to grids (nor compares to the fitted ones): another network on load
    enc, _ = fitted
    enc.set_params(spatial_pool=bad)
    try:
        with pytest.raises(ValueError, match=r"fitted with other parameters.*spatial_pool="):
            enc.save(tmp_path / "enc.pt")
    finally:
        enc.set_params(spatial_pool=None)
    assert not (tmp_path / "enc.pt").exists()


def test_save_of_an_unfitted_encoder_raises_not_fitted(tmp_path):
    with pytest.raises(NotFittedError):
        CLAPPEncoder().save(tmp_path / "enc.pt")


@pytest.mark.parametrize("layers, match", [
    (1.5, "layers must be 'all', an int or a list of ints"),
    ([], "layers must not be empty"),
])
def test_transform_names_bad_layers(fitted, layers, match):
    enc, X = fitted
    with pytest.raises(ValueError, match=match):
        enc.transform(X, layers=layers)


def test_update_similarity_refuses_batches_of_one_image(fitted):
    enc, X = fitted
    with pytest.raises(ValueError, match="batches of >= 2 images, got 1"):
        update_similarity(enc, X, n_batches=1, batch_size=1, random_state=0)


def test_three_factor_grad_on_integer_inputs_and_a_bad_loss():
    # integer inputs are computed in the default floating dtype: the autograd gradient of
    # the same values in float32
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (6, 4), generator=g)
    W = torch.randint(-2, 3, (5, 4), generator=g)
    c = torch.randint(-2, 3, (6, 3), generator=g)
    B = torch.randint(-1, 2, (5, 3), generator=g)
    neg = torch.tensor([1, 2, 3, 4, 5, 0])
    Wf = W.float().requires_grad_(True)
    clapp_layer_loss(torch.relu(x.float() @ Wf.T), c.float(), B.float(), neg,
                     "softhinge").backward()
    got = three_factor_grad(x, W, c, B, neg, "softhinge")
    assert got.dtype == torch.get_default_dtype()
    torch.testing.assert_close(got, Wf.grad)
    with pytest.raises(ValueError, match="loss must be one of"):
        three_factor_grad(x, W, c, B, neg, "square")


def test_an_int_block_is_a_one_convolution_block():
    assert check_architecture([16, (32, "M")]) == [(16,), (32, "M")]
    assert check_architecture([np.int64(8)]) == [(8,)]


def test_average_gradients_counts_a_missing_gradient_as_zeros(tmp_path):
    # a parameter without .grad (no loss reached it on this rank) gets zeros, so that the
    # flat all-reduce has the same layout on every rank; one gloo process: the mean is
    # the gradient itself
    import torch.distributed as dist

    from mlpapers.ssl.clapp import _distributed as _dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not already initialised")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        a = torch.zeros(2, 3, requires_grad=True)
        b = torch.zeros(4, requires_grad=True)
        a.grad = torch.arange(6.0).reshape(2, 3)
        _dist.average_gradients([a, b], 1)
        assert torch.equal(a.grad, torch.arange(6.0).reshape(2, 3))
        assert b.grad is not None and torch.equal(b.grad, torch.zeros(4))
    finally:
        dist.destroy_process_group()


def test_lr_beyond_float32_is_refused_before_training():
    # AdamW's float32 step failed with torch's "value cannot be converted to type float
    # without overflow" after the network was built (no parameter named)
    from mlpapers.ssl.clapp import GlobalSSLEncoder

    X, _ = make_shifted_digits(n_samples=8, random_state=0)
    top = float(torch.finfo(torch.float32).max) * (1 - 0.9)  # AdamW's first step: lr / 0.1
    for cls in (CLAPPEncoder, GlobalSSLEncoder):
        for lr in (1e39, 1e38):  # 1e38 fits in float32, but lr / 0.1 does not
            with pytest.raises(ValueError, match=r"lr must be at most 3.403e\+37"):
                cls(architecture="tiny", lr=lr, n_epochs=1).fit(X)
        cls(architecture="tiny", lr=top, n_epochs=1, random_state=0).fit(X)  # no torch error
