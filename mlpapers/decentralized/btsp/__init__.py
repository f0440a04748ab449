"""BTSP-MSR: node assignment minimising the bottleneck delay of circulant topologies.

Reference: "Bottleneck Communication Delay Minimization for Communication-Efficient
Decentralized Learning", ICML 2026.
"""

from mlpapers.decentralized.btsp._assign import (
    BottleneckNodeAssigner,
    best_multiplier,
    multiplier_relabel,
)
from mlpapers.decentralized.btsp._bottleneck import (
    biconnected_threshold,
    bottleneck_delay,
    bottleneck_tsp,
    is_biconnected,
)
from mlpapers.decentralized.btsp._data import make_delay_matrix
from mlpapers.decentralized.btsp._dsgd import DecentralizedSGD
from mlpapers.decentralized.btsp._topology import (
    TOPOLOGIES,
    circulant_schedule,
    delays_from_graph,
    metric_closure,
    mixing_matrices,
    scale_schedule,
)

__all__ = [
    "TOPOLOGIES",
    "BottleneckNodeAssigner",
    "DecentralizedSGD",
    "best_multiplier",
    "biconnected_threshold",
    "bottleneck_delay",
    "bottleneck_tsp",
    "circulant_schedule",
    "delays_from_graph",
    "is_biconnected",
    "make_delay_matrix",
    "metric_closure",
    "mixing_matrices",
    "multiplier_relabel",
    "scale_schedule",
]
