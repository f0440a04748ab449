"""Exact changes of units by powers of two, for data far from unit scale."""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import ArrayLike


def power_of_two_unit(amax: float, max_exponent: int) -> float:
    """The power of two at or below ``amax`` when ``amax`` lies outside
    ``[2**-max_exponent, 2**max_exponent]``, else 1.

    Dividing data whose largest magnitude is ``amax`` by it is exact in floating point
    (results scale back bit for bit) and brings squares and sums of the data back into
    range; data already near unit scale is left untouched. ``amax <= 0`` (all-zero
    data) gives 1.
    """
    return float(power_of_two_units(np.float64(amax), max_exponent))


def power_of_two_units(amax: ArrayLike, max_exponent: int) -> np.ndarray:
    """:func:`power_of_two_unit` elementwise over an array of magnitudes (one unit per
    column of data, say); zero, NaN and infinite magnitudes give 1. The power is read
    off the binary exponent (``frexp``), so it is never above ``amax``: ``log2`` rounds
    values just below ``2**e`` up to ``e``."""
    amax = np.asarray(amax, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        outside = np.isfinite(amax) & (amax > 0) & ~(
            (amax >= 2.0 ** -max_exponent) & (amax <= 2.0 ** max_exponent))
    exponent = np.frexp(np.where(outside, amax, 1.0))[1] - 1
    return np.where(outside, np.ldexp(1.0, exponent), 1.0)


def row_power_of_two(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Per row of ``x`` (reduced over ``dim``, kept as a size-1 axis), a power of two
    within a factor 2 of the row's largest magnitude (the smallest normal one for a
    subnormal row); 1 for zero or non-finite rows.

    Dividing a row by it is exact in floating point (ordinary rows give bit-identical
    results after scaling back) and brings the row's largest entry near 1, so its
    squares and sums neither underflow nor overflow. The scale is a constant to
    autograd. Computed as ``exp2(floor(log2(.)))``, not with ``torch.frexp``, which
    has no MPS kernel; ``log2`` may round a value just below ``2**e`` up to ``e``,
    which only moves the largest entry to just below 1. The exponent is clamped to the
    dtype's normal range, so the scale itself is never subnormal or infinite. An empty
    ``dim`` (no entries to scale) gives ones.
    """
    if x.shape[dim] == 0:
        # amax has no identity element: an empty reduction raises in torch
        shape = list(x.shape)
        shape[dim] = 1
        return torch.ones(shape, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        amax = x.detach().abs().amax(dim=dim, keepdim=True)
        ok = torch.isfinite(amax) & (amax > 0)
        top = math.frexp(torch.finfo(x.dtype).max)[1] - 1   # 2**top is representable
        e = torch.where(ok, amax, torch.ones_like(amax)).log2().floor()
        return torch.exp2(e.clamp(-top + 1, top))
