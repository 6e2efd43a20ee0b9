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
``gram_forward(c, ctx) -> C'``       the full-Gram map (docs/theory.md §8): the n x n Gram
                                     ``c`` of its input tokens -> of its output (:mod:`.gram`)
``gram_backward(c, g, ctx) -> G``    the gradient Gram ``g`` [n, n] at its output -> at its
                                     input, for input Gram ``c``
``gram_step(c, x, ctx) -> (C', X')`` the forward map and the backward map's adjoint at ``x``
                                     (default: its vector-Jacobian product; containers compose)

The Gram maps read ``n`` from the shape of ``c``; the mask is the attention layer's static
field ``causal`` (attention to the keys j <= i; :func:`masked` sets it on every layer that
has the field, :func:`is_causal` reads it); with ``c = (q - p) I + p 11^T`` and no mask
they are the (q, p) maps. A map that holds only where two tokens' norms are equal (an MLP's tables, DyT's
rules) gives NaN for a pair (i, k) with ``C_ii != C_kk``, never another pair's answer.

and what a block sweep (:mod:`.sweep`) asks of it, whose defaults answer for a leaf
without tables (``prepare_for`` builds the kernel of a layer that has one):

``children()``, ``map_children(fn)`` a container's sub-layers, and the container with ``fn``
                                     applied to each (``()`` and itself for a leaf)
``logit_scale()``                    the logit scale its attention tables are built for
                                     (None: no logits)
``logit_tables()``                   whether its maps read tables on the logit scale, which
                                     a sweep builds once per distinct scale
