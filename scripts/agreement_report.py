#!/usr/bin/env python
"""Theory-vs-simulation agreement report (docs/simulation.md).

1. exponents: simulated lambda_a, lambda_g(16) on a 16 x 16 grid (sigma_w x alpha) at
   width 512, n = 32, 16 draws (``phasefield.simulate.sweep``), against the theory sweep
   (``phasefield.diagram.sweep``): median / 90th percentile / max |error| by phase.
2. transients: per-layer q and rho over 16 blocks from a simplex input (q0 = 1, rho0 = .5),
   simulated vs ``paper.trajectory`` over sigma_w x sigma_A, to show where the paper's
   attention map (Assumption 3.2) breaks (large sigma_A), and the exact-softmax map
   (hp.attention = 'exact').

    python scripts/agreement_report.py --out out/agreement [--stage all|sim|report]

The simulated sweep is resumable (parts directory); the report is written to
OUT/report.md and printed.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import phasefield
from phasefield import HParams
from phasefield.simulate import compare, measure
from phasefield.simulate import sweep as simsweep

phasefield.use_all_cpu_cores()  # this script owns its process

SW = np.linspace(0.5, 3.0, 16)
ALPHA = np.linspace(0.1, 0.9, 16)
WIDTH, SEEDS = 512, 16


def stage_sim(out):
    path = os.path.join(out, "sim.nc")
    if os.path.exists(path):
        return path
    t = time.time()
    ds = simsweep.fixed_point_grid(
        "paper", width=WIDTH, draws=SEEDS, sigma_w=SW, alpha=ALPHA, chunk=16, parts_dir=path + ".parts", progress=True
    )
    ds.attrs["runtime_s"] = time.time() - t
    ds.to_netcdf(path + ".tmp", engine="h5netcdf")
    os.replace(path + ".tmp", path)
    return path


def stage_theory(out):
    from phasefield import diagram

    path = os.path.join(out, "theory.nc")
    ds = diagram.sweep(sigma_w=SW, alpha=ALPHA)
    ds.to_netcdf(path + ".tmp", engine="h5netcdf")
    os.replace(path + ".tmp", path)
    return path


def transient_table(
    out, attention="paper", sigma_ws=(1.0, 2.0, 3.0), sigma_as=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0), width=WIDTH, seeds=8
):
    from phasefield.layers import presets, registry

    paper = registry.lookup("paper").engine  # its trajectory

    rows = []
    for sa in sigma_as:
        dq, drho = [], []
        for sw in sigma_ws:
            hp = HParams(sigma_w=sw, sigma_a=sa, alpha_a=0.5, alpha_m=0.5, attention=attention)
            sim = measure.transients(presets.paper(hp), 1.0, 0.5, width=width, draws=seeds, seed=7)
            q_th, p_th = (np.asarray(v, float) for v in paper.trajectory(hp, 1.0, 0.5, 16))
            dq.append(np.max(np.abs(sim["q"] - q_th) / q_th))
            drho.append(np.max(np.abs(sim["rho"] - p_th / q_th)))
        rows.append((sa, np.median(dq), np.max(dq), np.median(drho), np.max(drho)))
    lines = [
        "| sigma_A | median max-layer rel. err q | max | median max-layer err rho | max |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r[0]:.1f} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} |" for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/agreement")
    ap.add_argument("--stage", choices=["all", "sim", "report"], default="all")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sim = stage_sim(args.out)
    if args.stage == "sim":
        return
    th = stage_theory(args.out)
    rows = compare.agreement(compare.open_grid(th), compare.open_grid(sim))
    parts = [
        f"## Exponents: {len(SW)} x {len(ALPHA)} grid, sigma_w in [{SW[0]}, {SW[-1]}], "
        f"alpha_A = alpha_M in [{ALPHA[0]}, {ALPHA[-1]}], sigma_A = 1, n = 32, L = 16, "
        f"width {WIDTH}, {SEEDS} draws",
        compare.format_markdown(rows),
    ]
    for attention in ("paper", "exact"):
        table = transient_table(args.out, attention=attention)
        parts += [
            f"## Transients over 16 blocks, attention map '{attention}' "
            f"(sigma_w in 1, 2, 3; alpha = .5; q0 = 1, rho0 = .5; width {WIDTH}, 8 draws)",
            table,
        ]
    text = "\n\n".join(parts) + "\n"
    with open(os.path.join(args.out, "report.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
