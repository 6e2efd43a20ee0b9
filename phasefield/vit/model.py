"""The vision transformer of the paper's App. D, built from the shared block.

    patches [B, P, patch_dim] --Dense--> tokens [B, P, d] + learned positional embeddings
    prepend the class token (its own learned positional embedding, zero content)
    -> ``depth`` x :class:`phasefield.block.Block` (docs/theory.md §1, the same module the
       simulator uses, initialised from sigma_w, sigma_A, alpha_A, alpha_M of ``hp``), or
       ``depth`` x the module of ``block``, any :mod:`phasefield.layers` block
    -> LN(class token) -> Dense -> logits

The blocks are stacked with ``nn.scan`` (one compiled block body, parameters with a leading
depth axis), so a 16-block model compiles as fast as a 1-block one. Every numeric field of
``hp`` may be a traced value: ``jax.vmap`` of ``init``/``apply`` over hyperparameter points
works.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from .. import HParams
from ..block import Block, normalize


class _Layer(nn.Module):
    """Adapter giving the block the ``(carry, out)`` signature of ``nn.scan``: the shared
    :class:`Block` of ``hp``, or the Flax module of a :mod:`phasefield.layers` block (the
    module the simulator and the probe use)."""

    hp: HParams
    mlp_hidden: int | None = None
    block: Any = None

    @nn.compact
    def __call__(self, x, _):
        if self.block is not None:
            return self.block.module("dense", name="block")(x), None
        return Block(self.hp, mlp_hidden=self.mlp_hidden, name="block")(x), None


class ViT(nn.Module):
    """ViT classifier. ``depth`` is static here (``hp.depth`` is only used by the theory)."""

    hp: HParams
    num_classes: int
    width: int = 64
    depth: int = 16
    mlp_hidden: int | None = None
    pos_std: float = 1.0  # positional embeddings ~ N(0, pos_std^2): "initialized at random"
    block: Any = None  # a phasefield.layers block (pre-ln, post-ln, ...): replaces hp's paper block

    @nn.compact
    def __call__(self, patches):
        b, p, _ = patches.shape
        d = self.width
        x = nn.Dense(d, name="embed")(patches)
        init = nn.initializers.normal(self.pos_std)
        pos = self.param("pos_embedding", init, (p, d), jnp.float32)
        cls = self.param("cls_pos_embedding", init, (1, d), jnp.float32)
        x = x + pos.astype(x.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (b, 1, d)), x], axis=1)
        scan = nn.scan(_Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.depth)
        x, _ = scan(self.hp, self.mlp_hidden, self.block, name="blocks")(x, None)
        return nn.Dense(self.num_classes, name="head")(normalize(x[:, 0]))


def patchify(images, patch_size: int):
    """[B, H, W, C] -> [B, (H/p)(W/p), p*p*C], row-major over patches; a 1-D signal
    ([B, H, 1, C], e.g. MNIST-1D) -> [B, H/p, p*C]."""
    b, h, w, c = images.shape
    ph, pw = (patch_size if h > 1 else 1), (patch_size if w > 1 else 1)
    x = images.reshape(b, h // ph, ph, w // pw, pw, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // ph) * (w // pw), ph * pw * c)


def unpatchify(patches, image_size: int, patch_size: int, channels: int):
    """Inverse of :func:`patchify`."""
    b = patches.shape[0]
    g, p = image_size // patch_size, patch_size
    x = patches.reshape(b, g, g, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, image_size, image_size, channels)


def preprocess(images, scale, patch_size: int):
    """The paper's preprocessing of already-resized images: x/scale -> (x - .5) * 2 -> patches."""
    x = jnp.asarray(images).astype(jnp.float32) / jnp.float32(scale)
    return patchify((x - 0.5) * 2.0, patch_size)


def n_tokens(image_size: int, patch_size: int, dims: int = 2) -> int:
    """Tokens seen by the blocks: patches + the class token (the theory's n); ``dims`` 1 for
    a 1-D signal of ``image_size`` samples."""
    return (image_size // patch_size) ** dims + 1
