"""Blocks named on the command line (``phasefield.layers.spec``), ``phasefield block
exponents`` and ``phasefield block sweep``: values equal the library's point by point, bad
input is one line and exit 2 with no file left."""

import json
import os

import numpy as np
import pytest

from phasefield import layers
from phasefield.cli import main
from phasefield.layers import spec


@pytest.mark.parametrize(
    "text,name,kw",
    [
        ("pre-ln", "pre-ln", {}),
        ("post-ln:sigma=0.55, alpha=0.2,heads=12", "post-ln", dict(sigma=0.55, alpha=0.2, heads=12)),
        ("rms-swiglu:softmax-correction=false", "rms-swiglu", dict(softmax_correction=False)),
        ("pre-ln:qk_norm=true", "pre-ln", dict(qk_norm=True)),
        ("deepscalelm:depth=8,k=2", "deepscalelm", dict(depth=8, k=2.0)),
        ("paper:sigma_w=2,alpha_a=0.3,activation=gelu", "paper", dict(sigma_w=2.0, alpha_a=0.3, activation="gelu")),
    ],
)
def test_spec_parses(text, name, kw):
    assert spec.parse(text) == (name, kw)
    spec.build(name, kw)


@pytest.mark.parametrize(
    "text,msg",
    [
        ("gpt-5", "unknown block"),
        ("pre-ln:sigma=0", "outside"),
        ("pre-ln:sigma=nan", "outside"),
        ("pre-ln:heads=0", "heads"),
        ("pre-ln:heads=2.5", "integer"),
        ("pre-ln:depth=3", "has no"),
        ("pre-ln:sigma", "key=value"),
        ("pre-ln:activation=swish", "activation"),
        ("pre-ln:attention=full", "attention"),
        ("deepscalelm:depth=1,k=3", "beta"),
        ("paper:alpha_a=2", "outside"),
        ("paper:residual=half", "paper"),
        ("pre-ln:mult=1e9", "mult"),
    ],
)
def test_spec_refuses_in_one_line(text, msg):
    with pytest.raises(ValueError, match=msg) as exc:
        spec.parse(text)
    assert "\n" not in str(exc.value)


def test_spec_file(tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"block": "post-ln", "sigma": 1.2, "heads": 4}))
    assert spec.parse(str(f)) == ("post-ln", dict(sigma=1.2, heads=4))
    f.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        spec.parse(str(f))


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_block_exponents_json(capsys):
    rc, out, _ = _run(
        capsys, "block", "exponents", "--block", "post-ln:sigma=1,heads=2", "--depth", "3", "--n-tokens", "8", "--json"
    )
    assert rc == 0
    res = json.loads(out)
    blk = layers.presets.get("post-ln", sigma=1.0, heads=2)
    fd = layers.finite_depth(blk, q0=1.0, rho0=0.5, n_tokens=8, depth=3)
    assert res["has_fixed_point"] and res["q_star"] == 1.0
    assert abs(res["lambda_g_input"] - float(fd["lambda_g_input"])) < 1e-14 and "lambda_g" not in res
    assert abs(res["lambda_a"] - float(layers.fixed_point_exponents(blk, n_tokens=8, depth=3)["lambda_a"])) < 1e-14
    rc, out, _ = _run(capsys, "block", "exponents", "--block", "pre-ln:heads=2", "--depth", "3", "--n-tokens", "8")
    assert rc == 0 and "finite-depth rates, not exponents" in out