``logit_grid()``                     whether its maps integrate on a logit grid (with or
                                     without those tables: the sweep's chunk size)
``with_logit_tables(s, t, interp, interp_t)``  the layer reading those tables' values
``kernel_scale()``                   the input scale its Gaussian-integral kernel is built
                                     for (None: no kernel)
``kernel_at(scale, sigma_max)``      that kernel at another (possibly traced) input scale,
                                     from its static fields alone
``with_kernel(kern)``                the layer reading the kernel ``kern``
``prepare_for(ctx, logit_max, kernel_max)``  :meth:`prepare` with tables sized for every
                                     scale up to these: callable under a trace, and every
                                     layer so prepared has the same pytree structure

:class:`Serial` composes layers; a block is a ``Serial`` and the presets
(:mod:`.presets`) are named compositions.
"""

from __future__ import annotations

from typing import Any

import jax
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

    def gram_forward(self, c, ctx: Context):
        raise NotImplementedError(f"{type(self).__name__} has no Gram maps (gram_forward)")

    def gram_backward(self, c, g, ctx: Context):
        raise NotImplementedError(f"{type(self).__name__} has no Gram maps (gram_backward)")

    def gram_step(self, c, x, ctx: Context):
        """``(gram_forward(c), B_c^T(x))``: the output Gram and the adjoint of the backward map
        ``g -> gram_backward(c, g)`` (linear in ``g``; Frobenius inner product) at ``x``, which
        carries a gradient component forward through a stack (:func:`.gram.forward_adjoint`).
        Here the adjoint is the backward map's vector-Jacobian product; a layer that can share
        work between the two maps overrides it (the exact attention: one draw of its fields)."""
        _, vjp = jax.vjp(lambda g: self.gram_backward(c, g, ctx), x)
        return self.gram_forward(c, ctx), vjp(x)[0]

    def states(self, k: Kernel, ctx: Context):
        """The input state of every leaf layer and the output: ``(inputs, out)`` (a flat
        list); leaf layers give ``([k], forward(k))``."""
        return [k], self.forward(k, ctx)

    # ---- what a block sweep asks (:mod:`.sweep`) -----------------------------------------
    def children(self) -> tuple:
        """Its sub-layers: ``()`` for a leaf layer."""
        return ()

    def map_children(self, fn):
        """The layer with ``fn`` applied to each of its sub-layers."""
        return self

    def logit_scale(self):
        """The scale of its attention logits on normalized tokens, the number its logit
        tables are built for (None: a layer without logits)."""
        return None

    def logit_tables(self) -> bool:
        """Whether its maps read tables on the logit scale (built per distinct
        :meth:`logit_scale` by a block sweep)."""
        return False

    def logit_grid(self) -> bool:
        """Whether its maps integrate on a logit grid (the exact map, the softmax term), tables
        or not: ~30 MB a point where they integrate per point (a sweep's chunk)."""
        return self.logit_tables()

    def with_logit_tables(self, s, t, interp: bool, interp_t: bool):
        """The layer reading the logit tables' values ``s`` and ``t`` (a sweep point's,
        :func:`.sweep.mesh_tables`; ``interp``, ``interp_t``: their interpolants are exact)."""
        return self

    def kernel_scale(self):
        """The input scale its Gaussian-integral kernel is built for (None: no kernel)."""
        return None

    def kernel_at(self, scale, sigma_max):
        """Its kernel at input scale ``scale`` (may be traced), tables sized for scales up
        to ``sigma_max``; reads the static fields alone (a sweep builds it per distinct
        scale)."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")

    def with_kernel(self, kern):
        """The layer reading the kernel ``kern``."""
        return self

    def prepare_for(self, ctx: Context, logit_max, kernel_max):
        """:meth:`prepare` with its tables sized for logit scales up to ``logit_max`` and
        input scales up to ``kernel_max``, not for its own numbers: callable under a trace,
        and every layer so prepared has the same pytree structure."""
        scale = self.kernel_scale()
        if scale is None:
            return self.prepare(ctx)
        return self.with_kernel(self.kernel_at(scale, kernel_max))


@struct.dataclass
class Serial(Layer):
    """``layers[-1] o ... o layers[0]``."""

    layers: tuple[Any, ...]

    def children(self):
        return self.layers

    def map_children(self, fn):
        return self.replace(layers=tuple(fn(layer) for layer in self.layers))

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

    def gram_forward(self, c, ctx):
        for layer in self.layers:
            c = layer.gram_forward(c, ctx)
        return c

    def gram_step(self, c, x, ctx):
        for layer in self.layers:  # the adjoint of the backward composition: forward order
            c, x = layer.gram_step(c, x, ctx)
        return c, x

    def gram_backward(self, c, g, ctx):
        inputs = []
        for layer in self.layers:
            inputs.append(c)
            c = layer.gram_forward(c, ctx)
        for layer, c_in in zip(reversed(self.layers), reversed(inputs)):
            g = layer.gram_backward(c_in, g, ctx)
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


def _has_mask(layer) -> bool:
    """Whether ``layer`` carries a mask: a static field ``causal`` (attention)."""
    return "causal" in getattr(layer, "__dataclass_fields__", {})


def masked(layer, causal: bool = True):
    """``layer`` with every attention in it causal (``causal=False``: none): each leaf layer
    with the static field ``causal`` (:class:`.attention.Attention` and its variants) set,
    through ``map_children``."""
    if _children(layer):
        return layer.map_children(lambda child: masked(child, causal))
    return layer.replace(causal=bool(causal)) if _has_mask(layer) else layer


def is_causal(layer) -> bool:
    """Whether any attention in ``layer`` is causal."""
    kids = _children(layer)
    if kids:
        return any(is_causal(child) for child in kids)
    return _has_mask(layer) and bool(layer.causal)


def _children(layer) -> tuple:
    """``layer.children()``, or none for a layer without the method (the older protocol)."""
    children = getattr(layer, "children", None)
    return tuple(children()) if callable(children) else ()


def check_layer(layer) -> None:
    """TypeError unless ``layer`` follows the protocol."""
    for name in ("forward", "backward", "module", "prepare"):
        if not callable(getattr(layer, name, None)):
            raise TypeError(f"{type(layer).__name__} is not a phasefield layer (no {name}())")
