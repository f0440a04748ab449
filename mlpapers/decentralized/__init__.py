"""Decentralized learning: communication topologies and their simulation.

* :mod:`mlpapers.decentralized.btsp` -- BTSP-MSR node assignment (ICML 2026) for
  circulant topologies, with a decentralized-SGD simulator.
"""

from mlpapers.decentralized.btsp import *  # noqa: F403
from mlpapers.decentralized.btsp import __all__ as _btsp_all

__all__ = list(_btsp_all)
