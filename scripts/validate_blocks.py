"""Theory vs finite-width simulation for the standard blocks, extrapolated to
infinite width.

For every preset and point (6 per preset, spanning the phases) it simulates random stacks
of the block's own Flax module (lazy weights, ``phasefield.layers.measure``) at several
widths and measures, from input tokens at (q0, rho0) = (1, 0.5):

* per-layer cosine rho_l (l = 1..L) and norm q_l,
* lambda_g(L) = (1/L) log E|J^T u|^2 / (n d) (u ~ N(0, I) at the output),
* the angle rate of nearby tokens (1/L) log[(1 - rho_L) / (1 - rho_0)] from rho_0 = 1 - EPS
  (per draw, with the draw's own realized rho_0; 1 - rho from the centred tokens,
  ``layers.measure.near_gap``, in a float64 network: read as 1 - p/q through the float32
  Gram matrix it was mostly rounding at d = 4096, where 1 - rho_L ~ 6e-6, and where
  1 - rho_L ~ 4e-9 (post-LN, sigma = 2) a float32 network merges the tokens; rows measured
  otherwise are remeasured by ``--remeasure-angle``),

each with its standard error over ``--draws`` independent draws, then fits y = a + b/d by
weighted least squares over the widths and compares the intercept a with the theory
(``phasefield.layers``: ``finite_depth`` from (1, 0.5), and the trajectory from
(1, 1 - EPS) for the angle rate): z = (a - theory) / se(a).

    .venv/bin/python scripts/validate_blocks.py [--widths 256,1024,4096] [--draws 32]
        [--presets pre-ln,post-ln,rms-swiglu,deepscalelm] [--out docs/data/blocks/rows.jsonl]

Resumable: each (preset, point, width) is one JSON line appended when done; a rerun skips
the rows present. ``--report`` only prints the table from the rows.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from phasefield import layers
from phasefield.io import append_jsonl, atomic_path, read_jsonl
from phasefield.layers import measure as M

N, L, Q0, RHO0, EPS, HEADS = 16, 8, 1.0, 0.5, 1e-3, 4

POINTS = {
    "pre-ln": [
        dict(sigma=s, alpha=a) for s, a in [(0.3, 1.0), (0.55, 0.2), (0.55, 1.0), (1.0, 1.0), (2.0, 0.2), (2.0, 1.0)]
    ],
    "post-ln": [
        dict(sigma=s, alpha=a) for s, a in [(0.3, 1.0), (0.55, 1.0), (1.0, 0.5), (1.0, 1.0), (2.0, 0.5), (2.0, 1.0)]
    ],
    "rms-swiglu": [
        dict(sigma=s, alpha=a) for s, a in [(0.3, 1.0), (1.0, 0.2), (1.0, 1.0), (1.5, 0.5), (2.0, 0.2), (2.0, 1.0)]
    ],
    "deepscalelm": [
        dict(depth=dd, sigma_a=s) for dd, s in [(4, 0.5), (4, 1.0), (4, 3.0), (8, 0.5), (8, 1.0), (8, 3.0)]
    ],
}


def block_of(preset, point, attention="paper"):
    return layers.presets.get(preset, heads=HEADS, attention=attention, **point)


def theory(preset, point, attention="paper") -> dict:
    blk = block_of(preset, point, attention)
    fd = layers.finite_depth(blk, q0=Q0, rho0=RHO0, n_tokens=N, depth=L)
    q, p = layers.trajectory(blk, Q0, 1.0 - EPS, n_tokens=N, depth=L)
    rho_near = np.asarray(p) / np.asarray(q)
    near = layers.finite_depth(blk, q0=Q0, rho0=1.0, n_tokens=N, depth=L)
    return dict(
        rho=np.asarray(fd["rho"])[1:].tolist(),
        q=np.asarray(fd["q"])[1:].tolist(),
        lambda_g_input=float(fd["lambda_g_input"]),
        angle_rate=float(np.log((1 - rho_near[-1]) / EPS) / L),
        angle_rate_limit=float(near["angle_rate"]),
    )


@functools.cache
def _draw_fn(structure, d):
    """One draw's measurements, compiled once per block structure and width (the block's
    numbers are traced arguments)."""

    def one(blk, k):
        k1, k2, k3 = jax.random.split(k, 3)
        q, p = M.transient(blk, k1, N, d, L, Q0, RHO0)
        g = M.gradient_energy(blk, k2, N, d, L, Q0, RHO0)
        return q, p / q, g

    return jax.jit(one)


ANGLE_MEASURE = "spread-f64"


@functools.cache
def _angle_fn(structure, d):
    def f(blk, k):
        gap = M.near_gap(blk, jax.random.split(k, 3)[2], N, d, L, Q0, EPS, dtype=jnp.float64)
        return jnp.log(gap[-1] / gap[0]) / L

    return jax.jit(f)


def angle_rates(preset, point, d, draws, seed=0) -> dict:
    """The angle rate of nearby tokens per draw (keys as :func:`simulate`), in a float64
    network, 1 - rho from the centred tokens: mean and standard error."""
    blk = block_of(preset, point)
    keys = jax.random.split(jax.random.PRNGKey(seed), draws)
    with jax.enable_x64(True):
        f = _angle_fn(jax.tree_util.tree_structure(blk), d)
        ang = np.array([float(f(blk, k)) for k in keys])
    return dict(
        angle_rate=float(ang.mean()),
        angle_rate_se=float(ang.std(ddof=1) / np.sqrt(len(ang))),
        angle_measure=ANGLE_MEASURE,
    )


def simulate(preset, point, d, draws, seed=0) -> dict:
    blk = block_of(preset, point)
    keys = jax.random.split(jax.random.PRNGKey(seed), draws)
    f = _draw_fn(jax.tree_util.tree_structure(blk), d)
    out = [f(blk, k) for k in keys]  # one draw at a time (memory at width 4096)
    q, rho, g = (np.stack([np.asarray(o[i], float) for o in out]) for i in range(3))
    se = lambda a: a.std(0, ddof=1) / np.sqrt(draws)
    return dict(
        rho=rho.mean(0)[1:].tolist(),
        rho_se=se(rho)[1:].tolist(),
        q=q.mean(0)[1:].tolist(),
        q_se=se(q)[1:].tolist(),
        lambda_g_input=float(np.log(g.mean()) / L),
        lambda_g_input_se=float(se(g) / g.mean() / L),
        **angle_rates(preset, point, d, draws, seed),
    )


def extrapolate(ds, y, se):
    """Weighted least squares y = a + b/d: (a, se(a)); one width: (y, se)."""
    ds, y, se = np.asarray(ds, float), np.asarray(y, float), np.asarray(se, float)
    # floor: the simulation runs in float32; a cosine saturated at 1 can have se = 0
    se = np.maximum(se, np.finfo(np.float32).eps * np.maximum(np.abs(y), 1.0))
    if len(ds) == 1:
        return float(y[0]), float(se[0])
    X = np.stack([np.ones_like(ds), 1.0 / ds], 1)
    W = 1.0 / np.square(se)
    cov = np.linalg.inv(X.T @ (W[:, None] * X))
    a = cov @ (X.T @ (W * y))
    return float(a[0]), float(np.sqrt(cov[0, 0]))


def load(path):
    """The rows written so far (a torn last line, from a kill in mid-write, is skipped)."""
    return read_jsonl(path)


MAPS = ("paper", "exact")


def report(rows):
    """Markdown table: every (preset, point) extrapolated over all the widths in ``rows``,
    against today's theory with the paper's attention map (Eq. 10) and the exact-softmax map."""
    width = max(r["width"] for r in rows)
    lines = [
        f"| preset | point | quantity | d -> inf (se) | at d = {width} | theory (paper map) | z | "
        "theory (exact map) | z |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst = {m: [] for m in MAPS}
    keyf = lambda r: (r["preset"], json.dumps(r["point"], sort_keys=True))
    groups = {}
    for r in rows:
        groups.setdefault(keyf(r), []).append(r)
    for (preset, pt), rs in groups.items():
        # one row per width, the one with the most draws (rows of one seed share draws)
        best = {}
        for r in rs:
            if r["width"] not in best or r["draws"] > best[r["width"]]["draws"]:
                best[r["width"]] = r
        rs = sorted(best.values(), key=lambda r: r["width"])
        ths = {m: theory(preset, json.loads(pt), m) for m in MAPS}
        ds = [r["width"] for r in rs]
        pt_s = ",".join(f"{k}={v}" for k, v in json.loads(pt).items())

        def row(label, a, s, last, values):
            cells = []
            for m in MAPS:
                z = (a - values[m]) / s
                worst[m].append((abs(z), preset, pt_s, label))
                cells.append(f"{values[m]:.4f} | {z:+.1f}")
            lines.append(f"| {preset} | {pt_s} | {label} | {a:.4f} ({s:.4f}) | {last:.4f} | {' | '.join(cells)} |")

        for name in ("lambda_g_input", "angle_rate"):
            a, s = extrapolate(ds, [r["sim"][name] for r in rs], [r["sim"][name + "_se"] for r in rs])
            row(name, a, s, rs[-1]["sim"][name], {m: ths[m][name] for m in MAPS})
        fits = [
            extrapolate(ds, [r["sim"]["rho"][layer] for r in rs], [r["sim"]["rho_se"][layer] for r in rs])
            for layer in range(L)
        ]
        for m in MAPS:  # each map's worst layer (its z is in its own column)
            zs = [abs(a - ths[m]["rho"][layer]) / s for layer, (a, s) in enumerate(fits)]
            i = int(np.argmax(zs))
            row(
                f"rho_{i + 1} (worst of 1..{L}, {m} map)",
                *fits[i],
                rs[-1]["sim"]["rho"][i],
                {mm: ths[mm]["rho"][i] for mm in MAPS},
            )
    return lines, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="256,1024,4096")
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--presets", default=",".join(POINTS))
    ap.add_argument("--out", default="docs/data/blocks/rows.jsonl")
    ap.add_argument("--report", action="store_true")
    ap.add_argument(
        "--remeasure-angle",
        action="store_true",
        help="recompute the angle rate of rows measured through the Gram matrix",
    )
    a = ap.parse_args(argv)
    widths = [int(w) for w in a.widths.split(",")]
    rows = load(a.out)
    if a.remeasure_angle:
        from tqdm import tqdm

        for i in tqdm(
            [i for i, r in enumerate(rows) if r["sim"].get("angle_measure") != ANGLE_MEASURE], desc="angle rates"
        ):
            r = rows[i]
            r["sim"].update(angle_rates(r["preset"], r["point"], r["width"], r["draws"]))
            with atomic_path(a.out) as tmp, open(tmp, "w") as f:  # rewritten whole: never torn
                f.writelines(json.dumps(r) + "\n" for r in rows)
        a.report = True
    done = {(r["preset"], json.dumps(r["point"], sort_keys=True), r["width"], r["draws"]) for r in rows}
    if not a.report:
        from tqdm import tqdm

        todo = [
            (p, pt, d)
            for d in widths
            for p in a.presets.split(",")
            for pt in POINTS[p]
            if (p, json.dumps(pt, sort_keys=True), d, a.draws) not in done
        ]
        for preset, pt, d in tqdm(todo, desc="block checks"):
            t0 = time.perf_counter()
            row = dict(
                preset=preset,
                point=pt,
                width=d,
                draws=a.draws,
                n_tokens=N,
                depth=L,
                heads=HEADS,
                sim=simulate(preset, pt, d, a.draws),
                theory=theory(preset, pt),
            )
            row["seconds"] = round(time.perf_counter() - t0, 1)
            append_jsonl(a.out, row)
            rows.append(row)
    lines, worst = report(rows)
    print("\n".join(lines))
    for m in MAPS:
        w = sorted((x for x in worst[m] if np.isfinite(x[0])), reverse=True)  # NaN: not measurable
        print(f"{m} map, largest |z|:", ", ".join(f"{z:.1f} ({p} {pt} {q})" for z, p, pt, q in w[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
