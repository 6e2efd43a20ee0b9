"""The paper's attention map (docs/theory.md §3, paper Eq. 10, Assumption 3.2), forward and backward.

Under permutation symmetry with token cosine ``rho`` the softmax averages reduce to two
weights, written as logistic functions so nothing overflows for large sigma_A or
negative rho::

    w_1   = sigmoid(sigma_A^2 (rho - 1)     + log(n - 1))   (same query token, i = k)
    w_rho = sigmoid(sigma_A^2 rho (rho - 1) + log(n - 1))   (different query tokens)

    q_A = sigma_V^2 [1 - w_1   (1 - rho)]
    p_A = sigma_V^2 [1 - w_rho (1 - rho)]

The backward (values-path) map of §7 uses the same weights; see :func:`backward`.
The exact-softmax map (no Assumption 3.2) is :mod:`.exact`; the choice between them is
made in :mod:`phasefield.theory.attention` (its ``attention`` argument).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weights(sigma_a, n_tokens, rho):
    """(w_1, w_rho): off-diagonal attention mass for equal and for different query tokens
    (logit scale sigma_A, n tokens)."""
    s2 = jnp.square(sigma_a)
    log_n1 = jnp.log(jnp.asarray(n_tokens, jnp.result_type(float)) - 1.0)
    w1 = jax.nn.sigmoid(s2 * (rho - 1.0) + log_n1)
    wr = jax.nn.sigmoid(s2 * rho * (rho - 1.0) + log_n1)
    return w1, wr


def forward(sigma_a, n_tokens, sigma_v, rho):
    """(q_A, p_A) of the attention output for normalized input tokens with cosine rho
    (value scale sigma_V)."""
    w1, wr = weights(sigma_a, n_tokens, rho)
    sv2 = jnp.square(sigma_v)
    return sv2 * (1.0 - w1 * (1.0 - rho)), sv2 * (1.0 - wr * (1.0 - rho))


def backward(sigma_a, n_tokens, sigma_v, q, rho, a, b):
    """Values-path backward map of the attention branch (without its residual).

    The gradient Gram at the branch output is ``G = a I + b 11^T``; returns the diagonal and
    off-diagonal entries of ``(sigma_V^2 / q) sum_ik E[A_im A_km'] G_ik`` for block input
    norm ``q`` and cosine ``rho``.
    """
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    w1, wr = weights(sigma_a, n_tokens, rho)
    d1, o1 = 1.0 - w1, w1 / (n - 1.0)  # sum_i E[A_im A_im'],  m = m' / m != m'
    dr, orr = (n - 1.0) * (1.0 - wr), wr  # sum_{i != k} E[A_im A_km']
    scale = jnp.square(sigma_v) / q
    diag = scale * (a * d1 + b * (d1 + dr))
    off = scale * (a * o1 + b * (o1 + orr))
    return diag, off
