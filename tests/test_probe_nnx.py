"""Flax NNX models in the probe: blocks found by class or path, a function of rngs or an
instance, the numbers equal to the same model written in Linen within their standard errors,
the fix on an NNX model, and the messages when blocks or initializers are missing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import phasefield

D, N, DEPTH = 32, 6, 3


class NBlock(nnx.Module):
    """normalize, tanh MLP with an output projection, residual"""

    def __init__(self, d, rngs):
        self.fc1 = nnx.Linear(d, d, rngs=rngs)
        self.out_proj = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x):
        h = x * jnp.sqrt(x.shape[-1]) / jnp.linalg.norm(x, axis=-1, keepdims=True)
        return x + self.out_proj(jnp.tanh(self.fc1(h)))


class NModel(nnx.Module):
    def __init__(self, rngs, d=D, depth=DEPTH):
        self.blocks = nnx.List([NBlock(d, rngs) for _ in range(depth)])

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class LBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = x * jnp.sqrt(x.shape[-1]) / jnp.linalg.norm(x, axis=-1, keepdims=True)
        return x + nn.Dense(x.shape[-1], name="out_proj")(jnp.tanh(nn.Dense(x.shape[-1], name="fc1")(h)))


class LModel(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(DEPTH):
            x = LBlock()(x)
        return x


X = jax.random.normal(jax.random.PRNGKey(0), (2, N, D))


def make(rngs):
    return NModel(rngs)


@pytest.mark.parametrize("blocks", [NBlock, "NBlock", r"blocks/\d+"])
def test_nnx_blocks_found_by_class_name_or_path(blocks):
    res = phasefield.probe(make, X, blocks=blocks, inits=4)
    assert res.depth == DEPTH and np.isfinite(res.angle_rate[0]) and np.isfinite(res.lambda_g_input[0])


def test_nnx_equals_linen_within_standard_errors():
    a = phasefield.probe(make, X, blocks=NBlock, inits=24)
    lm = LModel()
    b = phasefield.probe(lambda k: lm.init(k, X), lm.apply, X, blocks=LBlock, inits=24)
    for name in ("angle_rate", "lambda_g_input"):
        (va, sa), (vb, sb) = getattr(a, name), getattr(b, name)
        assert abs(va - vb) < 4 * np.hypot(sa, sb), (name, va, sa, vb, sb)
    for k in ("rho_data", "q_data"):
        d = np.abs(a.ds[k].values[1:] - b.ds[k].values[1:])
        se = np.hypot(a.ds[k + "_se"].values[1:], b.ds[k + "_se"].values[1:])
        assert np.all(d < 4 * se + 1e-6), (k, d, se)


def test_nnx_instance_without_initializers_is_refused():
    # flax 0.12's nnx.Linear keeps no initializer: one instance is one draw, and the message
    # says to pass the function of rngs instead
    with pytest.raises(ValueError, match=r"no initializer is kept for blocks/0/fc1/bias.*lambda rngs"):
        phasefield.probe(NModel(nnx.Rngs(3)), X, blocks=NBlock)


def test_nnx_missing_block_names_what_was_searched():
    with pytest.raises(
        ValueError,
        match=r"no block matching .Nope. \(searched 11 NNX modules: classes Linear, NBlock, List, NModel; paths blocks/0/fc1",
    ):
        phasefield.probe(make, X, blocks="Nope")


def test_nnx_model_is_fixed():
    res = phasefield.probe(
        make,
        X,
        blocks=NBlock,
        inits=4,
        fix=True,
        fix_options=dict(inits=2, verify_inits=8, residual=r"out_proj/kernel$"),
    )
    fx = res.fix
    assert set(fx) >= {"multipliers", "init_std", "after", "meets"}
    assert (
        "blocks/*/out_proj/kernel" in fx["init_std"]
        and fx["init_std"]["blocks/*/out_proj/kernel"]["residual_projection"]
    )
    assert fx["after"]["inits"] == 8 and np.isfinite(fx["after"]["angle_rate_se"])
    assert fx["meets"] == (fx["after"]["distance"] <= 1.0)
