"""The transformer block of THEORY.md §1, as one Flax module.

This is the single definition used by the finite-width simulator (``phasefield.simulate``)
and by the ViT trainer (``phasefield.vit``). Its initialisation is driven by the same
:class:`phasefield.config.HParams` pytree as the theory, and every numeric field may be a
traced value (so ``jax.vmap`` over hyperparameter points works through ``init``).

    Z  = beta_A X + alpha_A Attn(LN(X))
    X' = beta_M Z + alpha_M MLP(LN(Z))

with LN(x) = sqrt(d) x / |x| (no parameters, no mean subtraction) and
Attn(X) = softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from . import activations
from .config import HParams


def normalize(x, eps: float = 0.0):
    """LN(x) = sqrt(d) x / |x| over the last axis."""
    d = x.shape[-1]
    sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(sq / d + eps)


def _normal(std):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.normal(key, shape, dtype) * jnp.asarray(std, dtype)

    return init


class Attention(nn.Module):
    """Single-head softmax attention on already-normalized tokens."""

    hp: HParams
    causal: bool = False

    @nn.compact
    def __call__(self, xh, return_weights: bool = False):
        d = xh.shape[-1]
        qk_std = jnp.sqrt(jnp.asarray(self.hp.sigma_a) / d)
        v_std = jnp.asarray(self.hp.sigma_v) / jnp.sqrt(d)
        dense = lambda name, std: nn.Dense(d, use_bias=False, kernel_init=_normal(std), name=name)
        q = dense("query", qk_std)(xh)
        k = dense("key", qk_std)(xh)
        v = dense("value", v_std)(xh)
        logits = jnp.einsum("...id,...jd->...ij", q, k) / jnp.sqrt(d).astype(xh.dtype)
        if self.causal:
            n = logits.shape[-1]
            mask = jnp.tril(jnp.ones((n, n), dtype=bool))
            logits = jnp.where(mask, logits, -jnp.inf)
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("...ij,...jd->...id", weights, v)
        return (out, weights) if return_weights else out


class MLP(nn.Module):
    """Tokenwise bias-free MLP with ``hp.mlp_layers`` hidden layers."""

    hp: HParams
    hidden: Optional[int] = None

    @nn.compact
    def __call__(self, xh):
        d = xh.shape[-1]
        hidden = self.hidden or d
        phi = activations.get(self.hp.activation)
        h = xh
        fan_in = d
        for layer in range(self.hp.mlp_layers):
            std = jnp.asarray(self.hp.sigma_w) / jnp.sqrt(fan_in)
            h = phi(nn.Dense(hidden, use_bias=False, kernel_init=_normal(std), name=f"dense_{layer}")(h))
            fan_in = hidden
        std = jnp.asarray(self.hp.sigma_w) / jnp.sqrt(fan_in)
        return nn.Dense(d, use_bias=False, kernel_init=_normal(std), name=f"dense_{self.hp.mlp_layers}")(h)


class Block(nn.Module):
    """One pre-norm block (the paper's Eq. 4). Input and output: ``[..., n, d]``."""

    hp: HParams
    causal: bool = False
    mlp_hidden: Optional[int] = None

    @nn.compact
    def __call__(self, x, return_intermediates: bool = False):
        hp = self.hp
        dtype = x.dtype
        a_a, a_m = jnp.asarray(hp.alpha_a, dtype), jnp.asarray(hp.alpha_m, dtype)
        b_a, b_m = jnp.asarray(hp.beta_a, dtype), jnp.asarray(hp.beta_m, dtype)
        z = b_a * x + a_a * Attention(hp, causal=self.causal, name="attention")(normalize(x))
        out = b_m * z + a_m * MLP(hp, hidden=self.mlp_hidden, name="mlp")(normalize(z))
        return (out, z) if return_intermediates else out
