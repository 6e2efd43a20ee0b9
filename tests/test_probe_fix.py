"""Per-block diagnosis and the fix: the first block out of its band, the multipliers applied
to the right parameters, the fix's JSON (verified with fresh seeds, the theory beside it for a
preset), a model without residual projections or blocks named in the message, and every bad
input of the new options: one line, exit 2, no partial file."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import phasefield
from phasefield.probing import blocks as pblocks
from phasefield.probing import fix, models, recipes


class Blk(nn.Module):
    scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        h = x * jnp.sqrt(x.shape[-1]) / jnp.linalg.norm(x, axis=-1, keepdims=True)
        return x + nn.Dense(x.shape[-1], name="c_proj")(jnp.tanh(self.scale * nn.Dense(x.shape[-1], name="c_fc")(h)))


class Net(nn.Module):
    depth: int = 2  # the fix compiles three programs of this model (probe, search, check)

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            x = Blk(name=f"h_{i}")(x)
        return x


X = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 32))


def _net():
    net = Net()
    return (lambda k: net.init(k, X)), net.apply


def test_scale_multiplies_weights_and_residual_projections_only():
    init, _ = _net()
    params = init(jax.random.PRNGKey(1))
    sel = fix.check_selection(params)
    out = fix.scale(params, 0.5, 0.1, sel)
    p, o = params["params"]["h_0"], out["params"]["h_0"]
    np.testing.assert_allclose(o["c_fc"]["kernel"], 0.5 * p["c_fc"]["kernel"], rtol=1e-6)
    np.testing.assert_allclose(o["c_proj"]["kernel"], 0.05 * p["c_proj"]["kernel"], rtol=1e-6)
    np.testing.assert_array_equal(o["c_fc"]["bias"], p["c_fc"]["bias"])  # vectors are not weight matrices
    assert fix.groups(list(sel))["params/h_1/c_proj/kernel"] == "params/h_*/c_proj/kernel"


def test_first_failing_block_of_a_collapsing_post_ln_stack():
    """The network of test_cli_fix_json_with_the_theory_beside (SMALL), measured as the
    command measures it (with a progress callback: one program per chunk of inits), so the
    command's probe loads this test's program from the run's cache."""
    m = models.preset("post-ln", depth=2, width=16, n_tokens=4, heads=2, sigma=2.0)
    m.block = None  # no theory curves here: the diagnosis reads the measurement only
    res = phasefield.probe(m, inits=4, progress=lambda done, total: None)
    first = res.to_dict()["first_failing_block"]
    assert first["block"] == 1 and "angle" in first and first["angle"]["direction"] == "merge"
    assert "Block 1 of 2 is the first to leave its band" in res.verdict()
    # a band so wide that nothing leaves it
    diag = pblocks.diagnose(res.ds, max_factor=1e30, max_angle_rate=100.0)
    assert diag["first_failing_block"] is None