def test_a_lambda_g_from_collapse_and_one_from_the_input_do_not_share_a_name(capsys):
    """`phasefield exponents` and its alias `block exponents --block paper` print the same
    record (the paper block, lambda_g(L) from its collapsed fixed point: `lambda_g_collapse`,
    and no `lambda_g`); --rho0 adds `lambda_g_input` (from q0, rho0), another
    number under another name, equal to the generic block's (an independent route)."""
    point = ["--sigma-w", "2", "--sigma-a", "1", "--alpha", "0.5", "--n-tokens", "8", "--depth", "3"]
    rc, out, _ = _run(capsys, "exponents", *point, "--json")
    assert rc == 0
    paper = json.loads(out)
    assert "lambda_g_collapse" in paper and "lambda_g" not in paper and "lambda_g_input" not in paper
    rc, out, _ = _run(
        capsys,
        "block",
        "exponents",
        "--block",
        "paper:sigma_w=2,sigma_a=1,alpha_a=0.5,alpha_m=0.5",
        "--depth",
        "3",
        "--n-tokens",
        "8",
        "--json",
    )
    assert rc == 0 and json.loads(out) == paper
    rc, out, _ = _run(
        capsys,
        "exponents",
        "--block",
        "paper:sigma_w=2,sigma_a=1",
        "--alpha",
        "0.5",
        "--depth",
        "3",
        "--n-tokens",
        "8",
        "--rho0",
        "0.5",
        "--json",
    )
    blk = json.loads(out)
    assert rc == 0 and blk["lambda_g_collapse"] == paper["lambda_g_collapse"]
    from phasefield import HParams

    fd = layers.finite_depth(
        layers.presets.get("paper", HParams(sigma_w=2.0, sigma_a=1.0)), q0=1.0, rho0=0.5, n_tokens=8, depth=3
    )
    assert abs(blk["lambda_g_input"] - float(fd["lambda_g_input"])) < 1e-14
    assert abs(blk["lambda_g_input"] - paper["lambda_g_collapse"]) > 1e-3  # rho0 = 0.5, q0 = 1 vs q*
    rc, out, _ = _run(capsys, "block", "exponents", "--block", "pre-ln:heads=2", "--depth", "3", "--n-tokens", "8")
    assert rc == 0 and "lambda_g_input    = " in out and "lambda_g_collapse = " in out


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["exponents", "--block", "pre-ln", "--sigma-w", "2"], "block pre-ln has no number for --sigma-w"),
        (["exponents", "--block", "post-ln", "--attention", "exact"], "has no number for --attention"),
        (["exponents", "--block", "paper:sigma_w=2", "--sigma-w", "2"], "sigma_w given twice"),
        (["exponents", "--block", "paper:alpha_a=0.3", "--alpha", "0.2"], "alpha_a given twice"),
        (["exponents", "--block", "pre-ln", "--rho0", "2"], "--rho0"),
        (["exponents", "--block", "pre-ln", "--depth", "0"], "--depth"),
        (["block", "exponents", "--block", "gpt-5"], "unknown block"),
        (["trajectory", "--block", "rms-swiglu", "--alpha-a", "0.3"], "has no number for --alpha-a"),
        (["trajectory", "--block", "pre-ln:sigma=-1"], "outside"),
    ],
)
def test_block_options_refuse_in_one_line(capsys, argv, msg):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out, err


def test_trajectory_of_a_standard_block_equals_the_library(capsys):
    rc, out, _ = _run(
        capsys,
        "trajectory",
        "--block",
        "post-ln:sigma=1.2,heads=2",
        "--depth",
        "3",
        "--n-tokens",
        "8",
        "--rho0",
        "0.4",
        "--json",
    )
    assert rc == 0
    res = json.loads(out)
    q, p = layers.trajectory(layers.presets.post_ln(sigma=1.2, heads=2), q0=1.0, rho0=0.4, n_tokens=8, depth=3)
    assert np.allclose(res["q"], np.asarray(q), rtol=0, atol=1e-14)
    assert np.allclose(res["p"], np.asarray(p), rtol=0, atol=1e-14) and res["block"] == "post-ln"


