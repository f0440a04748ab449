"""CLAPP theory on a nonlinear (ReLU) network: the exact feedback still beats random B.

The paper note's pitfall: ``exact_linear_feedback`` makes the layer-local updates equal
backprop only in a deep *linear* network; with ReLUs the equivalence breaks, so a
nonlinear net is tested only for "cosine > random-B baseline". ``update_similarity``
works on a fitted conv ``CLAPPEncoder`` whose prediction heads are learned (no closed-form
feedback exists for its convs and pooling), so the comparison is built from the library's
kernels: a float64 ReLU MLP, one ``clapp_layer_loss`` per layer on detached inputs (the
local update) against the top layer's loss backpropagated through the whole net (the BP
update), on the same views and negatives, as in the paper's gradient analysis.

Measured (dims 20-16-16-8, 32 images, 10 seeds, 5 random draws per seed), mean cosine
with BP of layers 1 and 2, exact vs random feedback: dfb linear 0.55/0.70 vs 0.03/0.04,
dfb hinge 0.50/0.65 vs 0.10/0.13, lateral linear 0.38/0.55 vs 0.03/-0.02, lateral hinge
0.33/0.50 vs 0.08/0.15; over four blocks of 10 seeds the smallest mean margin was 0.25.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.ssl.clapp import clapp_layer_loss, exact_linear_feedback
from mlpapers.ssl.clapp._kernels import negative_indices, swap_views

DIMS = (20, 16, 16, 8)      # input, two hidden ReLU layers, ReLU top layer
N_IMAGES = 32
N_SEEDS = 10
N_DRAWS = 5                 # random feedback draws per seed
MARGIN = 0.15               # measured smallest mean margin: 0.25


def _relu_net(seed):
    """He-scaled float64 weights, two noisy views of each image, a random top B_L."""
    g = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(b, a, generator=g, dtype=torch.float64) * np.sqrt(2 / a)
          for a, b in zip(DIMS[:-1], DIMS[1:])]
    x = torch.randn(N_IMAGES, DIMS[0], generator=g, dtype=torch.float64)
    views = torch.cat([x + 0.3 * torch.randn(x.shape, generator=g, dtype=torch.float64)
                       for _ in range(2)])
    B_top = torch.randn(DIMS[-1], DIMS[-1], generator=g, dtype=torch.float64) / DIMS[-1]
    return Ws, views, B_top, g


def _cosines(Ws, x, B_top, Bs, mode, loss):
    """Per layer, cos(local CLAPP gradient with feedback ``Bs``, BP gradient of the top loss)."""
    Ws = [W.clone().requires_grad_(True) for W in Ws]
    neg = negative_indices(N_IMAGES)
    h = x
    for W in Ws:
        h = torch.relu(h @ W.T)
    bp = torch.autograd.grad(clapp_layer_loss(swap_views(h), h.detach(), B_top, neg, loss), Ws)
    zs, h = [], x
    for W in Ws:
        h = torch.relu(h.detach() @ W.T)
        zs.append(h)
    top = zs[-1].detach()
    total = sum(clapp_layer_loss(swap_views(z), top if mode == "dfb" else z.detach(), B, neg,
                                 loss) for z, B in zip(zs, Bs))
    local = torch.autograd.grad(total, Ws)
    return [float(F.cosine_similarity(a.reshape(-1), b.reshape(-1), dim=0))
            for a, b in zip(local, bp)]


@pytest.mark.parametrize("loss", ["linear", "hinge", "softhinge"])
@pytest.mark.parametrize("mode", ["dfb", "lateral"])
def test_exact_linear_feedback_beats_random_feedback_in_a_relu_net(mode, loss):
    """Note's pitfall: with ReLUs, B_l from exact_linear_feedback (ReLUs ignored) gives local
    updates better aligned with BP than random B_l of the same shapes and scale, by a margin,
    in every non-top layer (mean over seeds); the top layer is BP in both cases."""
    exact, rand = [], []
    for seed in range(N_SEEDS):
        Ws, x, B_top, g = _relu_net(seed)
        Bs = exact_linear_feedback(Ws, B_top, mode)
        cos = _cosines(Ws, x, B_top, Bs, mode, loss)
        assert cos[-1] > 1 - 1e-12
        exact.append(cos[:-1])
        draws = []
        for _ in range(N_DRAWS):
            # same shapes and RMS entry as the exact B_l (the hinge sees the same scale)
            Rs = [torch.randn(B.shape, generator=g, dtype=torch.float64)
                  * B.norm() / np.sqrt(B.numel()) for B in Bs[:-1]]
            cos = _cosines(Ws, x, B_top, [*Rs, B_top], mode, loss)
            assert cos[-1] > 1 - 1e-12
            draws.append(cos[:-1])
        rand.append(np.mean(draws, axis=0))
    exact_mean, rand_mean = np.mean(exact, axis=0), np.mean(rand, axis=0)
    assert (exact_mean - rand_mean > MARGIN).all(), (exact_mean, rand_mean)
    # approximate only: the ReLUs break the linear-network equivalence
    assert (exact_mean < 0.95).all(), exact_mean
