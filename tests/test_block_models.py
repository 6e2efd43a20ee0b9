"""The standard blocks' shipped loss predictors: one model per block inside the package,
loaded by block, refused for another block, and the block study's analysis
(:mod:`phasefield.vit.study.blocks`) on a tiny subset of the post-LN study."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phasefield.vit import analysis, failure
from phasefield.vit import predict as vp
from phasefield.vit.study import blocks as study
from phasefield.vit.study import registry


@pytest.mark.parametrize("block", ["pre-ln", "post-ln"])
def test_each_block_has_its_shipped_model(block):
    doc = vp.load_model(block=block)
    assert doc["block"] == block and vp.block_of(doc) == f"{block}:heads=4"
    assert doc["attention"] == "exact" and doc["failure"] and doc["cv"]["nested_r2"] is not None
    # keywords left out take the fitted ones; the fitted ones are accepted
    vp.check_block(doc, f"{block}:heads=4")
    assert block in vp.shipped_blocks() and "paper" in vp.shipped_blocks()
    assert vp.load_model()["block"] == "paper"


def test_a_model_of_another_block_is_refused_in_one_line():
    pre = vp.load_model(block="pre-ln")
    for call in (
        lambda: vp.predict(1.0, 1.0, 0.5, 0.5, 16, pre, block="post-ln"),
        lambda: vp.check_block(pre, "pre-ln:heads=12"),
        lambda: vp.check_block(vp.load_model(), "pre-ln"),
        lambda: vp.load_model(block="rms-swiglu"),
    ):
        with pytest.raises(ValueError) as exc:
            call()
        assert isinstance(exc.value, vp.FitError) and "\n" not in str(exc.value)


def test_block_predictions():
    """One pre-LN point (its model needs the block's rates: one program at L = 16), and the
    post-LN model's failure part read from its document."""
    pre = vp.predict(1.0, 1.0, 0.5, 0.5, 16, block="pre-ln")
    assert pre["block"] == "pre-ln:heads=4" and not pre["warnings"]
    assert 0.0 < pre["predicted_loss"] < 0.5 and pre["interval"][0] <= pre["predicted_loss"] <= pre["interval"][1]
    # no pre-LN run failed: P(fail) is the rule of three's bound 3 / N everywhere
    n = vp.load_model(block="pre-ln")["failure"]["n_runs"]
    assert pre["p_fail"] == pytest.approx(3 / n, rel=1e-9) and "rule of three" in pre["fail_note"]
    post = vp.load_model(block="post-ln")
    f = post["failure"]
    assert f["name"] == "platt_loss" and 0 < f["n_failed"] < f["n_runs"] and f["cv"]["auc"] > 0.8
    # P(fail) grows with the predicted loss (post-LN's failures end at chance)
    p = vp.p_fail(post, [0.1, 2.2])
    assert p[0] < 0.2 < 0.8 < p[1]


def test_rule_of_three_and_rates_vs_raw():
    """The two pieces of the blocks' analysis on a made-up report: P(fail) without failures
    is 3 / N, and the paired comparison is the mean difference of squared errors +- its se."""
    y = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    L = np.array([8, 8, 8, 16, 16, 16])
    oof = {"a": y + 0.01, "b": y - 0.05, "c": y + 0.02, "d": y}
    models = {k: dict(oof=v.tolist(), cv_r2=0.5, cv_rmse=0.1) for k, v in oof.items()}
    rep = dict(
        models=models,
        table=dict(loss=y.tolist(), depth=L.tolist(), run_failed=[[0, 0]] * 6, run_losses=[[v, v] for v in y]),
        best_exponent_model="a",
        best_raw_model="b",
        transfer={},
        L_sat=math.log(10),
    )
    r = study.rates_vs_raw(rep)
    first = r["pairs"][0]
    d = (oof["a"] - y) ** 2 - (oof["b"] - y) ** 2
    assert first["all"]["mean"] == pytest.approx(d.mean()) and first["all"]["se"] == pytest.approx(
        d.std(ddof=1) / np.sqrt(6)
    )
    assert first["by_depth"]["8"]["mean"] == pytest.approx(d[:3].mean())
    doc, cv = study.block_failure_doc(rep, dict(name="a"), 2, 1)
    assert doc["n_runs"] == 12 and cv["bound"] == pytest.approx(0.25)
    p = failure.from_json(doc["model"]).predict_proba(np.array([[0.1], [2.0]]))
    np.testing.assert_allclose(p, 0.25, rtol=1e-12)


def test_block_analysis_on_a_tiny_subset(monkeypatch):
    """The blocks' analyze (fit_sweep with the block's cached features, nested CV, rates vs raw,
    Platt failure model) on 16 post-LN configurations with a few linear candidates (cheap)."""
    keep = ("depth_max", "lambda_a_only", "linear_hp", "linear_hybrid", "constant")
    specs = analysis.model_specs
    monkeypatch.setattr(analysis, "model_specs", lambda tab: {k: v for k, v in specs(tab).items() if k in keep})
    monkeypatch.setattr(analysis, "CANDIDATES", ("constant", "linear_hp", "linear_hybrid"))
    monkeypatch.setattr(failure, "CANDIDATES", {k: failure.CANDIDATES[k] for k in ("logistic_raw",)})
    rep, model = study.analyze_block(registry.study("post-ln"), "post-ln", folds=3, repeats=1, subset=16)
    assert rep["n_configs"] == 16 and model["block"] == "post-ln" and model["name"] in keep
    assert rep["nested"]["r2"] is not None and rep["rates_vs_raw"]["pairs"]
    assert 0 < model["failure"]["n_failed"] < model["failure"]["n_runs"] == 48
    # (16 configurations, 3 folds: the scores are a smoke check of the pipeline, not a result)
    f = rep["failure"]["shipped"]
    assert (
        0.0 <= f["auc"] <= 1.0
        and f["n_runs"] == 48
        and f["reliability"]
        and "logistic_raw" in rep["failure"]["candidates"]
    )
