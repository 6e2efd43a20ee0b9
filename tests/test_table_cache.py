"""The computed tables' disk cache (:mod:`phasefield.theory.table_cache`): a table read back is
the computed one bit for bit; a file that is corrupt, of another key or not finite is ignored
and computed again; two processes writing one table at once leave a whole file; a new point
reads the exact-softmax tables from the folder without integrating; importing phasefield
writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from phasefield.theory import table_cache
from phasefield.theory.attention import exact_table

SOURCES = ("phasefield.theory.table_cache",)
_COMPILES = []


def _listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES.append(duration)


jax.monitoring.register_event_duration_secs_listener(_listen)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEFIELD_TABLES", str(tmp_path / "tables"))
    return tmp_path / "tables"


def _compute(calls, value=1.0):
    def compute():
        calls.append(1)
        rng = np.random.default_rng(0)
        return dict(a=rng.standard_normal((3, 4)) * value, b=np.arange(5.0))

    return compute


def test_the_suite_keeps_its_tables_in_the_runs_folder():
    """tests/conftest.py: the run's own folder (PHASEFIELD_TEST_TABLES), never the user's."""
    assert os.environ["PHASEFIELD_TABLES"] == os.environ["PHASEFIELD_TEST_TABLES"]
    home = Path(os.path.expanduser("~")) / ".cache" / "phasefield" / "tables"
    assert table_cache.folder() != home


def test_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PHASEFIELD_TABLES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert table_cache.folder() == tmp_path / "xdg" / "phasefield" / "tables"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert table_cache.folder() == tmp_path / "home" / ".cache" / "phasefield" / "tables"
    monkeypatch.setenv("PHASEFIELD_TABLES", str(tmp_path / "mine"))
    assert table_cache.folder() == tmp_path / "mine"
    for off in ("off", "OFF", "0", "none", ""):
        monkeypatch.setenv("PHASEFIELD_TABLES", off)
        assert table_cache.folder() is None


def test_round_trip_is_bitwise_and_computes_once(folder):
    calls = []
    first = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    (path,) = folder.iterdir()
    again = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    assert len(calls) == 1 and path.suffix == ".npz"
    for k in first:
        assert again[k].dtype == np.float64
        np.testing.assert_array_equal(again[k], first[k])
    assert not [p for p in folder.iterdir() if p.suffix == ".tmp"]  # no temporary file left


def test_another_key_or_version_is_another_table(folder, monkeypatch):
    calls = []
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    table_cache.cached("t", dict(n=5.0), SOURCES, _compute(calls))
    monkeypatch.setattr(table_cache, "FORMAT", table_cache.FORMAT + 1)
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    monkeypatch.setattr(table_cache, "FORMAT", table_cache.FORMAT - 1)
    import phasefield

    monkeypatch.setattr(phasefield, "__version__", phasefield.__version__ + ".post1")
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    assert len(calls) == 4 and len(list(folder.iterdir())) == 4


def test_a_file_of_another_key_at_the_path_is_ignored(folder):
    """A file whose stored key differs (another version's layout, a name collision) is never
    read as this table's: it is computed and the file replaced."""
    calls = []
    key = table_cache.full_key("t", dict(n=4.0), SOURCES)
    path = table_cache.path_for("t", key)
    table_cache.save(path, dict(key, phasefield="0.0.0"), dict(a=np.zeros((3, 4)), b=np.zeros(5)))
    got = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    assert len(calls) == 1 and np.any(got["a"] != 0.0)
    assert table_cache.load(path, key) is not None  # replaced by this key's table


@pytest.mark.parametrize(
    "damage", ["garbage", "truncated", "empty", "nan", "float32", "unpickled object"], ids=lambda d: d.replace(" ", "-")
)
def test_a_damaged_file_is_computed_again(folder, damage):
    calls = []
    good = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    (path,) = folder.iterdir()
    key = table_cache.full_key("t", dict(n=4.0), SOURCES)
    text = table_cache._text(key)
    if damage == "garbage":
        path.write_bytes(b"not a table" * 10)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "nan":
        np.savez(path, key=np.asarray(text), a=np.full((3, 4), np.nan), b=np.arange(5.0))
    elif damage == "float32":
        np.savez(path, key=np.asarray(text), a=np.zeros((3, 4), np.float32), b=np.arange(5.0))
    else:
        np.savez(path, key=np.asarray(text), a=np.asarray([{"x": 1}], dtype=object), b=np.arange(5.0))
    again = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    assert len(calls) == 2
    np.testing.assert_array_equal(again["a"], good["a"])
    assert table_cache.load(path, key) is not None  # the file is whole again


def test_a_check_refusing_the_arrays_computes_again(folder):
    calls = []
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls), check=lambda a: a["a"].shape == (4, 4))
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls), check=lambda a: a["missing"])  # KeyError: a miss
    assert len(calls) == 3


def test_off_or_unwritable_computes_without_error(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("PHASEFIELD_TABLES", "off")
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would be")
    monkeypatch.setenv("PHASEFIELD_TABLES", str(blocker / "tables"))
    table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls))
    assert len(calls) == 3 and blocker.read_text().startswith("a file")


