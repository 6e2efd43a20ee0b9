"""Residual connections ``x -> beta x + alpha f(x)`` (docs/theory.md §5).

``kind``: ``"unit-norm"`` (beta = sqrt(1 - alpha^2), the paper's), ``"identity"`` (beta = 1:
GPT-2, BERT, most trained transformers), ``"explicit"`` (beta a number of its own, e.g.
DeepScaleLM's). A 1/sqrt(L) or 1/L^gamma branch scale is just the number ``alpha``.

The branch carries fresh weights, so residual and branch are uncorrelated: forward
``(q, p) -> beta^2 (q, p) + alpha^2 f(q, p)``, backward ``G -> beta^2 G + alpha^2 f'(G)``;
the same on the full Gram (:mod:`.gram`): ``C -> beta^2 C + alpha^2 f(C)``, ``G -> beta^2 G +
alpha^2 f'(C; G)``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from .base import BlockModule, Layer
from .state import Kernel, as_float

KINDS = ("unit-norm", "identity", "explicit")


@struct.dataclass
class Residual(Layer):
    branch: Any
    alpha: Any = 0.5
    beta: Any = None  # used only by kind="explicit"
    kind: str = struct.field(pytree_node=False, default="unit-norm")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown residual {self.kind!r}; choose one of {', '.join(KINDS)}")
        if (self.kind == "explicit") != (self.beta is not None):
            raise ValueError("residual: give beta exactly when kind='explicit'")

    def beta_value(self):
        a = as_float(self.alpha)
        if self.kind == "identity":
            return jnp.ones_like(a)
        if self.kind == "explicit":
            return as_float(self.beta)
        return jnp.sqrt(jnp.clip(1.0 - jnp.square(a), 0.0, 1.0))

    def weights(self):
        """(beta^2, alpha^2)."""
        return jnp.square(self.beta_value()), jnp.square(as_float(self.alpha))

    def children(self):
        return (self.branch,)

    def map_children(self, fn):
        return self.replace(branch=fn(self.branch))

    def prepare(self, ctx):
        return self.replace(branch=self.branch.prepare(ctx))

    def forward(self, k, ctx):
        b2, a2 = self.weights()
        f = self.branch.forward(k, ctx)
        return Kernel(b2 * k.q + a2 * f.q, b2 * k.p + a2 * f.p)

    def backward(self, k, g, ctx):
        b2, a2 = self.weights()
        f = self.branch.backward(k, g, ctx)
        return g.scale(b2) + f.scale(a2)

    def gram_forward(self, c, ctx):
        b2, a2 = self.weights()
        return b2 * c + a2 * self.branch.gram_forward(c, ctx)

    def gram_backward(self, c, g, ctx):
        b2, a2 = self.weights()
        return b2 * g + a2 * self.branch.gram_backward(c, g, ctx)

    def gram_step(self, c, x, ctx):
        b2, a2 = self.weights()
        cb, xb = self.branch.gram_step(c, x, ctx)
        return b2 * c + a2 * cb, b2 * x + a2 * xb

    def call(self, x, weights, causal):
        a = jnp.asarray(self.alpha, x.dtype)
        b = jnp.asarray(self.beta_value(), x.dtype)
        return b * x + a * self.branch.call(x, weights, causal)

    def module(self, weights="dense", causal=False, name=None):
        return BlockModule(self, causal=causal, weights=weights, name=name)
