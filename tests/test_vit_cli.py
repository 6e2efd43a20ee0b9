"""``phasefield train-sweep | fit | predict``: end to end on a tiny model, and bad input."""

from __future__ import annotations

import json

import pytest

from phasefield.cli import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


TINY_ARGS = ("--depth", "2", "--width", "16", "--epochs", "1", "--batch-size", "128", "--quiet")


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--alpha", "0.2,1.5"), "--alpha must lie in [0, 1]"),
        (("--sigma-w", "abc"), "malformed range for --sigma-w"),
        (("--sigma-w", "0,1"), "--sigma-w must be > 0"),
        (("--patch-size", "3"), "does not divide"),
        (("--chunk", "0"), "--chunk must be >= 1"),
        (("--lr", "-1"), "--lr must be > 0"),
        (("--alpha", "0.5", "--alpha-a", "0.5"), "not both"),
        (("--activation", "swish"), "unknown activation"),
    ],
)
def test_train_sweep_bad_input(capsys, tmp_path, args, needle):
    out = tmp_path / "runs"
    code, stdout, err = run(capsys, "train-sweep", "--out", str(out), "--data-dir", str(tmp_path), *TINY_ARGS, *args)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert not out.exists()  # nothing that could look like a finished sweep


def test_unknown_dataset_is_one_line(capsys, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    code, _, err = run(
        capsys,
        "train-sweep",
        "--dataset",
        "no_such_dataset_xyz",
        "--out",
        str(tmp_path / "r"),
        "--data-dir",
        str(tmp_path),
        *TINY_ARGS,
    )
    assert code == 2 and err.count("\n") == 1 and "no_such_dataset_xyz" in err


def test_fit_and_predict_bad_input(capsys, tmp_path):
    code, _, err = run(capsys, "fit", "--runs", str(tmp_path / "missing"), "--out", str(tmp_path / "f.json"))
    assert code == 2 and err.count("\n") == 1 and "no such file" in err
    assert not (tmp_path / "f.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    code, _, err = run(capsys, "predict", "--fit", str(bad), "--sigma-w", "1", "--alpha", ".5")
    assert code == 2 and err.count("\n") == 1 and "not a fit file" in err
    code, _, err = run(capsys, "predict", "--sigma-w", "1", "--alpha", "1.5")
    assert code == 2 and "--alpha-a must lie in [0, 1]" in err
    code, _, err = run(capsys, "predict", "--sigma-w", "1", "--alpha", ".5", "--depth", "0")
    assert code == 2 and "--depth" in err and err.count("\n") == 1
    code, _, err = run(capsys, "recommend", "--alpha", "0.5", "--alpha-a", ".2")
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "recommend", "--n-tokens", "1")
    assert code == 2 and "--n-tokens" in err


def _write_study_dir(out, rows, feats, geometry):
    """A sweep directory as the trainability study leaves it: tables, geometry, features."""
    import csv

    from phasefield.vit.design import config_id
    from phasefield.vit.train import TrainConfig

    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"config": TrainConfig().to_dict(), "num_classes": 10}))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "input_geometry.json").write_text(json.dumps(geometry))
    ids = list(dict.fromkeys(config_id(r) for r in rows))
    with open(out / "features.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config"] + sorted(feats))
        for i, c in enumerate(ids):
            w.writerow([c] + [feats[k][i] for k in sorted(feats)])


