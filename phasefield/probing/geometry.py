"""Token geometry per sequence, averaged over a batch (docs/theory.md §2); the
permutation-symmetric tokens the theory starts from are :func:`phasefield.layers.measure.symmetric_tokens`.

Tokens are ``[..., n, d]``: the last two axes are the n tokens of one sequence and their
d components; leading axes are a batch of sequences, averaged over.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..layers.measure import q_rho_gap, spread, symmetric_tokens  # noqa: F401  (shared with the simulator)


def gram_qp(t):
    """(q, p): mean squared norm per component and mean off-diagonal dot product per
    component, averaged over the batch (from the Gram matrix, as the ViT's input geometry
    has always been measured)."""
    t = t.reshape((-1,) + t.shape[-2:])
    n, d = t.shape[-2:]
    g = jnp.einsum("bid,bjd->bij", t, t) / d
    diag = jnp.trace(g, axis1=1, axis2=2)
    return jnp.mean(diag) / n, jnp.mean((jnp.sum(g, (1, 2)) - diag) / (n * (n - 1)))
