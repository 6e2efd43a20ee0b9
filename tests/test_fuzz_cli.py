"""Property-based fuzz of every command's options, with hypothesis.

For each command (found by walking the click group, so a new command or option is fuzzed
without editing this file) hypothesis draws one or two of its options and a hostile value
for each (NaN, ±inf, negatives, zero, huge floats and integers, text, empty, malformed
ranges, bad paths) on top of a cheap valid base command line. The CLI runs in-process
(``phasefield.cli.main(argv)``) in a fresh folder. The promise: exit code 0 or 2, never a
traceback; with 2 exactly one line on stderr and no file left behind.

The expensive work behind the grid commands (sweep, simulate sweep, train-sweep, train-lm), figures,
demo, the seed figures, recommend and probe's measurement is replaced by a stub (their validation, output
checks and locks still run; the theory sweep's checks in the library too; scripts/hostile_probe.py runs them for real); everything else
runs for real with tiny sizes, so every example is cheap.
"""

from __future__ import annotations

import contextlib
import io as _io
import os
import shutil
import tempfile

import click
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from phasefield.cli import cli, main  # noqa: E402

NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "-1",
    "0",
    "-0",
    "1e308",
    "-1e308",
    "1e400",
    "99999999999999999999999",
    "1000000000",
    "1e9",
    "1e-320",
    "0.5e",
    "abc",
    "",
    " ",
    "1:2:1000000000",
    "0:1:0",
    "1:2",
    "1,,nan",
    "--",
    "2**10",
]
PATHS = ["", " ", "/proc/x.nc", "/proc", ".", "/", "exists.txt", "missing/deeper/x.nc", "/dev/null", "a\nb.nc"]
PATH_OPTIONS = {
    "out",
    "figure",
    "runs",
    "from_path",
    "sim_path",
    "fit_path",
    "points_file",
    "data_dir",
    "tfds_dir",
    "theory_nc",
    "sim_nc",
    "sim",
}

# a cheap valid command line per command (outputs inside the example's folder)
BASE = {
    "exponents": ["--depth", "4"],
    "trajectory": ["--depth", "3"],
    "sweep": ["--sigma-w", "1", "--depth", "4", "--quiet", "--out", "s.nc"],
    "gram trajectory": ["--n-tokens", "3", "--depth", "2"],
    "gram exponents": ["--n-tokens", "3", "--depth", "2"],
    "simulate exponents": ["--width", "4", "--seeds", "2", "--n-tokens", "2", "--depth", "2"],
    "simulate sweep": ["--width", "4", "--seeds", "2", "--n-tokens", "2", "--depth", "2", "--out", "sim.nc"],
    "compare": ["theory.nc", "sim.nc"],
    "figures": ["--out", "figs", "--quick"],
    "demo": ["--out", "demo"],
    "train-sweep": [
        "--sigma-w",
        "1",
        "--alpha",
        "0.5",
        "--epochs",
        "1",
        "--width",
        "4",
        "--depth",
        "1",
        "--quiet",
        "--out",
        "ts",
    ],
    "train-lm": [
        "--width",
        "16",
        "--depth",
        "2",
        "--heads",
        "2",
        "--context",
        "16",
        "--steps",
        "2",
        "--quiet",
        "--out",
        "lm.jsonl",
    ],
    "fit": ["--runs", "runs.csv", "--out", "fit.json"],
    "predict": ["--sigma-w", "1", "--alpha", "0.5"],
    "recommend": ["--no-loss"],
    "seeds rank-collapse": ["--draws", "0", "--n-tokens", "3", "--width", "2", "--depth", "2"],
    "seeds deepscalelm": ["--layers", "1", "--width", "4", "--seq-len", "2"],
    "seeds sensitivity": ["--depth", "1", "--width", "2", "--draws", "2"],
    "seeds figures": ["--out", "seedfigs", "--quick"],
    "block exponents": ["--block", "paper", "--depth", "2", "--n-tokens", "4"],
    "block sweep": [
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
        "b.nc",
        "--figure",
        "b.png",
    ],
    "probe": [
        "--preset",
        "pre-ln",
        "--set",
        "heads=2",
        "--width",
        "8",
        "--depth",
        "2",
        "--n-tokens",
        "2",
        "--inits",
        "2",
        "--figure",
        "p.png",
    ],
}
STUB_FILES = {"exists.txt": "x\n", "runs.csv": "sigma_w\n1\n", "theory.nc": "not netcdf", "sim.nc": "not netcdf"}


def _commands(group=cli, prefix=""):
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, full + " ")
        else:
            yield full, cmd


COMMANDS = dict(_commands())


def test_every_command_has_a_base_command_line():
    assert set(COMMANDS) == set(BASE), set(COMMANDS) ^ set(BASE)


def _fuzzable(cmd):
    """(flag or None for an argument, param name, is a path) for each non-flag parameter."""
    out = []
    for p in cmd.params:
        if isinstance(p, click.Option):
            if p.is_flag or p.name in ("help", "version"):
                continue
            out.append((max(p.opts, key=len), p.name, p.name in PATH_OPTIONS))
        elif isinstance(p, click.Argument):
            out.append((None, p.name, True))
    return out


