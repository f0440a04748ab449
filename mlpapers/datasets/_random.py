"""``random_state`` handling shared by the dataset generators."""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["check_random_state"]


def check_random_state(random_state) -> np.random.RandomState:
    """A ``numpy.random.RandomState`` from ``random_state``.

    Parameters
    ----------
    random_state : None, int, numpy.random.RandomState or numpy.random.Generator
        ``None`` uses fresh OS entropy; an int in ``[0, 2**32)`` seeds a new
        ``RandomState`` (the same stream as :func:`sklearn.utils.check_random_state`);
        a ``RandomState`` is used as is; a ``Generator`` seeds a new
        ``RandomState`` from one draw (so a seeded ``Generator`` gives
        reproducible data and advances by one draw per call).

    Raises
    ------
    TypeError
        For any other type (including ``bool`` and ``float``).
    ValueError
        For an int outside ``[0, 2**32)``.
    """
    if random_state is None or isinstance(random_state, np.random.RandomState):
        return np.random.RandomState(random_state) if random_state is None else random_state
    if isinstance(random_state, np.random.Generator):
        return np.random.RandomState(int(random_state.integers(0, 2**32, dtype=np.uint64)))
    if isinstance(random_state, bool | np.bool_) or not isinstance(random_state,
                                                                   numbers.Integral):
        raise TypeError("random_state must be None, an int, a numpy RandomState or a numpy "
                        f"Generator, got {random_state!r} of type {type(random_state).__name__}.")
    if not 0 <= int(random_state) < 2**32:
        raise ValueError(f"random_state must be in [0, 2**32) when an int, got {random_state}.")
    return np.random.RandomState(int(random_state))
