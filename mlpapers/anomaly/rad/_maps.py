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
from fractions import Fraction

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


def _tap_range(sigma: float, kernel_size: int | None) -> tuple[int, int]:
    """Offsets ``(lo, hi)`` of the first and last taps of :func:`_gaussian_taps`
    (``lo = -(kernel_size // 2)``), computed exactly for any finite ``sigma``."""
    if kernel_size is None:
        kernel_size = 2 * math.ceil(2 * Fraction(float(sigma))) + 1
    half = int(kernel_size) // 2
    return -half, int(kernel_size) - 1 - half


# a tap further than this many standard deviations from the centre is exactly zero in
# float64 (exp(-0.5 * 40**2) underflows)
_ZERO_TAIL = 40
# sums of Gaussian taps: term by term up to this many terms (or up to _EM_TERMS terms
# per residue class), else by the Euler-Maclaurin formula
_DIRECT_TERMS = 2**20
_EM_TERMS = 4096


def _gaussian_class_sums(sigma: float, lo: int, hi: int, period: int,
                         method: str | None = None) -> torch.Tensor:
    """``S[c] / sigma`` with ``S[c]`` the sum of the unnormalised taps
    ``exp(-d**2 / (2 sigma**2))`` over the offsets ``lo <= d <= hi`` with
    ``d = c (mod period)``, for ``c`` in ``[0, period)``.

    Blurring a map of ``n`` pixels with a kernel wider than the map only needs these
    sums (``period=1``: the normalisation of zero padding; ``period=2 (n - 1)``: the
    taps folded by reflect padding), and the sums do not need one term per tap:
    ``method="direct"`` adds the terms (in blocks of :data:`_DIRECT_TERMS`),
    ``"euler-maclaurin"`` sums each class (equally spaced samples of a Gaussian, at
    least :data:`_EM_TERMS` of them) by the integral plus endpoint corrections up to
    the fifth derivative (relative error of order ``(period / sigma)**6``, below float64
    rounding there), so a ``sigma`` of ``1e9`` costs no more than one of ``1e3``.
    ``None`` picks the direct sum when there are at most :data:`_DIRECT_TERMS` terms or
    at most :data:`_EM_TERMS` per class.

    Returns
    -------
    Tensor of shape (period,), float64
    """
    reach = math.ceil(_ZERO_TAIL * Fraction(float(sigma)))  # further taps are 0.0
    lo, hi = max(lo, -reach), min(hi, reach)
    if method is None:
        method = ("direct" if hi - lo + 1 <= max(_DIRECT_TERMS, _EM_TERMS * period)
                  else "euler-maclaurin")
    if method == "direct":
        out = torch.zeros(period, dtype=torch.float64)
        step = period * max(1, _DIRECT_TERMS // period)
        for start in range(lo, hi + 1, step):
            d = torch.arange(start, min(start + step, hi + 1))
            out.index_add_(0, torch.remainder(d, period),
                           torch.exp(-0.5 * (d.to(torch.float64) / sigma) ** 2))
        return out / sigma
    # the offsets of class c are u0, u0 + h, ..., u1 in units of sigma
    c = torch.arange(period)
    u0 = (float(Fraction(lo) / Fraction(float(sigma)))
          + torch.remainder(c - lo % period, period).to(torch.float64) / sigma)
    u1 = (float(Fraction(hi) / Fraction(float(sigma)))
          - torch.remainder(hi % period - c, period).to(torch.float64) / sigma)
    h = period / sigma

    def phi(u, degree):  # the derivative of exp(-u**2 / 2) of this degree (-He_n(u) phi)
        poly = {0: torch.ones_like(u), 1: -u, 3: -(u**3 - 3 * u),
                5: -(u**5 - 10 * u**3 + 15 * u)}[degree]
        return poly * torch.exp(-0.5 * u**2)

    def diff(degree):
        return phi(u1, degree) - phi(u0, degree)

    integral = math.sqrt(math.pi / 2) * (torch.special.erf(u1 / math.sqrt(2))
                                         - torch.special.erf(u0 / math.sqrt(2)))
    # h * S[c] by Euler-Maclaurin (Bernoulli numbers 1/6, -1/30, 1/42)
    hs = (integral + h / 2 * (phi(u0, 0) + phi(u1, 0)) + h**2 / 12 * diff(1)
          - h**4 / 720 * diff(3) + h**6 / 30240 * diff(5))
    return hs / period


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

    Notes
    -----
    Along an axis the kernel is wider than (``kernel_size // 2 > n - 1``), the blur
    is an ``(n, n)`` matrix product instead (the taps that reach
    the map, folded by the padding), so a huge ``sigma`` costs no more than one as wide
    as the map; the result is the wide kernel's, up to float rounding.
    """
    if sigma <= 0:
        return maps
    half = -_tap_range(sigma, kernel_size)[0]
    taps = None
    out = maps
    for dim in (-1, -2):  # rows, then columns
        n = out.shape[dim]
        if half <= n - 1:
            if taps is None:
                taps = _gaussian_taps(sigma, kernel_size).tolist()
            out = _blur_slices(out, dim, taps, padding)
        else:
            # the kernel reaches past the map: its taps beyond the map are folded into
            # an (n, n) matrix (what the slices would compute, without the wide kernel)
            G = _blur_matrix(n, sigma, padding, kernel_size).to(out)
            out = out @ G.T if dim == -1 else G @ out
    return out


def _blur_slices(x: torch.Tensor, dim: int, g: list[float], padding: str) -> torch.Tensor:
    """1-D blur of ``x`` along ``dim`` with the taps ``g``, as weighted sums of shifted
    slices of the padded ``x`` (much faster on CPU than a single-channel conv2d, the
    same result up to float rounding)."""
    n, half = x.shape[dim], len(g) // 2
    if padding == "reflect":
        x = x.index_select(dim, _reflected(torch.arange(-half, n + half, device=x.device), n))
    else:
        x = F.pad(x, (half, half) if dim == -1 else (0, 0, half, half))
    y = x.narrow(dim, 0, n) * g[0]
    for i in range(1, len(g)):
        y.add_(x.narrow(dim, i, n), alpha=g[i])
    return y


def top_ratio_pool(maps: torch.Tensor, ratio: float) -> torch.Tensor:
    """Mean of the top ``ratio`` fraction of each map's pixels (at least one pixel).

    Parameters
    ----------
    maps : Tensor of shape (B, H, W) or (B, P)
    ratio : float in [0, 1]
        The mean is over the ``max(1, floor(ratio * H * W))`` largest pixels (the
        product taken to within float rounding: 0.29 of 100 pixels is 29); ``0`` is
        the plain maximum.

    Returns
    -------
    Tensor of shape (B,)
    """
    flat = maps.reshape(maps.shape[0], -1)
    n = _top_count(flat.shape[1], ratio)
    return _top_values(flat, n).mean(dim=1)


def _top_count(n_pixels: int, ratio: float) -> int:
    """``max(1, floor(ratio * n_pixels))``, the number of pixels :func:`top_ratio_pool`
    averages, with the product read to within float rounding: a product that falls
    short of an integer by rounding only (``0.29 * 100 = 28.999999999999996``) counts
    as that integer (29 pixels, not 28)."""
    product = float(ratio) * n_pixels
    return min(n_pixels, max(1, math.floor(product * (1 + 1e-12))))


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


def _blur_matrix(n: int, sigma: float, padding: str,
                 kernel_size: int | None = None) -> torch.Tensor:
    """(n, n) float64 matrix of the 1-D blur of :func:`gaussian_blur` along one axis.

    A kernel wider than the map (``kernel_size // 2 > n - 1``) is never built: with zero
    padding only its taps within ``n - 1`` of the centre reach the map (normalised by
    the sum of all taps), and reflect padding folds the taps onto ``2 (n - 1)`` residues
    (the padding is periodic), summed by :func:`_gaussian_class_sums`. The matrix is
    the one the whole kernel would give, up to float rounding, at a cost that does not
    grow with ``sigma``.
    """
    if sigma <= 0:
        return torch.eye(n, dtype=torch.float64)
    lo, hi = _tap_range(sigma, kernel_size)
    r = torch.arange(n)
    if -lo > n - 1:
        if padding != "reflect":
            d = r[None, :] - r[:, None]  # G[r, u] is the tap at offset u - r
            taps = torch.exp(-0.5 * (d.to(torch.float64) / sigma) ** 2)
            taps = taps / _gaussian_class_sums(sigma, lo, hi, 1) / sigma
            return torch.where((d >= max(lo, -n)) & (d <= min(hi, n)), taps, 0.0)
        if n == 1:  # every tap lands on the one pixel
            return torch.ones(1, 1, dtype=torch.float64)
        period = 2 * (n - 1)
        folded = _gaussian_class_sums(sigma, lo, hi, period)
        folded = folded / folded.sum()
        u = _reflected(r[:, None] + torch.arange(period)[None, :], n)
        G = torch.zeros(n, n, dtype=torch.float64)
        G.index_put_((r[:, None].expand_as(u), u), folded.expand_as(u), accumulate=True)
        return G
    g = _gaussian_taps(sigma, kernel_size)
    half = len(g) // 2
    # padded position r + i holds source u = r + i - half: reflected for "reflect",
    # zero outside the axis otherwise
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
