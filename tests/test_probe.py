"""phasefield.probe and its package phasefield.probing: finding blocks in any Flax model, the measurements against independent
routes, the probe against the theory on phasefield's own blocks, bad input, the CLI, the
ViT's input geometry through the probe, and Hugging Face models (skipped without
transformers)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import phasefield
from phasefield import HParams, layers
from phasefield.probing import capture, geometry, measure, models, theory
from phasefield.probing import probe as probe_fn


class Blk(nn.Module):
    @nn.compact
    def __call__(self, x, scale=1.0):
        return x + scale * jnp.tanh(nn.Dense(x.shape[-1], name="w")(x))


class Net(nn.Module):
    depth: int = 3
    nan_at: int = -1

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(11, 8, name="embed")(ids)
        for i in range(self.depth):
            x = Blk(name=f"layer_{i}")(x, scale=0.5)
            if i == self.nan_at:
                x = x * jnp.nan
        return nn.Dense(2, name="head")(x)


IDS = jnp.arange(12).reshape(2, 6) % 11


def _net(**kw):
    net = Net(**kw)
    return net, (lambda k: net.init(k, IDS)), (lambda p, x: net.apply(p, x))


def _by_hand(params, depth=3):
    """The same network's per-block tokens, written out."""
    p = params["params"]
    x = p["embed"]["embedding"][IDS]
    xs = [x]
    for i in range(depth):
        w = p[f"layer_{i}"]["w"]
        x = x + 0.5 * jnp.tanh(x @ w["kernel"] + w["bias"])
        xs.append(x)
    return xs


@pytest.mark.parametrize(
    "blocks", [Blk, "Blk", r"layer_\d+", lambda m, meth: meth == "__call__" and isinstance(m, Blk)]
)
def test_blocks_are_found_by_class_name_path_or_filter(blocks):
    _, init, apply = _net()
    params = init(jax.random.PRNGKey(0))
    x0, outs = capture.runner(apply, IDS, blocks=blocks)(params)
    ref = _by_hand(params)
    np.testing.assert_allclose(x0, ref[0], rtol=1e-6)
    np.testing.assert_allclose(outs, jnp.stack(ref[1:]), rtol=1e-5, atol=1e-6)


def test_injected_tokens_replace_the_first_blocks_input():
    _, init, apply = _net()
    params = init(jax.random.PRNGKey(1))
    z = jax.random.normal(jax.random.PRNGKey(2), (2, 6, 8))
    x0, outs = capture.runner(apply, IDS, blocks=Blk)(params, z)
    p = params["params"]
    x = z
    for i in range(3):
        x = x + 0.5 * jnp.tanh(x @ p[f"layer_{i}"]["w"]["kernel"] + p[f"layer_{i}"]["w"]["bias"])
    np.testing.assert_allclose(x0, z)
    np.testing.assert_allclose(outs[-1], x, rtol=1e-5, atol=1e-6)


def test_a_model_without_the_named_blocks_is_a_value_error():
    _, init, apply = _net()
    with pytest.raises(ValueError, match="no block matching"):
        phasefield.probe(init, apply, IDS, blocks="NoSuchBlock", inits=2)


def test_nan_outputs_are_a_value_error_naming_the_block():
    _, init, apply = _net(nan_at=1)
    with pytest.raises(ValueError, match="not finite.*after block 3 of 3"):
        phasefield.probe(init, apply, IDS, blocks=Blk, inits=2)


