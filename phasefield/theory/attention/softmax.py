"""Softmax-derivative (query/key path) term of the attention backward map (§7, §8).

Derivation: docs/beyond.md §3. With ``e_il = g_i . v_l`` (output gradient times value) the
logit gradient is ``dM_il = A_il (e_il - sum_j A_ij e_ij)``; it reaches token ``m`` through
the query (``sum_l dM_ml P x_l``) and the key (``sum_i dM_im P^T x_i``) with
``P = W_Q W_K^T / sqrt(d)``. At d -> infinity (E over W_V given A, and
``(P x_l).(P x_l') / d -> sigma_A^2 R_ll'``; query/key and values/softmax cross terms are
O(1/d)) the extra gradient Gram, before the LN factor ``1/sqrt(q_m q_m')``, is::

    sigma_A^2 sigma_V^2 [ G_mm' sum_ll' R_ll' E[A_ml A_m'l' Rt^{mm'}_ll']          (query)
                        + sum_ii' R_ii' G_ii' E[A_im A_i'm' Rt^{ii'}_mm'] ]        (key)
    Rt^{ik}_{ll'} = (e_l - A_i)^T R (e_l' - A_k)

It vanishes at the collapsed point (R = 11^T => Rt = 0). Under permutation symmetry
(G = a I + b 11^T, R = (1 - rho) I + rho 11^T) it needs two scalars,

    T_1   = E[ sum_l A_l^2 (1 - 2 A_l) + (sum_l A_l^2)^2 ]                  (one row A)
    T_rho = E[ sum_l A_l B_l (1 - A_l - B_l) + (A . B)^2 ]                 (rows A, B, i != k)

computed without Assumption 3.2 by :func:`.exact.t_values`, and adds::

    diag += k [ (2 - rho)(a + b) T_1 + b rho (n - 1) T_rho ]
    off  += k [ (1 - 2 rho) b T_rho - (a + b) T_1 / (n - 1) ],   k = sigma_A^2 sigma_V^2 (1 - rho) / q

(times alpha_A^2, next to the values path). The Gram version uses the fixed Monte-Carlo
attention samples of :func:`.full_gram.mc_attention`. Switched on by the
``softmax_correction`` argument of :mod:`phasefield.theory.attention`'s backward maps
(``HParams(softmax_correction=True)`` in the paper engine), which add it.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import exact, exact_table
from .full_gram import mc_attention, sample_mean, tn_mean


def t_values(sigma_a, n_tokens, rho, att=None):
    """(T_1, T_rho) at token cosine rho (exact softmax expectations, :func:`.exact.t_values`;
    ``att``: grid sizes, :func:`.exact.grid_sizes`, and possibly the mesh values ``att.t``)."""
    if att is not None and getattr(att, "interp_t", False):  # mesh values of this (sigma_A, n)
        return exact_table.interpolate(n_tokens, att.t, rho)
    return exact.t_values(sigma_a, n_tokens, rho, *exact.grid_sizes(sigma_a, n_tokens, att))


def softmax_term(sigma_a, n_tokens, sigma_v, q, rho, a, b, att=None):
    """(diag, off) added to the attention branch's backward map by the softmax path."""
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    t1, tr = t_values(sigma_a, n_tokens, rho, att)
    k = jnp.square(sigma_a) * jnp.square(sigma_v) * (1.0 - rho) / q
    diag = k * ((2.0 - rho) * (a + b) * t1 + b * rho * (n - 1.0) * tr)
    off = k * ((1.0 - 2.0 * rho) * b * tr - (a + b) * t1 / (n - 1.0))
    return diag, off


def gram_softmax_term(sigma_a, sigma_v, r, g, mask, samples=None, a=None):
    """sigma_A^2 sigma_V^2 (query + key terms) for cosine matrix r and gradient Gram g
    (before alpha_A^2 / sqrt(q q')), averaged over the fixed Monte-Carlo attention samples
    (``a``: those of :func:`.full_gram.mc_attention` when the caller has them; ``samples``:
    their number otherwise, default :func:`.full_gram.mc_samples`). Each sample's products in
    the samples' dtype, the means in float64 (:func:`.full_gram.sample_mean`)."""
    if a is None:
        a = mc_attention(sigma_a, r, mask, samples)  # [s, n, n]
    n, dt = a.shape[-1], a.dtype
    rs, h = jnp.asarray(r, dt), jnp.asarray(r * g, dt)
    up = a @ jnp.concatenate([rs, rs * rs], 1)  # [U | P]: U = A R, P = A (R.R)
    u = up[..., :n]
    # per sample A [U | P | U.U]^T = [V | A (R.R) A^T | A (U.U)^T],  V = A R A^T
    y = a @ jnp.swapaxes(jnp.concatenate([u, up[..., n:], u * u], 1), -1, -2)
    v = y[..., :n]
    m = sample_mean(jnp.concatenate([v * v, y[..., n:]], -1))
    vv, arra, t2 = m[:, :n], m[:, n : 2 * n], m[:, 2 * n :]
    # query path: G .* E[A (R.R) A^T - A (U.U)^T - (U.U) A^T + V.V]
    query = g * (arra - t2 - t2.T + vv)
    # key path: R.(A^T H A) - ((H A).U)^T A - A^T (U.(H A)) + A^T (H.V) A,  H = R.G:
    # E[A^T [H A | (H A).U | (H.V) A]] in one product per block of samples
    ha = h @ a
    k = tn_mean(a, jnp.concatenate([ha, ha * u, (h * v) @ a], -1))
    aha, k2, ahva = k[:, :n], k[:, n : 2 * n], k[:, 2 * n :]
    key = r * aha - k2 - k2.T + ahva
    return jnp.square(sigma_a) * jnp.square(sigma_v) * (query + key)
