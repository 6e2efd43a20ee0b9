"""Theory sweeps (labeled grids, chunking, resume) and the theory CLI."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import phasefield
from phasefield import HParams, diagram, grid
from phasefield.cli import main
from phasefield.layers import paper
from phasefield.layers.paper import sweep as paper_sweep

SW = np.array([0.7, 1.9, 3.2])
ALPHA = np.array([0.1, 0.5, 0.9])


def test_sweep_is_labeled_and_matches_pointwise():
    ds = phasefield.sweep(sigma_w=SW, alpha=ALPHA, sigma_a=[0.5, 2.0], n_tokens=16, depth=8)
    assert dict(ds.sizes) == {"sigma_w": 3, "sigma_a": 2, "alpha": 3}
    assert set(paper_sweep.VARIABLES) <= set(ds.data_vars)
    assert float(ds.n_tokens) == 16 and float(ds.depth) == 8
    for sw, sa, a in [(0.7, 0.5, 0.1), (3.2, 2.0, 0.9), (1.9, 0.5, 0.5)]:
        one = paper.exponents(HParams(sigma_w=sw, sigma_a=sa, alpha_a=a, alpha_m=a, n_tokens=16, depth=8))
        pt = ds.sel(sigma_w=sw, sigma_a=sa, alpha=a)
        for k in paper_sweep.VARIABLES:
            assert float(pt[k]) == pytest.approx(float(one[k]), abs=1e-10), k


def test_tiled_sweep_equals_the_thorough_path_across_bistable_regions(monkeypatch):
    """The sweep refines, tile by tile, only the root brackets its points have;
    the thorough path (one vmap, every bracket refined at every point: the reference
    evaluation) gives the same numbers on a grid with one and two stable points
    (docs/theory.md §6's bistable example, sigma_A = 6.875, n = 128), tiles of 8 points."""
    monkeypatch.setattr(paper_sweep, "TILE", 8)
    sw, al = np.array([0.3, 0.5, 3.0, 4.5, 6.0, 7.5, 9.0]), np.linspace(0.2, 0.95, 9)
    kw = dict(sigma_w=sw, alpha=al, sigma_a=6.875, n_tokens=128)
    fast = phasefield.sweep(**kw)
    ref = phasefield.sweep(**kw, _thorough=True)
    counts = set(fast.n_stable.values.ravel().tolist())
    assert {1.0, 2.0} <= counts, counts  # single and bistable points
    # tiles of the first rows skip the search: no_roots holds on whole tiles there, and
    # wherever it holds the search finds the collapsed point alone
    from phasefield.layers.paper import fixed_points

    kern = jax.tree.map(jnp.asarray, paper_sweep.build_kernels(sw))
    s_i, a_i = np.meshgrid(np.arange(sw.size), np.arange(al.size), indexing="ij")
    with jax.enable_x64(True):
        cert = np.asarray(
            jax.jit(
                jax.vmap(
                    lambda i, a: fixed_points.no_roots(
                        HParams(sigma_w=kern.sigma_w[i], sigma_a=6.875, alpha_a=a, alpha_m=a, n_tokens=128.0),
                        jax.tree.map(lambda x: x[i], kern),
                    )
                )
            )(jnp.asarray(s_i.ravel()), jnp.asarray(al[a_i.ravel()]))
        )
    assert cert[:16].all() and not cert.all()
    assert np.all(ref.n_stable.values.ravel()[cert] == 1) and np.all(ref.rho_star.values.ravel()[cert] == 1)
    for k in paper_sweep.VARIABLES:
        a, b = fast[k].values, ref[k].values
        assert np.array_equal(np.isnan(a), np.isnan(b)), k
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=k)
    # and one bistable point against the single-point API (its own bracket count)
    i = np.argwhere(fast.n_stable.values >= 2)[0]
    pt = fast.isel(sigma_w=int(i[0]), alpha=int(i[1]))
    a = float(pt.alpha)
    one = paper.exponents(HParams(sigma_w=float(pt.sigma_w), sigma_a=6.875, alpha_a=a, alpha_m=a, n_tokens=128))
    for k in paper_sweep.VARIABLES:
        assert float(pt[k]) == pytest.approx(float(one[k]), abs=1e-12), k


def test_tiles_on_cpu_devices_one_vmap_on_accelerators():
    """The tiled evaluation (above) runs on CPU devices; a chunk on an accelerator is one vmap
    (the thorough path: ~21x faster on an H100, docs/benchmarks.md)."""
    from types import SimpleNamespace

    assert paper_sweep._tiled_on(jax.local_devices(backend="cpu"))  # CPU devices, wherever the suite runs
    assert not paper_sweep._tiled_on([SimpleNamespace(platform="gpu")])
    assert not paper_sweep._tiled_on([SimpleNamespace(platform="cpu"), SimpleNamespace(platform="tpu")])


def test_separate_alphas_and_depth_axis():
    ds = phasefield.sweep(sigma_w=2.0, alpha_a=[0.2, 0.6], alpha_m=[0.3, 0.7, 0.9], depth=[4, 16])
    assert ds.lambda_a.dims == ("alpha_a", "alpha_m", "depth")
    one = paper.exponents(HParams(sigma_w=2.0, alpha_a=0.6, alpha_m=0.3, depth=4))
    assert float(ds.lambda_g_collapse.sel(alpha_a=0.6, alpha_m=0.3, depth=4)) == pytest.approx(
        float(one["lambda_g_collapse"]), abs=1e-10
    )
    with pytest.raises(ValueError, match="not both"):
        phasefield.sweep(sigma_w=1.0, alpha=0.5, alpha_a=0.5)
    with pytest.raises(ValueError, match="alpha"):
        phasefield.sweep(sigma_w=1.0, alpha=[0.5, 1.5])


