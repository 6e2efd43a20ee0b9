"""P(fails to train): the shared criterion, the failure model, its grouped CV and
scores, its serialization, and predict / recommend carrying and respecting it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from phasefield.cli import main
from phasefield.vit import analysis, design
from phasefield.vit import failure as FL

L_SAT = math.log(10)
BOX = dict(sigma_w=(0.3, 3.0), sigma_a=(0.3, 4.0), alpha_a=(0.05, 0.95), alpha_m=(0.05, 0.95))


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ criterion
def test_a_run_fails_when_it_diverged_or_ended_within_five_percent_of_chance():
    r = lambda v, **kw: dict(test_loss=v, **kw)
    assert analysis.at_chance(r(0.95 * L_SAT), L_SAT) and analysis.at_chance(r(L_SAT), L_SAT)
    assert not analysis.at_chance(r(0.94 * L_SAT), L_SAT) and not analysis.at_chance(r(0.1), L_SAT)
    assert analysis.at_chance(r(float("nan")), L_SAT) and analysis.at_chance(r(None), L_SAT)
    assert analysis.at_chance(r(0.1, diverged=True), L_SAT) and analysis.at_chance(r(5.0), L_SAT)
    rows = [
        dict(sigma_w=1.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, depth=16, lr=1e-3, seed=s, test_loss=v)
        for s, v in enumerate((0.2, 2.25, float("nan")))
    ]
    tab = analysis.configurations(rows, 10)
    assert tab["run_failed"] == [[0, 1, 1]] and tab["n_failed"].tolist() == [2]
    T = FL.run_table(tab)
    assert T["failed"].tolist() == [0, 1, 1] and T["group"].tolist() == [0, 0, 0]


# ------------------------------------------------------------------------------ grouped CV
def test_grouped_folds_never_split_a_configuration():
    groups = np.repeat(np.arange(23), 3)
    for seed in range(4):
        seen = np.zeros(len(groups), int)
        for tr, te in FL.grouped_folds(groups, 5, seed):
            assert not set(groups[tr]) & set(groups[te])
            assert len(tr) + len(te) == len(groups)
            seen[te] += 1
        assert (seen == 1).all()  # every run is tested exactly once
    # uneven group sizes, shuffled rows
    g = np.random.default_rng(0).permutation(np.repeat(np.arange(10), [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]))
    for tr, te in FL.grouped_folds(g, 3, 1):
        assert not set(g[tr]) & set(g[te])
    with pytest.raises(ValueError, match="too few"):
        list(FL.grouped_folds(np.arange(3), 5))


def test_auc_brier_and_reliability():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)
    p = np.clip(0.3 * y + rng.uniform(0, 0.7, 200), 0, 1)
    p[:20] = 0.5  # ties
    assert FL.auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert FL.auc([0, 0, 1], [0.1, 0.2, 0.9]) == 1.0 and FL.auc([0, 0, 1], [0.9, 0.8, 0.1]) == 0.0
    assert math.isnan(FL.auc([1, 1], [0.2, 0.3]))
    assert FL.brier([0, 1], [0.0, 1.0]) == 0.0 and FL.brier([0, 1], [0.5, 0.5]) == 0.25
    rel = FL.reliability(y, p)
    assert sum(b["n"] for b in rel) == len(y) and sum(b["failed"] for b in rel) == y.sum()
    for b in rel:
        if b["n"]:
            assert b["lo"] <= b["mean_pred"] <= b["hi"]


def _runs(n_configs=40, seeds=3, seed=0):
    """A synthetic run table: P(fail) = expit(4 (alpha_m - 0.7) / 0.1 ... ), seeds Bernoulli."""
    rng = np.random.default_rng(seed)
    configs = [dict(c, depth=16, lr=1e-3) for c in design.sobol(n_configs, BOX, seed=seed)]
    rows = []
    for c in configs:
        p = 1 / (1 + math.exp(-(c["alpha_m"] - 0.7) * 25 + (c["sigma_w"] - 1.6)))
        for s in range(seeds):
            rows.append(dict(c, seed=s, test_loss=L_SAT if rng.uniform() < p else 0.2 + 0.05 * rng.uniform()))
    tab = analysis.configurations(rows, 10)
    tab = analysis.add_features(tab, {})
    return tab, FL.run_table(tab)


def test_logistic_candidates_learn_the_boundary_and_round_trip():
    tab, T = _runs()
    for name in ("logistic_raw_eff", "logistic_sw_sa_eff2", "forest_branches"):
        cv = FL.cross_validate(name, T, k=4, repeats=1)
        assert cv["auc"] > 0.85, name
        oof = np.asarray(cv["oof"], float)
        assert np.all((0 <= oof) & (oof <= 1)), name  # a NaN fails (min/max would depend on its place)
        m = FL.fit(name, T)
        X = FL.X_of(T, m.features)
        back = FL.from_json(json.loads(json.dumps(m.to_json())))
        np.testing.assert_array_equal(back.predict_proba(X), m.predict_proba(X))
        p = m.predict_proba(X)
        assert ((0 <= p) & (p <= 1)).all()
    bad = FL.fit("logistic_raw", T).to_json()
    bad["coef"] = bad["coef"][:-1]
    with pytest.raises(ValueError, match="coefficients"):
        FL.from_json(bad)
    with pytest.raises(ValueError, match="kind"):
        FL.from_json(dict(kind="pickle"))


def test_platt_model_is_monotone_in_the_predicted_loss_and_its_nested_cv_holds_configurations_out():
    tab, T = _runs(n_configs=32)
    # a loss model's out-of-fold predictions: the chance loss where runs fail
    m = FL.fit_platt(tab["loss"], tab["run_failed"])
    assert m.coef[0] > 0
    grid = np.linspace(0, 2.5, 101)[:, None]
    p = m.predict_proba(grid)
    assert (np.diff(p) >= 0).all() and ((0 < p) & (p < 1)).all()
    specs = analysis.model_specs(tab)
    st = FL.cross_validate_stacked(tab, T, specs["linear_hp_eff"], k=4, repeats=1, inner_k=3)
    assert st["auc"] > 0.8 and len(st["oof"]) == len(T["failed"])
    # one class only: a constant probability, still in (0, 1)
    c = FL.fit_platt([0.1, 0.2], [[0, 0], [0, 0]])
    assert 0 < c.predict_proba([[0.1]])[0] < 0.01


# ------------------------------------------------------------------------------ shipped
def test_packaged_model_carries_a_calibrated_failure_probability():
    from phasefield.vit import predict as P

    doc = P.load_model()
    f = doc["failure"]
    assert f["name"] == FL.SHIPPED and "0.95 log C" in f["criterion"] and f["n_configs"] >= 193
    assert f["cv"]["auc"] > 0.9 and f["cv"]["brier"] < f["cv"]["brier_base"]
    sw, am = np.meshgrid(np.linspace(0.3, 3, 5), np.linspace(0.05, 0.95, 5))
    res = P.predict(sw.ravel(), 4.0, 0.95, am.ravel(), 16, doc)
    p = np.array([r["p_fail"] for r in res])
    y = np.array([r["predicted_loss"] for r in res])
    assert ((0 <= p) & (p <= 1)).all()
    o = np.argsort(y)  # monotone in the predicted loss it scales
    assert (np.diff(p[o]) >= -1e-12).all()
    mid = P.predict(1.65, 2.15, 0.5, 0.5, 16, doc)["p_fail"]
    edge = P.predict(1.65, 4.0, 0.95, 0.95, 16, doc)["p_fail"]
    assert mid < 0.1 < edge
    # round trip through JSON text, as the file ships
    back = json.loads(json.dumps(doc))
    assert P.predict(1.0, 1.0, 0.7, 0.9, 16, back)["p_fail"] == P.predict(1.0, 1.0, 0.7, 0.9, 16, doc)["p_fail"]
    # an older fit file without a failure model: predict says None
    old = {k: v for k, v in doc.items() if k != "failure"}
    assert P.predict(1.0, 1.0, 0.5, 0.5, 16, old)["p_fail"] is None


def test_predict_cli_prints_and_json_carries_p_fail(capsys, tmp_path):
    code, out, err = run(
        capsys, "predict", "--sigma-w", "1.2", "--alpha-a", "0.9", "--alpha-m", "0.95", "--sigma-a", "3", "--json"
    )
    assert code == 0, err
    res = json.loads(out)
    assert 0 <= res["p_fail"] <= 1 and "0.95 log C" in res["fail_criterion"]
    code, out, err = run(capsys, "predict", "--sigma-w", "1.2", "--alpha", "0.3")
    assert code == 0 and "P(fails to train) = " in out
    from phasefield.vit import predict as P

    bad = dict(P.load_model(), failure=dict(model=dict(kind="logistic", features=["predicted_loss"])))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    code, out, err = run(capsys, "predict", "--fit", str(path), "--sigma-w", "1", "--alpha", ".5")
    assert code == 2 and err.count("\n") == 1 and "malformed" in err and "Traceback" not in err and out == ""
    # a scaled interval whose scale model is broken is refused the same way, before any work
    bad = json.loads(json.dumps(P.load_model()))
    assert "scale" in bad["interval"]
    del bad["interval"]["scale"]["state"]
    path.write_text(json.dumps(bad))
    code, out, err = run(capsys, "predict", "--fit", str(path), "--sigma-w", "1", "--alpha", ".5")
    assert code == 2 and err.count("\n") == 1 and "malformed" in err and "Traceback" not in err and out == ""


def _harsh_doc():
    """The packaged model with its failure model shifted so that much of the box fails."""
    from phasefield.vit import predict as P

    doc = json.loads(json.dumps(P.load_model()))
    doc["failure"]["model"]["intercept"] += 4.0
    return doc


def test_recommend_never_proposes_a_point_above_max_fail_prob():
    from phasefield.vit import predict as P
    from phasefield.vit import recommend as R

    doc = _harsh_doc()
    level = 0.3
    res = R.recommend(
        n_tokens=17, depth=16, fixed=dict(sigma_a=3.5), candidates=64, top=3, model=doc, max_fail_prob=level
    )
    assert res["max_fail_prob"] == level and res["excluded"]["evaluated"] > 0
    proposed = res["critical"] + [res["lowest_predicted_loss"]]
    for c in proposed:
        assert c["p_fail"] <= level
        again = P.predict(c["sigma_w"], c["sigma_a"], c["alpha_a"], c["alpha_m"], 16, doc)["p_fail"]
        assert again == pytest.approx(c["p_fail"], abs=1e-12) and again <= level
    with pytest.raises(R.RecommendError, match="no point"):
        R.recommend(n_tokens=17, depth=16, candidates=32, top=1, model=doc, max_fail_prob=0.0)


def test_recommend_cli_max_fail_prob(capsys, tmp_path):
    path = tmp_path / "harsh.json"
    path.write_text(json.dumps(_harsh_doc()))
    code, out, err = run(
        capsys, "recommend", "--fit", str(path), "--sigma-a", "3.5", "--max-fail-prob", "0.3", "--json"
    )
    assert code == 0, err
    res = json.loads(out)
    assert res["lowest_predicted_loss"]["p_fail"] <= 0.3 and all(c["p_fail"] <= 0.3 for c in res["critical"])
    for args in (
        ("--max-fail-prob", "0"),
        ("--max-fail-prob", "1.5"),
        ("--max-fail-prob", "0.1", "--no-loss"),
        ("--max-fail-prob", "nan"),
    ):
        code, out, err = run(capsys, "recommend", "--fit", str(path), *args)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and out == "", args
    code, out, err = run(capsys, "recommend", "--fit", str(path), "--max-fail-prob", "0")
    assert "no point" in err and "--max-fail-prob" in err
