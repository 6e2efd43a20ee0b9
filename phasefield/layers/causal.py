"""Per-position results of a stack of blocks on the full Gram (docs/theory.md, "Causal
stacks"): any block (every registered preset) from a permutation-symmetric input, with or
without the causal mask, through :mod:`.gram`'s engine.

* ``q_L_pos`` [n]: token i's squared norm per component after L blocks, ``C_ii``.
* ``rho_L_pos`` [n]: token i's mean cosine with the earlier tokens j < i after L blocks
  (position 0 has none: 0).
* ``angle_rate_last``: the last token's angle rate,
  ``(1/L) log[(1 - rho_L_last) / (1 - rho_0)]`` in the limit ``rho_0 -> 1`` from norm q0,
  with ``rho_L_last`` the last token's mean cosine with the earlier ones: the derivative of
  ``1 - rho_L_last`` along ``C_0 = q0 [(1 - eps) 11^T + eps I]`` at ``eps = 0`` (forward-mode
  autodiff through the L blocks), as the (q, p) engine's ``angle_rate``
  (:mod:`.depth`). At the collapsed Gram ``C = Q 11^T`` every attention row is the uniform
  average over its allowed keys and ``A 1 = 1``, so the first-order change of
  ``E[A C A^T]`` is ``E[A dC A^T]`` at that uniform ``A``: the same in both attention maps.
  The rate is computed with that uniform map (:func:`at_collapse`,
  :class:`CollapsedAttention`: the paper map's value and first order there, and the exact
  map's, whose Monte-Carlo fields would differentiate an eigendecomposition at its
  degenerate point, NaN).
* ``lambda_g_last``: the last token's gradient rate ``(1/L) log G_0[n-1, n-1]``, with the
  gradient Gram ``G_L = I`` at the output backpropagated through the L blocks along the
  trajectory from (q0, rho0), computed forward (:func:`.gram.forward_adjoint`: the adjoint of
  each block's backward map carries ``e e^T`` of the last token, one draw of each attention's
  fields for both maps): the per-layer log growth of the last input token's squared gradient
  norm, the (q, p) engine's ``lambda_g_input`` for one token. Under the mask the last input
  token reaches only the last output token, so this is its own gradient.

* ``q_pos`` [L + 1, n], ``rho_pos`` [L + 1, n] (:func:`causal_trajectory`): token i's
  squared norm per component and mean cosine with the earlier tokens after l blocks (index
  0: the input), the per-position trajectory.

The mask is a property of the block: every attention layer's static field ``causal``
(:func:`masked` sets it, :func:`is_causal` reads it; ``NAME:causal=true`` builds a preset
masked). Float64; one compiled program per block structure, n, depth and mask (the
numbers, q0 and rho0 are traced).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..theory.precision import float64
from . import gram
from .attention import Attention
from .base import Layer, check_layer, is_causal, masked  # noqa: F401 (the mask is a property of the block)
from .state import Context, as_float


def mean_cosine_with_earlier(c):
    """[n]: each token's mean cosine with the tokens before it (position 0: 0)."""
    n = c.shape[-1]
    lower = np.tril(np.ones((n, n)), -1)
    counts = np.maximum(lower.sum(-1), 1.0)
    return jnp.sum(gram.cosines(c) * lower, -1) / counts


def _with_mask(layer, causal):
    """``layer`` masked as ``causal`` says (True: every attention, False: none), or as its
    layers say (None)."""
    return layer if causal is None else masked(layer, causal)


@struct.dataclass
class CollapsedAttention(Attention):
    """An attention's Gram forward map at the collapsed Gram ``C = Q 11^T`` and to first order
    around it (module docstring): ``sigma_O^2 sigma_V^2 U C U^T`` with ``U`` the uniform
    average over the allowed keys, which the paper and the exact map both are there (the
    logits of a query are all equal; the change of ``A`` meets ``C 1 = Q n 1`` and
    ``dA 1 = 0``). Read only by :func:`at_collapse`'s blocks, along the collapsed input."""

    def gram_forward(self, c, ctx):
        mask = gram.causal_mask(c.shape[-1], self.causal)
        u = jnp.asarray(mask / mask.sum(-1, keepdims=True), c.dtype)
        return self._out_scale() * (jnp.square(as_float(self.sigma_v)) * (u @ c @ u.T))

    def gram_step(self, c, x, ctx):  # its own forward map, not the exact map's fused one
        return Layer.gram_step(self, c, x, ctx)


