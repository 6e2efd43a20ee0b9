"""How the number of attention heads changes a finite-width block: the mean-field
map does not depend on the heads (phasefield/layers/attention.py says why), the finite-width
draw-to-draw spread does.

For the pre-LN block at a few (sigma, alpha) and width d, with H heads (d_head = d / H), it
measures over ``--draws`` independent draws the per-draw lambda_g(L) (log of the gradient
energy over L) and rho_L from (q0, rho0) = (1, 0.5): their mean, standard error and the
draw-to-draw standard deviation, beside the theory (one number for every H).

    .venv/bin/python scripts/heads_spread.py [--width 512] [--heads 1,2,4,8,16] [--draws 32]
        [--out docs/data/blocks/heads.jsonl]          # resumable; --report prints the table
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from phasefield import layers
from phasefield.io import append_jsonl, read_jsonl
from phasefield.layers import measure

N, L, Q0, RHO0 = 16, 8, 1.0, 0.5
POINTS = [dict(sigma=1.0, alpha=1.0), dict(sigma=2.0, alpha=0.2)]


def simulate(point, heads, d, draws, seed=0):
    block = layers.presets.get("pre-ln", heads=heads, **point)

    def one(key):
        k1, k2 = jax.random.split(key)
        q, p = measure.transient(block, k1, N, d, L, Q0, RHO0)
        return p[-1] / q[-1], measure.gradient_energy(block, k2, N, d, L, Q0, RHO0)

    f = jax.jit(one)
    out = [f(k) for k in jax.random.split(jax.random.PRNGKey(seed), draws)]
    rho = np.array([float(o[0]) for o in out])
    lg = np.log(np.array([float(o[1]) for o in out])) / L
    return dict(rho_L=rho.tolist(), lambda_g_draws=lg.tolist())


def theory(point):
    out = {}
    for amap in ("paper", "exact"):
        fd = layers.finite_depth(
            layers.presets.get("pre-ln", heads=1, attention=amap, **point), q0=Q0, rho0=RHO0, n_tokens=N, depth=L
        )
        out[amap] = dict(rho_L=float(fd["rho"][-1]), lambda_g_input=float(fd["lambda_g_input"]))
    return out


def report(rows):
    lines = [
        "| point | heads | d_head | rho_L mean (se) | rho_L spread | lambda_g_input (se) | lambda_g_input spread | "
        "theory rho_L, lambda_g_input (paper / exact map) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (json.dumps(r["point"]), r["heads"])):
        rho, lg = np.asarray(r["rho_L"]), np.asarray(r["lambda_g_draws"])
        n = len(rho)
        g = np.exp(L * lg)  # lambda_g(L) of the mean energy, se by the delta method
        lam, lam_se = np.log(g.mean()) / L, g.std(ddof=1) / g.mean() / np.sqrt(n) / L
        th = r["theory"]
        pt = ",".join(f"{k}={v}" for k, v in r["point"].items())
        lines.append(
            f"| {pt} | {r['heads']} | {r['width'] // r['heads']} | {rho.mean():.4f} ({rho.std(ddof=1) / np.sqrt(n):.4f}) | "
            f"{rho.std(ddof=1):.4f} | {lam:.4f} ({lam_se:.4f}) | {lg.std(ddof=1):.4f} | "
            f"{th['paper']['rho_L']:.4f}, {th['paper']['lambda_g_input']:.4f} / "
            f"{th['exact']['rho_L']:.4f}, {th['exact']['lambda_g_input']:.4f} |"
        )
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", default="1,2,4,8,16")
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--out", default="docs/data/blocks/heads.jsonl")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args(argv)
    rows = read_jsonl(a.out)
    if not a.report:
        from tqdm import tqdm

        done = {(json.dumps(r["point"], sort_keys=True), r["heads"], r["width"], r["draws"]) for r in rows}
        todo = [
            (pt, int(h))
            for pt in POINTS
            for h in a.heads.split(",")
            if (json.dumps(pt, sort_keys=True), int(h), a.width, a.draws) not in done
        ]
        for pt, h in tqdm(todo, desc="heads"):
            row = dict(
                point=pt,
                heads=h,
                width=a.width,
                draws=a.draws,
                n_tokens=N,
                depth=L,
                **simulate(pt, h, a.width, a.draws),
                theory=theory(pt),
            )
            append_jsonl(a.out, row)
            rows.append(row)
    print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
