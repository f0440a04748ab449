"""CLoVE: clustered federated learning by clustering loss vector embeddings.

Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, ICML 2026, arXiv:2506.22427.
Also provides the IFCA and FedAvg baselines with the same interface, and the
pure assignment step :func:`clove_assign`.
"""

from mlpapers.federated.clove._estimator import IFCA, CLoVE, FedAvg
from mlpapers.federated.clove._kernels import choose_n_clusters, clove_assign, ifca_assign

__all__ = ["CLoVE", "FedAvg", "IFCA", "choose_n_clusters", "clove_assign", "ifca_assign"]
