"""JSON from a user goes through one checked reader (:func:`phasefield.io.read_json`,
:func:`phasefield.io.loads_json`): a file nested 100,000 deep or larger than the size limit
is one line on stderr and exit code 2, never ``RecursionError`` or a traceback -- for block
files (``--block file.json``), fit files (``predict --fit``), results tables
(``fit --runs``), simulation rows (``sweep --sim``) and ``probe --set`` values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from phasefield import io
from phasefield.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = 100_000


def _deep(n=DEEP):
    return "[" * n + "]" * n


def _one_line(capsys, code, *words):
    out, err = capsys.readouterr()
    assert code == 2, (code, err[-500:])
    assert err.startswith("phasefield: error:") and err.count("\n") == 1, err[-500:]
    assert "Traceback" not in err and "internal error" not in err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture
def deep_block(tmp_path):
    path = tmp_path / "block.json"
    path.write_text('{"block": "pre-ln", "heads": ' + _deep() + "}")
    return str(path)


@pytest.mark.parametrize(
    "command",
    [
        ["exponents"],
        ["trajectory"],
        ["block", "exponents"],
        ["simulate", "exponents"],
        ["predict"],
    ],
)
def test_deep_block_file_is_one_line_exit_2(capsys, tmp_path, deep_block, command):
    code = main(command + ["--block", deep_block])
    _one_line(capsys, code, "nested more than", deep_block)


def test_deep_block_file_sweep_writes_nothing(capsys, tmp_path, deep_block):
    out = tmp_path / "out"
    out.mkdir()
    code = main(["sweep", "--block", deep_block, "--out", str(out / "x.nc")])
    _one_line(capsys, code, "nested more than")
    assert not os.listdir(out)


def test_deep_block_file_from_the_command(tmp_path, deep_block):
    """The installed entry point (a fresh process): one line, exit 2, no traceback."""
    env = {**os.environ, "PHASEFIELD_HOST_DEVICES": "1", "PHASEFIELD_CACHE": "off"}
    res = subprocess.run(
        [sys.executable, "-m", "phasefield", "exponents", "--block", deep_block],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env=env,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith("phasefield: error: cannot read block file")


def test_huge_block_file_is_one_line_exit_2(capsys, tmp_path):
    """A file past the size limit is refused before it is read (sparse: no disk used)."""
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.write(b'{"block": "pre-ln"}')
        f.truncate(io.JSON_MAX_BYTES + 1)
    code = main(["exponents", "--block", str(path)])
    _one_line(capsys, code, "too large")


def test_block_file_past_a_lower_limit(capsys, tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"block": "pre-ln", "sigma": 0.5, "note": "x" * 2000}))
    monkeypatch.setattr(io, "JSON_MAX_BYTES", 1000)
    _one_line(capsys, main(["exponents", "--block", str(path)]), "too large")
    monkeypatch.setattr(io, "JSON_MAX_BYTES", 10_000)
    monkeypatch.setattr(io, "JSON_MAX_DEPTH", 0)
    _one_line(capsys, main(["exponents", "--block", str(path)]), "nested more than 0 levels")


def test_deep_fit_file(capsys, tmp_path):
    path = tmp_path / "fit.json"
    path.write_text('{"model": ' + _deep() + "}")
    code = main(["predict", "--fit", str(path), "--sigma-w", "1", "--alpha", "0.5"])
    _one_line(capsys, code, "nested more than")


def test_huge_fit_file(capsys, tmp_path):
    path = tmp_path / "fit.json"
    with open(path, "wb") as f:
        f.truncate(io.JSON_MAX_BYTES + 10)
    code = main(["predict", "--fit", str(path), "--sigma-w", "1", "--alpha", "0.5"])
    _one_line(capsys, code)


@pytest.mark.parametrize("name", ["results.json", "results.jsonl"])
def test_deep_results_table(capsys, tmp_path, name):
    path = tmp_path / name
    path.write_text(
        '[{"sigma_w": ' + _deep() + "}]\n"
        if name.endswith(".json")
        else '{"sigma_w": 1}\n{"sigma_w": ' + _deep() + "}\n"
    )
    code = main(["fit", "--runs", str(path), "--out", str(tmp_path / "fit.json")])
    _one_line(capsys, code, "nested more than")
    assert not (tmp_path / "fit.json").exists()


def test_deep_simulation_rows(capsys, tmp_path):
    sim = tmp_path / "sim.jsonl"
    sim.write_text('{"sigma": 1}\n' + _deep() + "\n")
    code = main(
        [
            "sweep",
            "--block",
            "pre-ln",
            "--axis",
            "sigma=0.5,1",
            "--axis",
            "alpha=0.5,1",
            "--depth",
            "2",
            "--n-tokens",
            "4",
            "--out",
            str(tmp_path / "b.nc"),
            "--figure",
            str(tmp_path / "b.png"),
            "--sim",
            str(sim),
        ]
    )
    _one_line(capsys, code, "--sim", "line 2")
    assert sorted(os.listdir(tmp_path)) == ["sim.jsonl"]


def test_deep_probe_setting_is_not_a_crash(capsys):
    """A ``--set`` value nested 60,000 deep (argv allows ~128 KiB) is taken as text."""
    code = main(
        [
            "probe",
            "--preset",
            "pre-ln",
            "--set",
            "heads=" + _deep(60_000),
            "--width",
            "8",
            "--depth",
            "2",
            "--n-tokens",
            "2",
            "--inits",
            "2",
        ]
    )
    _one_line(capsys, code, "heads")


def test_json_depth_skips_strings():
    assert io.json_depth('["]]]\\"[[[[", {"a": [[]]}]') == 4
    assert io.json_depth("1") == 0 and io.json_depth("{}") == 1 and io.json_depth("[[1], [2]]") == 2
    assert io.json_depth("[" * 5000, limit=100) > 100


def test_loads_json_limits():
    assert io.loads_json('{"a": [1, {"b": "[[["}]}') == {"a": [1, {"b": "[[["}]}
    with pytest.raises(ValueError, match="x.json is nested more than 100 levels deep"):
        io.loads_json(_deep(101), "x.json")
    assert io.loads_json(_deep(100)) == json.loads(_deep(100))
    with pytest.raises(ValueError, match="too large"):
        io.loads_json("[1, 2, 3]", max_bytes=5)
    with pytest.raises(json.JSONDecodeError):
        io.loads_json("[1, 2")


def test_read_jsonl_skips_a_torn_line_and_refuses_a_deep_one(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": [2\n')
    assert io.read_jsonl(str(path)) == [{"a": 1}]
    path.write_text('{"a": 1}\n' + _deep() + "\n")
    with pytest.raises(ValueError, match="nested more than"):
        io.read_jsonl(str(path))


def test_a_study_file_nested_too_deep_is_one_line(capsys, tmp_path):
    """A results folder whose sweep.json is nested 100,000 deep (a study file): train-sweep
    refuses it in one line, exit 2, before any training."""
    out = tmp_path / "runs"
    out.mkdir()
    (out / "sweep.json").write_text(_deep())
    args = ("--depth", "2", "--width", "16", "--epochs", "1", "--batch-size", "128", "--quiet")
    code = main(["train-sweep", "--out", str(out), "--data-dir", str(tmp_path), *args])
    _one_line(capsys, code, "not a sweep config")
