"""One point at a time: the cost of a new point of every preset, and of the CLI at a new point.

In one process, for each preset: one warm-up point, then POINTS random points (exponents and
finite-depth rates, ``phasefield.layers.rates``, at n = 16, L = 16), each timed and each
counted for XLA compilations (JAX's compile-duration events). Then the CLI's ``exponents``
at a new point, for ``--block pre-ln:...`` against the paper block, with a cold compilation
cache (an empty ``PHASEFIELD_CACHE``) and a warm one (the same folder, another new point),
the median of ``--cli-repeats`` runs each.
Prints the medians and the ratios measured in this run; the goals (median <= 20 ms, no
compilation after the first point, the CLI within 1.5x the paper block's) are printed beside
them, never asserted.

    python scripts/bench_points.py [--points 20] [--seed 0] [--no-cli] [--cli-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from phasefield import layers
from phasefield.layers import presets, spec

N_TOKENS, DEPTH = 16, 16
GOAL_MS = 20.0
GOAL_CLI = 1.5

_compiles = [0]


def _count(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1


def _point(name, rng):
    """Random numbers of preset ``name`` in the range its phase diagrams span."""
    if name == "paper":
        return dict(
            sigma_w=rng.uniform(0.5, 3.0),
            sigma_a=rng.uniform(0.5, 2.0),
            alpha_a=rng.uniform(0.05, 0.95),
            alpha_m=rng.uniform(0.05, 0.95),
        )
    kw = dict(sigma=rng.uniform(0.2, 2.0), alpha=rng.uniform(0.05, 1.0))
    if name == "dyt":
        kw["a"] = rng.uniform(0.2, 1.5)
    return kw


def bench_preset(name, points, rng):
    def one():
        kw = _point(name, rng)
        c0, t0 = _compiles[0], time.perf_counter()
        r = layers.rates(spec.build(name, kw), n_tokens=N_TOKENS, depth=DEPTH)
        jax.block_until_ready(r["angle_rate"])
        return time.perf_counter() - t0, _compiles[0] - c0

    first_s, first_c = one()
    runs = [one() for _ in range(points)]
    ms = [1e3 * t for t, _ in runs]
    return dict(
        first_s=first_s,
        first_compiles=first_c,
        median_ms=statistics.median(ms),
        max_ms=max(ms),
        compiles_after=sum(c for _, c in runs),
    )


def _cli(args, cache):
    env = dict(os.environ, PHASEFIELD_CACHE=cache)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "phasefield", *args, "--json"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"CLI failed: {' '.join(args)}\n{out.stderr}")
    json.loads(out.stdout)
    return time.perf_counter() - t0


def bench_cli(rng, repeats):
    """Median wall seconds of ``repeats`` CLI runs per (cache, block), each at a new point:
    cold in a fresh empty cache folder each time, warm in the folder a cold run filled."""
    runs = [_cli_once(rng, os.path.join(_tmp, str(i))) for i in range(repeats)]
    return {
        label: {kind: statistics.median(r[label][kind] for r in runs) for kind in ("paper", "pre-ln")}
        for label in ("cold", "warm")
    }


def _cli_once(rng, folder):
    rows = {}
    for label in ("cold", "warm"):
        times = {}
        for kind in ("paper", "pre-ln"):
            cache = os.path.join(folder, kind)  # cold: empty; warm: the cold run's folder
            if kind == "paper":
                args = [
                    "exponents",
                    "--sigma-w",
                    f"{rng.uniform(0.5, 3):.6f}",
                    "--sigma-a",
                    "1",
                    "--alpha-a",
                    f"{rng.uniform(0.1, 0.9):.6f}",
                    "--alpha-m",
                    "0.5",
                    "--n-tokens",
                    str(N_TOKENS),
                    "--depth",
                    str(DEPTH),
                ]
            else:
                args = [
                    "exponents",
                    "--block",
                    f"pre-ln:sigma={rng.uniform(0.3, 1.5):.6f},alpha={rng.uniform(0.1, 1):.6f}",
                    "--n-tokens",
                    str(N_TOKENS),
                    "--depth",
                    str(DEPTH),
                ]
            times[kind] = _cli(args, cache)
        rows[label] = times
    return rows


def main():
    global _tmp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cli", action="store_true")
    ap.add_argument("--cli-repeats", type=int, default=3, help="CLI runs per case (their median)")
    a = ap.parse_args()
    jax.monitoring.register_event_duration_secs_listener(_count)
    rng = np.random.default_rng(a.seed)
    names = [n for n in ("paper", "pre-ln", "post-ln", "rms-swiglu", "dyt") if n in presets.NAMES]
    print(
        f"{a.points} random points per preset after one warm-up point (n = {N_TOKENS}, L = {DEPTH}; "
        f"jax {jax.__version__}, {jax.devices()[0].platform})"
    )
    print(
        f"{'preset':<12}{'first s':>9}{'compiles':>10}{'median ms':>11}{'max ms':>9}"
        f"{'compiles after':>16}  goal: median <= {GOAL_MS:g} ms, 0 after"
    )
    for name in names:
        r = bench_preset(name, a.points, rng)
        ok = r["median_ms"] <= GOAL_MS and r["compiles_after"] == 0
        print(
            f"{name:<12}{r['first_s']:>9.2f}{r['first_compiles']:>10d}{r['median_ms']:>11.2f}{r['max_ms']:>9.1f}"
            f"{r['compiles_after']:>16d}  {'met' if ok else 'NOT met'}"
        )
    if not a.no_cli:
        with tempfile.TemporaryDirectory() as _tmp:
            rows = bench_cli(rng, a.cli_repeats)
        print(
            f"\nCLI `exponents` at a new point (wall s, median of {a.cli_repeats}; goal: pre-ln <= {GOAL_CLI:g}x paper)"
        )
        for label, t in rows.items():
            ratio = t["pre-ln"] / t["paper"]
            print(
                f"  {label:<5} cache: paper {t['paper']:.2f} s, pre-ln {t['pre-ln']:.2f} s, ratio {ratio:.2f}"
                f"  {'met' if ratio <= GOAL_CLI else 'NOT met'}"
            )


_tmp = None

if __name__ == "__main__":
    main()
