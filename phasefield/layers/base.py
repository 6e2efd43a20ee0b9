"""The layer protocol and serial composition (in the manner of neural-tangents' stax: a
layer carries its network and its kernel maps together).

Every layer is a ``flax.struct`` dataclass: its sweepable numbers are pytree leaves
(``jit``/``vmap``/``grad`` apply to each), its structure is static. It provides

``forward(k, ctx) -> Kernel``        the mean-field map of the token geometry (q, p)
``backward(k, g, ctx) -> Grad``      the gradient Gram at its output -> at its input, for
                                     input geometry ``k`` (gradient independence: fresh
                                     weights backward, THEORY.md §7)
``module(weights, causal) -> nn.Module``  its Flax network: ``weights="dense"`` trainable
                                     (the ViT), ``"lazy"`` sampled for simulation
                                     (:mod:`phasefield.block`)
``prepare(ctx) -> layer``            the same layer with its tables built outside any trace
                                     (MLP Chebyshev tables, exact-attention grids); a no-op
                                     for layers without tables

:class:`Serial` composes layers; a block is a ``Serial`` and the presets
(:mod:`.presets`) are named compositions.
"""
from __future__ import annotations

from typing import Any, Tuple

import jax
from flax import linen as nn
from flax import struct

from .state import Context, Grad, Kernel


class Layer:
    """Mixin with the defaults of the protocol (see the module docstring)."""

    def prepare(self, ctx: Context):
        return self

    def forward(self, k: Kernel, ctx: Context) -> Kernel:   # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, k: Kernel, g: Grad, ctx: Context) -> Grad:   # pragma: no cover
        raise NotImplementedError

    def module(self, weights: str = "dense", causal: bool = False) -> nn.Module:   # pragma: no cover
        raise NotImplementedError

    def states(self, k: Kernel, ctx: Context):
        """The input state of every leaf layer and the output: ``(inputs, out)`` (a flat
        list); leaf layers give ``([k], forward(k))``."""
        return [k], self.forward(k, ctx)


@struct.dataclass
class Serial(Layer):
    """``layers[-1] o ... o layers[0]``."""

    layers: Tuple[Any, ...]

    def prepare(self, ctx):
        return self.replace(layers=tuple(layer.prepare(ctx) for layer in self.layers))

    def forward(self, k, ctx):
        for layer in self.layers:
            k = layer.forward(k, ctx)
        return k

    def backward(self, k, g, ctx):
        inputs = []
        for layer in self.layers:
            inputs.append(k)
            k = layer.forward(k, ctx)
        for layer, k_in in zip(reversed(self.layers), reversed(inputs)):
            g = layer.backward(k_in, g, ctx)
        return g

    def module(self, weights="dense", causal=False):
        return nn.Sequential([layer.module(weights, causal) for layer in self.layers])


def check_layer(layer) -> None:
    """TypeError unless ``layer`` follows the protocol."""
    for name in ("forward", "backward", "module", "prepare"):
        if not callable(getattr(layer, name, None)):
            raise TypeError(f"{type(layer).__name__} is not a phasefield layer (no {name}())")


def tree_leaves(layer):
    return jax.tree_util.tree_leaves(layer)
