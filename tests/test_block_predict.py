"""fit / predict / recommend on runs of a phasefield.layers block: the features
and the theory point are the block's, the fit records its block, and a model is never
applied to another block than the one it was fitted on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phasefield import layers
from phasefield.vit import features as F
from phasefield.vit import predict as vp
from phasefield.vit.sweep import block_theory
from phasefield.vit.train import TrainConfig

SPEC = "pre-ln:heads=2"
Q0, RHO0 = 1.6, 0.07


# sigma on three levels (each draw of U(0.3, 1.5) to the nearest), alpha continuous; 0.55 and
# 0.8 are the pre-LN points of tests/test_vit.py and tests/test_branch_scales.py. The
# per-run theory (test_block_features_are_the_blocks) sizes every point's tables for the
# point cap: one compiled program for every sigma, a few ms a point once compiled.
SIGMA_LEVELS = np.array([0.55, 0.8, 1.2])


def _configs(n=12):
    rng = np.random.default_rng(3)
    sig = SIGMA_LEVELS[np.argmin(np.abs(rng.uniform(0.3, 1.5, n)[:, None] - SIGMA_LEVELS), 1)]
    return [
        dict(sigma_w=float(s), sigma_a=1.0, alpha_a=float(a), alpha_m=float(a), lr=1e-3, depth=2)
        for s, a in zip(sig, rng.uniform(0.2, 1.0, n))
    ]


@pytest.fixture(scope="module")
def block_study():
    """A synthetic pre-LN study: 6 configurations x 2 seeds, the loss a smooth function of
    the block's own finite-depth rate (so the block's features, not the paper's, carry it)."""
    cfg = TrainConfig(block=SPEC, depth=2, width=16)
    configs = _configs(6)
    feats = F.block_features(cfg, configs, Q0, RHO0, maps=("paper",))
    from phasefield.vit.design import config_id

    order = [config_id(c) for c in configs]
    rng = np.random.default_rng(0)
    loss = 0.4 + 3.0 * np.abs(feats["lambda_g_collapse"])
    rows = [
        dict(c, seed=s, test_loss=float(loss[i] + 0.01 * rng.standard_normal()), test_acc=0.5, diverged=False)
        for i, c in enumerate(configs)
        for s in range(2)
    ]
    return cfg, configs, feats, order, rows


def test_block_features_are_the_blocks(block_study):
    """Collapsed-point features = the per-run theory of train-sweep --block; input-geometry
    features = layers.finite_depth of the preset built directly (not through TrainConfig)."""
    cfg, configs, feats, _, _ = block_study
    th = block_theory(cfg, configs)  # every configuration: one compiled program for all
    for k in ("angle_rate", "lambda_g_collapse"):
        # the features size every point's tables alike (one program per depth), the per-run
        # theory sizes them per point: the same maps, equal to rounding
        assert np.isfinite(feats[k]).all(), k
        np.testing.assert_allclose(feats[k], th[k], rtol=1e-12, atol=1e-14)
    for k in ("lambda_a", "lambda_g_inf"):  # no fixed point anywhere (test below): NaN in both
        assert np.isnan(feats[k]).all() and np.isnan(th[k]).all(), k
    for i in (0, 5):
        c = configs[i]
        for corr, name in ((False, "lambda_g_in_paper"), (True, "lambda_g_in_paper_corr")):
            blk = layers.presets.get(
                "pre-ln", sigma=c["sigma_w"], alpha=c["alpha_a"], heads=2, attention="paper", softmax_correction=corr
            )
            fd = layers.finite_depth(blk, q0=Q0, rho0=RHO0, n_tokens=cfg.n_tokens, depth=2)
            assert feats[name][i] == pytest.approx(float(fd["lambda_g_input"]), abs=1e-12)
        rho_l = float(np.asarray(fd["rho"])[-1])
        assert feats["rho_out_paper"][i] == pytest.approx(rho_l, abs=1e-12)
        assert feats["angle_rate_in_paper"][i] == pytest.approx(np.log((1 - rho_l) / (1 - RHO0)) / 2, abs=1e-12)
    # pre-LN has no finite fixed point: its angle feature is the finite-depth angle rate (< 0, ordered)
    assert np.all(feats["angle_rate"] < 0)