def test_probe_is_the_function_and_a_stack_callable_works_too():
    assert phasefield.probe is probe_fn
    _, init, apply = _net()
    params = init(jax.random.PRNGKey(0))
    x0 = _by_hand(params)[0]

    def stack(p, x):  # per-block tokens from the first block's input
        out = []
        for i in range(3):
            w = p["params"][f"layer_{i}"]["w"]
            x = x + 0.5 * jnp.tanh(x @ w["kernel"] + w["bias"])
            out.append(x)
        return out

    z = jax.random.normal(jax.random.PRNGKey(4), x0.shape)
    run_a = capture.runner(apply, IDS, blocks=Blk)
    run_b = capture.runner(None, x0, stack=stack)
    np.testing.assert_allclose(run_a(params, z)[1], run_b(params, z)[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_a(params)[1], run_b(params)[1], rtol=1e-5, atol=1e-6)
    res = phasefield.probe(init, lambda p, x: None, x0, stack=stack, inits=3)
    assert res.depth == 3 and np.isfinite(res.lambda_g_input[0]) and np.isnan(res.ds["grad"].values[1])


def test_geometry_spread_is_q_minus_p_and_symmetric_tokens_have_their_geometry():
    t = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 7))
    q, p = geometry.gram_qp(t)
    q2, rho, gap = geometry.q_rho_gap(t)
    np.testing.assert_allclose(geometry.spread(t), q - p, rtol=1e-5)
    np.testing.assert_allclose(q2, q, rtol=1e-6)
    np.testing.assert_allclose(rho, p / q, rtol=1e-5, atol=1e-6)
    x = geometry.symmetric_tokens(jax.random.PRNGKey(1), (64, 8, 512), 2.0, 0.3)
    q, p = geometry.gram_qp(x)
    assert abs(float(q) - 2.0) < 0.02 and abs(float(p / q) - 0.3) < 0.02


def test_gradient_per_block_equals_the_explicit_jacobian():
    _, init, apply = _net()
    run = capture.runner(apply, IDS, blocks=Blk)
    key = jax.random.PRNGKey(3)
    res = jax.jit(lambda k: measure.one(init, run, k, 1e-3))(key)  # one program, not op by op
    kp, _, _, ku = jax.random.split(key, 4)
    params = init(kp)
    xs = _by_hand(params)
    u = jax.random.normal(ku, xs[0].shape, xs[0].dtype)
    p = params["params"]

    def from_block(l, x, upto=3):  # x_l -> x_upto written out
        for i in range(l, upto):
            w = p[f"layer_{i}"]["w"]
            x = x + 0.5 * jnp.tanh(x @ w["kernel"] + w["bias"])
        return x

    @jax.jit
    def explicit(xs, u):  # |u . d x_L / d x_l|^2 / |x0| of every block l, in one program
        out = []
        for l in range(4):
            jac = jax.jacobian(lambda x, l=l: from_block(l, x))(xs[l])  # [out..., in...]
            out.append(jnp.sum(jnp.tensordot(u, jac, axes=u.ndim) ** 2) / u.size)
        return out

    for l, want in enumerate(explicit(xs, u)):
        np.testing.assert_allclose(res["grad"][l], want, rtol=1e-4)
    # a stack callable gives the whole stack's gradient only
    run_s = capture.runner(None, xs[0], stack=lambda pp, x: [from_block(0, x, k) for k in range(1, 4)])
    res_s = jax.jit(lambda k: measure.one(init, run_s, k, 1e-3, with_deltas=False))(key)
    np.testing.assert_allclose(res_s["grad"][0], res["grad"][0], rtol=1e-5)
    assert np.isnan(res_s["grad"][1])


def test_theory_gradient_curve_equals_gradient_exponent_of_each_sub_stack(compiles):
    """At the agreement tests' size (8 tokens, 3 blocks): their trajectory program. The
    curves of new numbers compile nothing (the programs are keyed by the block's structure)."""
    theory.curves(layers.presets.get("pre-ln", sigma=0.7, alpha=0.4, heads=2), 8, 3, 1.3, 0.4, 1e-3)
    before = compiles.count
    blk = layers.presets.get("pre-ln", sigma=0.8, alpha=0.5, heads=2)
    th = theory.curves(blk, 8, 3, 1.3, 0.4, 1e-3)
    assert compiles.count == before
    q, p = (np.asarray(a) for a in layers.trajectory(blk, 1.3, 0.4, n_tokens=8, depth=3))
    for l in range(3):
        lg = float(layers.gradient_exponent(blk, q[l], p[l] / q[l], n_tokens=8, depth=3 - l))
        assert abs(th["log_grad"][l] - (3 - l) * lg) < 1e-12
    assert th["log_grad"][3] == 0.0
    np.testing.assert_allclose(th["rho"], p / q, rtol=1e-14)


