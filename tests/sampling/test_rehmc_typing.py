"""Regressions found by the static typing audit (mypy on the public annotations)."""

import numpy as np
import pytest
import torch

from mlpapers.sampling import ess, rhat


@pytest.mark.parametrize("make", [
    lambda x: x.clone().requires_grad_(),  # draws kept in an autograd graph
    lambda x: x.to(torch.bfloat16),         # numpy has no bfloat16
    lambda x: x.to(torch.float16),
], ids=["requires_grad", "bfloat16", "float16"])
def test_ess_and_rhat_take_the_tensors_their_signature_accepts(make):
    # ess / rhat take ArrayLike (numpy array-likes or tensors, e.g. the samples_tensor of
    # sample(return_tensor=True)); np.asarray raised on these tensors (and on CUDA ones)
    draws = make(torch.from_numpy(np.random.default_rng(0).standard_normal((2, 60, 3))))
    values = draws.detach()
    values = (values if values.dtype == torch.float64 else values.float()).numpy()
    np.testing.assert_array_equal(ess(draws), ess(values))
    np.testing.assert_array_equal(ess(draws, kind="tail"), ess(values, kind="tail"))
    np.testing.assert_array_equal(rhat(draws), rhat(values))


def test_width_of_a_set_whose_interior_point_is_a_row():
    # a user subclass may return its interior point as a (1, d) row; the width's chords
    # are then still taken along the set's d axes (a typing refactor once read d from the
    # row's first axis: width 1.71 instead of 2 for the unit ball in 3-D)
    from mlpapers.sampling.rehmc import ConvexSet

    def unit_ball(x):
        return (x**2).sum(-1) - 1

    for point in ([[0.0, 0.0, 0.0]], [[0.5, 0.0, 0.0]]):  # centred, and moved by centring
        class RowInterior(ConvexSet):
            def interior_point(self, point=point):
                return np.array(point)

        assert RowInterior(unit_ball, dim=3).width() == pytest.approx(2.0)


def test_g_returning_arrays_without_grad_g_is_named_when_the_search_needs_normals():
    # with dim= the interior point is searched by gradient descent, which needs autograd
    # normals before the interior point is checked: the documented TypeError, not a
    # "'numpy.float64' object is not iterable" from inside the search
    from mlpapers.sampling.rehmc import ConvexSet

    def g(z):
        return ((z.detach().numpy() - 3.0) ** 2).sum(-1) - 1.0

    with pytest.raises(TypeError, match="g returned a ndarray, not a torch tensor"):
        ConvexSet(g, dim=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_polar_factor_of_a_half_precision_tensor_keeps_its_dtype(dtype):
    # the signature takes any tensor and the docstring promises its dtype back; torch's
    # SVD has no half-precision kernel ("linalg_svd_cpu" not implemented for 'BFloat16')
    from mlpapers.sampling import polar_factor

    X = torch.randn(3, 5, 2, generator=torch.Generator().manual_seed(0)).to(dtype)
    X.requires_grad_()
    Q = polar_factor(X)
    assert Q.dtype == dtype
    torch.testing.assert_close(Q, polar_factor(X.detach().float()).to(dtype))
    Q.sum().backward()  # the graph reaches the half-precision input
    assert X.grad is not None and X.grad.dtype == dtype
