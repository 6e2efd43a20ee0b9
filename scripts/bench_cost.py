"""Cost cliffs of the theory's options, in one run: per-point time of each option against tanh.

For each configuration, warm (after a first call that compiles):

* ``point``: one ``paper.exponents`` call from scratch at one point, MLP kernel included
  (what ``phasefield exponents`` pays after start-up), median of 3 (``--quick``) or 5;
* ``sweep``: ``phasefield.sweep`` over an alpha axis at fixed sigma_w, wall time per grid
  point (the MLP kernel is built once per sigma_w and shared; with exact attention the
  exact map's values on the stable-point mesh once per (sigma_A, n)).

Ratios are to tanh at sigma_w = 5 (paper attention). Then the peak resident memory of the
36-point exact-attention sweep (``phasefield sweep --sigma-w 0.5:3:6 --alpha 0.2:0.8:6
--attention exact``) in a child process (``ru_maxrss``).

    nice -n 15 python scripts/bench_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import phasefield  # noqa: E402
from phasefield import HParams  # noqa: E402
from phasefield.layers import registry  # noqa: E402

paper = registry.lookup("paper").engine  # its exponents

CONFIGS = [  # (label, HParams fields, sweep points)
    ("tanh  sw=5", dict(sigma_w=5.0), 64),
    ("gelu  sw=5   mlp_layers=2", dict(sigma_w=5.0, activation="gelu", mlp_layers=2), 64),
    ("gelu  sw=5", dict(sigma_w=5.0, activation="gelu"), 64),
    ("tanh  sw=10", dict(sigma_w=10.0), 64),
    ("tanh  sw=100", dict(sigma_w=100.0), 64),
    ("tanh  sw=5   attention=exact", dict(sigma_w=5.0, attention="exact"), 64),
    ("tanh  sw=5   exact, sigma_A=2", dict(sigma_w=5.0, sigma_a=2.0, attention="exact"), 64),
    ("tanh  sw=5   exact, sigma_A=3", dict(sigma_w=5.0, sigma_a=3.0, attention="exact"), 64),
]


def _block(tree):
    jax.block_until_ready(tree)
    return tree


def time_point(fields, reps):
    """Warm seconds per point, median of ``reps``: kernel + exponents at a sigma_w and
    sigma_A not seen before (same grid sizes; the exact map's mesh values are recomputed)."""
    _block(paper.exponents(HParams(**fields)))  # compile
    sw, sa = fields["sigma_w"], fields.get("sigma_a", 1.0)
    times = []
    for k in range(reps):
        hp = HParams(**dict(fields, sigma_w=sw * (1 - 1e-7 * (k + 1)), sigma_a=sa * (1 - 1e-7 * (k + 1))))
        t0 = time.perf_counter()
        _block(paper.exponents(hp))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_sweep(fields, n, reps):
    """Wall seconds per grid point of a warm sweep, median of ``reps`` sweeps."""
    static = {k: fields[k] for k in ("activation", "mlp_layers", "attention") if k in fields}
    alpha = np.linspace(0.1, 0.9, n)
    phasefield.sweep(sigma_w=fields["sigma_w"], alpha=alpha, **static)  # compile
    times = []
    for k in range(reps):
        t0 = time.perf_counter()
        phasefield.sweep(sigma_w=fields["sigma_w"] * (1 - 1e-7 * (k + 1)), alpha=alpha, **static)
        times.append((time.perf_counter() - t0) / n)
    return float(np.median(times))


def peak_rss_exact_sweep():
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "phasefield",
            "sweep",
            "--sigma-w",
            "0.5:3:6",
            "--alpha",
            "0.2:0.8:6",
            "--attention",
            "exact",
            "--quiet",
            "-o",
            os.path.join(tmp, "exact36.nc"),
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        wall = time.perf_counter() - t0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2, wall  # KiB -> GiB


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no memory run")
    args = ap.parse_args()
    reps = 3 if args.quick else 5
    cpu = (
        next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
            platform.processor(),
        )
        if os.path.exists("/proc/cpuinfo")
        else platform.processor()
    )
    print(
        f"# {time.strftime('%Y-%m-%d')}  {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
        f"jax {jax.__version__}"
    )
    rows = []
    for label, fields, n in CONFIGS:
        t_point = time_point(fields, reps)
        t_sweep = time_sweep(fields, n if not args.quick else min(n, 16), reps)
        rows.append((label, t_point, t_sweep))
        print(f"  measured {label}: {t_point:.4g} s/point, sweep {t_sweep:.3g} s/point", flush=True)
    base_p, base_s = rows[0][1], rows[0][2]
    print(f"\n{'configuration':32s} {'point s':>10s} {'x tanh':>8s} {'sweep s/pt':>11s} {'x tanh':>8s}")
    for label, tp, ts in rows:
        print(f"{label:32s} {tp:10.4g} {tp / base_p:8.2f} {ts:11.3g} {ts / base_s:8.1f}")
    if not args.quick:
        gib, wall = peak_rss_exact_sweep()
        print(f"\nexact attention, 36-point sweep: peak RSS {gib:.2f} GiB, wall {wall:.0f} s")


if __name__ == "__main__":
    main()
