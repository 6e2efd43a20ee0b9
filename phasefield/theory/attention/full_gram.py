"""The attention branch on a full token Gram (docs/theory.md §8): ``E[A_ij A_kl]`` for a cosine
matrix ``R`` and an allowed-(query, key) mask, in both modes.

* paper — ratio of expectations (Assumption 3.2) over the allowed keys
  ``exp(sigma_A^2 R_ik R_jl) / sum_{j' <= i?, l' <= k?} exp(sigma_A^2 R_ik R_j'l')``, stored
  as an ``n^4`` weight tensor (fine for n <= 64);
* exact — no Assumption 3.2: Monte-Carlo over a fixed set of logit fields
  ``M = sigma_A L Z L^T`` (``R = L L^T``, antithetic standard-normal ``Z`` drawn once with a
  fixed seed), so it is deterministic and jit-able; its error is O(1/sqrt(samples)).

Forward ``C^A = sigma_V^2 E[A R A^T]``; backward (values path)
``sum_ik E[A_im A_km'] G_ik``. The mode is chosen by :mod:`phasefield.theory.attention`.
Every map takes the logit scale ``sigma_a`` (and the forward maps the value scale
``sigma_v``); ``n`` is the size of ``r``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

MC_SAMPLES = 4096
MC_SEED = 20240601


def paper_weights(sigma_a, r, mask):
    """W[i, k, j, l] ~ E[A_ij A_kl] under Assumption 3.2, restricted to the mask."""
    s2 = jnp.square(sigma_a)
    logits = s2 * r[:, :, None, None] * r[None, None, :, :]
    allowed = jnp.asarray(mask[:, None, :, None] & mask[None, :, None, :])
    logits = jnp.where(allowed, logits, -jnp.inf)
    n = r.shape[-1]
    flat = logits.reshape(n, n, n * n)
    w = jax.nn.softmax(flat, axis=-1)
    return w.reshape(n, n, n, n)


@functools.lru_cache(maxsize=16)
def _mc_normals(n: int, samples: int, seed: int) -> np.ndarray:
    z = np.random.default_rng(seed).standard_normal((samples // 2, n, n))
    return np.concatenate([z, -z])  # antithetic pairs


def mc_attention(sigma_a, r, mask, samples: int = MC_SAMPLES, seed: int = MC_SEED):
    """Attention matrices A [samples, n, n] of the fixed logit fields M = sigma_A L Z L^T."""
    n = r.shape[-1]
    z = jnp.asarray(_mc_normals(n, int(samples), int(seed)), r.dtype)
    lam, u = jnp.linalg.eigh(r)
    l_mat = u * jnp.sqrt(jnp.clip(lam, 0.0, None))[None, :]
    logits = sigma_a * jnp.einsum("ij,sjk,lk->sil", l_mat, z, l_mat)
    logits = jnp.where(jnp.asarray(mask), logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def paper_forward(sigma_a, sigma_v, r, mask):
    """C^A = sigma_V^2 E[A R A^T] under Assumption 3.2 (no residual)."""
    w = paper_weights(sigma_a, r, mask)
    return jnp.square(sigma_v) * jnp.einsum("ikjl,jl->ik", w, r)


def exact_forward(sigma_a, sigma_v, r, mask):
    """C^A = sigma_V^2 E[A R A^T] over the Monte-Carlo logit fields (no residual)."""
    a = mc_attention(sigma_a, r, mask)
    return jnp.square(sigma_v) * jnp.mean(jnp.einsum("sij,jl,skl->sik", a, r, a), axis=0)


def paper_backward(sigma_a, r, g, mask):
    """sum_ik E[A_im A_km'] G_ik under Assumption 3.2 (before sigma_V^2 / sqrt(q q'))."""
    w = paper_weights(sigma_a, r, mask)
    return jnp.einsum("ikml,ik->ml", w, g)


def exact_backward(sigma_a, r, g, mask):
    """sum_ik E[A_im A_km'] G_ik over the Monte-Carlo logit fields."""
    a = mc_attention(sigma_a, r, mask)
    return jnp.mean(jnp.einsum("sim,ik,skl->sml", a, g, a), axis=0)
