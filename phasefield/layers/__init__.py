"""Your transformer as a composition of layers, each carrying its Flax network and its
mean-field maps (forward (q, p), backward gradient Gram): :mod:`.norm`, :mod:`.attention`,
:mod:`.mlp`, :mod:`.residual`, composed by :class:`Serial`; named blocks in :mod:`.presets`.

    from phasefield import layers
    block = layers.presets.pre_ln(sigma=0.55, alpha=0.2, heads=12)
    layers.fixed_point_exponents(block, n_tokens=64, depth=24)  # fixed-point exponents (NaN: none)
    layers.finite_depth(block, n_tokens=64, depth=24)           # finite-depth rates along the trajectory
    layers.causal_rates(block, n_tokens=8, depth=24, causal=True)  # per position, causal mask (full Gram)
    layers.rates(layers.causal.masked(block))                   # a causal block: the same, per position
    block.module(weights="lazy")                                # the same block as a Flax module

Every public function here runs in float64 (JAX's scoped switch) and is jit-compiled once
per block structure and depth; the block's numbers are pytree leaves (vmap over them with
:mod:`.depth`'s functions inside ``jax.enable_x64(True)``, after :func:`prepare`).

The paper's block from an :class:`phasefield.HParams` (its block map, fixed points,
exponents, grid evaluator and full-Gram mean field, jit-compiled per static configuration)
is the package :mod:`phasefield.layers.paper`, which registers the ``paper`` preset with its
closed-form engine; the library reaches it as ``registry.lookup("paper").engine``.
The layer kinds' maps call the Gaussian-integral kernels of :mod:`phasefield.theory`, which
imports nothing from here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..theory.precision import float64
from . import (  # noqa: F401
    depth,
    paper,  # noqa: F401  (registers the paper preset, first of the built-ins)
    presets,
    sweep,
)
from .attention import Attention  # noqa: F401
from .base import Layer, Serial, check_layer  # noqa: F401
from .causal import causal_rates, causal_trajectory, is_causal  # noqa: F401
from .dyt import DyT  # noqa: F401
from .glu import GLU  # noqa: F401
from .mlp import MLP  # noqa: F401
from .norm import Norm  # noqa: F401
from .residual import Residual  # noqa: F401
from .state import Context, Grad, Kernel  # noqa: F401


@float64
def prepare(block, n_tokens=32, scales=None):
    """(block with its tables built, Context): call outside any trace. Tables are sized for
    the block's own numbers, or, with ``scales=(att_max, mlp_max)`` (e.g.
    ``sweep.block_scales(blocks)``), for every block up to those scales, so blocks prepared
    with the same scales stack into one pytree for ``jax.vmap``. A causal block has no (q, p)
    maps (ValueError): its results are per position (:func:`rates`, :func:`trajectory`)."""
    check_layer(block)
    if is_causal(block):
        raise ValueError(
            "a causal block has no (q, p) maps (the mask makes every position differ): "
            "its results are per position (layers.rates, layers.trajectory, layers.causal_rates)"
        )
    ctx = Context(jnp.asarray(n_tokens, jnp.result_type(float)))
    if scales is not None:
        from .sweep import prepare_traced

        return prepare_traced(block, Context(n_tokens), *scales), ctx
    return block.prepare(Context(n_tokens)), ctx


@functools.cache
def compiled(name):
    """The jit-compiled function ``name`` of :mod:`.depth` (``depth`` static): one per name for
    the process, compiled once per block structure and depth."""
    fn = getattr(depth, name)
    return jax.jit(fn, static_argnames=("depth",) if name != "norm_fixed_point" else ())


def _kernel(q0, rho0):
    dt = jnp.result_type(float)
    q0 = jnp.asarray(q0, dt)
    return Kernel(q0, q0 * jnp.asarray(rho0, dt))


@float64
def fixed_point_exponents(block, n_tokens=32, depth=16) -> dict:
    """:func:`.depth.fixed_point_exponents` of ``block`` (float64)."""
    block, ctx = prepare(block, n_tokens)
    return dict(compiled("fixed_point_exponents")(block, ctx, depth=int(depth)))


@float64
def q_star(block, n_tokens=32):
    """The collapsed fixed point's q* (``inf``: the norm grows with depth, no fixed point)."""
    block, ctx = prepare(block, n_tokens)
    return compiled("norm_fixed_point")(block, ctx, jnp.asarray(1.0, jnp.result_type(float)))


@float64
def trajectory(block, q0=1.0, rho0=0.5, n_tokens=32, depth=16):
    """(q, p) per layer from (q0, rho0 q0), length depth + 1; a causal block
    (:func:`.causal.is_causal`): per layer and position, the dict of
    :func:`.causal.causal_trajectory` (``q_pos``, ``rho_pos`` [depth + 1, n])."""
    if is_causal(block):
        return causal_trajectory(block, q0, rho0, n_tokens, depth)
    block, ctx = prepare(block, n_tokens)
    return compiled("trajectory")(block, ctx, _kernel(q0, rho0), depth=int(depth))


@float64
def gradient_exponent(block, q0=1.0, rho0=1.0, n_tokens=32, depth=16):
    """lambda_g(L) from (q0, rho0 q0)."""
    block, ctx = prepare(block, n_tokens)
    return compiled("gradient_exponent")(block, ctx, _kernel(q0, rho0), depth=int(depth))


@float64
def finite_depth(block, q0=1.0, rho0=0.5, n_tokens=32, depth=16) -> dict:
    """:func:`.depth.finite_depth` from (q0, rho0 q0)."""
    block, ctx = prepare(block, n_tokens)
    return dict(compiled("finite_depth")(block, ctx, _kernel(q0, rho0), depth=int(depth)))


@float64
def rates(block, q0=1.0, rho0=0.5, n_tokens=32, depth=16) -> dict:
    """Everything a block answers at one point, in one compiled program
    (:func:`.depth.rates`): :func:`finite_depth` from (q0, rho0 q0), and, where the block has
    a finite collapsed fixed point (``has_fixed_point``), the exponents ``lambda_a``,
    ``lambda_g_inf``, ``q_star``, ``rho_star`` and the attractors (``n_stable``,
    ``rho_star_min``, ``rho_star_max``) of :func:`fixed_point_exponents`; without one (the norm grows with
    depth) those are NaN (``q_star`` inf, ``n_stable`` 0) and the costly attractor search is
    skipped. A causal block (:func:`.causal.is_causal`): its per-position results,
    :func:`.causal.causal_rates` (``q_L_pos``, ``rho_L_pos``, ``angle_rate_last``,
    ``lambda_g_last``); the (q, p) numbers would ignore the mask."""
    if is_causal(block):
        return causal_rates(block, n_tokens, depth, q0, rho0)
    block, ctx = prepare(block, n_tokens)
    out = dict(compiled("rates")(block, ctx, _kernel(q0, rho0), depth=int(depth)))
    out["has_fixed_point"] = bool(out["has_fixed_point"])
    return out