def test_non_finite_tables_are_not_stored(folder):
    calls = []
    out = table_cache.cached("t", dict(n=4.0), SOURCES, _compute(calls, value=np.nan))
    assert np.isnan(out["a"]).all() and not folder.exists()


_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from pathlib import Path
    from phasefield.theory import table_cache

    path, key, seed = Path(sys.argv[1]), dict(n=4.0), int(sys.argv[2])
    arrays = dict(a=np.arange(100_000.0) + 1.0)
    bad = 0
    for _ in range(20):
        table_cache.save(path, key, arrays)
        got = table_cache.load(path, key)
        bad += got is None or not np.array_equal(got["a"], arrays["a"])
    print(bad)
    """
)


def test_two_processes_writing_at_once_leave_a_whole_table(folder):
    """Two processes each write the same table 20 times and read it back after each write:
    every read finds a whole file (the writes replace it atomically), no temporary file stays."""
    folder.mkdir()
    path = folder / "t-shared.npz"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(i)], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [int(o.strip()) for o in outs] == [0, 0]
    assert [p.name for p in folder.iterdir()] == ["t-shared.npz"]
    np.testing.assert_array_equal(table_cache.load(path, dict(n=4.0))["a"], np.arange(100_000.0) + 1.0)


def test_importing_phasefield_writes_nothing(tmp_path):
    """Imports (and the tables' folder name) make no folder: the cache is made on first write."""
    env = {k: v for k, v in os.environ.items() if k not in ("PHASEFIELD_TABLES", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    (tmp_path / "home").mkdir()
    code = (
        "import phasefield, phasefield.layers, phasefield.theory\n"
        "from phasefield.theory import table_cache\n"
        "from phasefield.theory.attention import exact_table\n"
        "print(table_cache.folder())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "home" / ".cache" / "phasefield" / "tables")
    assert list((tmp_path / "home").rglob("*")) == []


# ---- the exact-softmax tables of one point --------------------------------------------------

N, CAP = 4.0, 0.5  # a small grid: the pieces of [0, CAP] integrate in seconds


def _sizes():
    return exact_table.exact.sizes(sigma_max=CAP, n_max=N)


_MEMOS = (exact_table.point_pieces, exact_table._scale_pieces, exact_table._st_values)


def _fresh_process_state():
    """Forget what this process computed or read (as a new process would)."""
    for memo in _MEMOS:
        memo.cache_clear()


@pytest.fixture
def fresh():
    _fresh_process_state()
    yield
    _fresh_process_state()


def test_point_tables_read_back_bitwise_without_integrating(folder, fresh, monkeypatch):
    """The pieces of the interpolant in the logit scale are computed once and written; a new
    process reads them back bit for bit, and its new points integrate nothing and compile
    nothing."""
    n_a, n_z = _sizes()
    with jax.enable_x64(True):
        built = exact_table.point_pieces(N, n_a, n_z, CAP, 0.0, CAP)
        values = [exact_table._point_values(sa, N, n_a, n_z, CAP) for sa in (0.11, 0.43)]
    assert built and len(list(folder.iterdir())) == 1
    _fresh_process_state()

    def refuse(*args, **kwargs):
        raise AssertionError("integrated a table the folder holds")

    monkeypatch.setattr(exact_table, "_st_values", refuse)
    monkeypatch.setattr(exact_table, "_scale_pieces", refuse)
    before = len(_COMPILES)
    with jax.enable_x64(True):
        read = exact_table.point_pieces(N, n_a, n_z, CAP, 0.0, CAP)
        again = [exact_table._point_values(sa, N, n_a, n_z, CAP) for sa in (0.11, 0.43)]
    assert len(_COMPILES) == before
    assert len(read) == len(built)
    for a, b in zip(read, built):
        assert a[:2] == b[:2]
        for x, y in zip(a[2:], b[2:]):
            np.testing.assert_array_equal(x, y)
    for (s, t), (s0, t0) in zip(again, values):
        np.testing.assert_array_equal(s, s0)
        np.testing.assert_array_equal(t, t0)


def test_point_values_do_not_depend_on_the_scales_asked_before(folder, fresh):
    """A point's tables are one function of (sigma_A, n): the same bits first in a process or
    after other scales (the interpolant in the scale, within 1e-12 of that scale integrated)."""
    n_a, n_z = _sizes()
    with jax.enable_x64(True):
        first = exact_table._point_values(0.29, N, n_a, n_z, CAP)
        _fresh_process_state()
        for sa in (0.05, 0.17, 0.31, 0.38, 0.47):
            exact_table._point_values(sa, N, n_a, n_z, CAP)
        later = exact_table._point_values(0.29, N, n_a, n_z, CAP)
        s0, t0 = exact_table._direct_tables(np.asarray([0.29]), N, n_a, n_z, CAP, adaptive=False)
    for x, y in zip(first, later):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(first[0], s0[0], rtol=1e-12, atol=0)
    np.testing.assert_allclose(first[1], t0[0], rtol=0, atol=1e-12)
