"""Hostile input: limits checked before work, unwritable outputs, chunk checksums, store locks,
stale temporary files, RFC 8259 JSON -- each bad case one line on stderr, exit code 2 and no
partial output."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from phasefield import grid, io
from phasefield.cli import main


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err):
    return code == 2 and err.startswith("phasefield: error:") and err.count("\n") == 1 and "Traceback" not in err


def _strict_json(text):
    def bad(c):
        raise AssertionError(f"bare {c} in JSON output")

    return json.loads(text, parse_constant=bad)


# ---------------------------------------------------------------- limits, before any work
@pytest.mark.parametrize(
    "args, words",
    [
        (["exponents", "--sigma-w", "1e308"], "<= 100"),
        (["exponents", "--sigma-a", "1e308"], "<= 100"),
        (["exponents", "--sigma-v", "1e308"], "<= 100"),
        (["exponents", "--alpha", "nan"], "finite"),
        (["exponents", "--n-tokens", "99999999999999999999999"], "n-tokens"),
        (["trajectory", "--q0", "inf"], "finite"),
        (["trajectory", "--depth", "1000000"], "depth"),
        (["gram", "exponents", "--depth", "1000000"], "depth"),
        (["simulate", "exponents", "--depth", "1000000"], "depth"),
        (["simulate", "exponents", "--width", "1000000000"], "width"),
        (["simulate", "exponents", "--seeds", "1000000000"], "seeds"),
        (["simulate", "exponents", "--mlp-hidden", "1000000000"], "mlp-hidden"),
        (["simulate", "exponents", "--n-tokens", "1000000", "--width", "8192"], "memory"),
        (["seeds", "rank-collapse", "--n-tokens", "10000000"], "n-tokens"),
        (["seeds", "rank-collapse", "--draws", "1000000000"], "draws"),
        (["seeds", "rank-collapse", "--n-tokens", "4096", "--width", "256", "--draws", "100000"], "memory"),
        (["seeds", "rank-collapse", "--sigma-x", "inf"], "finite"),
        (["seeds", "rank-collapse", "--sigma-x", "1e308"], "sigma-x"),
        (["seeds", "rank-collapse", "--alpha-tilde", "inf"], "finite"),
        (["seeds", "deepscalelm", "--layers", "1000000"], "layers"),
        (["seeds", "deepscalelm", "--draws", "1000000000"], "draws"),
        (["seeds", "sensitivity", "--draws", "1000000000"], "draws"),
        (["predict", "--sigma-w", "1e308", "--alpha", "0.5"], "sigma-w"),
        (["recommend", "--n-tokens", "99999999999999999999999"], "n-tokens"),
    ],
)
def test_huge_and_non_finite_values_are_refused_in_one_line(capsys, args, words):
    code, out, err = run(capsys, *args)
    assert one_line_error(code, err), err
    assert words in err


@pytest.mark.parametrize(
    "var, value",
    [
        ("PHASEFIELD_CACHE_MIN_SECS", "soon"),
        ("PHASEFIELD_CACHE_MIN_SECS", "-1"),
        ("PHASEFIELD_CACHE_MIN_SECS", "inf"),
        ("PHASEFIELD_CACHE_MAX_BYTES", "1.5e9"),
        ("PHASEFIELD_CACHE_MAX_BYTES", "0"),
    ],
)
def test_a_malformed_cache_setting_is_refused_in_one_line(capsys, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    code, _, err = run(capsys, "exponents", "--depth", "4")
    assert one_line_error(code, err) and var in err, err


def test_grid_size_is_checked_before_any_allocation(tmp_path, capsys):
    out = tmp_path / "g.nc"
    code, _, err = run(capsys, "sweep", "--sigma-w", "0.5:4:1000000000", "--out", out)
    assert one_line_error(code, err) and "points on one axis" in err
    code, _, err = run(capsys, "sweep", "--sigma-w", "0.5:4:10000", "--alpha", "0.1:0.9:10000", "--out", out)
    assert one_line_error(code, err) and "100,000,000 points" in err
    assert not os.listdir(tmp_path)


def test_exact_attention_grid_is_checked_before_any_work(tmp_path, capsys):
    """--attention exact sizes its logit grid from sigma_A and n: at sigma_A = 50 it would need
    a grid of cost n_a n_z^2 ~ 1e10 (hours per point), so it is refused in one line, no file."""
    code, _, err = run(capsys, "exponents", "--attention", "exact", "--sigma-a", "50")
    assert one_line_error(code, err) and "logit grid" in err and "--attention paper" in err
    out = tmp_path / "x.nc"
    code, _, err = run(
        capsys, "sweep", "--attention", "exact", "--sigma-a", "1,50", "--sigma-w", "1", "--alpha", "0.5", "--out", out
    )
    assert one_line_error(code, err) and "logit grid" in err
    assert not os.listdir(tmp_path)


def test_memory_estimate_names_the_size(monkeypatch):
    monkeypatch.setenv("PHASEFIELD_MEMORY_LIMIT", "1G")
    with pytest.raises(
        ValueError, match=r"grid of 50,000,000 points needs about 2.98 GiB of memory, more than the 1 GiB"
    ):
        grid.check_grid([50_000_000], 64)
    assert grid.check_grid([1000, 1000], 64) == 1_000_000


def test_train_sweep_too_big_leaves_no_directory(tmp_path, capsys):
    out = tmp_path / "ts"
    code, _, err = run(
        capsys, "train-sweep", "--width", "4096", "--depth", "4096", "--sigma-w", "1", "--alpha", "0.5", "--out", out
    )
    assert one_line_error(code, err) and "memory" in err
    code, _, err = run(capsys, "train-sweep", "--depth", "1000000", "--out", out)
    assert one_line_error(code, err)
    assert not os.listdir(tmp_path)


def test_train_sweep_failing_inside_leaves_no_empty_folders(tmp_path, capsys, monkeypatch):
    from phasefield.vit import sweep as vsweep

    def boom(cfg, runs, out_dir, data, **kw):
        os.makedirs(os.path.join(out_dir, "metrics"))
        os.makedirs(os.path.join(out_dir, "checkpoints"))
        raise MemoryError

    monkeypatch.setattr(vsweep, "run_sweep", boom)
    code, _, err = run(
        capsys, "train-sweep", "--sigma-w", "1", "--alpha", "0.5", "--epochs", "1", "--out", tmp_path / "ts", "--quiet"
    )
    assert one_line_error(code, err) and "out of memory" in err
    assert not os.listdir(tmp_path)


# ---------------------------------------------------------------- outputs
@pytest.mark.parametrize("out, words", [("", "empty"), ("/proc/x.nc", "/proc"), (".", "directory")])
def test_bad_output_paths(tmp_path, capsys, monkeypatch, out, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "sweep", "--sigma-w", "1", "--out", out)
    assert one_line_error(code, err) and words in err, err
    assert not os.listdir(tmp_path)


def test_unwritable_directory_is_refused_before_work(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real = io.tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):  # a read-only folder (works for root too)
        if dir is not None and os.path.abspath(dir).startswith(str(ro)):
            raise PermissionError(errno.EROFS, "Read-only file system", dir)
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(io.tempfile, "mkstemp", mkstemp)
    for args in (
        ["sweep", "--sigma-w", "1", "--out", ro / "x.nc"],
        ["seeds", "rank-collapse", "--draws", "0", "--figure", ro / "f.png"],
        ["figures", "--out", ro / "figs"],
        ["seeds", "figures", "--out", ro / "figs"],
        ["train-sweep", "--out", ro / "ts"],
        ["fit", "--runs", tmp_path, "--out", ro / "fit.json"],
    ):
        code, _, err = run(capsys, *args)
        assert one_line_error(code, err) and "Read-only" in err, (args, err)
    assert not os.listdir(ro)


def test_full_disk_is_refused_before_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(io.shutil, "disk_usage", lambda p: type("U", (), {"free": 1024})())
    code, _, err = run(capsys, "figures", "--out", tmp_path / "figs")
    assert one_line_error(code, err) and "not enough free space" in err
    assert not os.listdir(tmp_path)


def test_disk_full_during_write_exit_2_and_no_partial_file(tmp_path, capsys, monkeypatch):
    import xarray as xr

    def full(self, path, *a, **kw):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(xr.Dataset, "to_netcdf", full)
    out = tmp_path / "g.nc"
    code, _, err = run(capsys, "sweep", "--sigma-w", "1,2", "--out", out, "--quiet")
    assert one_line_error(code, err) and "No space left" in err
    assert not out.exists()
    assert [p for p in os.listdir(tmp_path) if ".part" in p] == []


def test_figures_failure_leaves_no_empty_directory(tmp_path, capsys, monkeypatch):
    import phasefield.figures as figs

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(figs, "_make", full)
    code, _, err = run(capsys, "figures", "--out", tmp_path / "figs", "--quick")
    assert one_line_error(code, err)
    assert not (tmp_path / "figs").exists()


def test_stale_part_files_are_cleaned_but_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    host = io._host()
    stale = tmp_path / f".x.nc.{host}-{dead}.abc123.part.nc"
    live = tmp_path / f".x.nc.{host}-{os.getpid()}.def456.part.nc"
    other = tmp_path / f".y.nc.{host}-{dead}.abc123.part.nc"
    for p in (stale, live, other):
        p.write_bytes(b"partial")
    io.write_json(tmp_path / "x.nc", {"a": 1})
    assert not stale.exists() and live.exists() and other.exists()
    assert json.loads((tmp_path / "x.nc").read_text()) == {"a": 1}


def test_outputs_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        io.write_json(tmp_path / "a.json", {})
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "a.json").st_mode & 0o777) == 0o644


# ---------------------------------------------------------------- JSON
def test_json_is_rfc8259_with_nan_as_null():
    assert (
        io.dumps({"a": float("nan"), "b": np.array([1.0, np.inf]), "c": np.float32(-np.inf), "d": (1, 2)})
        == '{"a": null, "b": [1.0, null], "c": null, "d": [1, 2]}'
    )


def test_cli_json_never_prints_bare_nan(capsys):
    # the per-position mean cosine with earlier tokens is undefined (NaN) at position 0
    code, out, err = run(capsys, "gram", "trajectory", "--json", "--n-tokens", "4", "--depth", "2")
    assert code == 0, err
    doc = _strict_json(out)
    assert doc["mean_cosine_with_earlier"][0][0] is None


# ---------------------------------------------------------------- chunk store
def _chunk_file(store, i):
    return store.path(i)


@pytest.mark.parametrize("damage", ["zeros", "truncate", "empty", "other_values", "no_checksum"])
def test_corrupt_chunk_is_detected_and_reported(tmp_path, damage):
    msgs = []
    store = grid.ChunkStore(tmp_path / "c", {"k": 1}, log=msgs.append)
    vals = {"a": np.arange(5.0), "b": np.ones(5)}
    store.save(0, vals)
    path = _chunk_file(store, 0)
    data = open(path, "rb").read()
    if damage == "zeros":
        open(path, "wb").write(b"\0" * len(data))
    elif damage == "truncate":
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "empty":
        open(path, "wb").close()
    elif damage == "other_values":  # a well-formed file whose arrays do not match the checksum
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["a"] = np.zeros(5)
        np.savez(path.replace(".npz", ""), **arrays)
    else:
        np.savez(path.replace(".npz", ""), **vals)
    store.close()
    store = grid.ChunkStore(tmp_path / "c", {"k": 1}, log=msgs.append)
    assert not store.has(0)
    assert store.missing(1) == [0]
    assert len(msgs) == 1 and "chunk 0" in msgs[0] and "corrupt" in msgs[0] and "recomputing" in msgs[0]
    assert not os.path.exists(path)
    store.save(0, vals)
    assert store.has(0) and np.array_equal(store.load(0)["a"], vals["a"])


CORRUPT = {
    "paper": ["--sigma-w", "0.5:3:6", "--alpha", "0.3"],
    "pre-ln": [
        "--block",
        "pre-ln:heads=2",
        "--axis",
        "sigma=0.4,1.1,1.7",
        "--axis",
        "alpha=0.3,0.8",
        "--depth",
        "2",
        "--n-tokens",
        "4",
    ],
}


@pytest.mark.parametrize("block", sorted(CORRUPT))
def test_sweep_recomputes_a_corrupt_chunk_and_says_so(tmp_path, capsys, monkeypatch, block):
    out = tmp_path / "g.nc"
    args = ["sweep", *CORRUPT[block], "--chunk", "2", "--out", out, "--quiet"]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    clean = io.read_netcdf(out)
    os.remove(out)

    real = grid.ChunkStore.save

    def save_then_stop(st, i, v):
        real(st, i, v)
        if i == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(grid.ChunkStore, "save", save_then_stop)
    assert run(capsys, *args)[0] == 130
    monkeypatch.setattr(grid.ChunkStore, "save", real)
    chunk = tmp_path / "g.nc.chunks" / "chunk_000000.npz"
    chunk.write_bytes(b"\0" * chunk.stat().st_size)
    code, _, err = run(capsys, *args)
    assert code == 0, err
    assert "chunk 0" in err and "corrupt" in err
    again = io.read_netcdf(out)
    for v in clean.data_vars:
        np.testing.assert_array_equal(again[v].values, clean[v].values)


# ---------------------------------------------------------------- locks
def test_second_writer_of_a_sweep_exits_2(tmp_path, capsys):
    import fcntl

    out = tmp_path / "g.nc"
    args = ["sweep", "--sigma-w", "0.5,1", "--chunk", "1", "--out", out, "--quiet"]
    folder = tmp_path / "g.nc.chunks"
    folder.mkdir()
    fd = os.open(folder / ".lock.0", os.O_RDWR | os.O_CREAT)  # a running sweep's lock
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        code, _, err = run(capsys, *args)
    finally:
        os.close(fd)
    assert one_line_error(code, err) and "another phasefield process" in err
    assert not out.exists() and not list(folder.glob("chunk_*"))
    code, _, err = run(capsys, *args)
    assert code == 0, err
    assert out.exists() and not folder.exists()


def test_second_train_sweep_on_one_directory_exits_2(tmp_path, capsys):
    out = tmp_path / "ts"
    with io.dir_lock(out):
        code, _, err = run(
            capsys, "train-sweep", "--sigma-w", "1", "--alpha", "0.5", "--epochs", "1", "--out", out, "--quiet"
        )
    assert one_line_error(code, err) and "another phasefield process" in err
    assert sorted(os.listdir(out)) == [".lock"]


def test_json_lines_append_and_read_back_skipping_a_torn_line(tmp_path):
    """The study scripts' tables: append_jsonl writes one record a line (NaN kept), and
    read_jsonl returns the complete ones, skipping a last line torn by a kill."""
    import math

    from phasefield import io

    path = str(tmp_path / "rows.jsonl")
    assert io.read_jsonl(path) == []
    io.append_jsonl(path, {"a": float("nan"), "b": [1, 2]})
    io.append_jsonl(path, {"c": "x"})
    with open(path, "a") as f:
        f.write('{"d": 1')  # killed in mid-write
    rows = io.read_jsonl(path)
    assert len(rows) == 2 and math.isnan(rows[0]["a"]) and rows[0]["b"] == [1, 2] and rows[1] == {"c": "x"}
