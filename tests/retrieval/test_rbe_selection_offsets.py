"""Farthest-point and k-means support selection on relevance with large offsets.

Regression: both computed squared distances as |x|^2 - 2 x.y + |y|^2, which cancels for
items far from the origin: a relevance offset by 1e6 changed the farthest-point picks
from the 14th on, and per-query offsets of 1e7 made k-means return members farther
from their centroid than others of the same cluster.
"""

import numpy as np
import pytest

from mlpapers.retrieval.rbe import select_support


def _farthest_reference(X, k):
    """Farthest-point traversal from the item farthest from the mean, in numpy."""
    picks = [int(np.argmax(np.linalg.norm(X - X.mean(0), axis=1)))]
    dmin = np.linalg.norm(X - X[picks[0]], axis=1)
    dmin[picks[0]] = -1.0
    for _ in range(k - 1):
        j = int(np.argmax(dmin))
        picks.append(j)
        dmin = np.minimum(dmin, np.linalg.norm(X - X[j], axis=1))
        dmin[j] = -1.0
    return np.array(picks)


@pytest.mark.parametrize("offset", ["common", "per_query"])
def test_farthest_picks_do_not_depend_on_offsets(offset):
    rng = np.random.default_rng(2)
    R = rng.standard_normal((300, 1000))
    shift = 1e6 if offset == "common" else 1e8 * rng.standard_normal((300, 1))
    ref = _farthest_reference(R.T, 30)
    np.testing.assert_array_equal(select_support(R, 30, "farthest", center=False), ref)
    np.testing.assert_array_equal(select_support(R + shift, 30, "farthest", center=False), ref)


def test_kmeans_picks_do_not_depend_on_per_query_offsets():
    # k-means clusters the centred item vectors (the offsets cancel there); the member
    # nearest each centroid must be too (with the cancellation, two clusters took
    # members farther from their centroid than the plain data's picks)
    rng = np.random.default_rng(0)
    R = rng.standard_normal((30, 200))
    shifted = R + 1e7 * rng.standard_normal(30)[:, None]
    plain = select_support(R, 8, "kmeans", random_state=0)
    np.testing.assert_array_equal(select_support(shifted, 8, "kmeans", random_state=0), plain)


@pytest.mark.parametrize("scale", [2.0**-530, 1e-200, 1e-100, 1e100, 1e160, 2.0**600])
def test_cur_query_weights_do_not_depend_on_the_scale(scale):
    # the Gram matrix of C underflowed near 1e-160 (NaN weights, no error) and overflowed
    # near 1e160 (torch's eigh failed to converge)
    import torch

    from mlpapers.retrieval.rbe import cur_query_weights

    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 8, generator=g, dtype=torch.float64)
    s = torch.randn(3, generator=g, dtype=torch.float64) @ A
    I = torch.tensor([0, 2, 5, 7])
    C, u = A[:, I].T[None], s[I][None]
    w = cur_query_weights(C, u)
    torch.testing.assert_close(w @ A, s[None])
    torch.testing.assert_close(cur_query_weights(C * scale, u * scale), w, rtol=1e-9, atol=0)
    torch.testing.assert_close(cur_query_weights(C * scale, u), w / scale, rtol=1e-9, atol=0)
    if 2.0**-500 < scale < 2.0**500:  # the ridge in C's units squared, representable
        torch.testing.assert_close(
            cur_query_weights(C * scale, u * scale, ridge=0.5 * scale * scale,
                              gram=(C @ C.mT) * scale * scale),
            cur_query_weights(C, u, ridge=0.5), rtol=1e-9, atol=0)


def test_cur_query_weights_keep_a_ridge_their_units_can_hold():
    # the ridge in the units of a tiny C (2**-61) overflowed float32 to inf and every
    # weight was 0; a smaller unit change keeps it in range
    import torch

    from mlpapers.retrieval.rbe import cur_query_weights

    g = torch.Generator().manual_seed(0)
    C = torch.randn(1, 4, 6, generator=g)
    C = C / C.abs().max() * 5e-19
    u = torch.randn(1, 4, generator=g)
    C64, u64 = C.double()[0], u.double()[0]
    ref = C64.T @ torch.linalg.solve(C64 @ C64.T + 100 * torch.eye(4, dtype=torch.float64), u64)
    w32 = cur_query_weights(C, u, ridge=100)
    assert bool((w32 != 0).all())
    torch.testing.assert_close(w32[0].double(), ref, rtol=1e-4, atol=0)  # (float32)
    torch.testing.assert_close(cur_query_weights(C.double(), u.double(), ridge=100)[0], ref,
                               rtol=1e-9, atol=0)
