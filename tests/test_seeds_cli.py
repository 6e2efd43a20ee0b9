"""CLI: ``phasefield seeds rank-collapse|deepscalelm|sensitivity|figures``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from phasefield.cli import main


def test_rank_collapse_json(capsys):
    assert (
        main(["seeds", "rank-collapse", "--n-tokens", "2", "--width", "4", "--draws", "3000", "--rho", "0.6", "--json"])
        == 0
    )
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


def test_deepscalelm_theory_options(capsys):
    """Default: the validated theory (kappa closure, ln_fluct="auto"); --kappa iso and
    --ln-fluct on/off reach the other library settings."""
    from phasefield.seeds import deepscalelm as ds

    base = [
        "seeds",
        "deepscalelm",
        "--arch",
        "post-ln",
        "--init",
        "dslm",
        "--layers",
        "4",
        "--width",
        "64",
        "--seq-len",
        "64",
        "--json",
    ]
    lam2, beta2 = ds.dslm_scaling(4, 2.0)
    for extra, kw in (
        ([], dict(kappa="auto")),
        (["--kappa", "iso", "--ln-fluct", "off"], dict(ln_fluct=False)),
        (["--ln-fluct", "on"], dict(kappa="auto", ln_fluct=True)),
    ):
        assert main(base + extra) == 0
        out = json.loads(capsys.readouterr().out)
        th = ds.stack("post-ln", 4, 64, 64, "dslm", 0.1, lam2, beta2, r0=0.2, **kw)
        np.testing.assert_allclose(out["theory"]["g_var"], th["g_var"], rtol=1e-12)
        np.testing.assert_allclose(out["theory"]["kappa"], th["kappa"], rtol=1e-12)
    assert out["theory"]["kappa"][1] > 1.2  # the closure's anisotropy, not the isotropic 1


def test_sensitivity_json(capsys):
    assert (
        main(
            [
                "seeds",
                "sensitivity",
                "--arch",
                "feedforward",
                "--depth",
                "3",
                "--width",
                "8",
                "--draws",
                "1024",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for s, se, t in zip(out["S"], out["se"], out["theory"]):
        assert abs(s - t) < 4 * se


def test_rank_collapse_figure(tmp_path, capsys):
    path = tmp_path / "rc.png"
    assert (
        main(["seeds", "rank-collapse", "--n-tokens", "2", "--width", "4", "--draws", "16", "--figure", str(path)]) == 0
    )
    assert path.stat().st_size > 1000
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


@pytest.mark.parametrize(
    "argv",
    [
        ["seeds", "rank-collapse", "--rho", "1.5"],
        ["seeds", "rank-collapse", "--sigma-x", "0"],
        ["seeds", "deepscalelm", "--dropout", "1"],
        ["seeds", "deepscalelm", "--init", "dslm", "--layers", "1", "--k", "2"],
        ["seeds", "deepscalelm", "--arch", "post-ln", "--init", "dslm", "--layers", "3", "--width", "4"],
        ["seeds", "deepscalelm", "--width", "4", "--figure", "never-written.png"],
        ["seeds", "deepscalelm", "--kappa", "measured"],
        ["seeds", "sensitivity", "--arch", "densenet"],
        ["seeds", "sensitivity", "--draws", "1"],
        ["seeds", "figures", "--out", __file__],
    ],
)
def test_bad_input_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("phasefield: error:") and err.count("\n") == 1