def test_block_sweep_and_figure(capsys, tmp_path):
    # the pre-LN sizes of tests/test_sweep_blocks.py (2 heads, 4 tokens, 2 blocks, chunks of 2,
    # sigma <= 1.7): its compiled programs (alpha, a number of the points, sizes nothing)
    nc, png = tmp_path / "b.nc", tmp_path / "b.png"
    rows = tmp_path / "rows.jsonl"  # a row of an earlier release (its lambda_g: lambda_g_input) reads too
    rows.write_text(
        json.dumps(
            dict(preset="pre-ln", point=dict(sigma=1.0, alpha=0.5), width=256, sim=dict(angle_rate=-0.1, lambda_g=0.2))
        )
        + "\n"
    )
    rc, out, err = _run(
        capsys,
        "block",
        "sweep",
        "--block",
        "pre-ln:heads=2",
        "--axis",
        "sigma=0.4,1.1,1.7",
        "--axis",
        "alpha=0.2:1:3",
        "--depth",
        "2",
        "--n-tokens",
        "4",
        "--chunk",
        "2",
        "--out",
        str(nc),
        "--figure",
        str(png),
        "--sim",
        str(rows),
    )
    assert rc == 0, err
    import xarray as xr

    with xr.open_dataset(nc, engine="h5netcdf") as ds:
        assert ds.lambda_g_input.dims == ("sigma", "alpha") and ds.attrs["block"] == "pre-ln"
        blk = layers.presets.get("pre-ln", sigma=1.7, alpha=float(ds.alpha[1]), heads=2)
        fd = layers.finite_depth(blk, q0=1.0, rho0=0.5, n_tokens=4, depth=2)
        assert abs(float(ds.lambda_g_input.isel(sigma=2, alpha=1)) - float(fd["lambda_g_input"])) < 1e-13
        assert abs(float(ds.lambda_g_collapse.isel(sigma=2, alpha=1)) - float(fd["lambda_g_collapse"])) < 1e-13
        assert "lambda_g" not in ds
        assert abs(float(ds.angle_rate.isel(sigma=2, alpha=1)) - float(fd["angle_rate"])) < 1e-13
    assert os.path.getsize(png) > 1000


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--axis", "sigma=0:1:3"], "outside"),
        (["--axis", "heads=1,2"], "no number"),
        (["--axis", "sigma=1,2", "--sigma-w", "1"], "options of the paper block"),
        (["--axis", "sigma"], "NAME="),
        (["--axis", "depth=0,2"], "depth"),
        (["--axis", "sigma=1,2"], "--figure needs two"),
    ],
)
def test_block_sweep_bad_input(capsys, tmp_path, args, msg):
    out = tmp_path / "x.nc"
    argv = ["block", "sweep", "--block", "pre-ln", "--out", str(out)] + args
    if msg.startswith("--figure"):
        argv += ["--figure", str(tmp_path / "f.png")]
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not os.listdir(tmp_path)


def test_block_exponents_reports_the_attractors_of_a_multistable_point(capsys):
    """The paper block at a bistable point (sigma_w = 3, sigma_A = 6.875, n = 128): two stable
    cosines, as the generic block engine finds them (an independent route: the paper preset
    through phasefield.layers.fixed_point_exponents)."""
    from phasefield import HParams

    rc, out, _ = _run(
        capsys,
        "block",
        "exponents",
        "--block",
        "paper:sigma_w=3,sigma_a=6.875,alpha_a=0.5,alpha_m=0.5",
        "--depth",
        "8",
        "--n-tokens",
        "128",
        "--json",
    )
    assert rc == 0
    res = json.loads(out)
    ex = layers.fixed_point_exponents(
        layers.presets.get("paper", HParams(sigma_w=3.0, sigma_a=6.875, alpha_a=0.5, alpha_m=0.5)),
        n_tokens=128,
        depth=8,
    )
    assert res["n_stable"] == int(ex["n_stable"]) == 2
    for k in ("rho_star_min", "rho_star_max", "rho_star"):
        assert abs(res[k] - float(ex[k])) < 1e-9, k
    rc, out, _ = _run(
        capsys,
        "block",
        "exponents",
        "--block",
        "paper:sigma_w=3,sigma_a=6.875,alpha_a=0.5,alpha_m=0.5",
        "--depth",
        "8",
        "--n-tokens",
        "128",
    )
    assert rc == 0 and "(2 stable fixed points: BISTABLE" in out