# ---- the probe against the theory on phasefield's own blocks (modest size; d = 1024 in
# scripts/probe_blocks.py, docs/probe.md), where scripts/validate_blocks.py finds the
# theory valid (sigma <= 1 for the standard presets)
CASES = [
    ("paper", dict(hp=HParams(sigma_w=2.0, alpha_a=0.6, alpha_m=0.6, n_tokens=8, softmax_correction=True))),
    ("pre-ln", dict(sigma=1.0, alpha=0.5, heads=2)),
    ("post-ln", dict(sigma=0.55, alpha=1.0, heads=2)),
    ("rms-swiglu", dict(sigma=1.0, alpha=0.5, heads=2)),
    ("deepscalelm", dict(heads=2)),
]


def _worst_z(z):
    """The largest |z| of each quantity of ``res.agreement()``. Every z must be a number: a
    NaN compares false with any bound, and under ``max`` it passes or fails by its place."""
    bad = {k: v for k, v in z.items() if not np.all(np.isfinite(v))}
    assert not bad, bad
    return {k: float(np.max(np.abs(np.atleast_1d(v)))) for k, v in z.items()}


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_probe_agrees_with_the_theory_on_phasefield_blocks(name, kw):
    """Every preset with dense weights, one network size for all (depth 3, width 256, 8
    tokens, 16 initializations); pre-LN at sigma = 1, the edge of the theory's validity; the
    result's document and verdict (read once, of pre-LN)."""
    # keys of JAX's rbg generator (XLA's RngBitGenerator), the probe's and the input's: the
    # same Gaussian weights in distribution as the default threefry's, drawn in about half
    # the CPU under the suite's -O0 compile (drawing 16 inits x 3 blocks of width-256
    # matrices is ~90 % of a case's run time with threefry)
    with jax.default_prng_impl("rbg"):
        m = models.preset(name, depth=3, width=256, n_tokens=8, weights="dense", **kw)
        res = phasefield.probe(m, inits=16, chunk=4)
    worst = _worst_z(res.agreement())
    assert max(worst.values()) < 3.0, worst
    if name == "pre-ln":
        d = res.to_dict()
        assert d["phase"] == list(res.phase) and "theory" in d and len(d["blocks"]["q_data"]) == 4
        assert res.verdict().startswith(res.name)


# ---- the command line
def _cli(argv, tmp_path, monkeypatch):
    from phasefield.cli import main

    monkeypatch.chdir(tmp_path)
    return main(argv)


def test_cli_json_and_figure(tmp_path, monkeypatch, capsys):
    # the network of test_probe_fix's command-line tests (SMALL there): the command's probe
    # program (one per chunk of inits, whatever their number) is compiled once per run
    argv = ["probe", "--block", "post-ln:heads=2,sigma=2", "--width", "16", "--depth", "2", "--n-tokens", "4"]
    code = _cli(argv + ["--inits", "3", "--json", "--figure", "f.png"], tmp_path, monkeypatch)
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["depth"] == 2 and doc["inits"] == 3 and len(doc["theory"]["q"]) == 3
    assert (tmp_path / "f.png").stat().st_size > 1000


# the model file of test_probe_fix (its Dense named alike): with scale 0.5 its probe of 2
# inits (test_cli_runs_a_users_model_file) is the program of test_cli_as_declares_a_preset_for_the_theory
MODEL_FILE = """
import jax.numpy as jnp
from flax import linen as nn
from phasefield.probing import Model

class B(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(x.shape[-1], name="lin")(x) * {scale}

class M(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = B(name=f"b{{i}}")(x)
        return x

def make(blocks="B"):
    m = M()
    x = jnp.ones((1, 4, 8)) + jnp.arange(32.).reshape(1, 4, 8) / 32
    return Model(lambda k: m.init(k, x), m.apply, x, blocks=blocks)

def not_a_model():
    return 3
"""


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "no_such_module_xyz:make"], "cannot import"),
        (["--model", "m.py:nope"], "no factory"),
        (["--model", "m.py:not_a_model"], "must return"),
        (["--model", "m.py:make", "--set", "blocks=Nothing"], "no block matching"),
        (["--model", "m.py:make", "--set", "bogus=1"], "refused its arguments"),
        (["--model", "nan.py:make"], "not finite"),
        (["--preset", "nope"], "unknown block"),
        (["--model", "m.py:make", "--preset", "paper"], "one of them"),
        (["--block", "pre-ln:sigma=0"], "outside"),
        (["--block", "pre-ln", "--preset", "paper"], "one of --block"),
        (["--block", "pre-ln:heads=2", "--set", "heads=3"], "given twice"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MODEL_FILE.format(scale="0.5"))
    (tmp_path / "nan.py").write_text(MODEL_FILE.format(scale="jnp.nan"))
    code = _cli(["probe", "--inits", "2", "--figure", "f.png"] + argv, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "f.png").exists()


