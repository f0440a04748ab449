"""Federated learning: clustered / personalised federated learning simulated in one process.

* :mod:`mlpapers.federated.clove` -- CLoVE (ICML 2026) with IFCA and FedAvg baselines.
"""

from mlpapers.federated.clove import (
    IFCA,
    CLoVE,
    FedAvg,
    choose_n_clusters,
    clove_assign,
    ifca_assign,
)

__all__ = ["CLoVE", "FedAvg", "IFCA", "choose_n_clusters", "clove_assign", "ifca_assign"]
