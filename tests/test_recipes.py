"""The init recipes (phasefield.probing.recipes) against their papers' formulas, the roles
of a model's weight matrices they read, and "not applicable" as a value. No program is
compiled here: the plans are numbers, and apply() runs on small arrays."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from phasefield.probing import fix, recipes
from phasefield.probing.recipes import Structure

# DeepNet (Wang et al. 2022), encoder-only / decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4)
DEEPNORM = {6: (1.8612097182041991, 0.3799178428257963), 18: (2.449489742783178, 0.28867513459481287)}


@pytest.mark.parametrize("n", [6, 18])
def test_deepnorm_constants_at_the_papers_depths(n):
    a, b = recipes.deepnorm_constants(n)
    assert a == pytest.approx(DEEPNORM[n][0], rel=1e-12) and b == pytest.approx(DEEPNORM[n][1], rel=1e-12)
    assert a**4 == pytest.approx(2 * n) and b**-4 == pytest.approx(8 * n)  # the formula's other route


def test_tfixup_gpt2_and_depth_constants():
    # T-Fixup (Huang et al. 2020): encoder 0.67 N^(-1/4), decoder (9N)^(-1/4)
    assert recipes.tfixup_scale(6) == pytest.approx(0.67 / 6**0.25) == pytest.approx(0.428092, abs=1e-6)
    assert recipes.tfixup_scale(6, decoder=True) == pytest.approx(0.368894, abs=1e-6)
    # GPT-2: std 0.02, residual projections 0.02 / sqrt(2L): 0.0040825 at L = 12 (GPT-2 small)
    assert recipes.gpt2_std(12) == (0.02, pytest.approx(0.0040824829046, rel=1e-10))
    assert recipes.gpt2_std(48)[1] == pytest.approx(0.0020412414523, rel=1e-10)
    for bad in (0, 2.5, -1):
        with pytest.raises(ValueError, match="integer >= 1"):
            recipes.deepnorm_constants(bad)


# the roles of phasefield's post-LN preset (its parameter paths), of Flax's attention modules
# and of GPT-2's fused attention
PRESET = [
    "params/block_0/BlockModule_0/AttentionModule_0/query/kernel",
    "params/block_0/BlockModule_0/AttentionModule_0/key/kernel",
    "params/block_0/BlockModule_0/AttentionModule_0/value/kernel",
    "params/block_0/BlockModule_0/AttentionModule_0/out/kernel",
    "params/block_0/BlockModule_0/MLPModule_0/dense_0/kernel",
    "params/block_0/BlockModule_0/MLPModule_0/dense_1/kernel",
]


def _sel(paths):
    params = {}
    for p in paths:
        node = params
        parts = p.split("/")
        for c in parts[:-1]:
            node = node.setdefault(c, {})
        node[parts[-1]] = np.zeros((2, 2), np.float32)
    return fix.select(params), params


def test_roles_of_the_preset_flax_attention_and_gpt2():
    sel, _ = _sel(PRESET)
    r = recipes.roles(sel)
    assert [r[p] for p in PRESET] == ["query", "key", "value", "attn_out", "mlp", "mlp_out"]
    for att in ("blocks/0/attn", "params/MultiHeadDotProductAttention_0"):  # nnx, linen
        sel, _ = _sel([f"{att}/{n}/kernel" for n in ("query", "key", "value", "out")] + ["blocks/0/up/kernel"])
        r = recipes.roles(sel)
        assert r[f"{att}/out/kernel"] == "attn_out" and r["blocks/0/up/kernel"] == "mlp"
    gpt2 = ["h/0/attn/c_attn/kernel", "h/0/attn/c_proj/kernel", "h/0/mlp/c_fc/kernel", "h/0/mlp/c_proj/kernel"]
    r = recipes.roles(_sel(gpt2)[0])
    assert [r[p] for p in gpt2] == ["qkv", "attn_out", "mlp", "mlp_out"]
    # a plain "out" that is no attention's is not a residual projection by default
    sel, _ = _sel(["blocks/0/mlp/up/kernel", "blocks/0/mlp/out/kernel"])
    assert not any(r for _, r in sel.values())


def _preset_structure(L, post_ln):
    sel, _ = _sel(PRESET)
    return Structure(L, recipes.roles(sel), post_ln)


def test_deepnorm_plan_and_where_it_does_not_apply():
    a, b = DEEPNORM[6]
    p = recipes.plan("deepnorm", _preset_structure(6, True))
    assert p["applicable"] and p["reason"] is None
    assert p["multipliers"] == pytest.approx(dict(value=b, attn_out=b / a, mlp=b, mlp_out=b / a))
    m = recipes.per_path(p, _preset_structure(6, True))
    assert [m[k] for k in PRESET] == pytest.approx([1, 1, b, b / a, b, b / a])
    pre = recipes.plan("deepnorm", _preset_structure(6, False))
    assert not pre["applicable"] and "pre-LN" in pre["reason"]
    assert set(recipes.per_path(pre, _preset_structure(6, False)).values()) == {1.0}
    assert "not known" in recipes.plan("deepnorm", _preset_structure(6, None))["reason"]
    fused = Structure(6, {"a/c_attn/kernel": "qkv", "a/c_proj/kernel": "attn_out", "m/c_fc/kernel": "mlp"}, True)
    assert "value projection" in recipes.plan("deepnorm", fused)["reason"]
    # T-Fixup keeps the normalizations: it applies to the pre-LN stack
    t = recipes.plan("t-fixup", _preset_structure(6, False))
    assert t["applicable"] and t["multipliers"]["value"] == pytest.approx(0.67 / 6**0.25)


def test_branch_recipes_and_no_residual_projection():
    st = _preset_structure(16, False)
    assert recipes.plan("depth-mup", st)["multipliers"] == dict(attn_out=0.25, mlp_out=0.25)
    assert recipes.plan("completep", st)["multipliers"] == dict(attn_out=1 / 16, mlp_out=1 / 16)
    assert recipes.plan("rezero", st)["multipliers"] == dict(attn_out=0.0, mlp_out=0.0)
    none = Structure(4, {"b/0/w/kernel": "mlp"}, False, {"b/0/w/kernel": 0.1})
    for name in ("depth-mup", "completep", "rezero", "gpt2"):
        p = recipes.plan(name, none)
        assert not p["applicable"] and "no residual output projection" in p["reason"]
    assert recipes.plan("small-std", none)["applicable"]
    with pytest.raises(ValueError, match="unknown recipe 'admin'"):
        recipes.plan("admin", st)


def test_apply_sets_gpt2_stds_and_leaves_a_recipe_that_does_not_apply_unchanged():
    L = 8
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    params = {
        f"h_{i}": {
            "c_fc": {"kernel": np.asarray(jax.random.normal(k[0], (64, 64))) * 0.3, "bias": np.zeros(64, np.float32)},
            "c_proj": {"kernel": np.asarray(jax.random.normal(k[1], (64, 64))) * 0.7},
        }
        for i in range(L)
    }
    new, p = recipes.apply("gpt2", params, depth=L)
    assert p["applicable"]
    fc = np.stack([np.asarray(new[f"h_{i}"]["c_fc"]["kernel"]) for i in range(L)])
    pr = np.stack([np.asarray(new[f"h_{i}"]["c_proj"]["kernel"]) for i in range(L)])
    # the group's std (each matrix about its mean, pooled) is the target, to float32 rounding
    assert math.sqrt(np.mean(np.square(fc - fc.mean((1, 2), keepdims=True)))) == pytest.approx(0.02, rel=1e-5)
    assert math.sqrt(np.mean(np.square(pr - pr.mean((1, 2), keepdims=True)))) == pytest.approx(0.02 / 4, rel=1e-5)
    np.testing.assert_array_equal(new["h_0"]["c_fc"]["bias"], params["h_0"]["c_fc"]["bias"])
    same, p = recipes.apply("deepnorm", params, depth=L, post_ln=True)  # no attention: no value projection
    assert not p["applicable"] and same["h_3"]["c_proj"]["kernel"] is params["h_3"]["c_proj"]["kernel"]
    z, _ = recipes.apply("rezero", params, depth=L)
    assert not np.any(np.asarray(z["h_5"]["c_proj"]["kernel"]))
    s, _ = recipes.apply("small-std", params, depth=L, m=0.25)
    np.testing.assert_allclose(s["h_1"]["c_fc"]["kernel"], 0.25 * params["h_1"]["c_fc"]["kernel"], rtol=1e-6)


def test_preset_numbers():
    now = dict(sigma=2.0, alpha_attn=0.5, alpha_mlp=1.0)
    g = recipes.as_preset_numbers("gpt2", now, depth=8, width=64)
    assert g == pytest.approx(dict(sigma=0.16, alpha_attn=0.25, alpha_mlp=0.25))
    assert recipes.as_preset_numbers("completep", now, 8, 64) == pytest.approx(
        dict(sigma=2.0, alpha_attn=1 / 16, alpha_mlp=1 / 8)
    )
    assert recipes.as_preset_numbers("small-std", now, 8, 64, m=0.5)["sigma"] == 1.0
    assert recipes.as_preset_numbers("deepnorm", now, 8, 64) is None
