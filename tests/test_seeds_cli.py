"""CLI: ``phasefield seeds rank-collapse|deepscalelm|sensitivity|figures``."""
from __future__ import annotations

import json
import os

import pytest

from phasefield.cli import main


def test_rank_collapse_json(capsys):
    assert main(["seeds", "rank-collapse", "--n-tokens", "2", "--width", "4", "--draws", "3000",
                 "--rho", "0.6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["value_eq17"] == pytest.approx(16 * (1 + 0.6))
    assert abs(out["autodiff_query"] - out["query_exact"]) < 4 * out["autodiff_query_se"]
    assert out["rho_depth_alpha1"] > out["rho_depth"]


def test_deepscalelm_text_and_json(capsys):
    assert main(["seeds", "deepscalelm", "--init", "dslm", "--layers", "6", "--width", "64"]) == 0
    assert "beta^2 = 0.3333" in capsys.readouterr().out
    assert main(["seeds", "deepscalelm", "--arch", "post-ln", "--layers", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["theory"]["var"]) == 7


def test_sensitivity_json(capsys):
    assert main(["seeds", "sensitivity", "--arch", "feedforward", "--depth", "3", "--width", "8",
                 "--draws", "1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for s, se, t in zip(out["S"], out["se"], out["theory"]):
        assert abs(s - t) < 4 * se


def test_rank_collapse_figure(tmp_path, capsys):
    path = tmp_path / "rc.png"
    assert main(["seeds", "rank-collapse", "--n-tokens", "2", "--width", "4", "--draws", "16",
                 "--figure", str(path)]) == 0
    assert path.stat().st_size > 1000
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


@pytest.mark.parametrize("argv", [
    ["seeds", "rank-collapse", "--rho", "1.5"],
    ["seeds", "rank-collapse", "--sigma-x", "0"],
    ["seeds", "deepscalelm", "--dropout", "1"],
    ["seeds", "deepscalelm", "--init", "dslm", "--layers", "1", "--k", "2"],
    ["seeds", "sensitivity", "--arch", "densenet"],
    ["seeds", "sensitivity", "--draws", "1"],
    ["seeds", "figures", "--out", __file__],
])
def test_bad_input_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("phasefield: error:") and err.count("\n") == 1
