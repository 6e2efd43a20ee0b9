"""Token geometry per sequence, averaged over a batch (THEORY.md §2), and the
permutation-symmetric tokens the theory starts from.

Tokens are ``[..., n, d]``: the last two axes are the n tokens of one sequence and their
d components; leading axes are a batch of sequences, averaged over.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gram_qp(t):
    """(q, p): mean squared norm per component and mean off-diagonal dot product per
    component, averaged over the batch (from the Gram matrix, as the ViT's input geometry
    has always been measured)."""
    t = t.reshape((-1,) + t.shape[-2:])
    n, d = t.shape[-2:]
    g = jnp.einsum("bid,bjd->bij", t, t) / d
    diag = jnp.trace(g, axis1=1, axis2=2)
    return jnp.mean(diag) / n, jnp.mean((jnp.sum(g, (1, 2)) - diag) / (n * (n - 1)))


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


def symmetric_tokens(key, shape, q0, rho0, dtype=jnp.float32):
    """Tokens ``sqrt(q0 rho0) g + sqrt(q0 (1 - rho0)) e_i`` (g, e_i standard normal, g
    shared by the tokens of a sequence): squared norm q0 per component and pairwise cosine
    rho0 in expectation, every token alike."""
    *batch, n, d = shape
    kg, ke = jax.random.split(key)
    g = jax.random.normal(kg, (*batch, 1, d), dtype)
    e = jax.random.normal(ke, (*batch, n, d), dtype)
    return jnp.sqrt(q0 * rho0).astype(dtype) * g + jnp.sqrt(q0 * (1.0 - rho0)).astype(dtype) * e
