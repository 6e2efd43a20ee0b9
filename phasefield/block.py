"""The transformer block of docs/theory.md §1 as a Flax module: the network of the ``paper``
preset of :mod:`phasefield.layers` (one definition per layer kind: its network and its
mean-field maps together, :mod:`phasefield.layers.attention`, :mod:`phasefield.layers.mlp`,
...). Used by the finite-width simulator (``phasefield.simulate``) and the ViT trainer
(``phasefield.vit``). Its initialisation is driven by the same
:class:`phasefield.HParams` pytree as the theory, and every numeric field may be a
traced value (so ``jax.vmap`` over hyperparameter points works through ``init``).

    Z  = beta_A X + alpha_A Attn(LN(X))
    X' = beta_M Z + alpha_M MLP(LN(Z))

with LN(x) = sqrt(d) x / |x| (no parameters, no mean subtraction) and
Attn(X) = softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V.

Its linear layers are a choice (``weights``, :mod:`phasefield.layers.weights`): ``"dense"``
trainable ``nn.Dense`` layers (the ViT; the simulator's reference path) or ``"lazy"``
lazily sampled Gaussian maps (``Block(hp, weights="lazy").apply({}, x, rngs={"lazy": key})``).
"""

from __future__ import annotations

from typing import Any

from flax import linen as nn

from .layers import registry
from .layers.weights import (  # noqa: F401
    LAZY_RNG,
    RANK_TOL,
    WEIGHTS,
    RandomLinear,
    check_weights,
    cotangent_root,
    normalize,
    random_linear,
    token_basis,
)


class Block(nn.Module):
    """One pre-norm block (the paper's Eq. 4). Input and output: ``[..., n, d]``.
    ``mlp_hidden``: the MLP's hidden width (default d)."""

    hp: Any  # the paper preset's numbers (phasefield.HParams)
    causal: bool = False
    mlp_hidden: int | None = None
    weights: str = "dense"  # "dense" (nn.Dense, trainable) or "lazy" (sampled, simulation)

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        mult = 1.0 if self.mlp_hidden is None else self.mlp_hidden / x.shape[-1]
        return registry.lookup("paper").builder(self.hp, mult=mult).call(x, self.weights, self.causal)
