"""Finite-width simulations of random transformers (docs/theory.md §1) and their agreement
with the mean-field theory: one simulator for every block (a preset ``NAME:key=value,...``,
a ``(name, keywords)`` pair or a :mod:`phasefield.layers` block; the paper's is ``"paper:..."``).

    stack    random stacks of the block's own Flax network; the token inputs
    measure  every measurement of a block: the fixed-point protocol (per-layer q, p, rho;
             norm/cosine samples; group cosines; lambda_a and lambda_g_collapse at the
             collapsed fixed point q*) and the finite-depth protocol (angle_rate,
             lambda_g_input, lambda_g_collapse, lambda_a, rho_L, q_L from (q0, rho0))
    sweep    the same over grids of a preset's numbers (netCDF: the theory sweep's format,
             :func:`~.sweep.fixed_point_grid`, or the block sweep's, :func:`~.sweep.rates_grid`)
    positions per-position measurements of causal stacks (:func:`causal_positions`: the
             network's ``causal_rates``: q_L_pos, rho_L_pos, angle_rate_last, lambda_g_last)
    compare  the theory's values at a point, z-scores, and theory-vs-simulation tables
"""

from .measure import (  # noqa: F401
    angle_exponent,
    fixed_point_exponents,
    gradient_exponent,
    group_cosines,
    rates,
    token_geometry,
    transients,
)
from .positions import causal_positions  # noqa: F401