def at_collapse(layer):
    """``layer`` with every attention its :class:`CollapsedAttention` (the same forward map at
    the collapsed Gram and its first order in both attention maps, module docstring)."""
    if isinstance(layer, Attention):
        return CollapsedAttention(**{f.name: getattr(layer, f.name) for f in dataclasses.fields(Attention)})
    return layer.map_children(at_collapse) if layer.children() else layer


def causal_rates_traced(block, ctx, q0, rho0, n: int, depth: int) -> dict:
    """:func:`causal_rates` on a prepared block (pure, traced)."""
    last = jnp.zeros((n, n)).at[-1, -1].set(1.0)  # e e^T of the last token: G_0[n-1, n-1]
    c_l, log_g = gram.forward_adjoint(block, ctx, gram.symmetric_gram(n, q0, rho0 * q0), last, depth)
    lambda_g_last = log_g / depth

    collapsed = at_collapse(block)

    def gap_last(eps):
        c0 = q0 * ((1.0 - eps) * jnp.ones((n, n)) + eps * jnp.eye(n))
        return 1.0 - mean_cosine_with_earlier(gram.forward_grams(collapsed, ctx, c0, depth)[-1])[-1]

    zero = jnp.zeros_like(q0)
    _, slope = jax.jvp(gap_last, (zero,), (jnp.ones_like(q0),))
    return dict(
        q_L_pos=jnp.diagonal(c_l),
        rho_L_pos=mean_cosine_with_earlier(c_l),
        angle_rate_last=jnp.log(slope) / depth,
        lambda_g_last=lambda_g_last,
    )


def causal_trajectory_traced(block, ctx, q0, rho0, n: int, depth: int) -> dict:
    """:func:`causal_trajectory` on a prepared block (pure, traced)."""
    cs = gram.forward_grams(block, ctx, gram.symmetric_gram(n, q0, rho0 * q0), depth)
    return dict(q_pos=jnp.diagonal(cs, axis1=-2, axis2=-1), rho_pos=mean_cosine_with_earlier(cs))


@functools.cache
def _compiled(name: str = "rates"):
    fn = causal_rates_traced if name == "rates" else causal_trajectory_traced
    return jax.jit(fn, static_argnames=("n", "depth"))


def _run(name, block, n_tokens, depth, q0, rho0, causal) -> dict:
    check_layer(block)
    n = int(n_tokens)
    if n < 2:
        raise ValueError(f"n_tokens must be at least 2 (a token before the last), got {n_tokens}")
    if int(depth) < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    dt = jnp.result_type(float)
    prepared = gram.prepare_kernels(_with_mask(block, causal), Context(n))
    ctx = Context(jnp.asarray(n, dt))
    out = _compiled(name)(prepared, ctx, jnp.asarray(q0, dt), jnp.asarray(rho0, dt), n=n, depth=int(depth))
    return dict(out)


@float64
def causal_rates(block, n_tokens: int = 32, depth: int = 16, q0=1.0, rho0=0.5, causal: bool | None = None) -> dict:
    """Per-position results of ``depth`` blocks from the permutation-symmetric input
    (q0, rho0) on ``n_tokens`` tokens (module docstring): ``q_L_pos`` [n], ``rho_L_pos``
    [n], ``angle_rate_last``, ``lambda_g_last`` (names of :data:`phasefield.schema.NAMES`).
    ``causal``: every attention masked (True) or none (False); None: as the block's layers
    say (:func:`is_causal`). Without the mask every position is the (q, p) engine's
    ``q_L``/``rho_L``, ``angle_rate`` and ``lambda_g_input``."""
    return _run("rates", block, n_tokens, depth, q0, rho0, causal)


@float64
def causal_trajectory(block, q0=1.0, rho0=0.5, n_tokens: int = 32, depth: int = 16, causal: bool | None = None) -> dict:
    """Per layer and position from the permutation-symmetric input (q0, rho0): ``q_pos``
    [depth + 1, n] (``C_ii``) and ``rho_pos`` [depth + 1, n] (token i's mean cosine with the
    tokens j < i; position 0: 0), index 0 the input; ``causal`` as :func:`causal_rates`."""
    return _run("trajectory", block, n_tokens, depth, q0, rho0, causal)
