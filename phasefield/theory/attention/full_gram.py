"""The attention branch on a full token Gram (docs/theory.md §8): ``E[A_ij A_kl]`` for a cosine
matrix ``R`` and an allowed-(query, key) mask, in both modes.

* paper — ratio of expectations (Assumption 3.2) over the allowed keys
  ``exp(sigma_A^2 R_ik R_jl) / sum_{j' <= i?, l' <= k?} exp(sigma_A^2 R_ik R_j'l')``, stored
  as an ``n^4`` weight tensor (fine for n <= 64);
* exact — no Assumption 3.2: Monte-Carlo over a fixed set of logit fields
  ``M = sigma_A L Z L^T`` (``R = L L^T``, standard-normal ``Z`` drawn once with a fixed
  seed, :func:`mc_normals`), so it is deterministic and jit-able.

The fields (:func:`mc_normals`): antithetic pairs ``(Z, -Z)`` (every odd moment of the
sample zero), and, where there are at least twice as many samples as entries of ``Z``
(``2 n^2 <= samples``), whitened: the sample's second moments made exactly those of the
normal law (``sum_s Z_s (x) Z_s / S = I``), so the sample mean of any quadratic function of
the logits is exact and the error starts at the fourth order. :func:`mc_samples` gives the
count per n: :data:`MC_WHITENED` fields where they can be whitened (n <= 22), else
:data:`MC_SAMPLES` plain antithetic ones. The whitened 1024 are more accurate than 4096
plain ones (measured against 65,536 whitened fields on causal stacks: docs/theory.md,
"Causal stacks").

The sampled part runs in :data:`SAMPLE_DTYPE` (float32: each sample's products and the sums
within blocks of :data:`BLOCK` samples; the blocks' sums in float64): its rounding, ~1e-7
relative, is far below the sampling error.

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

MC_SAMPLES = 4096  # plain antithetic fields (n too large to whiten this many)
MC_WHITENED = 1024  # whitened antithetic fields, where 2 n^2 <= MC_WHITENED
MC_SEED = 20240601
SAMPLE_DTYPE = jnp.float32
BLOCK = 64  # samples per block of a sum in SAMPLE_DTYPE (the blocks' sums in float64)


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


def mc_samples(n: int) -> int:
    """The number of logit fields the exact maps average at n tokens (module docstring)."""
    return MC_WHITENED if 2 * n * n <= MC_WHITENED else MC_SAMPLES


def whiten(z: np.ndarray) -> np.ndarray:
    """Fields ``z`` [S, n, n] (their mean zero: antithetic) linearly transformed so that
    their sample second moments are exactly the identity."""
    flat = z.reshape(z.shape[0], -1)
    lam, u = np.linalg.eigh(flat.T @ flat / flat.shape[0])
    return (flat @ (u / np.sqrt(lam)) @ u.T).reshape(z.shape)


@functools.lru_cache(maxsize=16)
def mc_normals(n: int, samples: int | None = None, seed: int = MC_SEED) -> np.ndarray:
    """The fixed standard-normal fields Z [samples, n, n] (float64; default count
    :func:`mc_samples`): antithetic pairs, whitened where ``2 n^2 <= samples``."""
    samples = mc_samples(n) if samples is None else int(samples)
    z = np.random.default_rng(seed).standard_normal((samples // 2, n, n))
    z = np.concatenate([z, -z])  # antithetic pairs
    if 2 * n * n <= samples:
        z = whiten(z)[: samples // 2]  # whitening is linear: the pairs stay (z, -z), exactly so
        z = np.concatenate([z, -z])
    return z


def field_factor(r):
    """``L`` with ``L L^T = r`` (the eigenvectors scaled by the clipped roots of the
    eigenvalues): the logit fields are ``sigma_A L Z L^T``."""
    lam, u = jnp.linalg.eigh(r)
    return u * jnp.sqrt(jnp.clip(lam, 0.0, None))[None, :]


def mc_attention(sigma_a, r, mask, samples: int | None = None, seed: int = MC_SEED, dtype=None):
    """Attention matrices A [samples, n, n] (``dtype``, default :data:`SAMPLE_DTYPE`) of the fixed logit fields
    M = sigma_A L Z L^T (:func:`mc_normals`; the second half of the fields is the first's
    negative, so are its logits: computed once)."""
    n, dtype = r.shape[-1], SAMPLE_DTYPE if dtype is None else dtype
    z = mc_normals(n, samples, int(seed))
    half = jnp.asarray(z[: z.shape[0] // 2], dtype)
    l_mat = field_factor(r).astype(dtype)
    logits = jnp.asarray(sigma_a, dtype) * jnp.einsum("ij,sjk,lk->sil", l_mat, half, l_mat)
    logits = jnp.concatenate([logits, -logits])
    logits = jnp.where(jnp.asarray(mask), logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def _block(s: int) -> int:
    """Samples per block of a sum (:data:`BLOCK`, or all ``s`` where it does not divide them)."""
    return BLOCK if s % BLOCK == 0 else s


def sample_mean(x):
    """Mean over the samples (axis 0) of ``x`` [S, ...]: summed in its dtype within blocks of
    :data:`BLOCK` samples, the blocks' sums in float64."""
    s = x.shape[0]
    k = _block(s)
    part = jnp.sum(x.reshape(s // k, k, *x.shape[1:]), axis=1)
    return jnp.sum(part.astype(jnp.float64), axis=0) / s


def tn_mean(f, y):
    """``E[F^T Y] = (1/S) sum_s F_s^T Y_s`` [p, p'] of per-sample ``f`` [S, m, p] and ``y``
    [S, m, p'] (float64): one matrix product per block of :data:`BLOCK` samples (in their
    dtype), the blocks summed in float64."""
    s, m = f.shape[:2]
    k = _block(s)
    fb, yb = f.reshape(s // k, k * m, f.shape[-1]), y.reshape(s // k, k * m, y.shape[-1])
    return jnp.sum(jnp.einsum("bkp,bkq->bpq", fb, yb).astype(jnp.float64), axis=0) / s


def pair_mean(a, x):
    """``E[A X A^T]`` over the samples ``a`` [S, n, n] (float64)."""
    return sample_mean((a @ jnp.asarray(x, a.dtype)) @ jnp.swapaxes(a, -1, -2))


def pair_mean_t(a, g):
    """``E[A^T G A]`` (``sum_ik E[A_im A_km'] G_ik``) over the samples ``a`` (float64)."""
    return tn_mean(a, jnp.asarray(g, a.dtype) @ a)


def paper_forward(sigma_a, sigma_v, r, mask):
    """C^A = sigma_V^2 E[A R A^T] under Assumption 3.2 (no residual)."""
    w = paper_weights(sigma_a, r, mask)
    return jnp.square(sigma_v) * jnp.einsum("ikjl,jl->ik", w, r)


def exact_forward(sigma_a, sigma_v, r, mask):
    """C^A = sigma_V^2 E[A R A^T] over the Monte-Carlo logit fields (no residual)."""
    return jnp.square(sigma_v) * pair_mean(mc_attention(sigma_a, r, mask), r)


def paper_backward(sigma_a, r, g, mask):
    """sum_ik E[A_im A_km'] G_ik under Assumption 3.2 (before sigma_V^2 / sqrt(q q'))."""
    w = paper_weights(sigma_a, r, mask)
    return jnp.einsum("ikml,ik->ml", w, g)


def exact_backward(sigma_a, r, g, mask, a=None):
    """sum_ik E[A_im A_km'] G_ik over the Monte-Carlo logit fields (``a``: their attention
    matrices, :func:`mc_attention`, when the caller has them)."""
    return pair_mean_t(mc_attention(sigma_a, r, mask) if a is None else a, g)
