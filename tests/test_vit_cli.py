"""``phasefield train-sweep | fit | predict``: end to end on a tiny model, and bad input."""
from __future__ import annotations

import json
import os

import pytest

from phasefield.cli import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


TINY_ARGS = ("--depth", "2", "--width", "16", "--epochs", "1", "--batch-size", "128", "--quiet")


@pytest.mark.parametrize("args, needle", [
    (("--alpha", "0.2,1.5"), "--alpha must lie in [0, 1]"),
    (("--sigma-w", "abc"), "malformed range for --sigma-w"),
    (("--sigma-w", "0,1"), "--sigma-w must be > 0"),
    (("--patch-size", "3"), "does not divide"),
    (("--chunk", "0"), "--chunk must be >= 1"),
    (("--lr", "-1"), "--lr must be > 0"),
    (("--alpha", "0.5", "--alpha-a", "0.5"), "not both"),
    (("--activation", "swish"), "unknown activation"),
])
def test_train_sweep_bad_input(capsys, tmp_path, args, needle):
    out = tmp_path / "runs"
    code, stdout, err = run(capsys, "train-sweep", "--out", str(out), "--data-dir", str(tmp_path), *TINY_ARGS, *args)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert not out.exists()  # nothing that could look like a finished sweep


def test_unknown_dataset_is_one_line(capsys, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    code, _, err = run(capsys, "train-sweep", "--dataset", "no_such_dataset_xyz", "--out", str(tmp_path / "r"),
                       "--data-dir", str(tmp_path), *TINY_ARGS)
    assert code == 2 and err.count("\n") == 1 and "no_such_dataset_xyz" in err


def test_fit_and_predict_bad_input(capsys, tmp_path):
    code, _, err = run(capsys, "fit", "--runs", str(tmp_path / "missing"), "--out", str(tmp_path / "f.json"))
    assert code == 2 and err.count("\n") == 1 and "no such file" in err
    assert not (tmp_path / "f.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    code, _, err = run(capsys, "predict", "--fit", str(bad), "--sigma-w", "1", "--alpha", ".5")
    assert code == 2 and err.count("\n") == 1 and "not a fit file" in err
    code, _, err = run(capsys, "predict", "--fit", str(bad), "--sigma-w", "1", "--alpha", "1.5")
    assert code == 2 and "--alpha-a must lie in [0, 1]" in err
    code, _, err = run(capsys, "fit", "--runs", str(tmp_path), "--figure", str(tmp_path / "f.txt"))
    assert code == 2 and ".png" in err


def test_sweep_fit_predict_end_to_end(capsys, tmp_path):
    out = tmp_path / "runs"
    args = ("train-sweep", "--alpha", "0.2:0.9:3", "--sigma-w", "0.5:3:3", "--out", str(out),
            "--data-dir", str(tmp_path), "--chunk", "9", "--json", *TINY_ARGS)
    code, stdout, err = run(capsys, *args)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["trained"] == 9 and summary["runs_in_table"] == 9
    for name in ("results.csv", "results.json", "results.jsonl", "sweep.json"):
        assert (out / name).exists()
    assert len(os.listdir(out / "metrics")) == 9 and (out / "checkpoints" / "chunk_0001").is_dir()
    code, stdout, _ = run(capsys, *args)  # resumed: nothing to do
    assert code == 0 and json.loads(stdout)["trained"] == 0
    # a different config into the same directory: refused, one line
    code, _, err = run(capsys, *args[:-len(TINY_ARGS)], *TINY_ARGS[:-3], "--batch-size", "64", "--quiet")
    assert code == 2 and "different training config" in err and err.count("\n") == 1
    fit, fig = tmp_path / "fit.json", tmp_path / "fig7.png"
    code, stdout, err = run(capsys, "fit", "--runs", str(out), "--out", str(fit), "--figure", str(fig), "--folds", "3")
    assert code == 0, err
    assert "max" in stdout and "lambda_a" in stdout and fig.stat().st_size > 10_000
    doc = json.loads(fit.read_text())
    assert doc["n_runs"] + doc["n_diverged"] == 9 and doc["context"]["n_tokens"] == 17
    assert set(doc["models"]) == {"max", "lambda_a", "lambda_g", "linear_hp", "quad_hp", "constant"}
    code, stdout, err = run(capsys, "predict", "--fit", str(fit), "--sigma-w", "1.2", "--alpha", ".4",
                            "--sigma-a", "1", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert 0 < res["predicted_loss"] <= doc["L_sat"] + 1e-9
    for k in ("lambda_a", "lambda_g"):
        assert isinstance(res[k], float)
