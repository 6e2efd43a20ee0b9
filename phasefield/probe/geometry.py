"""Token geometry per sequence, averaged over a batch (THEORY.md §2); the
permutation-symmetric tokens the theory starts from are :func:`phasefield.layers.measure.symmetric_tokens`.

Tokens are ``[..., n, d]``: the last two axes are the n tokens of one sequence and their
d components; leading axes are a batch of sequences, averaged over.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..layers.measure import symmetric_tokens  # noqa: F401  (the probe's symmetric start)


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
