"""The permutation-symmetric state a layer maps: token geometry forward, gradient Gram
backward (docs/theory.md §2, §7).

``Kernel(q, p)``  tokens' squared norm per component ``q = |x_i|^2 / d`` and dot product
                  ``p = x_i . x_j / d`` (i != j): the Gram ``C = (q - p) I + p 11^T``.
``Grad(a, b)``    the gradient Gram ``G = a I + b 11^T`` (diagonal ``a + b``, off-diagonal
                  ``b``) of the backpropagated cotangents.
``Context``       what every layer may read besides its own numbers: the token count n
                  (whether attention is causal is the attention layer's own static field,
                  :attr:`.attention.Attention.causal`).

All three are pytrees whose numbers are leaves, so ``vmap``/``jit``/``grad`` go through them.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Kernel:
    q: Any
    p: Any

    @property
    def rho(self):
        return self.p / self.q


@struct.dataclass
class Grad:
    a: Any
    b: Any

    @property
    def diag(self):
        return self.a + self.b

    @staticmethod
    def from_diag_off(diag, off) -> Grad:
        return Grad(diag - off, off)

    def scale(self, c) -> Grad:
        return Grad(c * self.a, c * self.b)

    def __add__(self, other: Grad) -> Grad:
        return Grad(self.a + other.a, self.b + other.b)


@struct.dataclass
class Context:
    n_tokens: Any = 32


def as_float(x):
    return jnp.asarray(x, jnp.result_type(float))
