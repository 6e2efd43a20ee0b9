"""One sweep for every block: ``phasefield.sweep(block=..., axes=...)`` and
``phasefield sweep --block ... --axis ...`` (``block sweep`` its alias).

The standard blocks' grids equal the layers library point by point (an independent route:
``layers.finite_depth`` / ``layers.fixed_point_exponents`` of ``layers.spec.build``); the paper block's
spellings (keywords, ``block=``, ``axes=``) give bit-identical numbers; bad input is one
line, exit 2, no file."""

from __future__ import annotations

import os

import numpy as np
import pytest

import phasefield
from phasefield import layers
from phasefield.cli import main
from phasefield.layers import spec
from phasefield.layers import sweep as layers_sweep

# tiny grids: 3 x 2 points, (fixed numbers, axes, tokens, blocks, chunk size). pre-ln's grid (4
# tokens, 2 blocks, sigma <= 1.7, chunks of 2) is the one of the resume, corrupt-chunk and
# two-process tests (tests/test_sweep.py, test_hardening.py, test_multiprocess.py): they share
# its compiled programs. post-ln's is at the sizes of the 2-head post-LN points of
# tests/test_blocks_cli.py (8 tokens, 3 blocks: the library's finite-depth, q* and
# fixed-point programs), and its chunks of 4 are those of the 2 x 2 diagram there (the same
# numbers, sigma <= 1.7: one compiled sweep program)
PRE_LN = ({"heads": 2}, {"sigma": [0.4, 1.1, 1.7], "alpha": [0.3, 0.8]})
CASES = {
    "pre-ln": (*PRE_LN, 4, 2, 2),  # no finite fixed point: lambda_a NaN
    "post-ln": ({"heads": 2, "alpha_attn": 0.5}, {"sigma": [0.6, 1.3, 1.7], "alpha_mlp": [0.2, 0.7]}, 8, 3, 4),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def block_grid(request):
    name = request.param
    fixed, axes, n_tokens, depth, chunk = CASES[name]
    ds = phasefield.sweep(block=(name, fixed), axes=axes, n_tokens=n_tokens, depth=depth, chunk_size=chunk)
    return name, fixed, axes, ds


def _library(name, kw, n_tokens, depth):
    """The point's variables from phasefield.layers (finite_depth; lambda_a from exponents
    where the block has a finite fixed point, else NaN where q_star is infinite)."""
    blk = spec.build(name, spec.check(name, kw))
    fd = layers.finite_depth(blk, q0=1.0, rho0=0.5, n_tokens=n_tokens, depth=depth)
    if np.isfinite(float(layers.q_star(blk, n_tokens=n_tokens))):
        la = layers.fixed_point_exponents(blk, n_tokens=n_tokens, depth=depth)["lambda_a"]
    else:
        la = np.nan
    return dict(
        angle_rate=fd["angle_rate"],
        lambda_g_input=fd["lambda_g_input"],
        lambda_g_collapse=fd["lambda_g_collapse"],
        lambda_a=la,
        rho_L=np.asarray(fd["rho"])[-1],
        q_L=np.asarray(fd["q"])[-1],
    )


def test_a_standard_block_sweep_equals_the_layers_library_point_by_point(block_grid):
    name, fixed, axes, ds = block_grid
    keys = list(axes)
    assert list(ds.lambda_a.dims) == keys and ds.attrs["block"] == name
    assert set(ds.data_vars) == set(layers_sweep.VARIABLES)
    assert "lambda_g" not in ds and "lambda_g_collapsed" not in ds
    for v in ds.data_vars:
        assert ds[v].attrs["long_name"] and ds[v].attrs["symbol"], v
    assert np.isnan(ds.lambda_a.values).all() == (name == "pre-ln")
    rng = np.random.default_rng(0)
    i, j = rng.integers(len(axes[keys[0]])), rng.integers(len(axes[keys[1]]))
    _, _, n_tokens, depth, _ = CASES[name]
    want = _library(name, dict(fixed, **{keys[0]: axes[keys[0]][i], keys[1]: axes[keys[1]][j]}), n_tokens, depth)
    pt = ds.isel({keys[0]: i, keys[1]: j})
    for k, w in want.items():
        # NaN on both sides only where the library says the block has no fixed point
        assert np.isfinite(float(w)) or (k == "lambda_a" and name == "pre-ln"), (name, k, w)
        np.testing.assert_allclose(float(pt[k]), float(w), rtol=0, atol=1e-9, err_msg=f"{name} {k}")


def test_depth_and_n_tokens_are_axes_of_a_standard_block(block_grid):
    name, fixed, axes, ref = block_grid
    if name != "pre-ln":
        pytest.skip("one block")
    ds = phasefield.sweep(block=(name, fixed), axes=dict(axes, depth=[2]), n_tokens=[4, 8], chunk_size=2)
    assert ds.lambda_a.dims == ("n_tokens", "depth") + tuple(axes)
    for v in ref.data_vars:  # n = 4: the fixture's grid; NaN (the same answer) only for lambda_a
        assert np.isfinite(ref[v].values).all() != (v == "lambda_a"), v  # (no finite fixed point)
        assert np.array_equal(ds[v].sel(n_tokens=4, depth=2).values, ref[v].values, equal_nan=True), v
    want = _library(name, dict(fixed, sigma=1.1, alpha=0.8), 8, 2)
    pt = ds.sel(n_tokens=8, depth=2, sigma=1.1, alpha=0.8)
    for k in ("angle_rate", "lambda_g_input", "q_L"):
        np.testing.assert_allclose(float(pt[k]), float(want[k]), rtol=0, atol=1e-9, err_msg=k)


def test_the_paper_block_spellings_give_bit_identical_numbers():
    sw, al = np.array([0.7, 1.9, 3.2]), np.array([0.1, 0.9])
    ref = phasefield.sweep(sigma_w=sw, alpha=al, sigma_a=2.0, n_tokens=8, depth=4)
    for kw in (
        dict(block="paper:sigma_a=2", axes={"sigma_w": sw, "alpha": al}),
        dict(block=("paper", {"sigma_a": 2.0}), sigma_w=sw, axes={"alpha": al}),
        dict(block="paper", axes={"sigma_w": sw, "alpha": al, "sigma_a": 2.0}),
    ):
        ds = phasefield.sweep(**kw, n_tokens=8, depth=4)
        assert list(ds.data_vars) == list(ref.data_vars)
        for v in ref.data_vars:  # every point has every quantity here: a NaN fails
            assert np.array_equal(ds[v].values, ref[v].values), (kw, v)
    assert "lambda_g" not in ref and "lambda_g_collapse" in ref


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(block="pre-ln", sigma_w=1.0, axes={"sigma": [1.0]}), "of the paper block"),
        (dict(block="pre-ln:sigma=1", axes={"sigma": [0.5, 1.0]}), "both an axis and a fixed"),
        (dict(block="pre-ln", axes={"sigma_w": [1.0]}), "no number"),
        (dict(block="deepscalelm", axes={"k": [1.0]}, depth=[2, 4]), "depth"),
        (dict(block="paper", axes={"sigma": [1.0]}), "no number"),
        (dict(block="paper:sigma_w=2", sigma_w=[1.0, 2.0]), "given twice"),
        (dict(block="paper", q0=2.0), "q0"),
        (
            dict(block="pre-ln", axes={"sigma": np.linspace(0.1, 1, 10_000), "alpha": np.linspace(0, 1, 10_000)}),
            "more than the limit",
        ),
    ],
)
def test_bad_library_input_is_one_line_value_error(kw, msg, tmp_path):
    with pytest.raises(ValueError, match=msg):
        phasefield.sweep(**kw, out=str(tmp_path / "x.nc"))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--block", "pre-ln", "--axis", "sigma=1,2", "--alpha", "0.5"], "options of the paper block"),
        (["--block", "pre-ln", "--axis", "sigma=1,2", "--activation", "relu"], "options of the paper block"),
        (["--block", "pre-ln", "--axis", "nope=1,2"], "no number"),
        (["--block", "pre-ln", "--axis", "sigma=1:2"], "malformed range for --axis sigma"),
        (["--block", "deepscalelm", "--axis", "k=1,2", "--depth", "2,4"], "depth"),
        (["--block", "pre-ln:sigma=1", "--axis", "sigma=1,2"], "both an axis and a fixed value"),
        (["--block", "pre-ln", "--axis", "sigma=0.1:1:2000", "--axis", "alpha=0:1:1000"], "at most"),
        (["--block", "pre-ln", "--axis", "depth=2", "--depth", "3"], "depth is both an axis and depth="),
        (["--axis", "sigma_w=1,2", "--sigma-w", "1"], "given twice"),
        (["--axis", "sigma=1,2"], "block paper has no number"),
        (["--sigma-w", "1,2", "--q0", "2"], "q0=/rho0="),
    ],
)
@pytest.mark.parametrize("command", [["sweep"], ["block", "sweep"]])
def test_bad_cli_input_exits_2_in_one_line_with_no_file(capsys, tmp_path, command, args, msg):
    code = main(command + args + ["--out", str(tmp_path / "x.nc")])
    _, err = capsys.readouterr()
    assert code == 2 and msg in err and err.startswith("phasefield: error:") and err.count("\n") == 1, err
    assert not os.listdir(tmp_path)


def test_block_sweep_is_the_sweep_command():
    from phasefield.cli import cli

    assert cli.commands["block"].commands["sweep"] is cli.commands["sweep"]
