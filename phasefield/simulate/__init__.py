"""Finite-width simulations of random transformers (docs/theory.md §1) and their agreement
with the mean-field theory.

    stack    random stacks built from the shared :class:`phasefield.block.Block`
    measure  per-layer q, p, rho; norm/cosine samples; group cosines; lambda_a; lambda_g
    sweep    simulated exponents on a hyperparameter grid (netCDF, theory-sweep format)
    compare  theory-vs-simulation agreement tables
"""
from .measure import (angle_exponent, exponents, gradient_exponent, group_cosines,  # noqa: F401
                      token_geometry, transients)
