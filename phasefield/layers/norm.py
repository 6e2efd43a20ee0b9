"""Normalization layers: the paper's RMS norm, LayerNorm (centring, gain, bias), RMSNorm.

Mean field at initialization (gain 1, bias 0): every kind maps ``(q, p) -> (1, p / q)``.
LayerNorm's centring subtracts the feature mean of a token, whose square is O(q / d) for
the zero-mean random features of a random network, so it changes q and p by O(1/d) only
(a finite-width term the simulator measures; it is not in the infinite-width map).
Backward: ``LN'(x) = (sqrt(d) / |x|) (I - x x^T / |x|^2)`` removes one direction of d, so
at infinite width the gradient Gram is divided by q: ``(a, b) -> (a, b) / q``.

Full Gram (:mod:`.gram`), exact at any token norms: forward ``C -> R`` (the cosine matrix,
``C_ik / sqrt(C_ii C_kk)``), backward ``G_ik -> G_ik / sqrt(C_ii C_kk)`` (each token divided by
its own norm).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from . import gram
from .base import Layer
from .state import Kernel
from .weights import normalize

KINDS = ("rms", "layernorm", "rmsnorm")
EPS = 1e-6  # the epsilon of the trainable LayerNorm / RMSNorm modules (none for "rms")


@struct.dataclass
class Norm(Layer):
    """``kind``: ``"rms"`` (the paper: sqrt(d) x / |x|, no parameters), ``"layernorm"``
    (centring, trainable gain and bias), ``"rmsnorm"`` (trainable gain)."""

    kind: str = struct.field(pytree_node=False, default="rms")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown norm {self.kind!r}; choose one of {', '.join(KINDS)}")

    def forward(self, k, ctx):
        return Kernel(jnp.ones_like(k.q), k.p / k.q)

    def backward(self, k, g, ctx):
        return g.scale(1.0 / k.q)

    def gram_forward(self, c, ctx):
        return gram.cosines(c)

    def gram_backward(self, c, g, ctx):
        q = jnp.diagonal(c)
        return g / jnp.sqrt(q[:, None] * q[None, :])

    def module(self, weights="dense", causal=False, name=None):
        return NormModule(self.kind, trainable=weights == "dense", name=name)


class NormModule(nn.Module):
    kind: str = "rms"
    trainable: bool = True

    @nn.compact
    def __call__(self, x):
        if self.kind == "rms":
            return normalize(x)
        if self.kind == "layernorm":
            if self.trainable:
                return nn.LayerNorm(epsilon=EPS, name="layernorm")(x)
            x = x - jnp.mean(x, -1, keepdims=True)
            return x * jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + EPS))
        if self.trainable:
            return nn.RMSNorm(epsilon=EPS, name="rmsnorm")(x)
        return x * jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + EPS))
