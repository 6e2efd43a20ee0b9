"""The decoders' presets: ``gpt2`` is the causal pre-LN block at GPT-2's init (sigma =
0.02 sqrt(width), alpha = 1/sqrt(2 depth)), ``llama`` the causal RMSNorm/SwiGLU block at
Hugging Face's (sigma = 0.02 sqrt(width), alpha 1): the same blocks and numbers, bit for bit,
as the standard presets spelled with those numbers; the point commands start from their
embeddings' geometry unless given q0/rho0 (and say which they used); gpt2 is built for the
depth of the stack it is asked about. RoPE is the attention network's alone: its maps refuse
it, and it rotates each head's queries and keys by their positions."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phasefield
from phasefield.cli import main
from phasefield.cli import theory as cli_theory
from phasefield.layers import presets, registry, spec
from phasefield.layers.attention import Attention, rotary
from phasefield.layers.state import Context, Kernel

# the sizes and maps of tests/test_causal_option.py and tests/test_gram_layers.py: the same
# compiled programs (gpt2's block has pre-ln's structure there, llama's rms-swiglu's)
N, DEPTH, WIDTH = 6, 3, 256
PLAIN = "attention=paper,softmax_correction=false,heads=2"
LLAMA_PLAIN = "attention=paper,softmax_correction=false,heads=12"
SIGMA = 0.02 * math.sqrt(WIDTH)


def _same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_gpt2_is_pre_ln_at_gpt2_init_bit_for_bit():
    alpha = 1.0 / math.sqrt(2 * DEPTH)
    want_spec = f"pre-ln:sigma={SIGMA!r},alpha={alpha!r},{PLAIN},causal=true"
    assert spec.build(*spec.parse(f"gpt2:width={WIDTH},depth={DEPTH},{PLAIN}")) == spec.build(*spec.parse(want_spec))
    assert spec.build(*spec.parse("gpt2")) == spec.build(
        *spec.parse(f"pre-ln:sigma={presets.GPT2_SIGMA!r},causal=true,alpha={1 / math.sqrt(24)!r}")
    )
    # the stack's depth sets alpha (depth=DEPTH is the point's); the input is the embeddings'
    got = phasefield.exponents(f"gpt2:width={WIDTH},{PLAIN}", n_tokens=N, depth=DEPTH)
    want = phasefield.exponents(want_spec, n_tokens=N, depth=DEPTH, q0=8e-4, rho0=0.0)
    _same(got, want)
    assert np.all(np.isfinite(np.asarray(got["q_L_pos"]))) and np.all(np.isfinite(np.asarray(got["rho_L_pos"])))
    assert np.isfinite(float(got["angle_rate_last"])) and np.isfinite(float(got["lambda_g_last"]))
    # given q0/rho0 win over the preset's geometry
    other = phasefield.exponents(f"gpt2:width={WIDTH},{PLAIN}", n_tokens=N, depth=DEPTH, q0=1.0, rho0=0.5)
    _same(other, phasefield.exponents(want_spec, n_tokens=N, depth=DEPTH))
    assert not np.array_equal(np.asarray(other["q_L_pos"]), np.asarray(got["q_L_pos"]))


def test_llama_is_rms_swiglu_at_hf_init_bit_for_bit():
    want_spec = f"rms-swiglu:sigma={SIGMA!r},alpha=1,{LLAMA_PLAIN},causal=true"
    assert spec.build(*spec.parse(f"llama:width={WIDTH},{LLAMA_PLAIN}")) == spec.build(*spec.parse(want_spec))
    assert spec.build(*spec.parse("llama")) == spec.build(*spec.parse("rms-swiglu:sigma=1.28,heads=32,causal=true"))
    got = phasefield.exponents(f"llama:width={WIDTH},{LLAMA_PLAIN}", n_tokens=N, depth=DEPTH)
    _same(got, phasefield.exponents(want_spec, n_tokens=N, depth=DEPTH, q0=4e-4, rho0=0.0))


def test_the_presets_say_their_init_and_input():
    g, ll = registry.lookup("gpt2"), registry.lookup("llama")
    assert g.causal_default and ll.causal_default and g.stack_depth == "depth" and ll.stack_depth is None
    assert g.defaults["sigma"] == presets.GPT2_SIGMA and g.defaults["alpha"] == 1 / math.sqrt(24)
    assert ll.defaults["sigma"] == 0.02 * 64 and ll.defaults["alpha"] == 1.0 and ll.default_heads == 32
    assert g.defaults_for({"width": 1024, "depth": 24})["alpha"] == 1 / math.sqrt(48)
    assert g.geometry({}) == presets.GPT2_INPUT == (8e-4, 0.0) and ll.geometry({}) == presets.LLAMA_INPUT == (4e-4, 0.0)
    assert registry.lookup("pre-ln").geometry({}) is None and not registry.lookup("pre-ln").causal_default
    # the CLI's help (written out: --help imports no JAX) says the same numbers
    assert "gpt2: 8e-4 and 0, llama: 4e-4 and 0" in cli_theory.GEOMETRY_HELP
    assert spec.build("gpt2", {"causal": False}) == spec.build(
        *spec.parse(f"pre-ln:sigma={presets.GPT2_SIGMA!r},alpha={1 / math.sqrt(24)!r}")
    )
    with pytest.raises(ValueError, match="width must lie in"):
        spec.parse("gpt2:width=0")


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_point_commands_use_and_report_the_input(capsys):
    size = ("--n-tokens", str(N), "--depth", str(DEPTH))
    res = _json(capsys, "exponents", "--block", f"gpt2:width={WIDTH},{PLAIN}", *size, "--json")
    assert (res["q0"], res["rho0"], res["causal"], res["block_depth"]) == (8e-4, 0.0, True, DEPTH)
    res = _json(capsys, "exponents", "--block", f"gpt2:width={WIDTH},{PLAIN}", *size, "--q0", "1", "--json")
    assert (res["q0"], res["rho0"]) == (1.0, 0.0)
    # causal=false: the (q, p) route, from the same input
    res = _json(capsys, "exponents", "--block", f"gpt2:width={WIDTH},causal=false,{PLAIN}", *size, "--json")
    assert (res["q0"], res["rho0"], res["causal"]) == (8e-4, 0.0, False) and res["q"][0] == 8e-4
    assert np.isfinite(res["angle_rate"]) and np.isfinite(res["lambda_g_input"])
    traj = _json(capsys, "trajectory", "--block", f"llama:width={WIDTH},{LLAMA_PLAIN}", *size, "--json")
    assert (traj["q0"], traj["rho0"]) == (4e-4, 0.0) and traj["q_pos"][0] == [4e-4] * N
    traj = _json(
        capsys, "trajectory", "--block", f"llama:width={WIDTH},{LLAMA_PLAIN}", *size, "--rho0", "0.2", "--json"
    )
    assert (traj["q0"], traj["rho0"]) == (4e-4, 0.2)
    # a preset without its own input keeps the old defaults
    traj = _json(capsys, "trajectory", "--block", f"pre-ln:{PLAIN}", *size, "--json")
    assert (traj["q0"], traj["rho0"]) == (1.0, 0.3)


def test_commands_without_per_position_results_refuse_the_causal_default(capsys, tmp_path):
    """The ViT's training sweep (a bidirectional ViT) refuses a decoder's preset; a simulated
    grid of it checks its network's sizes before any work."""
    out = tmp_path / "o.nc"
    rc = main(["train-sweep", "--block", "gpt2", "--axis", "sigma=0.5:1:2", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "gpt2 is causal unless spelled gpt2:causal=false" in err and len(err.strip().splitlines()) == 1
    rc = main(["simulate", "sweep", "--block", "gpt2", "--axis", "sigma=0.5:1:2", "--width", "100", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "phasefield: error: width 100 is not a multiple of heads 12", err
    assert not list(tmp_path.iterdir())


# ---- RoPE: the attention network's alone ------------------------------------------------------


def test_rotary_keeps_norms_and_reads_relative_positions():
    x = jax.random.normal(jax.random.key(0), (6, 2, 8))
    r = rotary(x)
    np.testing.assert_allclose(jnp.linalg.norm(r, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(r[0], x[0], rtol=0, atol=0)  # position 0: no rotation
    # one query vector and one key vector at positions (t, s): the logit depends on t - s
    q = jnp.broadcast_to(x[0], x.shape)
    k = jnp.broadcast_to(x[1], x.shape)
    rq, rk = rotary(q), rotary(k)
    dots = jnp.einsum("thd,shd->hts", rq, rk)
    np.testing.assert_allclose(dots[:, 3, 1], dots[:, 5, 3], rtol=1e-5)
    np.testing.assert_allclose(dots[:, 2, 2], jnp.einsum("hd,hd->h", x[0], x[1]), rtol=1e-5)
    assert float(jnp.max(jnp.abs(dots[:, 3, 1] - dots[:, 3, 3]))) > 1e-2
    with pytest.raises(ValueError, match="even head dimension"):
        rotary(x[..., :7])


def test_rope_is_network_only():
    att = Attention(sigma_a=1.0, heads=2, rope=True)
    k, ctx = Kernel(jnp.asarray(1.0), jnp.asarray(0.3)), Context(4.0)
    with pytest.raises(ValueError, match="rope=True has no mean-field map"):
        att.forward(k, ctx)
    with pytest.raises(ValueError, match="rope=True has no mean-field map"):
        att.gram_forward(jnp.eye(4), ctx)
    x = jax.random.normal(jax.random.key(1), (5, 16))
    on = att.replace(causal=True)
    out, params = on.module("dense").init_with_output(jax.random.key(2), x)
    off = on.replace(rope=False).module("dense").apply(params, x)  # the same weights, no rotation
    np.testing.assert_allclose(out[0], off[0], rtol=1e-6, atol=1e-7)  # the first token reads itself only
    assert float(jnp.max(jnp.abs(out[1:] - off[1:]))) > 1e-3
