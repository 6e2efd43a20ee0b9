"""Per-position measurements of causal stacks: the finite-width network's estimates of
:func:`phasefield.layers.causal_rates` (docs/theory.md, "Causal stacks"), each with a
standard error over independent draws (fresh weights and fresh input tokens per draw).

* ``q_L_pos`` [n]: token i's squared norm per component after L blocks, ``|x_i|^2 / d``,
  averaged over draws, from the permutation-symmetric tokens at (q0, rho0)
  (:func:`phasefield.layers.measure.tokens`, the finite-depth protocol's input).
* ``rho_L_pos`` [n]: token i's mean cosine with the tokens j < i, per draw, averaged
  (position 0 has none: 0, se 0).
* ``angle_rate_last``: ``(1/L) log(E gap_L / E gap_0)`` (a ratio of means,
  :func:`.measure.log_ratio_of_means`, delta-method se), with ``gap`` the last token's
  ``1 - mean_j cos(x_last, x_j)`` over the earlier tokens, read stably as
  ``mean_j |x^_last - x^_j|^2 / 2`` of the unit tokens, from nearby tokens at
  (q0, 1 - eps): the finite-difference twin of the theory's derivative at eps = 0. This
  pass runs in float64, as the simulator's other angle measurements
  (:func:`.measure.rates`).
* ``lambda_g_last``: ``(1/L) log(E g / E u)``, with ``u`` ~ N(0, 1) the output cotangent of
  every token (output gradient Gram I), ``g = |(J^T u)_last|^2 / d`` the last input token's
  squared gradient per component and ``u = |u_last|^2 / d`` (E u = 1; the mask lets the last
  input token reach only the last output token), in the same float32 pass as q and rho.

The draw kernels are compiled once per structure (``n``, ``d``, ``depth``, ``causal``,
weights, batch; the block's numbers, q0, rho0 and eps are traced).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..layers import measure as M
from .measure import GAP_EPS, batch_size, check, draw_keys, leaves_as, log_ratio_of_means, mean_se
from .stack import DEFAULT_WEIGHTS, block_of, cast, stack_forward

POSITION_QUANTITIES = ("q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last")


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def earlier_cosines(x):
    """[n]: each token's mean cosine with the tokens before it (position 0: 0), tokens
    ``[n, d]``."""
    n = x.shape[-2]
    xh = _unit(x)
    lower = np.tril(np.ones((n, n)), -1)
    counts = np.maximum(lower.sum(-1), 1.0)
    return jnp.sum((xh @ xh.T) * lower, -1) / counts


def last_gap(x):
    """The last token's ``1 - mean cosine`` with the earlier tokens of ``[n, d]``, read as
    ``mean_j |x^_last - x^_j|^2 / 2`` (no cancellation near collapse)."""
    xh = _unit(x)
    return 0.5 * jnp.mean(jnp.sum(jnp.square(xh[-1] - xh[:-1]), -1))


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "weights", "dtype", "batch"))
def position_draws(block, keys, q0, rho0, *, n, d, depth, causal, weights, dtype, batch):
    """Per draw from tokens at (q0, rho0) through ``depth`` blocks: ``q`` [draws, n] and
    ``rho`` [draws, n] (:func:`earlier_cosines`) of the output tokens, and the last token's
    ``g`` and ``u`` [draws] (one VJP per draw, module docstring)."""
    block = cast(block, dtype)

    def one(key):
        kx, kw, ku = jax.random.split(key, 3)
        x = M.tokens(kx, n, d, jnp.asarray(q0, dtype), jnp.asarray(rho0, dtype), dtype)
        out, vjp = jax.vjp(lambda h: stack_forward(block, kw, h, depth, causal=causal, weights=weights), x)
        u = jax.random.normal(ku, out.shape, out.dtype)
        (g,) = vjp(u)
        return dict(
            q=jnp.sum(jnp.square(out), -1) / d,
            rho=earlier_cosines(out),
            g=jnp.sum(jnp.square(g[-1])) / d,
            u=jnp.sum(jnp.square(u[-1])) / d,
        )

    return jax.lax.map(one, keys, batch_size=batch)


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "weights", "batch"))
def last_gap_draws(block, keys, q0, eps, *, n, d, depth, causal, weights, batch):
    """Per draw (float64; call inside ``jax.enable_x64``) the last token's gap
    (:func:`last_gap`) of nearby tokens at (q0, 1 - eps) before and after ``depth`` blocks:
    ``[draws, 2]``."""
    block = cast(block, jnp.float64)

    def one(key):
        kx, kw = jax.random.split(jax.random.fold_in(key, 1))
        q = jnp.asarray(q0, jnp.float64)
        x = M.tokens(kx, n, d, q, 1.0 - jnp.asarray(eps, jnp.float64), jnp.float64)
        out = stack_forward(block, kw, x, depth, causal=causal, weights=weights)
        return jnp.stack([last_gap(x), last_gap(out)])

    return jax.lax.map(one, keys, batch_size=batch)


def causal_positions(
    block,
    *,
    n_tokens=8,
    width=512,
    depth=4,
    draws=64,
    seed=0,
    q0=1.0,
    rho0=0.5,
    eps=GAP_EPS,
    weights=DEFAULT_WEIGHTS,
    dtype=jnp.float32,
    batch=None,
) -> dict:
    """The finite-width network's :func:`phasefield.layers.causal_rates` (causal mask on):
    ``q_L_pos``, ``rho_L_pos`` (arrays [n]), ``angle_rate_last``, ``lambda_g_last``, each
    with ``<name>_se`` over ``draws`` independent draws of weights and inputs (module
    docstring), NumPy float64. ``block``: anything :func:`.stack.resolve` takes; ``eps``:
    1 - rho of the angle rate's nearby tokens; ``dtype``: the forward and gradient pass
    (the angle pass is float64); ``batch``: draws vmapped at once (default:
    :func:`.measure.batch_size`)."""
    block = block_of(block)
    check(width, draws, n_tokens, depth, q0, rho0, eps, weights)
    n, d, L = int(n_tokens), int(width), int(depth)
    keys = draw_keys(seed, draws)
    dt = jnp.dtype(dtype)
    batch = int(batch or batch_size(block, n, d, L, weights, draws, itemsize=8))
    opts = dict(n=n, d=d, depth=L, causal=True, weights=weights, batch=batch)
    # traced inside JAX's x64 scope (every array has an explicit dtype): one compilation
    # whether the caller has x64 on or off
    with jax.enable_x64(True):
        fw = jax.device_get(
            position_draws(leaves_as(block, dt), keys, np.asarray(q0, dt), np.asarray(rho0, dt), dtype=dt, **opts)
        )
        f64 = (np.asarray(v, np.float64) for v in (q0, eps))
        gap = np.asarray(jax.device_get(last_gap_draws(leaves_as(block, np.float64), keys, *f64, **opts)), np.float64)
    fw = {k: np.asarray(v, np.float64) for k, v in fw.items()}
    out = {}
    out["q_L_pos"], out["q_L_pos_se"] = mean_se(fw["q"])
    out["rho_L_pos"], out["rho_L_pos_se"] = mean_se(fw["rho"])
    for name, (a, b) in (("angle_rate_last", (gap[:, 1], gap[:, 0])), ("lambda_g_last", (fw["g"], fw["u"]))):
        m, se = log_ratio_of_means(a, b, scale=1.0 / L)
        out[name], out[name + "_se"] = np.float64(m), np.float64(se)
    return out