def _argv(name, picks):
    """The base command line with the picked options replaced by their hostile values."""
    base = list(BASE[name])
    cmd = COMMANDS[name]
    args = [a for a in base if not a.endswith(".nc") or name != "compare"]
    positional = [a for a in base if name == "compare" and a.endswith(".nc")]
    argv = name.split()
    for (flag, pname, _), value in picks:
        if flag is None:
            idx = [p.name for p in cmd.params if isinstance(p, click.Argument)].index(pname)
            positional[idx] = value
            continue
        aliases = next(p.opts for p in cmd.params if p.name == pname)
        i = 0
        while i < len(args):  # drop the base value of this option
            if args[i] in aliases:
                del args[i : i + 2]
            else:
                i += 1
        args += [flag, value]
    return argv + args + positional


@contextlib.contextmanager
def _stubs():
    """Replace the minutes-long work of a few commands (their checks still run)."""
    import xarray as xr

    import phasefield.figures as figs
    from phasefield import diagram, driver, probing
    from phasefield.figures import demo
    from phasefield.layers import sweep as block_sweep
    from phasefield.lm import runs as lm_runs
    from phasefield.seeds import figures as seed_figs
    from phasefield.simulate import sweep as simsweep
    from phasefield.vit import recommend as vrec
    from phasefield.vit import sweep as vsweep

    def block_grid():
        return xr.Dataset(
            {v: (("sigma", "alpha"), [[0.1, -0.1], [0.2, -0.2]]) for v in block_sweep.VARIABLES},
            coords={"sigma": [0.5, 1.0], "alpha": [0.5, 1.0]},
            attrs={"block": "pre-ln", "depth": 2},
        )

    def tiny(*a, **k):
        if k.get("block") is not None and diagram.block_of(k["block"]).name != "paper":  # a block's 2-D grid
            return block_grid()  # (its figure draws)
        return xr.Dataset({"lambda_a": ("sigma_w", [0.0])}, coords={"sigma_w": [1.0]})

    class Stop(Exception):
        """Raised where a sweep's work would start: every check before it ran."""

    def stop(*a, **k):
        raise Stop

    def checked_sweep(*a, **k):  # the library's checks run; its work is replaced by ``tiny``
        real = (driver.Driver, block_sweep.plan)
        driver.Driver = block_sweep.plan = stop
        try:
            return sweep(*a, **k)
        except Stop:
            return tiny(*a, **k)
        finally:
            driver.Driver, block_sweep.plan = real

    def png(path, **k):
        with open(path, "w") as f:
            f.write("x")

    saved = [
        (vsweep, "run_sweep", vsweep.run_sweep),
        (figs, "make_figures", figs.make_figures),
        (demo, "run", demo.run),
        (vrec, "recommend", vrec.recommend),
        (diagram, "sweep", diagram.sweep),
        (simsweep, "fixed_point_grid", simsweep.fixed_point_grid),
    ]
    saved += [
        (seed_figs, n, getattr(seed_figs, n))
        for n in ("rank_collapse_figure", "deepscalelm_figure", "sensitivity_figure")
    ]
    saved.append((probing, "probe", probing.probe))
    saved.append((lm_runs, "train_seeds", lm_runs.train_seeds))

    def fake_probe(model, inits=2, eps=1e-3, **k):  # the factory and the checks ran; no measuring
        import numpy as np

        raw = {n: np.ones((inits, 3)) for n in ("q_data", "rho_data", "q_sym", "rho_sym", "grad")}
        raw["gap"] = np.full((inits, 3), eps) * np.arange(1, inits + 1)[:, None]
        return probing.ProbeResult("stub", probing.result.dataset(raw), (1.0, 0.5), eps)

    probing.probe = fake_probe
    lm_runs.train_seeds = lambda *a, **k: []
    vsweep.run_sweep = lambda *a, **k: dict(requested=1, already_done=0, trained=1, diverged=0, seconds=0.0)
    figs.make_figures = lambda *a, **k: dict(paths=[], seconds=0.0)
    demo.run = lambda *a, **k: {}
    vrec.recommend = lambda *a, **k: dict(critical=[], critical_found=False)
    sweep = diagram.sweep
    diagram.sweep = checked_sweep
    simsweep.fixed_point_grid = tiny
    for n in ("rank_collapse_figure", "deepscalelm_figure", "sensitivity_figure"):
        setattr(seed_figs, n, png)
    try:
        yield
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


def _run_in(folder, argv):
    old = os.getcwd()
    out, err = _io.StringIO(), _io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # pragma: no cover - main() should not exit
                code = exc.code
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(r, f), folder) for r, ds, fs in os.walk(folder) for f in fs + ds)


def _check(name, picks):
    folder = tempfile.mkdtemp(prefix="pf-fuzz-")
    try:
        for f, text in STUB_FILES.items():
            with open(os.path.join(folder, f), "w") as fh:
                fh.write(text)
        before = _listing(folder)
        argv = _argv(name, picks)
        with _stubs():
            code, out, err = _run_in(folder, argv)
        assert "Traceback" not in err, (argv, err)
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            assert err.startswith("phasefield: error:") and err.count("\n") == 1, (argv, err)
            assert _listing(folder) == before, (argv, err, _listing(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@st.composite
def _picks(draw, name):
    params = _fuzzable(COMMANDS[name])
    chosen = draw(st.lists(st.sampled_from(params), min_size=1, max_size=2, unique_by=lambda p: p[1]))
    return [(p, draw(st.sampled_from(PATHS if p[2] else NUMBERS) | st.text(max_size=6))) for p in chosen]


@pytest.mark.parametrize("name", sorted(BASE))
def test_hostile_options_exit_0_or_2_in_one_line(name):
    @settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(picks=_picks(name))
    def prop(picks):
        _check(name, picks)

    prop()
