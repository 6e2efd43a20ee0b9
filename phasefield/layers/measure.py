"""Finite-width random stacks of any block (its Flax module, lazily sampled or dense
weights) and the measurements that the mean-field maps predict (docs/theory.md §6, §7).

Pure in ``(block, key, ...)``: ``jit``/``vmap`` over draws. Depth ``L`` blocks with
independent weights (one key each) run in a ``lax.scan``; the block's numbers may be traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .weights import LAZY_RNG, check_weights


def stack(block, key, x, depth: int, weights: str = "lazy", causal: bool = False):
    """Tokens after each of ``depth`` random blocks: ``[depth + 1, n, d]`` (index 0: x)."""
    check_weights(weights)
    mod = block.module(weights, causal)

    def step(h, k):
        if weights == "lazy":
            y = mod.apply({}, h, rngs={LAZY_RNG: k})
        else:
            y, _ = mod.init_with_output({"params": k}, h)
        return y, y

    _, ys = jax.lax.scan(step, x, jax.random.split(key, depth))
    return jnp.concatenate([x[None], ys])


def symmetric_tokens(key, shape, q0, rho0, dtype=jnp.float32):
    """Tokens ``[..., n, d]`` ``sqrt(q0 rho0) g + sqrt(q0 (1 - rho0)) e_i`` (g, e_i standard
    normal, g shared by the tokens of a sequence): squared norm q0 per component and
    pairwise cosine rho0 in expectation, every token alike."""
    *batch, n, d = shape
    kg, ke = jax.random.split(key)
    g = jax.random.normal(kg, (*batch, 1, d), dtype)
    e = jax.random.normal(ke, (*batch, n, d), dtype)
    return jnp.sqrt(q0 * rho0).astype(dtype) * g + jnp.sqrt(q0 * (1.0 - rho0)).astype(dtype) * e


def tokens(key, n: int, d: int, q0, rho0, dtype=jnp.float32):
    """n tokens of one sequence at (q0, rho0): :func:`symmetric_tokens` of shape (n, d)."""
    return symmetric_tokens(key, (n, d), q0, rho0, dtype)


def geometry(x):
    """(q, p): mean squared norm per component and mean off-diagonal dot product per component."""
    n, d = x.shape[-2:]
    gram = jnp.einsum("...id,...jd->...ij", x, x) / d
    q = jnp.trace(gram, axis1=-2, axis2=-1) / n
    p = (jnp.sum(gram, (-2, -1)) - q * n) / (n * (n - 1))
    return q, p


def spread(t):
    """u = q - p per sequence, averaged over the batch, from the centred tokens:
    ``sum_i |x_i - mean|^2 / (d (n - 1))`` (equal to q - p, without the cancellation of
    q - p near collapse)."""
    t = t.reshape((-1,) + t.shape[-2:])
    n, d = t.shape[-2:]
    c = t - jnp.mean(t, axis=-2, keepdims=True)
    return jnp.mean(jnp.sum(jnp.square(c), (-2, -1))) / (d * (n - 1))


def q_rho_gap(t):
    """(q, rho, 1 - rho) of tokens ``[..., n, d]``."""
    t = t.reshape((-1,) + t.shape[-2:])
    q = jnp.mean(jnp.square(t))
    u = spread(t)
    return q, 1.0 - u / q, u / q


def transient(block, key, n, d, depth, q0, rho0, weights="lazy", dtype=jnp.float32):
    """Per-layer (q, p) of one draw from (q0, rho0): arrays ``[depth + 1]``."""
    kx, kw = jax.random.split(key)
    xs = stack(block, kw, tokens(kx, n, d, q0, rho0, dtype), depth, weights)
    return geometry(xs)


def near_gap(block, key, n, d, depth, q0, eps, weights="lazy", dtype=jnp.float32):
    """``1 - rho`` per layer of one draw from nearby tokens at (q0, 1 - eps): ``[depth + 1]``
    (the same draw as :func:`transient` with this key), for the angle rate
    ``(1/L) log(gap_L / gap_0)``; from :func:`spread`, free of the cancellation in
    ``1 - p/q`` (in float32, a cosine within ~1e-5 of 1 read through the Gram matrix is
    mostly rounding at d = 4096). Where ``1 - rho`` falls below ~1e-8 the float32 network
    itself cannot keep nearby tokens apart (rounding merges them): pass ``dtype=float64``
    (inside ``jax.enable_x64``)."""
    kx, kw = jax.random.split(key)
    return jax.vmap(q_rho_gap)(stack(block, kw, tokens(kx, n, d, q0, 1.0 - eps, dtype), depth, weights))[2]


def gradient_draw(block, key, n, d, depth, q0, rho0, weights="lazy", dtype=jnp.float32) -> dict:
    """One draw from tokens at (q0, rho0) (``rho0 = 1``: n identical tokens) through ``depth``
    blocks: the per-layer geometry ``q, p`` (``[depth + 1]``, as :func:`transient`) and, for
    u ~ N(0, 1) at the output, ``g = |J^T u|^2 / (n d)`` and ``u = |u|^2 / (n d)`` (one VJP
    per draw, the protocol of docs/theory.md §7). The ratio of the means of g and u over
    draws estimates exp(L lambda_g(L)) with less noise than g's alone (E u = 1)."""
    kx, kw, ku = jax.random.split(key, 3)
    x = tokens(kx, n, d, q0, rho0, dtype)

    def f(h):
        xs = stack(block, kw, h, depth, weights)
        return xs[-1], geometry(xs)

    out, vjp, (q, p) = jax.vjp(f, x, has_aux=True)
    u = jax.random.normal(ku, out.shape, out.dtype)
    (g,) = vjp(u)
    return dict(q=q, p=p, g=jnp.sum(jnp.square(g)) / (n * d), u=jnp.sum(jnp.square(u)) / (n * d))


def gradient_energy(block, key, n, d, depth, q0, rho0, weights="lazy", dtype=jnp.float32):
    """|J^T u|^2 / (n d) of :func:`gradient_draw` (the same draw)."""
    return gradient_draw(block, key, n, d, depth, q0, rho0, weights, dtype)["g"]
