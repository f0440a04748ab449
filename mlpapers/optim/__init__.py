"""Stochastic optimisation algorithms (``mlpapers.optim``).

Re-exports the public names of :mod:`mlpapers.optim.scent`.
"""

from mlpapers.optim.scent import *  # noqa: F403
from mlpapers.optim.scent import __all__ as _scent_all

__all__ = list(_scent_all)
