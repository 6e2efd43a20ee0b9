"""Branch scales per branch, never dropped: the standard presets take
``alpha_attn`` and ``alpha_mlp`` (``alpha`` still sets both), ``train-sweep``, ``fit`` and
``predict`` pass a run's alpha_A and alpha_M through to the block, and a number a block does
not have is refused (one line, exit 2, nothing written)."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from phasefield import HParams, layers
from phasefield.cli import main
from phasefield.vit import data as vdata
from phasefield.vit import features as F
from phasefield.vit import train as vtrain
from phasefield.vit.sweep import block_theory
from phasefield.vit.train import TrainConfig, Trainer, make_points

SPEC = "pre-ln:heads=2"
TINY_ARGS = ("--depth", "1", "--width", "8", "--epochs", "1", "--batch-size", "256", "--quiet")


def _alphas(block):
    """(attention, MLP) residual branch scales of a two-sublayer block."""
    res = [x for x in block.layers if isinstance(x, layers.Residual)]
    assert len(res) == 2
    return tuple(float(np.asarray(r.alpha)) for r in res)


@pytest.mark.parametrize("name", ["pre-ln", "post-ln", "rms-swiglu"])
def test_presets_take_one_scale_per_branch(name):
    assert _alphas(layers.presets.get(name, sigma=0.5, alpha=0.4)) == (0.4, 0.4)
    assert _alphas(layers.presets.get(name, sigma=0.5, alpha_attn=0.3, alpha_mlp=0.9)) == (0.3, 0.9)
    assert _alphas(layers.presets.get(name, sigma=0.5, alpha=0.4, alpha_mlp=0.9)) == (0.4, 0.9)
    assert _alphas(layers.presets.get(name, sigma=0.5)) == (1.0, 1.0)
    # alpha = x is alpha_attn = alpha_mlp = x, number for number
    a = layers.rates(layers.presets.get(name, sigma=0.5, alpha=0.4, heads=2), n_tokens=8, depth=3)
    b = layers.rates(layers.presets.get(name, sigma=0.5, alpha_attn=0.4, alpha_mlp=0.4, heads=2), n_tokens=8, depth=3)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_a_block_spec_names_the_branch_scales():
    from phasefield.layers import spec

    name, kw = spec.parse("pre-ln:alpha_attn=0.3,alpha_mlp=0.9")
    assert _alphas(spec.build(name, kw)) == (0.3, 0.9)
    with pytest.raises(ValueError, match="alpha_mlp = -1 is outside"):
        spec.parse("pre-ln:alpha_mlp=-1")


def test_the_block_of_a_run_has_both_branch_scales():
    cfg = TrainConfig(block=SPEC, depth=1, width=8)
    hp = HParams(sigma_w=0.5, sigma_a=1.0, alpha_a=0.3, alpha_m=0.9)
    assert _alphas(cfg.block_for(hp)) == (0.3, 0.9)
    assert _alphas(vtrain.model_for(cfg, hp, 10).block) == (0.3, 0.9)  # what the trainer builds
    # the spec cannot set what the runs set
    for bad in ("pre-ln:alpha_attn=0.3", "pre-ln:alpha_mlp=0.3", "pre-ln:alpha=0.3"):
        with pytest.raises(ValueError, match="come from the runs"):
            TrainConfig(block=bad).validate()


def test_the_trainer_trains_the_mlp_branch_scale(tmp_path):
    """Two runs differing only in alpha_M (same seed, same data, one vmapped program) train
    differently: alpha_M reaches the model (it was alpha_A for both branches before)."""
    digits = vdata.load("digits", 8, data_dir=str(tmp_path))
    small = dataclasses.replace(
        digits,
        x_train=digits.x_train[:128],
        y_train=digits.y_train[:128],
        x_test=digits.x_test[:64],
        y_test=digits.y_test[:64],
    )
    cfg = TrainConfig(block=SPEC, depth=1, width=8, epochs=1, batch_size=64, eval_batch_size=64).validate()
    pts = make_points(cfg, [0.5, 0.5], [1.0, 1.0], [0.3, 0.3], [0.9, 0.3], [1e-2, 1e-2], [0, 0])
    params, metrics = Trainer(cfg, small).train_many(pts)
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
    assert any(not np.array_equal(x[0], x[1]) for x in leaves)
    assert np.isfinite(metrics["train_loss"]).all()  # (NaN != anything)
    assert metrics["train_loss"][0] != metrics["train_loss"][1]


def test_theory_features_follow_alpha_m():
    """The per-run theory (its cache key holds both scales) and the input-geometry features
    change when only alpha_M changes, and equal the block built directly."""
    cfg = TrainConfig(block=SPEC, depth=2, width=16)
    runs = [dict(sigma_w=0.8, sigma_a=1.0, alpha_a=0.3, alpha_m=m, depth=2) for m in (0.3, 0.9)]
    th = block_theory(cfg, runs)  # one call: one cache
    assert np.isfinite(th["lambda_g_collapse"]).all() and np.isfinite(th["angle_rate"]).all(), th  # (NaN != anything)
    assert th["lambda_g_collapse"][0] != th["lambda_g_collapse"][1] and th["angle_rate"][0] != th["angle_rate"][1]
    for i, m in enumerate((0.3, 0.9)):
        blk = layers.presets.get("pre-ln", sigma=0.8, alpha_attn=0.3, alpha_mlp=m, heads=2)
        fd = layers.finite_depth(blk, q0=1.0, rho0=1.0, n_tokens=cfg.n_tokens, depth=2)
        assert th["lambda_g_collapse"][i] == float(fd["lambda_g_collapse"])
    feats = F.block_features(cfg, runs, 1.6, 0.07, maps=("paper",))
    for k in ("lambda_g_collapse", "lambda_g_in_paper", "lambda_g_in_paper_corr", "rho_out_paper"):
        assert np.isfinite(feats[k]).all() and feats[k][0] != feats[k][1], k


def test_train_sweep_trains_and_records_both_scales(capsys, tmp_path):
    out = tmp_path / "runs"
    code = main(
        [
            "train-sweep",
            "--block",
            SPEC,
            "--axis",
            "sigma=0.5",
            "--axis",
            "alpha_attn=.3",
            "--axis",
            "alpha_mlp=.9",
            *TINY_ARGS,
            "--json",
            "--out",
            str(out),
            "--data-dir",
            str(tmp_path),
        ]
    )
    _, err = capsys.readouterr()
    assert code == 0, err
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (row["alpha_a"], row["alpha_m"]) == (0.3, 0.9)
    cfg = TrainConfig.from_dict(json.loads((out / "sweep.json").read_text())["config"])
    hp = cfg.hparams(row["sigma_w"], row["sigma_a"], row["alpha_a"], row["alpha_m"])
    assert _alphas(vtrain.model_for(cfg, hp, 10).block) == pytest.approx((0.3, 0.9))
    th = block_theory(cfg, [row, dict(row, alpha_m=0.3)])
    assert row["lambda_g_collapse"] == pytest.approx(th["lambda_g_collapse"][0], abs=1e-12)
    assert row["lambda_g_collapse"] != pytest.approx(th["lambda_g_collapse"][1], abs=1e-6)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--block", "deepscalelm:heads=2", "--alpha-m", ".9"), "block deepscalelm has no number for --alpha-m"),
        (("--block", "deepscalelm:heads=2", "--alpha", ".5"), "block deepscalelm has no number for --alpha"),
        (("--block", "deepscalelm:heads=2", "--sigma-w", "1"), "block deepscalelm has no number for --sigma-w"),
        (("--block", "pre-ln:heads=2", "--sigma-a", "2"), "block pre-ln has no number for --sigma-a"),
        (
            (
                "--block",
                "pre-ln:foo=1",
            ),
            "block pre-ln has no 'foo'",
        ),
        (("--block", "pre-ln:heads=2", "--sigma-w", "1"), "block pre-ln has no number for --sigma-w"),
        (("--block", "pre-ln:alpha_mlp=0.5", "--axis", "alpha_mlp=.2,.4"), "both in --block"),
        (("--block", "pre-ln", "--axis", "heads=2,4"), "not a number of the block"),
        (("--block", "pre-ln", "--axis", "sigma=0:1:3"), "outside"),
        (("--block", "deepscalelm", "--axis", "k=1,2"), "not a number a run sets"),
        (("--block", "paper", "--axis", "sigma_w=1,2", "--sigma-w", "1"), "given twice"),
        (("--block", "pre-ln", "--axis", "sigma"), "NAME="),
    ],
)
def test_a_number_the_block_does_not_have_is_refused(capsys, tmp_path, args, needle):
    out = tmp_path / "runs"
    code = main(["train-sweep", *args, *TINY_ARGS, "--out", str(out), "--data-dir", str(tmp_path)])
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_points_file_that_varies_a_number_the_block_does_not_have_is_refused(capsys, tmp_path):
    pts = tmp_path / "points.csv"
    pts.write_text("sigma_w,sigma_a,alpha,depth\n1.0,1.0,0.5,1\n1.0,2.0,0.5,1\n")
    out = tmp_path / "runs"
    code = main(
        [
            "train-sweep",
            "--block",
            SPEC,
            "--points",
            str(pts),
            *TINY_ARGS,
            "--out",
            str(out),
            "--data-dir",
            str(tmp_path),
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "block pre-ln has no number for the points file's sigma_a (2 values)" in err
    assert not out.exists()


def test_help_documents_the_spelling(capsys):
    """A block's numbers are its own names (--axis or --block), never a paper flag mapped onto
    them; a points file's columns still map (sigma_w -> sigma, ...) and the help says how."""
    assert main(["train-sweep", "--help"]) == 0
    text = " ".join(capsys.readouterr()[0].split())
    assert "A paper flag with another block is refused" in text and "--axis NAME=RANGE" in text
    assert "sigma_w -> sigma" in text and "alpha_a -> alpha_attn" in text and "alpha_m -> alpha_mlp" in text


