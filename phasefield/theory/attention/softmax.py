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

import jax
import jax.numpy as jnp

from . import exact, exact_table
from .full_gram import SAMPLE_DTYPE, field_factor, mc_attention, mc_normals, sample_mean, tn_mean

STEP_BLOCK = 32  # antithetic pairs of fields per step of :func:`exact_step`'s loop


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


def exact_step(sigma_a, r, c, x, mask, softmax=True):
    """The exact map's forward and the adjoint of its backward map from one draw of the fields
    (those of :func:`.full_gram.mc_attention` at ``(sigma_a, r)``), for a symmetric ``x``:
    ``(E[A c A^T], E[A x A^T], S^T(x))``, with ``S^T`` the adjoint of
    :func:`gram_softmax_term` in ``g`` before ``sigma_V^2`` (zero without ``softmax``)::

        S^T(x) = sigma_A^2 [ x . (W + W^T) + r . (K + K^T) / 2 ]
        W = E[(P/2 - U.U) A^T + V.V/2],   K = E[(A (r.x) - 2 (A x).U) A^T + V.(A x A^T)]

    (``U = A r``, ``P = A (r.r)``, ``V = U A^T``; ``.`` the entrywise product). Each term is
    the transpose of the query or key path's: ``<x, S(g)> = <S^T(x), g>`` for symmetric ``g``.
    Every per-sample product is one of two: the fields times ``[r | x | r.r/2 | r.x | c]``
    (``c`` left out where it is ``r``, the plain attention's case), then the stacked left
    factors times ``A^T``. The fields are drawn and used :data:`STEP_BLOCK` antithetic pairs
    at a time (a loop whose arrays stay in a CPU's cache: the same sums, ~40 % less CPU time
    than all samples at once), each block's sum in the samples' dtype and the blocks' sums
    in float64, as :func:`.full_gram.sample_mean` sums."""
    n = r.shape[-1]
    z = mc_normals(n)
    s = z.shape[0]
    k = STEP_BLOCK if (s // 2) % STEP_BLOCK == 0 else s // 2
    dt = SAMPLE_DTYPE
    half = jnp.asarray(z[: s // 2], dt).reshape(s // 2 // k, k, n, n)
    l_mat = field_factor(r).astype(dt)
    allowed = jnp.asarray(mask)
    same = c is r  # the logits read the values' Gram (plain attention): A c A^T = V
    rs, xs = jnp.asarray(r, dt), jnp.asarray(x, dt)
    rhs = [rs, xs] if same or softmax else [jnp.asarray(c, dt), xs]
    if softmax:
        rhs += [0.5 * (rs * rs), rs * xs] + ([] if same else [jnp.asarray(c, dt)])
    rhs = jnp.concatenate(rhs, 1)
    width = 4 * n if softmax else 2 * n

    def block_sum(a):  # [k, n, n] attention samples -> the sum of their products, float64
        prod = a @ rhs
        block = [prod[..., i * n : (i + 1) * n] for i in range(rhs.shape[1] // n)]
        left = block[:2]  # [A c or U, A x]
        if softmax:
            u, ax, half_p, arx = block[:4]
            left += [half_p - u * u, arx - 2.0 * (ax * u)] + block[4:]
        y = jnp.einsum("sjk,sik->sji", jnp.concatenate(left, 1), a)  # each left factor times A^T
        if not softmax:
            return jnp.sum(y, 0).astype(jnp.float64)
        part = [y[:, i * n : (i + 1) * n] for i in range(len(left))]
        v, p2, w1, y5 = part[:4]  # V = U A^T, A x A^T, (P/2 - U.U) A^T, (A (r.x) - 2 (A x).U) A^T
        terms = [v if same else part[4], p2, w1 + 0.5 * (v * v), y5 + v * p2]
        return jnp.sum(jnp.concatenate(terms, 1), 0).astype(jnp.float64)

    def step(total, zb):
        logits = jnp.asarray(sigma_a, dt) * jnp.einsum("ij,sjk,lk->sil", l_mat, zb, l_mat)
        for sign in (1.0, -1.0):  # the field and its antithetic partner
            e = jnp.where(allowed, sign * logits, -jnp.inf)
            e = jnp.exp(e - jnp.max(e, axis=-1, keepdims=True))
            a = e * (1.0 / jnp.sum(e, axis=-1, keepdims=True))
            total = total + block_sum(a)
        return total, None

    total, _ = jax.lax.scan(step, jnp.zeros((width, n), jnp.float64), half)
    m = total / s
    if not softmax:
        return m[:n], m[n:], jnp.zeros_like(m[:n])
    w, k2 = m[2 * n : 3 * n], m[3 * n :]
    soft = jnp.asarray(x) * (w + w.T) + jnp.asarray(r) * (0.5 * (k2 + k2.T))
    return m[:n], m[n : 2 * n], jnp.square(sigma_a) * soft
