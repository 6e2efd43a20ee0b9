"""``phasefield.exponents``: everything a block answers at one point, from its spelling.

    import phasefield
    phasefield.exponents("pre-ln:sigma=0.55,alpha=0.2", n_tokens=64, depth=24)
    phasefield.exponents("paper", sigma_w=2.0, alpha_a=0.5, alpha_m=0.5)   # numbers as keywords
    phasefield.exponents(my_block)                                          # a layers block

The block is a preset name, ``NAME:key=value,...``, a JSON file's path (checked as the
command line checks them, :mod:`.spec`) or a block built from layers; keyword numbers add
to a spelled preset's. The answer is :func:`phasefield.layers.rates` under the names of
:mod:`phasefield.schema`; every block takes this one road (the paper block too). A causal
block (``"pre-ln:causal=true"``, ``"gpt2"``, or one built with
:func:`phasefield.layers.causal.masked`) answers per position: ``q_L_pos``, ``rho_L_pos``,
``angle_rate_last``, ``lambda_g_last`` (:func:`phasefield.layers.causal_rates`).

The input (q0, rho0) is the caller's, else the spelled preset's own
(:meth:`.registry.Preset.geometry`: GPT-2's embeddings give q0 = 8e-4, rho0 = 0), else
q0 = 1, rho0 = 0.5. A preset whose numbers follow the depth of its stack (``gpt2``,
``deepscalelm``: :attr:`.registry.Preset.stack_depth`) is built for ``depth`` blocks unless
the spelling gives its own.
"""

from __future__ import annotations

from . import base, registry, spec

Q0, RHO0 = 1.0, 0.5  # the input of a block that says nothing of its own


def geometry(name: str | None, kw: dict, q0=None, rho0=None) -> tuple[float, float]:
    """``(q0, rho0)``: each the caller's where given, else the preset ``name``'s input
    geometry at its checked keywords ``kw`` (None: no preset), else :data:`Q0`, :data:`RHO0`."""
    own = registry.lookup(name).geometry(kw) if name is not None else None
    q, rho = own if own is not None else (Q0, RHO0)
    return (q if q0 is None else q0), (rho if rho0 is None else rho0)


def with_stack_depth(name: str, kw: dict, depth: int) -> dict:
    """``kw`` with the preset's stack-depth option (:attr:`.registry.Preset.stack_depth`)
    set to ``depth`` unless given, checked (ValueError, one line)."""
    opt = registry.lookup(name).stack_depth
    if opt is None or opt in kw:
        return kw
    return spec.check(name, {**kw, opt: int(depth)})


def exponents(block="paper", *, n_tokens: int = 32, depth: int = 16, q0=None, rho0=None, **numbers):
    """:func:`phasefield.layers.rates` of ``block`` (module docstring) at (q0, rho0 q0)."""
    from . import rates

    if isinstance(block, str):
        name, kw = spec.parse(block)
        kw = with_stack_depth(name, spec.check(name, {**kw, **numbers}), depth)
        q0, rho0 = geometry(name, kw, q0, rho0)
        block = spec.build(name, kw)
    elif numbers:
        raise ValueError("keyword numbers go with a preset's name, not with a block object")
    else:
        q0, rho0 = geometry(None, {}, q0, rho0)
    base.check_layer(block)
    return rates(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
