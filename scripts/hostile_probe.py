"""Hostile-user probe of the ``phasefield`` command.

Runs a list of bad inputs over every command, each as its own process (``python -m
phasefield ...``) with a timeout, in a fresh folder, and counts the cases that behave:
exit code 2 with exactly one line on stderr, no traceback and no file left behind (or
exit 0 for an input that is in fact legal, with no traceback). Anything else -- a
traceback, another exit code, a native abort, a hang past the timeout, a partial file --
broke the promise and is listed.

    python scripts/hostile_probe.py [--timeout 60] [--jobs 2] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (command, cheap valid base options); hostile values replace or add options
COMMANDS = {
    "exponents": [],
    "trajectory": [],
    "sweep": ["--quiet", "--out", "s.nc"],
    "gram trajectory": [],
    "gram exponents": [],
    "simulate exponents": ["--width", "8", "--seeds", "2", "--depth", "2", "--n-tokens", "4"],
    "simulate sweep": ["--width", "8", "--seeds", "2", "--depth", "2", "--n-tokens", "4", "--out", "sim.nc"],
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
    "predict": ["--sigma-w", "1", "--alpha", "0.5"],
    "recommend": ["--no-loss"],
    "seeds rank-collapse": ["--draws", "0"],
    "seeds deepscalelm": [],
    "seeds sensitivity": ["--draws", "8"],
}
FLOATS = {
    "exponents": ["--sigma-w", "--sigma-a", "--sigma-v", "--alpha", "--alpha-a", "--alpha-m"],
    "trajectory": ["--sigma-w", "--sigma-a", "--q0", "--rho0", "--p0", "--alpha"],
    "sweep": ["--sigma-w", "--sigma-a", "--sigma-v", "--alpha", "--n-tokens", "--depth"],
    "gram trajectory": ["--sigma-w", "--q0", "--rho0", "--rho-inter"],
    "gram exponents": ["--sigma-a", "--q0", "--rho0"],
    "simulate exponents": ["--sigma-w", "--sigma-a", "--eps"],
    "simulate sweep": ["--sigma-w", "--alpha"],
    "train-sweep": ["--sigma-w", "--alpha", "--sigma-a", "--lr", "--depth"],
    "predict": ["--sigma-w", "--sigma-a", "--alpha"],
    "recommend": ["--sigma-w", "--alpha"],
    "seeds rank-collapse": ["--sigma-x", "--rho", "--alpha-tilde"],
    "seeds deepscalelm": ["--dropout", "--k", "--alpha-exp", "--r0"],
    "seeds sensitivity": ["--alpha", "--alpha-a"],
}
INTS = {
    "exponents": ["--n-tokens", "--depth", "--mlp-layers"],
    "trajectory": ["--depth", "--n-tokens"],
    "sweep": ["--chunk", "--mlp-layers"],
    "gram trajectory": ["--depth", "--n-tokens"],
    "gram exponents": ["--depth"],
    "simulate exponents": ["--width", "--seeds", "--mlp-hidden", "--n-tokens", "--depth", "--seed"],
    "simulate sweep": ["--chunk", "--width", "--seeds"],
    "train-sweep": ["--seeds", "--epochs", "--width", "--chunk", "--batch-size", "--image-size"],
    "predict": ["--depth"],
    "recommend": ["--n-tokens", "--depth"],
    "seeds rank-collapse": ["--n-tokens", "--width", "--draws", "--depth", "--seed"],
    "seeds deepscalelm": ["--layers", "--width", "--seq-len", "--draws"],
    "seeds sensitivity": ["--depth", "--width", "--draws"],
}
BAD_FLOATS = ["nan", "inf", "1e308", "-1"]
BAD_INTS = ["-1", "99999999999999999999999", "1000000000"]
BAD_RANGES = ["0:1:1000000000", "1:2", "0.5:4:0", "1,,nan"]
OUTPUTS = [  # (command line, what)
    (["sweep", "--quiet", "--out", ""], "empty --out"),
    (["sweep", "--quiet", "--out", "/proc/x.nc"], "/proc"),
    (["sweep", "--quiet", "--out", "."], "a directory"),
    (["sweep", "--quiet", "--out", "RO/x.nc"], "read-only directory"),
    (["simulate", "sweep", "--width", "8", "--seeds", "2", "--out", "RO/x.nc"], "read-only directory"),
    (["figures", "--out", "RO/figs"], "read-only directory"),
    (["figures", "--out", "/proc/figs"], "/proc"),
    (["figures", "--out", "exists.txt"], "a file as the folder"),
    (["demo", "--out", "RO/demo"], "read-only directory"),
    (["seeds", "figures", "--out", "RO/f"], "read-only directory"),
    (["seeds", "rank-collapse", "--draws", "0", "--figure", "RO/f.png"], "read-only directory"),
    (["seeds", "deepscalelm", "--figure", "/proc/f.png"], "/proc"),
    (
        ["seeds", "deepscalelm", "--arch", "post-ln", "--init", "dslm", "--layers", "3", "--width", "4"],
        "width where the LayerNorm rules diverge",
    ),
    (["seeds", "deepscalelm", "--width", "4", "--figure", "f.png"], "figure stack where the rules diverge"),
    (["seeds", "deepscalelm", "--kappa", "measured"], "unknown --kappa"),
    (["seeds", "deepscalelm", "--ln-fluct", "yes"], "unknown --ln-fluct"),
    (["train-sweep", "--out", "RO/ts"], "read-only directory"),
    (["train-sweep", "--out", ""], "empty --out"),
    (["fit", "--runs", ".", "--out", "RO/fit.json"], "read-only directory"),
    (["compare", "missing.nc", "exists.txt"], "missing input"),
    (["figures", "--from", "exists.txt", "--out", "f"], "corrupt input"),
]


def cases():
    out = []
    for cmd, base in COMMANDS.items():
        for opt in FLOATS.get(cmd, []):
            for v in BAD_FLOATS + (BAD_RANGES if cmd in ("sweep", "simulate sweep", "train-sweep") else []):
                out.append((cmd.split() + base + [opt, v], f"{cmd} {opt} {v!r}"))
        for opt in INTS.get(cmd, []):
            for v in BAD_INTS:
                out.append((cmd.split() + base + [opt, v], f"{cmd} {opt} {v!r}"))
    for argv, what in OUTPUTS:
        out.append((argv, f"{' '.join(a for a in argv if not a.startswith('RO'))} ({what})"))
    return out


def run_case(argv, timeout):
    folder = tempfile.mkdtemp(prefix="pf-probe-")
    try:
        with open(os.path.join(folder, "exists.txt"), "w") as f:
            f.write("x\n")
        ro = os.path.join(folder, "RO")
        os.mkdir(ro)
        readonly = _make_readonly(ro)
        argv = [a.replace("RO/", ro + "/") for a in argv]
        before = _listing(folder)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            r = subprocess.run(
                [sys.executable, "-m", "phasefield", *argv],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return False, f"hang past {timeout} s"
        finally:
            if readonly:
                subprocess.run(["umount", ro], capture_output=True)
        err = r.stderr
        if "Traceback" in err:
            return False, "traceback: " + err.strip().splitlines()[-1][:150]
        if r.returncode == 0:
            return True, "accepted (exit 0)"
        if r.returncode != 2:
            return False, f"exit {r.returncode}: {err.strip()[-150:]}"
        lines = [l for l in err.splitlines() if l.strip()]
        if len(lines) != 1 or not lines[0].startswith("phasefield: error:"):
            return False, f"{len(lines)} lines on stderr: {err.strip()[:150]}"
        after = _listing(folder)
        if after != before:
            return False, f"left files: {sorted(set(after) - set(before))[:3]}"
        return True, lines[0][:150]
    finally:
        subprocess.run(["umount", os.path.join(folder, "RO")], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _make_readonly(path) -> bool:
    """A read-only folder: a read-only tmpfs where mounting is allowed (root counts as
    writable for chmod), otherwise mode 0555."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", path], capture_output=True)
    if r.returncode == 0:
        return True
    os.chmod(path, 0o555)
    return False


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(r, f), folder) for r, ds, fs in os.walk(folder) for f in fs + ds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    todo = [c for c in cases() if a.only is None or a.only in c[1]]
    with ThreadPoolExecutor(a.jobs) as ex:
        results = list(ex.map(lambda c: (c[1],) + run_case(c[0], a.timeout), todo))
    broke = [(w, m) for w, ok, m in results if not ok]
    accepted = sum(1 for w, ok, m in results if ok and m.startswith("accepted"))
    for w, m in broke:
        print(f"BROKE  {w}: {m}")
    print(
        f"cases tried: {len(results)}   behaved: {len(results) - len(broke)} "
        f"({accepted} legal inputs accepted with exit 0)   broke: {len(broke)}"
    )
    return 1 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
