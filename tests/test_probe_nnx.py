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
from phasefield.probing.paths import groups

D, N, DEPTH = 32, 6, 3
INITS = 24  # every probe of make(): one program (the scan over the inits' keys), compiled once


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


@pytest.fixture(scope="module")
def probe_make():
    """``blocks -> phasefield.probe(make, X, blocks=blocks, inits=INITS)``, each once per
    module (the NBlock class's probe serves both tests below)."""
    done = {}

    def run(blocks):
        if blocks not in done:
            done[blocks] = phasefield.probe(make, X, blocks=blocks, inits=INITS)
        return done[blocks]

    return run


@pytest.mark.parametrize("blocks", [NBlock, "NBlock", r"blocks/\d+"])
def test_nnx_blocks_found_by_class_name_or_path(blocks, probe_make):
    res = probe_make(blocks)
    assert res.depth == DEPTH and np.isfinite(res.angle_rate[0]) and np.isfinite(res.lambda_g_input[0])


def test_nnx_equals_linen_within_standard_errors(probe_make):
    a = probe_make(NBlock)
    lm = LModel()
    b = phasefield.probe(lambda k: lm.init(k, X), lm.apply, X, blocks=LBlock, inits=INITS)
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


class FBlock(nnx.Module):
    """pre-LN from Flax's own layers only: nnx.LayerNorm, nnx.MultiHeadAttention, two nnx.Linear"""

    def __init__(self, d, rngs):
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, d, rngs=rngs)
        self.down = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


# one block: the fix compiles three programs of this model (probe, search, check), each
# about half the work to trace and compile of two blocks'; the grouping of several blocks'
# NNX paths is checked on this model's paths below
F_DEPTH = 1


def test_flax_layers_model_is_fixed_with_the_default_names():
    """The attention's ``out`` is found by its query/key neighbours (no regex); the MLP's
    ``down`` is no default name, so it is one of the MLP's matrices. Pre-LN: DeepNorm does
    not apply, and says why; the other recipes are measured."""
    res = phasefield.probe(
        lambda rngs: nnx.Sequential(*[FBlock(D, rngs) for _ in range(F_DEPTH)]),
        X,
        blocks=FBlock,
        inits=4,
        fix=True,
        fix_options=dict(inits=2, verify_inits=8, recipes=["deepnorm", "gpt2", "rezero", "small-std"]),
    )
    fx = res.fix
    std = fx["init_std"]
    assert std["layers/0/attn/out/kernel"]["residual_projection"]
    assert not std["layers/0/down/kernel"]["residual_projection"]
    assert fx["roles"]["layers/0/attn/value/kernel"] == "value" and fx["roles"]["layers/0/up/kernel"] == "mlp"
    # NNX's block index is a path component of its own: two blocks' paths are one group
    two = list(std) + [p.replace("layers/0/", "layers/1/") for p in std]
    g = groups(two)
    assert g["layers/0/attn/out/kernel"] == g["layers/1/attn/out/kernel"] == "layers/*/attn/out/kernel"
    assert fx["after"]["inits"] == 8 and np.isfinite(fx["after"]["angle_rate_se"])
    assert fx["meets"] == (fx["after"]["distance"] <= 1.0)
    arms = {r["name"]: r for r in fx["recipes"]}
    assert list(arms) == ["deepnorm", "gpt2", "rezero", "small-std"]
    assert not arms["deepnorm"]["applicable"] and "pre-LN" in arms["deepnorm"]["reason"]
    assert arms["deepnorm"]["after"] is None and fx["search"]["normalized_spread"] > 1e-2
    for name in ("gpt2", "rezero", "small-std"):
        a = arms[name]["after"]
        assert a["inits"] == 8 and np.isfinite(a["angle_rate"]) and arms[name]["meets"] == (a["distance"] <= 1.0)
    # ReZero: the attention's out (the residual projection found) at 0, so only the MLP branch
    # acts; GPT-2: every matrix at std 0.02 -> its multiplier is 0.02 over the std as drawn
    assert arms["rezero"]["multipliers"] == {"attn_out": 0.0}
    m = arms["gpt2"]["multipliers"]["attn_out"]
    assert m == pytest.approx(0.02 / np.sqrt(2 * F_DEPTH) / std["layers/0/attn/out/kernel"]["before"], rel=1e-6)
