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
