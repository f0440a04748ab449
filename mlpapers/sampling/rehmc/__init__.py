"""Reflective Hamiltonian Monte Carlo on bounded supports (``mlpapers.sampling.rehmc``).

Billiard-flow HMC inside a convex container with exact boundary oracles, a
convex-container-plus-thinning scheme for non-convex supports, and Stiefel
manifold sampling through the polar reparameterisation.
"""

from mlpapers.sampling.rehmc._diagnostics import ess, rhat
from mlpapers.sampling.rehmc._sampler import ReflectiveHMC, SampleResult
from mlpapers.sampling.rehmc._stiefel import (
    StiefelResult,
    StiefelSampler,
    bingham_log_density,
    matrix_von_mises_fisher_log_density,
    polar_factor,
)
from mlpapers.sampling.rehmc._summary import SampleSummary
from mlpapers.sampling.rehmc._supports import (
    Ball,
    Box,
    ConvexContainer,
    ConvexSet,
    Ellipsoid,
    Polytope,
    Region,
)

__all__ = [
    "Ball",
    "Box",
    "ConvexContainer",
    "ConvexSet",
    "Ellipsoid",
    "Polytope",
    "ReflectiveHMC",
    "Region",
    "SampleResult",
    "SampleSummary",
    "StiefelResult",
    "StiefelSampler",
    "bingham_log_density",
    "ess",
    "matrix_von_mises_fisher_log_density",
    "polar_factor",
    "rhat",
]
