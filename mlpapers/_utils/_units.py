"""Exact changes of units by powers of two, for data far from unit scale."""

from __future__ import annotations

import math


def power_of_two_unit(amax: float, max_exponent: int) -> float:
    """The power of two at or below ``amax`` when ``amax`` lies outside
    ``[2**-max_exponent, 2**max_exponent]``, else 1.

    Dividing data whose largest magnitude is ``amax`` by it is exact in floating point
    (results scale back bit for bit) and brings squares and sums of the data back into
    range; data already near unit scale is left untouched. ``amax <= 0`` (all-zero
    data) gives 1.
    """
    if amax > 0.0 and not 2.0 ** -max_exponent <= amax <= 2.0 ** max_exponent:
        return 2.0 ** math.floor(math.log2(amax))
    return 1.0
