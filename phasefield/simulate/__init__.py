"""Finite-width simulations of random transformers (docs/theory.md §1) and their agreement
with the mean-field theory.

    stack    random stacks built from the shared :class:`phasefield.block.Block`
    measure  per-layer q, p, rho; norm/cosine samples; group cosines; lambda_a; lambda_g
             (the paper block, from an :class:`phasefield.HParams`)
    blocks   any block (a preset or ``NAME:key=value,...``): the theory's quantities under
             its names (angle_rate, lambda_g_input, lambda_g_collapse, lambda_a, rho_L, q_L)
    sweep    simulated exponents on a hyperparameter grid (netCDF, theory-sweep format)
    compare  theory-vs-simulation agreement tables
"""

from . import blocks  # noqa: F401
from .measure import angle_exponent, gradient_exponent, group_cosines, token_geometry, transients  # noqa: F401


def exponents(block, **kw) -> dict:
    """Simulated exponents at one point, each with its standard error over draws.

    ``block`` an :class:`phasefield.HParams`: the paper block's ``lambda_a``, ``lambda_g``
    (:func:`phasefield.simulate.measure.exponents`, keywords ``width, seeds, eps, causal,
    mlp_hidden, dtype, seed, weights``); anything else (a spec string
    ``"pre-ln:sigma=1,alpha=0.5"``, a ``(name, keywords)`` pair or a block): the quantities
    of its theory under the same names (:func:`phasefield.simulate.blocks.exponents`,
    keywords ``width, draws, n_tokens, depth, q0, rho0, eps, weights, dtype, seed``)."""
    from .. import HParams
    from . import measure

    if isinstance(block, HParams):
        return measure.exponents(block, **kw)
    return blocks.exponents(block, **kw)
