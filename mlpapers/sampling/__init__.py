"""Samplers: reflective Hamiltonian Monte Carlo on bounded supports."""

from mlpapers.sampling.rehmc import (
    Ball,
    Box,
    ConvexContainer,
    ConvexSet,
    Ellipsoid,
    Polytope,
    ReflectiveHMC,
    Region,
    SampleResult,
    StiefelResult,
    StiefelSampler,
    bingham_log_density,
    ess,
    matrix_von_mises_fisher_log_density,
    polar_factor,
    rhat,
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
    "StiefelResult",
    "StiefelSampler",
    "bingham_log_density",
    "ess",
    "matrix_von_mises_fisher_log_density",
    "polar_factor",
    "rhat",
]
