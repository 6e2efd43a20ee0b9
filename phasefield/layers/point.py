"""``phasefield.exponents``: everything a block answers at one point, from its spelling.

    import phasefield
    phasefield.exponents("pre-ln:sigma=0.55,alpha=0.2", n_tokens=64, depth=24)
    phasefield.exponents("paper", sigma_w=2.0, alpha_a=0.5, alpha_m=0.5)   # numbers as keywords
    phasefield.exponents(my_block)                                          # a layers block

The block is a preset name, ``NAME:key=value,...``, a JSON file's path (checked as the
command line checks them, :mod:`.spec`) or a block built from layers; keyword numbers add
to a spelled preset's. The answer is :func:`phasefield.layers.rates` under the names of
:mod:`phasefield.schema`; every block takes this one road (the paper block too). A causal
block (``"pre-ln:causal=true"``, or one built with :func:`phasefield.layers.causal.masked`)
answers per position: ``q_L_pos``, ``rho_L_pos``, ``angle_rate_last``, ``lambda_g_last``
(:func:`phasefield.layers.causal_rates`).
"""

from __future__ import annotations

from . import base, spec


def exponents(block="paper", *, n_tokens: int = 32, depth: int = 16, q0: float = 1.0, rho0: float = 0.5, **numbers):
    """:func:`phasefield.layers.rates` of ``block`` (module docstring) at (q0, rho0 q0)."""
    from . import rates

    if isinstance(block, str):
        name, kw = spec.parse(block)
        block = spec.build(name, spec.check(name, {**kw, **numbers}))
    elif numbers:
        raise ValueError("keyword numbers go with a preset's name, not with a block object")
    base.check_layer(block)
    return rates(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
