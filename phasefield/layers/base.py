"""The layer protocol and serial composition (in the manner of neural-tangents' stax: a
layer carries its network and its kernel maps together).

Every layer is a ``flax.struct`` dataclass: its sweepable numbers are pytree leaves
(``jit``/``vmap``/``grad`` apply to each), its structure is static. It provides

``forward(k, ctx) -> Kernel``        the mean-field map of the token geometry (q, p)
``backward(k, g, ctx) -> Grad``      the gradient Gram at its output -> at its input, for
                                     input geometry ``k`` (gradient independence: fresh
                                     weights backward, docs/theory.md §7)
``module(weights, causal) -> nn.Module``  its Flax network: ``weights="dense"`` trainable
                                     (the ViT), ``"lazy"`` sampled for simulation
                                     (:mod:`.weights`); a composition's is one
                                     :class:`BlockModule` whose children are its leaf
                                     layers' modules (named by a layer's ``name``)
``call(x, weights, causal)``         the network applied inside the calling compact module
``prepare(ctx) -> layer``            the same layer with its tables built outside any trace
                                     (MLP Chebyshev tables, exact-attention grids); a no-op
                                     for layers without tables

:class:`Serial` composes layers; a block is a ``Serial`` and the presets
(:mod:`.presets`) are named compositions.
"""

from __future__ import annotations

from typing import Any

from flax import linen as nn
from flax import struct

from .state import Context, Grad, Kernel
from .weights import check_weights


class Layer:
    """Mixin with the defaults of the protocol (see the module docstring)."""

    def prepare(self, ctx: Context):
        return self

    def forward(self, k: Kernel, ctx: Context) -> Kernel:  # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, k: Kernel, g: Grad, ctx: Context) -> Grad:  # pragma: no cover
        raise NotImplementedError

    def module(self, weights: str = "dense", causal: bool = False, name=None) -> nn.Module:  # pragma: no cover
        raise NotImplementedError

    def call(self, x, weights: str, causal: bool):
        """Its network on ``x`` inside the calling compact module: a leaf layer creates its
        module there (named by its ``name`` field where it has one); containers compose
        their layers' calls inline, adding no Flax scope of their own. (A layer written
        against the older protocol, ``module(weights, causal)`` without ``name``, still works
        unnamed.)"""
        name = getattr(self, "name", None)
        return self.module(weights, causal, **({} if name is None else {"name": name}))(x)

    def states(self, k: Kernel, ctx: Context):
        """The input state of every leaf layer and the output: ``(inputs, out)`` (a flat
        list); leaf layers give ``([k], forward(k))``."""
        return [k], self.forward(k, ctx)


@struct.dataclass
class Serial(Layer):
    """``layers[-1] o ... o layers[0]``."""

    layers: tuple[Any, ...]

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

    def call(self, x, weights, causal):
        for layer in self.layers:
            x = layer.call(x, weights, causal)
        return x

    def module(self, weights="dense", causal=False, name=None):
        return BlockModule(self, causal=causal, weights=weights, name=name)


class BlockModule(nn.Module):
    """The Flax network of a composition of layers (a block): the leaf layers' modules are
    its children, in call order. One definition for the simulator (``weights="lazy"``), the
    ViT and the probe (``"dense"``); the paper's :class:`phasefield.block.Block` is this
    network of the ``paper`` preset."""

    layer: Any
    causal: bool = False
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        return self.layer.call(x, self.weights, self.causal)


def check_layer(layer) -> None:
    """TypeError unless ``layer`` follows the protocol."""
    for name in ("forward", "backward", "module", "prepare"):
        if not callable(getattr(layer, name, None)):
            raise TypeError(f"{type(layer).__name__} is not a phasefield layer (no {name}())")