@pytest.mark.parametrize(
    "args, columns",
    [
        (
            ("--block", "pre-ln:heads=2,alpha_mlp=0.7", "--axis", "sigma=0.5,1", "--axis", "alpha_attn=0.2"),
            {(0.5, 0.2, 0.7, 1.0), (1.0, 0.2, 0.7, 1.0)},
        ),
        (("--axis", "sigma_w=0.5,1", "--axis", "alpha=0.3"), {(0.5, 0.3, 0.3, 1.0), (1.0, 0.3, 0.3, 1.0)}),
        (("--sigma-w", "0.5,1", "--alpha-a", "0.3"), {(0.5, 0.3, 0.5, 1.0), (1.0, 0.3, 0.5, 1.0)}),
        (("--block", "deepscalelm:heads=2", "--axis", "sigma_a=1,2"), {(1.0, 0.5, 0.5, 1.0), (1.0, 0.5, 0.5, 2.0)}),
    ],
)
def test_train_sweep_axes_are_the_blocks_numbers(capsys, tmp_path, monkeypatch, args, columns):
    """--axis NAME=RANGE over the block's own numbers (or fixed in --block) sets the runs'
    (sigma_w, alpha_a, alpha_m, sigma_a) columns; the paper flags still set the paper block's.
    The training itself is stubbed: the runs it is handed are the check."""
    from phasefield.vit import sweep as vsweep

    seen = {}

    def fake(cfg, runs, out, ds, **kw):
        seen.update(block=cfg.block, cols={(r["sigma_w"], r["alpha_a"], r["alpha_m"], r["sigma_a"]) for r in runs})
        return dict(trained=0, already_done=0, diverged=0, seconds=0.0)

    monkeypatch.setattr(vsweep, "run_sweep", fake)
    code = main(["train-sweep", *args, *TINY_ARGS, "--out", str(tmp_path / "runs"), "--data-dir", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert seen["cols"] == columns
    assert seen["block"] in ("pre-ln:heads=2", "paper", "deepscalelm:heads=2")  # numbers are the runs', not the spec's
