"""The causal character-level language model: bytes -> token embedding + learned position
embedding -> ``depth`` phasefield blocks with the causal mask -> final LayerNorm (where the
block does not end in one) -> a dense head over the 256 byte values.

    block = layers.spec.build("pre-ln", {"heads": 4})
    model = CharLM(block=block, width=128, depth=32, n=64)
    logits = model.apply({"params": params}, tokens)        # [B, n] int -> [B, n, 256]

The blocks are the layers block's own Flax network (``block.module("dense", causal=True)``,
the network the simulator and the probe use), stacked with ``nn.scan`` as in the ViT (one
compiled block body; the parameters have a leading depth axis, under ``blocks/block``).

Normalizations at the ends, by the block's structure (:func:`ends_in_norm`):

* a block that does not end in a normalization (pre-LN, GPT-2, LLaMA, DyT, ...): the stack's
  output goes through a final LayerNorm before the head (GPT-2's ``ln_f``);
* a block that ends in one (post-LN): its output is already normalized, so no final norm;
  its first block reads normalized embeddings (BERT's embedding LayerNorm), since a post-LN
  block's branches expect the previous block's normalized output.

Initialization: token embeddings ~ N(0, embed_std^2), position embeddings ~ N(0,
pos_std^2) per component, the head's kernel ~ N(0, head_std^2 / width) (its logits have
variance head_std^2 after a LayerNorm), the blocks as the preset draws them.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from .data import VOCAB


def ends_in_norm(block) -> bool:
    """Whether the block's last layer is a normalization (post-LN)."""
    from ..layers.norm import Norm

    layers = getattr(block, "layers", None)
    return bool(layers) and isinstance(layers[-1], Norm)


class _Layer(nn.Module):
    block: Any

    @nn.compact
    def __call__(self, x, _):
        return self.block.module("dense", causal=True, name="block")(x), None


class CharLM(nn.Module):
    """Causal byte-level language model of ``depth`` copies of a phasefield block."""

    block: Any
    width: int = 128
    depth: int = 4
    n: int = 64  # the context: the most positions it reads
    embed_std: float = 1.0
    pos_std: float = 1.0
    head_std: float = 1.0

    @nn.compact
    def __call__(self, tokens):
        t = tokens.shape[-1]
        d = self.width
        x = nn.Embed(VOCAB, d, embedding_init=nn.initializers.normal(self.embed_std), name="embed")(tokens)
        pos = self.param("pos_embedding", nn.initializers.normal(self.pos_std), (self.n, d), jnp.float32)
        x = x + pos[:t].astype(x.dtype)
        post_ln = ends_in_norm(self.block)
        if post_ln:
            x = nn.LayerNorm(name="embed_norm")(x)
        scan = nn.scan(_Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.depth)
        x, _ = scan(self.block, name="blocks")(x, None)
        if not post_ln:
            x = nn.LayerNorm(name="ln_f")(x)
        head = nn.initializers.normal(self.head_std / d**0.5)
        return nn.Dense(VOCAB, kernel_init=head, name="head")(x)