def test_fix_of_a_linen_model_is_verified_with_fresh_seeds():
    init, apply = _net()
    seen = []
    res = phasefield.probe(
        init,
        apply,
        X,
        blocks=Blk,
        inits=4,
        fix=True,
        fix_options=dict(inits=2, verify_inits=8),
        progress=lambda done, total: seen.append((done, total)),
    )
    # progress in initializations: 4 probed, at most 62 search points x 2, 8 for the fix's
    # check and each of the 7 recipes; it ends full
    assert {t for _, t in seen} == {4 + 62 * 2 + 8 * 8} and seen[-1][0] == seen[-1][1]
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    d = res.to_dict()
    fx = d["fix"]
    assert set(fx["multipliers"]) == {"weights", "residual", "attention", "mlp"}
    assert fx["init_std"]["params/h_*/c_proj/kernel"]["residual_projection"]
    g = fx["init_std"]["params/h_*/c_fc/kernel"]
    assert g["after"] == pytest.approx(g["before"] * fx["multipliers"]["weights"])
    a = fx["after"]
    assert (
        a["inits"] == 8 and a["seed"] != 0 and np.isfinite(a["angle_rate_se"]) and np.isfinite(a["lambda_g_input_se"])
    )
    assert fx["meets"] == (a["distance"] <= 1.0) and fx["meets"]
    assert "theory" not in fx  # not a preset
    # the recipes beside it: no attention here, so neither DeepNorm nor T-Fixup applies
    arms = {r["name"]: r for r in fx["recipes"]}
    assert list(arms) == list(recipes.NAMES)
    for name in ("deepnorm", "t-fixup"):
        assert not arms[name]["applicable"] and "value projection" in arms[name]["reason"]
    for name in ("gpt2", "depth-mup", "completep", "rezero", "small-std"):
        a = arms[name]["after"]
        assert a["seed"] == fx["after"]["seed"] and a["inits"] == 8 and arms[name]["meets"] == (a["distance"] <= 1.0)
    assert arms["completep"]["multipliers"] == {"mlp_out": pytest.approx(1 / 2)}  # 1 / depth
    # ReZero on this pre-norm stack: every block the identity, so nearby tokens keep their
    # angle (float32 rounding) and the gradient is the cotangent itself, |u|^2 / |x0| = 1
    # within its standard error
    rz = arms["rezero"]["after"]
    assert rz["angle_rate"] == pytest.approx(0.0, abs=1e-4) and 0 < rz["gradient_factor_se"] < 0.1
    assert abs(rz["gradient_factor"] - 1.0) < 4 * rz["gradient_factor_se"]
    json.dumps(d, default=float)