def test_lambda_a_is_nan_exactly_where_a_block_has_no_fixed_point(block_study):
    """The block features' lambda_a is the exponent at the collapsed fixed point, NaN where the
    block has none (every pre-LN point: layers.rates says so at the first configuration of each
    sigma level, the fast route at every point), and angle_rate is the finite-depth angle rate
    from collapsed tokens at every point (layers.rates of the preset built directly); the fast
    route of predict --block agrees (post-LN, which has a fixed point: a finite lambda_a,
    test_fast_block_rates_equal_the_reference_route)."""
    from phasefield.vit import block_rates

    cfg, configs, feats, _, _ = block_study
    first = {c["sigma_w"]: i for i, c in reversed(list(enumerate(configs)))}  # per sigma level
    assert len(first) == len(SIGMA_LEVELS)
    for i in sorted(first.values()):
        c = configs[i]
        blk = layers.presets.get("pre-ln", sigma=c["sigma_w"], alpha=c["alpha_a"], heads=2)
        r = layers.rates(blk, q0=1.0, rho0=1.0, n_tokens=cfg.n_tokens, depth=int(c["depth"]))
        assert not r["has_fixed_point"]
        assert np.isnan(feats["lambda_a"][i])
        assert np.isfinite(feats["angle_rate"][i])
        assert feats["angle_rate"][i] == pytest.approx(float(r["angle_rate"]), abs=1e-12)
    fast = block_rates.rates(cfg, configs)
    assert np.isnan(fast["lambda_a"]).all() and np.isfinite(fast["angle_rate"]).all()
    np.testing.assert_allclose(fast["angle_rate"], feats["angle_rate"], rtol=1e-12, atol=1e-14)


def test_the_exact_map_answers_at_the_raw_embeddings_norm():
    """post-LN's first attention reads the raw embedding (q0 != 1): the exact map integrates
    at the logit scale sigma_A q0 (within its grid's reach), so its input-geometry features
    are there and finite beside the paper map's."""
    cfg = TrainConfig(block="post-ln:heads=4", depth=2, width=16)  # the shipped post-LN model's
    # the collapsed-point columns by the paper map (attention="paper"): attention is uniform at
    # rho = 1, so every map gives them alike, and the exact map's collapsed-point route (its
    # fixed-point search, ~4 CPU-s here) is the reference of
    # test_fast_block_rates_equal_the_reference_route[post-ln]; the input-geometry columns,
    # this test's subject, come from both maps (maps=("paper", "exact"))
    feats = F.block_features(cfg, _configs(1), Q0, RHO0, maps=("paper", "exact"), attention="paper")
    assert "lambda_g_in_paper" in feats and "lambda_g_in_exact" in feats
    assert all(np.all(np.isfinite(v)) for k, v in feats.items() if k not in ("lambda_g_inf", "rho_star"))


