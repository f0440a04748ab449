"""Anomaly-map post-processing shared by RAD and PatchCore.

Per-layer score grids are upsampled (bilinear, ``align_corners=False``), fused
with layer weights, Gaussian-blurred and pooled into an image score. Bilinear
resizing and the separable blur are both linear and act on rows and columns
separately, so :func:`fused_smoothed_maps` composes them per axis into one small
matrix and computes the whole chain as two batched matmuls, equal to
``gaussian_blur(sum_l w_l resize_maps(s_l))`` up to float rounding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "fused_smoothed_maps",
    "gaussian_blur",
    "resize_maps",
    "smoothing_operator",
    "top_ratio_pool",
]


def _gaussian_taps(sigma: float, kernel_size: int | None) -> torch.Tensor:
    """Normalised float64 Gaussian taps; ``kernel_size=None`` gives ``2 ceil(2 sigma) + 1``."""
    if kernel_size is None:
        kernel_size = 2 * math.ceil(2 * sigma) + 1
    t = torch.arange(kernel_size, dtype=torch.float64) - kernel_size // 2
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    return g / g.sum()


def _reflected(u: torch.Tensor, n: int) -> torch.Tensor:
    """Source index of (possibly out-of-range) positions ``u`` on an axis of length ``n``
    under reflect padding (the edge not repeated, as ``numpy.pad(mode="reflect")``),
    mirrored again as often as needed when the padding exceeds ``n - 1``."""
    if n == 1:
        return torch.zeros_like(u)
    period = 2 * (n - 1)
    u = torch.remainder(u, period)
    return torch.where(u >= n, period - u, u)


def resize_maps(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of maps (B, h, w) -> (B, *size) (``align_corners=False``)."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps[:, None], size=tuple(size), mode="bilinear",
                         align_corners=False)[:, 0]


def gaussian_blur(
    maps: torch.Tensor, sigma: float, kernel_size: int | None = None, padding: str = "zeros"
) -> torch.Tensor:
    """Separable Gaussian blur of maps (B, H, W).

    Parameters
    ----------
    maps : Tensor of shape (B, H, W)
    sigma : float
        Standard deviation in pixels; ``0`` returns ``maps`` unchanged.
    kernel_size : int or None
        Odd size; ``None`` uses ``2 * ceil(2 * sigma) + 1`` (5 for ``sigma=1``,
        the official RAD kernel).
    padding : {"zeros", "reflect"}, default="zeros"
        ``"zeros"`` matches the official code (it darkens a 2-pixel border);
        ``"reflect"`` mirrors the map about its edges (as ``numpy.pad(mode="reflect")``,
        mirrored again where the kernel is wider than the map), so a constant map
        stays constant.

    Returns
    -------
    Tensor of shape (B, H, W)
    """
    if sigma <= 0:
        return maps
    g = _gaussian_taps(sigma, kernel_size).tolist()
    kernel_size, half = len(g), len(g) // 2
    H, W = maps.shape[-2:]
    if padding == "reflect":
        dev = maps.device
        rows = _reflected(torch.arange(-half, H + half, device=dev), H)
        cols = _reflected(torch.arange(-half, W + half, device=dev), W)
        x = maps.index_select(-2, rows).index_select(-1, cols)
    else:
        x = F.pad(maps, (half, half, half, half))
    # separable weighted sums of shifted slices: much faster on CPU than a
    # single-channel conv2d, same result up to float rounding
    y = x[:, :, 0:W] * g[0]
    for i in range(1, kernel_size):
        y.add_(x[:, :, i:i + W], alpha=g[i])
    z = y[:, 0:H] * g[0]
    for i in range(1, kernel_size):
        z.add_(y[:, i:i + H], alpha=g[i])
    return z


def top_ratio_pool(maps: torch.Tensor, ratio: float) -> torch.Tensor:
    """Mean of the top ``ratio`` fraction of each map's pixels (at least one pixel).

    Parameters
    ----------
    maps : Tensor of shape (B, H, W) or (B, P)
    ratio : float in [0, 1]
        ``0`` is the plain maximum.

    Returns
    -------
    Tensor of shape (B,)
    """
    flat = maps.reshape(maps.shape[0], -1)
    n = max(1, int(flat.shape[1] * float(ratio)))
    return _top_values(flat, n).mean(dim=1)


def _top_values(flat: torch.Tensor, n: int, block: int = 8) -> torch.Tensor:
    """The ``n`` largest values of each row of ``flat`` (B, P), in no particular order.

    ``topk`` over a whole upsampled map is slow on CPU, so the rows are first cut into
    blocks of ``block`` values: each of the ``n`` largest values lies in a block whose
    maximum is among the ``n`` largest block maxima (or equals a value that does), so
    the ``n`` largest values of those blocks, and of the tail that fills no block, are
    the ``n`` largest values of the row.
    """
    n_blocks = flat.shape[1] // block
    if n_blocks < 4 * n:  # too few blocks for the prefilter to pay
        return torch.topk(flat, n, dim=1, sorted=False).values
    head = flat[:, :n_blocks * block].reshape(len(flat), n_blocks, block)
    best = head.amax(dim=2).topk(n, dim=1, sorted=False).indices
    cand = torch.gather(head, 1, best[:, :, None].expand(-1, -1, block)).reshape(len(flat), -1)
    cand = torch.cat([cand, flat[:, n_blocks * block:]], dim=1)
    return torch.topk(cand, n, dim=1, sorted=False).values


def _blur_matrix(n: int, sigma: float, padding: str) -> torch.Tensor:
    """(n, n) float64 matrix of the 1-D blur of :func:`gaussian_blur` along one axis."""
    if sigma <= 0:
        return torch.eye(n, dtype=torch.float64)
    g = _gaussian_taps(sigma, None)
    half = len(g) // 2
    # padded position r + i holds source u = r + i - half: reflected for "reflect",
    # zero outside the axis otherwise
    r = torch.arange(n)
    u = r[:, None] + torch.arange(len(g))[None, :] - half
    if padding == "reflect":
        u = _reflected(u, n)
    inside = (u >= 0) & (u < n)
    G = torch.zeros(n, n, dtype=torch.float64)
    rows = r[:, None].expand_as(u)
    G.index_put_((rows[inside], u[inside]), g.expand_as(u)[inside], accumulate=True)
    return G


def smoothing_operator(n_in: int, n_out: int, sigma: float, padding: str = "zeros"
                       ) -> torch.Tensor:
    """Per-axis matrix of bilinear resizing ``n_in -> n_out`` followed by the blur.

    Parameters
    ----------
    n_in, n_out : int
        Input and output lengths of the axis.
    sigma : float
        Blur standard deviation in output pixels (``0``: resizing only).
    padding : {"zeros", "reflect"}, default="zeros"
        As in :func:`gaussian_blur`.

    Returns
    -------
    Tensor of shape (n_out, n_in), float64
    """
    # bilinear resizing without antialiasing is separable: resize the identity
    eye = torch.eye(n_in, dtype=torch.float64)[None, None]
    up = F.interpolate(eye, size=(n_out, n_in), mode="bilinear", align_corners=False)[0, 0]
    return _blur_matrix(n_out, sigma, padding) @ up


# read-only inside fused_smoothed_maps: scoring builds the same few operators per batch
_cached_operator = functools.lru_cache(maxsize=32)(smoothing_operator)


def fused_smoothed_maps(
    maps: Sequence[torch.Tensor],
    weights: Sequence[float],
    size: tuple[int, int],
    sigma: float,
    padding: str = "zeros",
) -> torch.Tensor:
    """``gaussian_blur(sum_l w_l resize_maps(maps[l], size), sigma, padding)`` as two matmuls.

    Parameters
    ----------
    maps : sequence of Tensor of shape (B, h_l, w_l)
        Per-layer score grids (same ``B``, dtype and device).
    weights : sequence of float
        Layer weights.
    size : (H, W)
        Output size.
    sigma : float
        Blur standard deviation (``0``: no blur).
    padding : {"zeros", "reflect"}, default="zeros"

    Returns
    -------
    Tensor of shape (B, H, W)
    """
    H, W = size
    left, right = [], []
    for m, w in zip(maps, weights):
        h_l, w_l = m.shape[-2:]
        rows = _cached_operator(int(h_l), int(H), float(sigma), padding).to(m)
        cols = _cached_operator(int(w_l), int(W), float(sigma), padding).to(m)
        left.append(float(w) * (rows @ m))  # (B, H, w_l)
        right.append(cols)  # (W, w_l)
    # sum over layers of (A_h M A_w^T) = [A_h M ...] @ [A_w ...]^T
    return torch.cat(left, dim=2) @ torch.cat(right, dim=1).T