def test_block_sweep_from_mesh_values_equals_the_integrated_maps():
    """The exact map and the softmax term (pre-LN has both) from their values on a 97-point
    mesh, once per logit scale, equal the maps integrated at every point (to 1e-12), up to
    logit scale 4."""
    from phasefield.layers import sweep

    name, fixed = "pre-ln", {"heads": 2, "attention": "exact"}
    axes = {"sigma": np.array([0.5, 2.0]), "alpha": np.array([0.6])}
    fast = sweep.sweep_grid(name, axes, fixed=fixed, n_tokens=8, depth=2)
    slow = sweep.sweep_grid(name, axes, fixed=fixed, n_tokens=8, depth=2, mesh=False)
    assert (
        sweep.mesh_tables(
            name,
            sweep.spec.check(name, fixed),
            ("sigma", "alpha"),
            [axes["sigma"], np.repeat(axes["alpha"], 2)],
            8,
            4.0,
        )
        is not None
    )
    for v in fast.data_vars:
        np.testing.assert_allclose(fast[v].values, slow[v].values, rtol=0, atol=1e-12, err_msg=v)


def test_figures_draws_any_blocks_phase_diagram(capsys, tmp_path):
    """`figures --block NAME --axis A --axis B`: the block sweep's values and its diagram."""
    # the numbers and sizes of the post-LN grid of tests/test_sweep_blocks.py (sigma <= 1.7,
    # 8 tokens, 3 blocks; 4 points: its chunks of 4): one compiled sweep program
    out = tmp_path / "figs"
    rc, _, err = _run(
        capsys,
        "figures",
        "--block",
        "post-ln:heads=2,alpha_attn=0.5",
        "--axis",
        "sigma=0.6,1.7",
        "--axis",
        "alpha_mlp=0.2,0.7",
        "--depth",
        "3",
        "--n-tokens",
        "8",
        "--out",
        str(out),
    )
    assert rc == 0, err
    import xarray as xr

    with xr.open_dataset(out / "phase_post-ln.nc", engine="h5netcdf") as ds:
        fd = layers.finite_depth(
            layers.presets.get("post-ln", sigma=1.7, alpha_attn=0.5, alpha_mlp=0.7, heads=2),
            q0=1.0,
            rho0=0.5,
            n_tokens=8,
            depth=3,
        )
        assert "lambda_g" not in ds
        assert abs(float(ds["lambda_g_input"].isel(sigma=1, alpha_mlp=1)) - float(fd["lambda_g_input"])) < 1e-13
    assert (out / "phase_post-ln.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--block", "pre-ln", "--axis", "sigma=1,2"], "needs two --axis"),
        (["--block", "pre-ln", "--axis", "sigma=1,2", "--axis", "heads=1,2"], "not a number of the block"),
        (["--block", "pre-ln:sigma=1", "--axis", "sigma=1,2", "--axis", "alpha=1,2"], "both in --block"),
        (["--block", "pre-ln", "--axis", "sigma=1,2", "--axis", "alpha=1,2", "--quick"], "--quick is for the paper"),
        (["--depth", "3"], "--depth sets a --block diagram"),
        (["--block", "nope", "--axis", "sigma=1,2", "--axis", "alpha=1,2"], "unknown block"),
    ],
)
def test_figures_block_bad_input(capsys, tmp_path, args, msg):
    out = tmp_path / "figs"
    rc, stdout, err = _run(capsys, "figures", "--out", str(out), *args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1 and not stdout, err
    assert not out.exists()