@pytest.mark.usefixtures("small_ensembles")
def test_fit_and_predict_a_block_sweep(block_study, tmp_path, capsys):
    """The fit document records the block; predict computes that block's theory point; the
    CLI refuses a model for another block (predict --block, recommend), one line, exit 2.
    The trees are candidates only (small_ensembles: their shipped sizes are checked in
    tests/test_trainability.py)."""
    from phasefield.cli import main

    cfg, configs, feats, order, rows = block_study
    # two folds: the CV's scores are not this test's claim (two fits per candidate, not four)
    doc = vp.fit_sweep(rows, 10, cfg, dict(q0=Q0, rho0=RHO0), feats, order, k=2, repeats=1, nested_cv=False)["model"]
    assert vp.block_of(doc) == SPEC
    c = configs[3]
    res = vp.predict(c["sigma_w"], 1.0, c["alpha_a"], c["alpha_a"], 2, doc)
    th = block_theory(cfg, [c])
    assert res["block"] == SPEC
    assert np.isnan(res["lambda_a"]) and np.isnan(th["lambda_a"][0])  # no fixed point
    assert res["angle_rate"] == pytest.approx(th["angle_rate"][0], abs=1e-12)
    assert res["lambda_g_collapse"] == pytest.approx(th["lambda_g_collapse"][0], abs=1e-12)
    assert res["predicted_loss"] == pytest.approx(0.4 + 3.0 * abs(th["lambda_g_collapse"][0]), abs=0.15)

    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps(dict(report={}, model=doc)))
    args = ["predict", "--fit", str(fit), "--depth", "2"]
    assert main(args + ["--block", SPEC + ",sigma=0.8,alpha=0.5", "--json"]) == 0
    out, _ = capsys.readouterr()
    got = json.loads(out)
    ref = vp.predict(0.8, 1.0, 0.5, 0.5, 2, doc)
    assert got["block"] == SPEC and got["predicted_loss"] == pytest.approx(ref["predicted_loss"], abs=1e-12)
    assert main(args + ["--block", SPEC + ",sigma=0.8,alpha=0.5"]) == 0
    out, _ = capsys.readouterr()
    assert f"block {SPEC} at sigma=0.8, alpha=0.5" in out
    for bad in (args + ["--block", "post-ln:sigma=1,alpha=.5"], ["recommend", "--fit", str(fit)]):
        assert main(bad) == 2
        _, err = capsys.readouterr()
        assert len(err.strip().splitlines()) == 1 and "fitted on" in err
    # the shipped pre-LN model was fitted on pre-ln:heads=4: another head count is refused;
    # a block with no shipped model says how to fit one
    assert main(["predict", "--block", SPEC + ",sigma=1,alpha=.5"]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "model fitted on block pre-ln:heads=4" in err
    assert main(["predict", "--block", "rms-swiglu:sigma=1,alpha=.5"]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "no shipped model for block rms-swiglu" in err
    # a paper number with another block is refused, never mapped (pre-LN's sigma_A is sigma^2)
    assert main(args + ["--block", SPEC + ",sigma=1,alpha=.5", "--sigma-a", "2"]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "block pre-ln has no number for --sigma-a" in err


# ---------------------------------------------------------------- the fast route (closed-form block rates)
def test_uniform_attention_tables_are_the_exact_maps_at_the_collapsed_point():
    """n identical tokens: every logit of a row is equal, the softmax uniform, so S_1 = S_rho =
    1/n and T_1 = T_rho = 1/n - 1/n^2 whatever the logit scale: the closed forms
    block_rates hands the attention, against the exact map's quadrature at rho = 1 (its
    trapezoid rules leave ~1e-14 per axis; 1.2e-13 measured at n = 4)."""
    import jax

    from phasefield.theory.attention import exact
    from phasefield.vit import block_rates

    for n in (4.0, 17.0):
        s, t = block_rates.uniform_tables(n)
        for sa in (0.09, 6.25):
            n_a, n_z = exact.sizes(sigma_max=sa, n_max=n)
            with jax.enable_x64(True):  # one compiled program (not op by op), sizes closed over
                (s1, sr), (t1, tr) = jax.jit(lambda: exact.st_values(sa, n, 1.0, n_a, n_z))()
            np.testing.assert_allclose([float(s1), float(sr)], s[:, 0], rtol=0, atol=5e-13)
            np.testing.assert_allclose([float(t1), float(tr)], t[:, 0], rtol=0, atol=5e-13)
        assert np.all(s == s[:, :1]) and np.all(t == t[:, :1])


# opposite corners of the shipped models' box (sigma 0.3-2.5, alphas 0.2-1), mixed depths in
# one call: one below the fitted depths (8-32: a warning) at depth 2, whose post-LN reference
# program the map test above compiles already (its exact map's input geometry: the same
# block, n = 17 tokens and table sizes; block_study's pre-LN has 2 heads, the shipped model 4),
# and one inside at depth 8 (the reference route is the test's main cost: two points, not three)
POINTS = [
    dict(sigma_w=2.4, sigma_a=1.0, alpha_a=1.0, alpha_m=0.9, depth=2),
    dict(sigma_w=0.35, sigma_a=1.0, alpha_a=0.9, alpha_m=0.2, depth=8),
]


@pytest.mark.parametrize("block", ["pre-ln", "post-ln"])
def test_fast_block_rates_equal_the_reference_route(block):
    """predict --block's route (uniform attention at the collapsed point, no quadrature) gives
    the reference route's lambda_a, lambda_g (features.block_theory: the exact map integrated
    at every layer; post-LN has a fixed point, so its lambda_a comes from the full exponents)
    and so the same prediction, interval and P(fail), to 1e-12, at several points and
    depths of one call."""
    from phasefield.vit import block_rates

    doc = vp.load_model(block=block)
    cfg = TrainConfig.from_dict(doc["train_config"])
    fast = block_rates.rates(cfg, POINTS, doc["attention"])
    # pre-LN has no fixed point at these points (lambda_a NaN, its model reads angle_rate), post-LN has
    angle = "angle_rate" if block == "pre-ln" else "lambda_a"
    assert fast is not None and angle in doc["features"]
    assert all(np.all(np.isfinite(fast[k])) for k in ("angle_rate", "lambda_g_collapse", angle))
    assert np.isnan(fast["lambda_a"]).all() if block == "pre-ln" else np.isfinite(fast["lambda_a"]).all()
    cols = [np.array([c[k] for c in POINTS], float) for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")]
    got = vp.predict(*cols, doc)
    for i, g in enumerate(got):
        assert g[angle] == fast[angle][i] and g["lambda_g_collapse"] == fast["lambda_g_collapse"][i]
    # the reference route (features.block_theory) at every point of the call for pre-LN, whose
    # norm grows along the 8 layers from (1, 1); for post-LN at the large-logit corner alone:
    # what post-LN adds is its fixed point (lambda_a from the exact map's fixed-point
    # exponents, whose search costs most at the largest logit scale: ~5 of that point's
    # ~6.5 CPU-s), and its collapsed trajectory from (1, 1) sits at q* = 1, every layer of the
    # depth-8 point the same map (that point's reference: ~8 CPU-s)
    ref = range(len(POINTS)) if block == "pre-ln" else [0]
    want = vp.predict(*(c[list(ref)] for c in cols), doc, reference=True)
    for i, w in zip(ref, want):
        g = got[i]
        for k in (angle, "lambda_g_collapse", "predicted_loss", "p_fail"):
            assert g[k] == pytest.approx(w[k], abs=1e-12), k
        np.testing.assert_allclose(g["interval"], w["interval"], rtol=0, atol=1e-12)
        assert g["warnings"] == w["warnings"]


def test_fast_route_declines_what_it_does_not_cover():
    """A block with QK-norm attention (logits of normalized queries and keys) or the paper
    block: rates answers None and predict takes the reference route."""
    from phasefield.vit import block_rates

    c = [dict(sigma_w=1.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, depth=2)]
    assert block_rates.rates(TrainConfig(block="pre-ln:heads=2,qk_norm=true", depth=2, width=16), c) is None
    assert block_rates.rates(TrainConfig(depth=2, width=16), c) is None


def test_expit_is_scipys():
    """models.expit (predict's logistic function, NumPy) against scipy.special.expit."""
    from scipy.special import expit

    from phasefield.vit.models import expit as ours

    x = np.concatenate([np.linspace(-800.0, 800.0, 20001), np.random.default_rng(0).normal(0.0, 5.0, 20000)])
    np.testing.assert_allclose(ours(x), expit(x), rtol=1e-15, atol=0)
    assert ours(-1000.0) == 0.0 and ours(1000.0) == 1.0
