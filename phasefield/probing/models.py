"""Ready-made models for the probe: a stack of one of phasefield's blocks (a preset of
:mod:`phasefield.layers.presets`, or any block), with the theory beside it.

    m = models.preset("pre-ln", depth=8, width=1024, n_tokens=16, sigma=0.55, alpha=0.2)
    phasefield.probe(m, inits=32)

``weights="dense"`` draws every weight matrix (``init_fn`` = the Flax init);
``weights="lazy"`` samples the same Gaussian maps lazily (``phasefield.block``: exact in
distribution, O(n^2 d) per map instead of O(n d^2), the params are a key).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import linen as nn

from .. import HParams, layers
from ..block import LAZY_RNG, check_weights
from ..layers import registry
from .geometry import symmetric_tokens
from .model import Model

Q0, RHO0 = 1.0, 0.5


class _Block(nn.Module):
    layer: Any
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        return self.layer.module(self.weights)(x)


class Stack(nn.Module):
    """``depth`` blocks ``block_0 .. block_{L-1}`` of one phasefield block, independent weights."""

    layer: Any
    depth: int
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            x = _Block(self.layer, self.weights, name=f"block_{i}")(x)
        return x


def stack(
    block,
    depth: int = 8,
    width: int = 256,
    n_tokens: int = 16,
    batch: int = 1,
    weights: str = "dense",
    q0: float = Q0,
    rho0: float = RHO0,
    seed: int = 0,
    name: str = "phasefield block",
) -> Model:
    """A :class:`Model` of ``depth`` copies of ``block`` on ``batch`` sequences of permutation-
    symmetric tokens at (q0, rho0) (one fixed draw, ``seed``); causal where ``block`` is
    masked (``NAME:causal=true``, the decoders' presets)."""
    check_weights(weights)
    for what, v, lo in (("depth", depth, 1), ("width", width, 2), ("n_tokens", n_tokens, 2), ("batch", batch, 1)):
        if int(v) != v or v < lo:
            raise ValueError(f"{what} must be an integer >= {lo}, got {v}")
    layers.check_layer(block)
    x = symmetric_tokens(jax.random.PRNGKey(seed), (batch, n_tokens, width), q0, rho0)
    mod = Stack(block, int(depth), weights)
    if weights == "dense":
        init_fn = lambda k: mod.init(k, x)
        apply_fn = lambda p, xx: mod.apply(p, xx)
    else:
        init_fn = lambda k: k
        apply_fn = lambda k, xx: mod.apply({}, xx, rngs={LAZY_RNG: k})
    return Model(init_fn, apply_fn, x, blocks=r"block_\d+", block=block, name=name, causal=layers.is_causal(block))


def preset(
    name: str = "paper",
    depth: int = 8,
    width: int = 256,
    n_tokens: int = 16,
    batch: int = 1,
    weights: str = "dense",
    q0: float = Q0,
    rho0: float = RHO0,
    seed: int = 0,
    hp: HParams | None = None,
    **numbers,
) -> Model:
    """:func:`stack` of the preset ``name`` (``paper``, whose numbers are one object, from
    ``hp``, by default its preset's ``network_defaults``; the others from keyword numbers such
    as ``sigma``, ``alpha``, ``heads``, ``causal``; ``deepscalelm`` scales its residuals for this
    ``depth``; ``gpt2`` and ``llama`` are causal unless ``causal=False``, at this ``width``'s
    std 0.02)."""
    p = registry.lookup(name)
    if p.stack_depth is not None:  # the block's numbers follow the stack's depth
        numbers.setdefault(p.stack_depth, depth)
    if "width" in p.options:  # a decoder's init std is 0.02 at the network's width
        numbers.setdefault("width", width)
    if p.causal_default and p.numbers_class is None:  # a decoder: causal unless causal=False
        numbers.setdefault("causal", True)
    if numbers.get("causal"):
        from ..layers import spec

        spec.check(name, {"causal": True})  # a preset without a causal theory (dyt) says so
    if p.numbers_class is not None and hp is None:
        hp = p.numbers_class(**p.network_defaults)  # the theory of the network (its softmax path)
    block = layers.presets.get(name, hp, **numbers)
    label = name + "".join(f" {k}={v}" for k, v in numbers.items())
    m = stack(block, depth, width, n_tokens, batch, weights, q0, rho0, seed, name=label)
    m.spec = (name, dataclasses.asdict(hp) if p.numbers_class is not None else dict(numbers))
    return m