def test_cli_runs_a_users_model_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MODEL_FILE.format(scale="0.5"))
    assert _cli(["probe", "--model", "m.py:make", "--inits", "2"], tmp_path, monkeypatch) == 0
    assert "gradients" in capsys.readouterr().out


def test_cli_refuses_the_package_name_removed_in_0_3(tmp_path, monkeypatch, capsys):
    """``--model phasefield.probe.X:factory`` (the probe package's name until 0.2) is an
    ordinary module path that does not import: one line, exit 2; the package's name works."""
    argv = ["probe", "--model", "phasefield.probe.models:preset", "--set", "name=pre-ln", "--set", "heads=2"]
    argv += ["--width", "16", "--depth", "2", "--n-tokens", "4", "--inits", "2", "--json", "--quiet"]
    assert _cli(argv, tmp_path, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phasefield: error: --model: cannot import phasefield.probe.models") and "\n" not in err, err

    from phasefield.cli.probe import _factory

    assert _factory("phasefield.probing.models:preset") is models.preset


# ---- the ViT's input geometry through the probe, identical to the forward written by hand
def _geometry_by_hand(cfg, data, inits, images):
    from phasefield.vit.model import preprocess
    from phasefield.vit.train import model_for

    model = model_for(cfg, cfg.hparams(), data.num_classes)
    x = preprocess(data.x_train[:images], data.scale, cfg.patch_size)
    qs, ps = [], []
    for s in range(inits):
        params = model.init(jax.random.PRNGKey(s), x[:1])["params"]
        tok = x @ params["embed"]["kernel"] + params["embed"]["bias"] + params["pos_embedding"]
        cls = jnp.broadcast_to(params["cls_pos_embedding"], (x.shape[0], 1, cfg.width))
        t = jnp.concatenate([cls, tok], 1)
        g = jnp.einsum("bid,bjd->bij", t, t) / cfg.width
        n = g.shape[-1]
        diag = jnp.trace(g, axis1=1, axis2=2)
        qs.append(float(jnp.mean(diag) / n))
        ps.append(float(jnp.mean((jnp.sum(g, (1, 2)) - diag) / (n * (n - 1)))))
    return np.array(qs), np.array(ps)


def test_vit_input_geometry_uses_the_probe_with_unchanged_numbers():
    from types import SimpleNamespace

    from phasefield.vit import features
    from phasefield.vit.train import TrainConfig

    cfg = TrainConfig(width=16, depth=2, image_size=8, patch_size=4)
    rng = np.random.default_rng(0)
    data = SimpleNamespace(x_train=rng.integers(0, 17, (20, 8, 8, 1)).astype(np.uint8), scale=16.0, num_classes=10)
    got = features.input_geometry(cfg, data, inits=3, images=20)
    qs, ps = _geometry_by_hand(cfg, data, 3, 20)
    assert got["q0"] == float(qs.mean()) and got["p0"] == float(ps.mean())
    assert got["rho0"] == float((ps / qs).mean())


# ---- Hugging Face transformers (optional extra probe-hf)
def test_hf_gpt2_bert_vit_at_random_init():
    pytest.importorskip("transformers")
    from phasefield.probing import hf

    for factory in (hf.gpt2, hf.bert, hf.vit):
        m = factory(depth=2, width=32, heads=2, n_tokens=5, batch=1)  # ViT: 2 x 2 patches + cls
        res = phasefield.probe(m, inits=2)
        assert res.depth == 2 and np.all(np.isfinite(res.ds["grad"].values))
        # GPT-2 is causal (per position, the last token's rates); BERT and ViT are not
        assert m.causal is (factory is hf.gpt2) and res.causal is m.causal
        if res.causal:
            d = res.to_dict()
            assert len(d["q_L_pos"]) == 5 and np.isfinite(d["lambda_g_last"]) and "theory" not in d
