"""Regression tests from the adversarial audit of the CLAPP public API."""

import numpy as np
import pytest
import torch

from mlpapers.ssl.clapp import exact_linear_feedback


def _net(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    Ws = [torch.randn(5, 4, generator=gen, dtype=dtype),
          torch.randn(3, 5, generator=gen, dtype=dtype)]
    return Ws, torch.randn(3, 3, generator=gen, dtype=dtype)


@pytest.mark.parametrize("mode", ["dfb", "lateral"])
def test_exact_linear_feedback_accepts_arrays_and_mixed_dtypes(mode):
    Ws, B = _net()
    ref = exact_linear_feedback(Ws, B, mode)
    # numpy matrices and float32 layers with a float64 B_top raised torch errors before
    from_numpy = exact_linear_feedback([w.numpy() for w in Ws], B.numpy(), mode)
    mixed = exact_linear_feedback([w.float() for w in Ws], B, mode)
    for a, b, r in zip(from_numpy, mixed, ref):
        torch.testing.assert_close(a, r)
        assert b.dtype == torch.float64
        torch.testing.assert_close(b, r, rtol=1e-5, atol=1e-6)


def test_exact_linear_feedback_shape_errors_name_the_argument():
    Ws, B = _net()
    with pytest.raises(ValueError, match="non-empty"):
        exact_linear_feedback([], B)
    with pytest.raises(ValueError, match="B_top"):
        exact_linear_feedback(Ws, torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        exact_linear_feedback([Ws[0], torch.randn(3, 6, dtype=torch.float64)], B)
    with pytest.raises(ValueError, match=r"weights\[0\] must be a 2D"):
        exact_linear_feedback([np.ones(3)], np.eye(3))


def test_custom_augment_output_is_checked():
    from mlpapers.ssl.clapp import CLAPPEncoder, GlobalSSLEncoder

    X = np.random.default_rng(0).random((6, 1, 8, 8)).astype(np.float32)
    for cls in (CLAPPEncoder, GlobalSSLEncoder):
        def make(aug, cls=cls):
            return cls(architecture=[(4,), (4, "M")], n_epochs=1, batch_size=3,
                       augment=aug, random_state=0)

        # a numpy result or a one-argument callable failed inside torch.cat before
        with pytest.raises(TypeError, match="augment must return a torch.Tensor"):
            make(lambda x, g: x.numpy()).fit(X)
        with pytest.raises(TypeError, match=r"augment must be callable as augment\(x, gen"):
            make(lambda: None).fit(X)   # a one-argument augment(x) is accepted
        with pytest.raises(ValueError, match="augment must return images"):
            make(lambda x, g: x[:, :, 0]).fit(X)
        # a valid callable (float64 output, smaller crops) still trains
        enc = make(lambda x, g: x[:, :, 1:7, 1:7].double()).fit(X)
        assert enc.transform(X).shape[0] == 6


def test_exact_linear_feedback_accepts_a_parameter_list():
    # a module's nn.ParameterList is an iterable of matrices, not a Sequence
    Ws, B = _net()
    got = exact_linear_feedback(torch.nn.ParameterList([torch.nn.Parameter(w) for w in Ws]), B)
    for a, r in zip(got, exact_linear_feedback(Ws, B)):
        torch.testing.assert_close(a.detach(), r)


def test_exact_linear_feedback_rejects_unordered_containers():
    Ws, B = _net()
    for bad in ({i: w for i, w in enumerate(Ws)}, set(Ws)):
        with pytest.raises(ValueError, match="sequence"):
            exact_linear_feedback(bad, B)


@pytest.mark.parametrize("shape", [(6, 16, 16, 3), (6, 16, 16, 1), (16, 16, 3)])
def test_channels_last_images_get_a_clear_error(shape):
    # (n, H, W, C) photos used to be read as C=H channels of H x C images and failed later
    # with a misleading "images of size 16x3 are too small" (or trained on garbage).
    from mlpapers.ssl import CLAPPEncoder

    X = np.random.default_rng(0).random(shape)
    with pytest.raises(ValueError, match=r"\(n, C, H, W\)"):
        CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X)


@pytest.mark.parametrize("shape", [(6, 16, 16, 3), (16, 16, 3)])
@pytest.mark.parametrize("to_torch", [False, True])
def test_layout_errors_suggest_a_transpose_of_the_callers_array_type(shape, to_torch):
    # the single-image message suggested ``X[None].permute(...)``: an AttributeError on numpy
    import re

    from mlpapers.ssl import CLAPPEncoder

    X = np.random.default_rng(0).random(shape).astype(np.float32)
    with pytest.raises(ValueError) as err:
        CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(
            torch.from_numpy(X) if to_torch else X)
    kind = "torch" if to_torch else "numpy"
    fix = re.search(rf"(X[^ ]*\.(?:transpose|permute)\(0, 3, 1, 2\)) (?:for )?\({kind}\)|"
                    rf"(X[^ ]*\.(?:transpose|permute)\(0, 3, 1, 2\)) for {kind}", str(err.value))
    assert fix is not None, str(err.value)
    expr = fix.group(1) or fix.group(2)
    got = eval(expr, {"X": torch.from_numpy(X) if to_torch else X})  # noqa: S307
    assert tuple(got.shape) == ((1,) * (len(shape) == 3) + (shape[0],) * (len(shape) == 4)
                                + (shape[-1], *shape[-3:-1]))


def test_a_type_error_inside_an_augment_is_not_blamed_on_its_signature():
    # every TypeError during the call was reported as "augment must be callable as ...",
    # also one raised by the augment's own code under the documented signature
    from mlpapers.datasets import make_shifted_digits
    from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder

    X, _ = make_shifted_digits(n_samples=8, random_state=0)

    def buggy(x, generator):
        return x + torch.rand(x.shape, generator=generator, dtype="float32")

    def three(x, a, b):
        return x

    for cls in (CLAPPEncoder, GlobalSSLEncoder):
        with pytest.raises(TypeError) as info:
            cls(architecture="tiny", n_epochs=1, augment=buggy, random_state=0).fit(X)
        assert "augment must be callable" not in str(info.value)
        assert "rand()" in str(info.value)
        with pytest.raises(TypeError, match=r"augment must be callable as augment\(x, "):
            cls(architecture="tiny", n_epochs=1, augment=three, random_state=0).fit(X)


def test_string_arrays_of_numbers_are_refused_as_scikit_learn_does():
    from mlpapers.datasets import make_shifted_digits
    from mlpapers.ssl import GlobalSSLEncoder

    X, _ = make_shifted_digits(n_samples=8, random_state=0)
    for bad in (X.astype(str), X.astype(bytes)):
        with pytest.raises(TypeError, match="X must contain numbers, got an array of dtype"):
            GlobalSSLEncoder(architecture="tiny", n_epochs=1).fit(bad)