def test_fix_needs_residual_projections_and_says_what_it_searched():
    class B(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(x.shape[-1], name="lin")(x)

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return B()(B()(x))

    m = M()
    with pytest.raises(ValueError, match=r"no residual output projection.*B_0/lin/kernel"):
        phasefield.probe(lambda k: m.init(k, X), m.apply, X, blocks=B, fix=True)
    with pytest.raises(ValueError, match=r"no block matching 'Nope' \(searched 5 module calls: classes M, B, Dense"):
        phasefield.probe(lambda k: m.init(k, X), m.apply, X, blocks="Nope")
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        phasefield.probe(lambda k: m.init(k, X), m.apply, X, blocks=B, fix=True, fix_options=dict(bogus=1))
    with pytest.raises(ValueError, match="unknown recipe 'admin'"):
        phasefield.probe(lambda k: m.init(k, X), m.apply, X, blocks=B, fix=True, fix_options=dict(recipes=["admin"]))


def _cli(argv, tmp_path, monkeypatch):
    from phasefield.cli import main

    monkeypatch.chdir(tmp_path)
    return main(argv)


SMALL = ["probe", "--block", "post-ln:heads=2,sigma=2", "--width", "16", "--depth", "2", "--n-tokens", "4"]


@pytest.mark.slow  # recommend --block's theory answer: the exact-softmax tables of a dozen sigmas
def test_cli_fix_json_with_the_theory_beside(tmp_path, monkeypatch, capsys):
    argv = SMALL + ["--inits", "3", "--fix", "--fix-inits", "2", "--verify-inits", "4", "--json", "--quiet"]
    assert _cli(argv + ["--figure", "f.png"], tmp_path, monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_failing_block"]["block"] == 1
    fx = doc["fix"]
    for key in ("multipliers", "init_std", "after", "meets", "theory"):
        assert key in fx
    assert {"angle_rate", "angle_rate_se", "lambda_g_input", "lambda_g_input_se"} <= set(fx["after"])
    th = fx["theory"]
    assert th["block"] == "post-ln" and th["measured_fix"]["sigma"] == pytest.approx(2.0 * fx["multipliers"]["weights"])
    assert set(th["recommend"]) >= {"sigma", "alpha_attn", "alpha_mlp"} and set(th["log_ratio"]) == {
        "sigma",
        "alpha_attn",
        "alpha_mlp",
    }
    assert (tmp_path / "f.png").stat().st_size > 1000
    # the recipes on this post-LN stack (its blocks end in a LayerNorm: DeepNorm applies), and
    # recommend --block's answer as one more arm, each measured on the check's fresh inits
    arms = {r["name"]: r for r in fx["recipes"]}
    assert list(arms) == list(recipes.NAMES) + ["recommend"]
    assert fx["search"]["normalized_spread"] < 1e-3 and arms["deepnorm"]["applicable"]
    measured = [r for r in arms.values() if r["applicable"] and np.isfinite(r["after"]["angle_rate"])]
    assert len(measured) >= 5 and all(r["after"]["inits"] == 4 for r in measured)
    assert arms["deepnorm"]["multipliers"]["value"] == pytest.approx(16**-0.25)  # beta = (8N)^-1/4 at N = 2
    assert arms["deepnorm"]["multipliers"]["attn_out"] == pytest.approx(16**-0.25 / 4**0.25)  # beta / (2N)^1/4
    assert arms["gpt2"]["preset_numbers"]["sigma"] == pytest.approx(0.02 * 4)  # width 16
    assert arms["recommend"]["preset_numbers"]["sigma"] == pytest.approx(th["recommend"]["sigma"])
    w = th["recommend"]["sigma"] / 2.0
    assert arms["recommend"]["multipliers"]["query"] == pytest.approx(w)


# test_probe's model file too (scale 0.5 there): its probe of 2 inits is the program of
# test_cli_as_declares_a_preset_for_the_theory
MODEL_FILE = """
import jax.numpy as jnp
from flax import linen as nn
from phasefield.probing import Model

class B(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(x.shape[-1], name="lin")(x) * 0.5

class M(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = B(name=f"b{i}")(x)
        return x

def make():
    m = M()
    x = jnp.ones((1, 4, 8)) + jnp.arange(32.).reshape(1, 4, 8) / 32
    return Model(lambda k: m.init(k, x), m.apply, x, blocks="B")
"""


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--fix", "--fix-residual", "("], "not a regular expression"),
        (["--fix", "--fix-residual", " "], "empty regular expression"),
        (["--fix", "--fix-weights", "[a"], "not a regular expression"),
        (["--fix", "--max-gradient-factor", "1"], "--max-gradient-factor"),
        (["--max-angle-rate", "0"], "--max-angle-rate"),
        (["--fix", "--fix-inits", "1"], "--fix-inits"),
        (["--fix", "--verify-inits", "1"], "--verify-inits"),
        (["--fix-inits", "3"], "is an option of --fix"),
        (["--fix-residual", "lin"], "is an option of --fix"),
        (["--fix", "--recipes", "deepnorm,admin"], "unknown recipe 'admin'"),
        (["--recipes", "gpt2"], "is an option of --fix"),
        (["--fix", "--no-gradient"], "drop --no-gradient"),
        (["--as", "pre-ln"], "declares a --model"),
        (["--fix"], "no residual output projection"),
    ],
)
def test_cli_bad_fix_input_is_one_line_and_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MODEL_FILE)
    base = ["probe", "--inits", "2", "--figure", "f.png"]
    model = (
        ["--block", "pre-ln:heads=2", "--width", "8", "--depth", "2"] if "--as" in argv else ["--model", "m.py:make"]
    )
    code = _cli(base + model + argv, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("spec,needle", [("nope", "nope"), ("pre-ln:sigma=-1", "sigma")])
def test_cli_bad_as_is_one_line(spec, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MODEL_FILE)
    code = _cli(["probe", "--model", "m.py:make", "--as", spec, "--figure", "f.png"], tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "f.png").exists()


def test_cli_as_declares_a_preset_for_the_theory(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MODEL_FILE)
    code = _cli(
        ["probe", "--model", "m.py:make", "--as", "pre-ln:heads=2", "--inits", "2", "--json"], tmp_path, monkeypatch
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["theory"]["q"]) == 3
