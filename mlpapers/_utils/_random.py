"""Seeding without touching global RNG state."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.utils import check_random_state as _sklearn_check_random_state

from mlpapers._utils._typing import RandomStateLike

_SEED_HIGH = 2**63 - 1


def _check_seed_type(random_state, name: str = "random_state", *,
                     torch_generator: bool = False) -> None:
    """``random_state`` must be None, an int (not a bool), a RandomState or a Generator
    (``name``: what the error calls it; ``torch_generator``: a caller that also takes a
    ``torch.Generator``, which it has handled, and which the error then names)."""
    if random_state is None or isinstance(random_state, (np.random.RandomState,
                                                         np.random.Generator)):
        return
    if isinstance(random_state, bool | np.bool_) or not isinstance(random_state,
                                                                   numbers.Integral):
        kinds = ("an int, a numpy RandomState, a numpy Generator or a torch.Generator"
                 if torch_generator else "an int, a numpy RandomState or a numpy Generator")
        raise TypeError(f"{name} must be None, {kinds}, got {random_state!r} of type "
                        f"{type(random_state).__name__}.")


def check_seed(random_state: RandomStateLike) -> None:
    """Refuse a ``random_state`` that :func:`make_generators` would refuse, without
    drawing from it (for estimators that draw no random numbers but take the
    parameter, so that a bad value fails as it would elsewhere)."""
    _check_seed_type(random_state)
    if isinstance(random_state, numbers.Integral) and random_state < 0:
        raise ValueError(f"random_state must be a non-negative integer, got {random_state}.")


def check_random_state(random_state: RandomStateLike,
                       name: str = "random_state") -> np.random.RandomState:
    """A ``numpy.random.RandomState`` from ``random_state`` (for the dataset generators).

    Parameters
    ----------
    random_state : None, int, numpy.random.RandomState or numpy.random.Generator
        ``None`` returns numpy's global ``RandomState`` (as
        :func:`sklearn.utils.check_random_state` does: ``np.random.seed`` makes
        such calls reproducible, and they advance the global stream); an int in
        ``[0, 2**32)`` seeds a new
        ``RandomState`` (the same stream as :func:`sklearn.utils.check_random_state`);
        a ``RandomState`` is used as is; a ``Generator`` seeds a new
        ``RandomState`` from one draw (so a seeded ``Generator`` gives
        reproducible data and advances by one draw per call).
    name : str, default="random_state"
        What the errors call the argument.

    Raises
    ------
    TypeError
        For any other type (including ``bool`` and ``float``).
    ValueError
        For an int outside ``[0, 2**32)``.
    """
    _check_seed_type(random_state, name)
    if isinstance(random_state, np.random.Generator):
        return np.random.RandomState(int(random_state.integers(0, 2**32, dtype=np.uint64)))
    if isinstance(random_state, numbers.Integral) and not 0 <= int(random_state) < 2**32:
        raise ValueError(f"{name} must be in [0, 2**32) when an int, got {random_state}.")
    return _sklearn_check_random_state(random_state)


def make_generators(
    random_state: RandomStateLike,
    device: str | torch.device | None = None,
) -> tuple[torch.Generator, np.random.Generator]:
    """Return a seeded ``torch.Generator`` and numpy ``Generator`` from ``random_state``.

    The pair is derived deterministically from ``random_state`` so that a fit with
    the same ``random_state`` is reproducible, while the global torch and numpy
    RNGs are never seeded or advanced, except that ``None`` draws one seed from
    numpy's global ``RandomState`` (scikit-learn's convention for ``None``, so that
    ``np.random.seed`` makes ``random_state=None`` fits reproducible).

    Parameters
    ----------
    random_state : None, int, numpy.random.RandomState or numpy.random.Generator
        As in scikit-learn: ``None`` for a seed drawn from numpy's global
        ``RandomState``, an int (any size >= 0) for a reproducible
        stream, or an existing generator (which is advanced by one draw).
    device : str or torch.device, optional
        The device of the torch generator (default CPU).

    Returns
    -------
    torch_gen : torch.Generator
    numpy_gen : numpy.random.Generator
    """
    check_seed(random_state)
    if isinstance(random_state, np.random.Generator):
        seed = int(random_state.integers(0, _SEED_HIGH))
    elif random_state is None or isinstance(random_state, np.random.RandomState):
        seed = int(_sklearn_check_random_state(random_state).randint(0, 2**31 - 1))
    else:
        seed = int(random_state)
    # SeedSequence decorrelates the two streams even for small consecutive seeds.
    torch_seed, numpy_seed = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    gen = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    gen.manual_seed(int(torch_seed) & _SEED_HIGH)
    return gen, np.random.default_rng(int(numpy_seed))


def check_generator(random_state, device=None) -> torch.Generator:
    """Return only the torch generator of :func:`make_generators`, or
    ``random_state`` itself when it is a ``torch.Generator`` (which the error names)."""
    if isinstance(random_state, torch.Generator):
        return random_state
    _check_seed_type(random_state, torch_generator=True)
    return make_generators(random_state, device)[0]