# the paper block (closed form) and a standard block (the layers evaluator): one chunk driver
RESUME = {
    "paper": dict(sigma_w=SW, alpha=ALPHA),
    "pre-ln": dict(block="pre-ln:heads=2", axes={"sigma": [0.4, 1.1, 1.7], "alpha": ALPHA}, n_tokens=4, depth=2),
}  # (the grid of tests/test_sweep_blocks.py: its compiled programs)


@pytest.mark.parametrize("block", sorted(RESUME))
def test_chunked_sweep_resumes_without_recomputing(tmp_path, monkeypatch, block):
    kw = RESUME[block]
    one = [__import__("jax").devices()[0]]
    out = tmp_path / "grid.nc"
    calls = []
    real = grid.ChunkStore.save

    def failing(store, i, vals):
        calls.append(i)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(store, i, vals)

    monkeypatch.setattr(grid.ChunkStore, "save", failing)
    with pytest.raises(KeyboardInterrupt):
        diagram.sweep(**kw, out=str(out), chunk_size=2, devices=one)
    assert not out.exists()  # no complete-looking file
    assert len(list((tmp_path / "grid.nc.chunks").glob("chunk_*.npz"))) == 2
    calls.clear()
    monkeypatch.setattr(grid.ChunkStore, "save", lambda st, i, v: (calls.append(i), real(st, i, v)))
    ds = diagram.sweep(**kw, out=str(out), chunk_size=2, devices=one)
    assert len(calls) == 5 - 2  # 9 points / 2 = 5 chunks, 2 reused
    assert out.exists() and not (tmp_path / "grid.nc.chunks").exists()
    full = phasefield.sweep(**kw) if block == "paper" else phasefield.sweep(**kw, chunk_size=2, devices=one)
    xr.testing.assert_allclose(ds, full)
    back = xr.open_dataset(out, engine="h5netcdf")
    xr.testing.assert_allclose(back.load(), full)


def test_stale_chunks_of_another_sweep_are_refused(tmp_path):
    out = tmp_path / "g.nc"
    (tmp_path / "g.nc.chunks").mkdir()
    (tmp_path / "g.nc.chunks" / "meta.json").write_text(json.dumps({"key": "other"}))
    with pytest.raises(ValueError, match="different sweep"):
        diagram.sweep(sigma_w=SW, alpha=ALPHA, out=str(out))


def test_sharded_over_two_devices_equals_one():
    import jax

    devs = jax.local_devices()
    if len(devs) < 2:
        pytest.skip("one local device")
    a = diagram.sweep(sigma_w=SW, alpha=ALPHA, devices=devs[:2])
    b = diagram.sweep(sigma_w=SW, alpha=ALPHA, devices=devs[:1])
    xr.testing.assert_allclose(a, b)


# ---- CLI ------------------------------------------------------------------------------------


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exponents_json(capsys):
    code, out, _ = run(
        capsys,
        "exponents",
        "--sigma-w",
        "2",
        "--sigma-a",
        "1",
        "--alpha-a",
        ".5",
        "--alpha-m",
        ".5",
        "--n-tokens",
        "32",
        "--depth",
        "16",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf", "q_star", "rho_star"):
        assert k in res
    assert res["lambda_a"] == pytest.approx(0.02463, abs=1e-5)
    assert 0 < res["rho_star"] < 1


def test_cli_trajectory_json(capsys):
    code, out, _ = run(capsys, "trajectory", "--sigma-w", "2", "--depth", "5", "--q0", "1", "--rho0", ".3", "--json")
    assert code == 0
    res = json.loads(out)
    q, p = paper.trajectory(HParams(sigma_w=2.0, depth=5), 1.0, 0.3, 5)
    np.testing.assert_allclose(res["q"], np.asarray(q), rtol=1e-12)
    np.testing.assert_allclose(res["p"], np.asarray(p), rtol=1e-12)


def test_cli_sweep_writes_netcdf(tmp_path, capsys):
    out = tmp_path / "s.nc"
    code, msg, _ = run(
        capsys,
        "sweep",
        "--sigma-w",
        "0.5:4:5",
        "--alpha",
        "0.1:0.9:4",
        "--sigma-a",
        "1",
        "--n-tokens",
        "32",
        "--depth",
        "16",
        "--out",
        str(out),
        "--quiet",
    )
    assert code == 0, msg
    ds = xr.open_dataset(out)
    assert dict(ds.sizes) == {"sigma_w": 5, "alpha": 4}
    assert set(paper_sweep.VARIABLES) <= set(ds.data_vars)


@pytest.mark.parametrize(
    "args",
    [
        ["--alpha", "1.5"],
        ["--alpha-a", "-0.1"],
        ["--sigma-w", "0"],
        ["--sigma-a", "-1"],
        ["--n-tokens", "1"],
        ["--depth", "0"],
        ["--sigma-w", "1:2"],
        ["--sigma-w", "a:b:3"],
        ["--activation", "softsign"],
        ["--residual", "none"],
        ["--alpha", ".5", "--alpha-m", ".4"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line_and_no_file(tmp_path, capsys, args):
    out = tmp_path / "bad.nc"
    code, stdout, err = run(capsys, "sweep", *args, "--out", str(out))
    assert code == 2
    assert err.startswith("phasefield: error:") and err.count("\n") == 1
    assert "Traceback" not in err
    assert not os.listdir(tmp_path)
    code, _, err = run(capsys, "exponents", *[a if a != "1:2" else "x" for a in args])
    assert code == 2 and err.count("\n") == 1