@pytest.mark.usefixtures("small_ensembles")
def test_fit_on_a_study_directory_and_mixed_learning_rates(capsys, tmp_path):
    """fit reads a study directory (cached features), prints the report, writes a model that
    predict accepts; a table mixing learning rates is refused unless --per-lr. --no-nested
    leaves out the nested CV (about half this test's CPU; the pooled fit in
    test_trainability keeps it, and the report then says nothing of it)."""
    import numpy as np

    from phasefield.vit import design

    rng = np.random.default_rng(1)
    configs = [
        dict(c, depth=L, lr=1e-3)
        for L in (8, 16)
        for c in design.sobol(
            8, dict(sigma_w=(0.5, 2.5), sigma_a=(0.5, 3), alpha_a=(0.1, 0.9), alpha_m=(0.1, 0.9)), seed=L
        )
    ]
    la, lg = rng.normal(0, 0.4, 16), rng.normal(0, 0.3, 16)
    names = (
        "lambda_a",
        "lambda_g_collapse",
        "lambda_g_inf",
        "rho_star",
        "angle_rate_in_paper",
        "lambda_g_in_paper",
        "lambda_g_in_paper_corr",
        "rho_out_paper",
    )
    feats = {
        k: (la if k.startswith(("lambda_a", "angle_rate")) else lg if "lambda_g" in k else np.ones(16)) for k in names
    }
    rows = [
        dict(c, seed=s, test_loss=float(0.3 + abs(la[i]) + 0.02 * rng.standard_normal()), test_acc=0.9, diverged=False)
        for i, c in enumerate(configs)
        for s in range(2)
    ]
    out = tmp_path / "study"
    _write_study_dir(out, rows, feats, dict(q0=1.6, rho0=0.06))
    fit = tmp_path / "fit.json"
    code, stdout, err = run(  # two folds: the CV's scores are not this test's claim
        capsys, "fit", "--runs", str(out), "--out", str(fit), "--folds", "2", "--repeats", "1", "--no-nested"
    )
    assert code == 0, err
    assert "noise floor" in stdout and "best exponent model" in stdout and "quad_hp" in stdout
    assert "nested CV" not in stdout
    doc = json.loads(fit.read_text())
    assert doc["report"]["nested"] is None and doc["model"]["cv"]["nested_r2"] is None
    assert doc["report"]["n_configs"] == 16 and doc["report"]["seeds"] == 2
    assert doc["model"]["input_geometry"]["q0"] == 1.6
    code, stdout, err = run(
        capsys,
        "predict",
        "--fit",
        str(fit),
        "--sigma-w",
        "1.2",
        "--alpha-a",
        ".4",
        "--alpha-m",
        ".6",
        "--sigma-a",
        "1",
        "--depth",
        "8",
        "--json",
    )
    assert code == 0, err
    res = json.loads(stdout)
    assert res["interval"][0] <= res["predicted_loss"] <= res["interval"][1]
    assert isinstance(res["lambda_a"], float) and isinstance(res["warnings"], list)
    # a second learning rate in the table
    more = [dict(r, lr=1e-2) for r in rows]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + more))
    code, _, err = run(capsys, "fit", "--runs", str(out), "--out", str(fit))
    assert code == 2 and "mixes learning rates" in err and err.count("\n") == 1


def test_train_sweep_designs(capsys, tmp_path):
    """--design sobol:N with a depth list, and --points FILE: the right runs are trained. The
    points file has the design's shape (two runs at each depth), so its sweep trains and
    computes its theory with the design sweep's compiled programs."""
    out = tmp_path / "runs"
    code, stdout, err = run(
        capsys,
        "train-sweep",
        "--design",
        "sobol:2",
        "--sigma-w",
        "0.5:2",
        "--sigma-a",
        "1:3",
        "--alpha-a",
        ".1:.9",
        "--alpha-m",
        "0.5",
        "--depth",
        "1,2",
        "--width",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--quiet",
        "--json",
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path),
    )
    assert code == 0, err
    assert json.loads(stdout)["trained"] == 4
    rows = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["depth"] for r in rows) == [1, 1, 2, 2]
    assert all(0.5 <= r["sigma_w"] <= 2 and 1 <= r["sigma_a"] <= 3 and r["alpha_m"] == 0.5 for r in rows)
    pts = tmp_path / "points.csv"
    pts.write_text("sigma_w,sigma_a,alpha,depth\n1.0,1.0,0.5,1\n2.0,1.5,0.3,2\n1.5,2.0,0.7,1\n0.5,1.0,0.2,2\n")
    out2 = tmp_path / "runs2"
    code, stdout, err = run(
        capsys,
        "train-sweep",
        "--points",
        str(pts),
        "--width",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--quiet",
        "--json",
        "--out",
        str(out2),
        "--data-dir",
        str(tmp_path),
    )
    assert code == 0, err
    rows = [json.loads(l) for l in (out2 / "results.jsonl").read_text().splitlines()]
    assert sorted((r["sigma_w"], r["sigma_a"], r["depth"], r["alpha_a"], r["alpha_m"]) for r in rows) == [
        (0.5, 1.0, 2, 0.2, 0.2),
        (1.0, 1.0, 1, 0.5, 0.5),
        (1.5, 2.0, 1, 0.7, 0.7),
        (2.0, 1.5, 2, 0.3, 0.3),
    ]
    for bad, needle in (
        (("--design", "sobol:x"), "--design"),
        (("--design", "sobol:4", "--sigma-w", "2:1"), "lo <= hi"),
        (("--points", str(tmp_path / "nope.csv")), "cannot read points file"),
        (("--depth", "0"), "--depth"),
    ):
        code, _, err = run(capsys, "train-sweep", "--out", str(tmp_path / "r3"), "--quiet", *bad)
        assert code == 2 and needle in err and err.count("\n") == 1, err
        assert not (tmp_path / "r3").exists()
