"""The trainability study as a library (:mod:`phasefield.vit.study`): its registry against the
committed result tables, the provenance every shipped model file carries, the writers that
put it there, and the script as a thin command line over the library."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import io as _io
import json
import os
import re

import pytest

from phasefield.vit import predict as vp
from phasefield.vit.study import blocks, heldout, loss, pooled, training
from phasefield.vit.study import provenance as P
from phasefield.vit.study import registry as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBCOMMANDS = ("run", "plan", "features", "analyze", "score", "failure", "heldout")


def _load_script(name):
    """scripts/NAME.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name + "_cli", os.path.join(ROOT, "scripts", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def script():
    return _load_script("trainability_study")


def _shipped(block):
    path = os.path.join(R.PACKAGE_DIR, vp.BLOCK_RESOURCES[block])
    with open(path) as f:
        return path, json.load(f)


@pytest.mark.parametrize("block", sorted(vp.BLOCK_RESOURCES))
def test_every_shipped_model_records_its_provenance(block):
    """data (the studies and their committed tables), procedure, the regenerating commands,
    the version and the date, first in the file; the loader keeps it and predicts as before."""
    path, doc = _shipped(block)
    assert next(iter(doc)) == "provenance"
    prov = P.of(doc)
    assert set(prov) >= {"data", "procedure", "command", "phasefield_version", "fitted"}
    data = prov["data"]
    assert data["dataset"] == doc["train_config"]["dataset"] == "digits"
    assert data["studies"] and set(data["studies"]) <= set(R.STUDIES)
    assert data["tables"] == [os.path.relpath(R.STUDIES[s]["out"], R.ROOT) for s in data["studies"]]
    for table in data["tables"]:
        assert os.path.exists(os.path.join(ROOT, table, "results.jsonl")), table
    assert (data["n_configs"], data["n_runs"]) == (doc["n_configs"], doc["n_runs"])
    proc = prov["procedure"]
    assert proc["model"] == doc["name"] and proc["kind"] == doc["kind"] and proc["family"] == doc["family"]
    assert {"loss", "interval", "failure"} <= set(proc)
    for cmd in prov["command"]:
        words = cmd.split()
        assert words[:2] == ["python", "scripts/trainability_study.py"] and words[2] in SUBCOMMANDS, cmd
        if "--study" in words:
            assert words[words.index("--study") + 1] in R.STUDIES
    assert any(" --ship" in c for c in prov["command"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", prov["phasefield_version"])
    datetime.date.fromisoformat(prov["fitted"])
    if block == "paper":
        assert data["studies"] == list(R.POOLED)
    else:
        assert data["studies"] == [block] and doc["study"] == data["tables"][0]
    loaded = vp.load_model(block=block)
    assert loaded["provenance"] == prov
    assert vp.load_model(path) == loaded


@pytest.mark.parametrize("block", ["pre-ln", "post-ln"])
def test_a_block_names_its_angle_feature_by_what_it_is(block):
    """lambda_a is the exponent at the collapsed fixed point alone: pre-LN has none at any
    configuration of its studies (lambda_a NaN in every features.csv row, no lambda_a in its
    result rows), so its shipped model reads angle_rate (the finite-depth angle rate, finite
    everywhere); post-LN has one everywhere (lambda_a finite). A model file renamed since it
    was fitted says so in its provenance, one line per change."""
    import csv
    import math

    _, doc = _shipped(block)
    angle, other = ("angle_rate", "lambda_a") if block == "pre-ln" else ("lambda_a", "angle_rate")
    assert {angle, f"L_{angle}"} <= set(doc["features"]) and other not in doc["features"]
    notes = P.renamed(doc)
    assert notes and all(isinstance(n, str) and "\n" not in n for n in notes)
    assert any("renamed angle_rate" in n for n in notes) == (block == "pre-ln")
    for study in (block, f"{block}-holdout", f"{block}-mnist1d"):
        with open(os.path.join(R.STUDIES[study]["out"], "features.csv")) as f:
            rows = list(csv.DictReader(f))
        assert rows and all(math.isfinite(float(r["angle_rate"])) for r in rows), study
        fixed_point = [math.isfinite(float(r["lambda_a"])) for r in rows]
        assert not any(fixed_point) if block == "pre-ln" else all(fixed_point), study
        with open(os.path.join(R.STUDIES[study]["out"], "results.jsonl")) as f:
            keys = set().union(*(json.loads(line) for line in f if line.strip()))
        assert ("lambda_a" in keys) == (block == "post-ln"), study
    assert P.renamed({}) == []


def test_provenance_plays_no_part_in_a_prediction():
    doc = vp.load_model()
    bare = {k: v for k, v in doc.items() if k != "provenance"}
    a = vp.predict([0.8, 1.5], [1.0, 2.0], [0.3, 0.6], [0.2, 0.9], [16, 8], doc)
    b = vp.predict([0.8, 1.5], [1.0, 2.0], [0.3, 0.6], [0.2, 0.9], [16, 8], bare)
    assert a == b


def test_the_writers_put_the_provenance_in(tmp_path, monkeypatch):
    """``analyze --ship`` (the paper block and a standard block) and ``failure --ship``'s
    update write the provenance first and leave every fitted number as it was."""
    _, paper = _shipped("paper")
    model = {k: v for k, v in paper.items() if k != "provenance"}
    monkeypatch.setattr(R, "model_path", lambda block="paper": str(tmp_path / f"{block}.json"))
    path = loss.ship(dict(model=model, studies=list(R.POOLED), interval_kind="scaled"), 5, 5)
    with open(path) as f:
        written = json.load(f)
    prov = written.pop("provenance")
    assert written == model
    assert prov["command"] == [
        "python scripts/trainability_study.py analyze --ship",
        "python scripts/trainability_study.py failure --ship",
    ]
    assert prov["phasefield_version"] == P.version() and prov["fitted"] == datetime.date.today().isoformat()
    assert prov["procedure"] == paper["provenance"]["procedure"] and prov["data"] == paper["provenance"]["data"]
    # failure --ship: the failure entry and command follow its CV options
    again = P.with_failure(dict(written, provenance=prov), list(R.POOLED), 3, 2)
    assert again["command"][-1] == "python scripts/trainability_study.py failure --ship --folds 3 --repeats 2"
    assert sum("failure" in c.split() for c in again["command"]) == 1 and "x 2" in again["procedure"]["failure"]
    assert again["data"] == prov["data"]
    assert P.with_failure(model, list(R.POOLED), 5, 5)["data"]["studies"] == list(R.POOLED)

    _, pre = _shipped("pre-ln")
    model = {k: v for k, v in pre.items() if k != "provenance"}
    path = blocks.ship(model, "pre-ln", 5, 1)
    doc = vp.load_model(path, block="pre-ln")
    assert next(iter(doc)) == "provenance" and {k: v for k, v in doc.items() if k != "provenance"} == model
    assert (
        doc["provenance"]["command"]
        == pre["provenance"]["command"]
        == [
            "python scripts/trainability_study.py features --study pre-ln",
            "python scripts/trainability_study.py analyze --study pre-ln --ship --repeats 1",
        ]
    )
    assert "rule of three" in doc["provenance"]["procedure"]["failure"]


def test_the_registry_reproduces_the_committed_designs():
    """The Sobol designs the registry plans are the configurations in the committed tables
    (the paths resolve from the package to docs/data/trainability)."""
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id

    assert R.STUDIES["main"]["out"] == R.DEFAULT_OUT == os.path.join(ROOT, "docs", "data", "trainability")
    assert set(R.POOLED) <= set(R.STUDIES) and not set(R.POOLED) & {s for p in R.HELDOUT.values() for s in p}
    for st in R.STUDIES.values():
        assert st["out"].startswith(R.DEFAULT_OUT) and (st.get("holdout_of") in (None, *R.STUDIES))
    trained = {
        config_id(r) for d in (R.STUDIES["main"]["out"], R.STUDIES["depth"]["out"]) for r in vsweep.read_results(d)
    }
    first = pooled.planned_first()
    assert len(first) == 64 and first <= trained
    for name in ("corners", "faces", "edges", "holdout3", "post-ln-L64", "pre-ln-L64"):
        st = R.study(name)
        want = {
            config_id(dict(c, lr=1e-3))
            for d, lo, hi in R.blocks(R.parse_plan(st["plan"]))
            for c in R.study_configs(st, d, hi)[lo:hi]
        }
        assert want == {config_id(r) for r in vsweep.read_results(st["out"])}, name
    edges = R.configs(16, 20, "edges")
    assert all(c["alpha_m"] == R.BOUNDS["alpha_m"][1] for c in edges[:12])
    assert R.study("main", plan="16:8", out=None)["plan"] == "16:8"


def test_heldout_pooling_reproduces_the_committed_report(tmp_path, monkeypatch):
    monkeypatch.setattr(heldout, "report_path", lambda name: str(tmp_path / f"{name}.json"))
    rep = heldout.pool("holdout2", resamples=20)
    with open(os.path.join(R.DEFAULT_OUT, "heldout2.json")) as f:
        committed = json.load(f)
    for k in (
        "n_configs",
        "n_runs",
        "n_failed",
        "model",
        "r2_runs",
        "r2_means",
        "coverage_runs",
        "auc",
        "brier",
        "brier_base",
        "reliability",
        "per_study",
    ):
        assert rep[k] == committed[k], k
    with pytest.raises(R.StudyError, match="holdout2 or holdout3"):
        heldout.pool("main")


def test_the_script_is_a_thin_command_line(script, capsys):
    """Every study is a --study choice; 'plan' prints the library's projected cost; a library
    refusal is a one-line exit."""
    assert script.STUDIES is R.STUDIES
    script.main(["plan", "--study", "corners"])
    lines = capsys.readouterr().out.splitlines()
    cost = training.plan_cost(R.study("corners"))
    assert len(lines) == len(cost) and lines[-1].endswith(f"(cumulative {cost[-1]['cumulative'] / 60:5.1f} min)")
    with pytest.raises(SystemExit) as exc:
        script.main(["heldout", "--study", "main"])
    assert str(exc.value) == "heldout pools holdout2 or holdout3 (--study), not main"
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(_io.StringIO()):
        script.main(["plan", "--study", "nonesuch"])
    assert exc.value.code == 2
    # the script holds no study logic: every def is a command, a printer or the parser
    defs = [
        n
        for n in vars(script)
        if callable(getattr(script, n)) and getattr(getattr(script, n), "__module__", "") == script.__name__
    ]
    assert all(n.startswith(("cmd_", "block_", "_print", "_study", "main")) for n in defs), defs


def test_the_fix_studies_find_their_l64_configurations_in_the_deep_extension():
    """At L 64 the configurations come from the block studies' deep extension: post-LN's
    where every seed failed (the lowest sigma of them, for one), pre-LN's worst seed mean."""
    from phasefield.vit import sweep as vsweep

    fs = _load_script("fix_study")

    def by_config(name):
        out = {}
        for r in vsweep.read_results(R.STUDIES[name]["out"]):
            assert r["depth"] == 64
            out.setdefault(r["sigma_w"], []).append(r["test_loss"])
        return out

    failed = [k for k, v in by_config("post-ln-L64").items() if min(v) >= fs.TRAINS]
    (post,) = fs.configurations("post-ln", 64, 1)
    assert post["sigma_w"] == min(failed) and min(post["study_losses"]) >= fs.TRAINS
    pre = by_config("pre-ln-L64")
    assert fs.configurations("pre-ln", 64, 1)[0]["sigma_w"] == max(pre, key=lambda k: sum(pre[k]) / len(pre[k]))
    assert fs.configurations("post-ln", 32, 1)[0]["sigma_w"] < 1  # L 8-32: the study itself


def test_recipes_summary_compares_the_arms_on_complete_configurations_only():
    """A configuration where some arm has not run every seed is left out of the summary (and
    counted as in progress), so every arm's paired difference to the fix is over the same
    configurations; a not-applicable row counts as run."""
    rs = _load_script("recipes_study")
    rows = [
        dict(
            config="A", arm=arm, seed=s, applicable=arm != "deepnorm", test_loss=0.1 + 0.01 * i + 0.001 * s, trains=True
        )
        for i, arm in enumerate(rs.ARMS)
        for s in (0, 1, 2)
    ]
    rows += [
        dict(config="B", arm=arm, seed=s, test_loss=2.3, trains=False) for arm in ("as is", "fixed") for s in (0, 1, 2)
    ]
    rows.append(dict(config="B", arm="gpt2", seed=0, test_loss=0.05, trains=True))  # 1 of 3 seeds: not complete
    done, partial = rs.complete_configs(rows)
    assert done == {"A"} and partial == {"B": 2}
    summ = {s["arm"]: s for s in rs.summary_rows([r for r in rows if r["config"] in done])}
    assert summ["gpt2"]["configs"] == 1 and summ["gpt2"]["pairs"] == 3
    assert summ["gpt2"]["diff_mean"] == pytest.approx(0.01 * (rs.ARMS.index("gpt2") - 1))
    assert summ["deepnorm"]["runs"] == 0 and summ["deepnorm"]["not_applicable"] == 3


def test_recipes_earlier_fix_is_shown_but_not_required():
    """The earlier search's fix (``fixed-grid``, kept where it was trained) is an arm of the
    summary where it ran, and a configuration without it is still complete."""
    rs = _load_script("recipes_study")
    rows = [dict(config="A", arm=arm, seed=s, test_loss=0.1, trains=True) for arm in rs.ARMS for s in (0, 1)]
    rows += [dict(config="A", arm="fixed-grid", seed=s, test_loss=0.3 + 0.1 * s, trains=True) for s in (0, 1)]
    rows += [dict(config="B", arm=arm, seed=s, test_loss=0.2, trains=True) for arm in rs.ARMS for s in (0, 1)]
    done, partial = rs.complete_configs(rows)
    assert done == {"A", "B"} and not partial
    summ = {s["arm"]: s for s in rs.summary_rows(rows, rs.ARMS + rs.EARLIER)}
    assert summ["fixed-grid"]["configs"] == 1 and summ["fixed-grid"]["diff_mean"] == pytest.approx(0.25)


def test_lm_study_residual_arm_is_the_searchs_residual_axis(tmp_path, monkeypatch):
    """The language-model study's ``fixed-residual`` arm: the probe's search point on the
    residual knob alone (its own key in ``fixes.jsonl``, found once), or none where the
    search has no such point."""
    import types

    lm = _load_script("lm_study")
    monkeypatch.setattr(lm, "OUT", str(tmp_path))
    calls = []

    def fake(*args):
        calls.append(args)
        axes = {} if "48" in args else {"weights": {"weights": 0.8}, "residual": {"residual": 0.3, "weights": 1.0}}
        fix = dict(multipliers={"weights": 0.8, "residual": 1.0}, meets=True, search=dict(axes=axes))
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(dict(fix=fix)), stderr="")

    monkeypatch.setattr(lm, "_phasefield", fake)
    assert lm.find_fix("post-ln", 32, "fixed-residual")["multipliers"] == {"residual": 0.3}
    assert lm.find_fix("post-ln", 32, "fixed")["multipliers"]["weights"] == 0.8  # its own key
    assert lm.find_fix("post-ln", 32, "fixed-residual")["multipliers"] == {"residual": 0.3}  # kept
    assert len(calls) == 2
    assert lm.find_fix("post-ln", 48, "fixed-residual")["multipliers"] is None


def test_recipes_residual_arm_scales_the_residual_projections_only():
    """The ViT study's ``fixed-residual`` arm: m_res of the search's residual axis on the
    residual projections, 1 elsewhere; not applicable where the model as it is met the
    criteria (no axis searched)."""
    import types

    rs = _load_script("recipes_study")
    fs = _load_script("fix_study")
    sel = {"blocks/attn/out/kernel": (None, True), "blocks/attn/qkv/kernel": (None, False)}
    training = types.SimpleNamespace(paths=sorted(sel), sel=sel)
    training.multipliers = lambda run: fs.Training.multipliers(training, run)
    row = dict(fix=dict(search=dict(axes={"residual": {"residual": 0.25, "weights": 1.0}})))
    mult, info = rs.arm_multipliers(training, "fixed-residual", "post-ln", 16, row)
    assert mult == {"blocks/attn/out/kernel": 0.25, "blocks/attn/qkv/kernel": 1.0} and "0.25" in info["text"]
    none, why = rs.arm_multipliers(training, "fixed-residual", "post-ln", 16, dict(fix=dict(search=dict(axes={}))))
    assert none is None and why["reason"]
