"""Theory against ``phasefield simulate exponents --block``: pre-LN, post-LN and
rms-SwiGLU at three points each across their phases, at one width (default 4096).

For every (preset, point) it runs :func:`phasefield.simulate.measure.rates` (the library
behind ``simulate exponents --block``: lazy weights, float32 forward and gradient passes,
float64 angle pass) and :func:`phasefield.simulate.compare.theory`, and prints one line per
quantity (angle_rate, lambda_g_input, lambda_g_collapse, lambda_a where the block has a
finite fixed point, rho_L, q_L) with z = (sim - theory) / se (se floored at 1e-6 relative,
:func:`phasefield.simulate.compare.z_scores`). The theory uses the exact-softmax attention
map (``attention=exact``, the map valid at every logit scale of these blocks, docs/blocks.md);
the network does not depend on the map. n = 16 tokens, L = 8 blocks, 4 heads, from
(q0, rho0) = (1, 0.5).

    python scripts/validate_simulate_blocks.py [--width 4096] [--draws 32] [--seed 0]
        [--presets pre-ln,post-ln,rms-swiglu] [--out docs/data/blocks/simulate_validation]

Writes ``OUT.json`` (one object per (preset, point, width, draws, seed)) and ``OUT.csv``
(one line per quantity) after every point; a rerun skips the rows already there
(resumable; the XLA compilations are kept in ``--cache``, so a rerun does not compile
again). Needs only jax, flax, numpy (no netCDF). Cost: 9 points; compilation dominates
(three block structures x two kernels, and the theory with the exact map); at width 256
with 8 draws the whole run took 170 CPU s on the 2-core CPU. Where one call
has a time limit, run it per preset (``--presets pre-ln`` ...): each call prints every
finished point and keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

N, L, HEADS, Q0, RHO0 = 16, 8, 4, 1.0, 0.5

# three points per preset across its phases (theory with the exact map, n = 16, L = 8):
# pre-LN is ordered with growing gradients everywhere (small -> large sigma * alpha);
# post-LN vanishing (sigma 0.55, 1) and exploding (sigma 2); rms-SwiGLU ordered (sigma 0.3,
# 1) and chaotic (sigma 2, alpha 0.2: angle rate +0.11)
POINTS = {
    "pre-ln": [dict(sigma=0.55, alpha=0.2), dict(sigma=1.0, alpha=1.0), dict(sigma=2.0, alpha=1.0)],
    "post-ln": [dict(sigma=0.55, alpha=1.0), dict(sigma=1.0, alpha=0.5), dict(sigma=2.0, alpha=0.5)],
    "rms-swiglu": [dict(sigma=0.3, alpha=1.0), dict(sigma=1.0, alpha=1.0), dict(sigma=2.0, alpha=0.2)],
}


def spec_of(preset, point) -> str:
    return f"{preset}:" + ",".join(f"{k}={v}" for k, v in point.items()) + f",heads={HEADS},attention=exact"


def phase(th) -> str:
    angle = th["lambda_a"] if np.isfinite(th["lambda_a"]) else th["angle_rate"]
    return ("chaotic" if angle > 0 else "ordered") + "/" + ("exploding" if th["lambda_g_input"] > 0 else "vanishing")


def run_point(preset, point, width, draws, seed) -> dict:
    from phasefield.simulate import compare, measure

    spec = spec_of(preset, point)
    t0 = time.perf_counter()
    th = compare.theory(spec, n_tokens=N, depth=L, q0=Q0, rho0=RHO0)
    sim = measure.rates(
        spec, width=width, draws=draws, n_tokens=N, depth=L, q0=Q0, rho0=RHO0, seed=seed, q_star=th["q_star"]
    )
    z = compare.z_scores(sim, th)
    rows = {
        q: dict(sim=sim[q], se=sim[q + "_se"], theory=th[q], z=z[q]) for q in measure.QUANTITIES if np.isfinite(th[q])
    }
    return dict(
        preset=preset,
        point=point,
        spec=spec,
        width=width,
        draws=draws,
        seed=seed,
        n_tokens=N,
        depth=L,
        heads=HEADS,
        q0=Q0,
        rho0=RHO0,
        phase=phase(th),
        quantities=rows,
        seconds=round(time.perf_counter() - t0, 1),
    )


def key(r):
    return (r["preset"], json.dumps(r["point"], sort_keys=True), r["width"], r["draws"], r["seed"])


def load(path) -> list:
    try:
        with open(path) as f:
            rows = json.load(f)
        return rows if isinstance(rows, list) else []
    except (OSError, ValueError):
        return []


def _atomic_write(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save(rows, out):
    """OUT.json and OUT.csv, each replaced whole (never torn)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    _atomic_write(out + ".json", json.dumps(rows, indent=1, allow_nan=False, default=lambda o: None) + "\n")
    cols = ["preset", "point", "width", "draws", "seed", "phase", "quantity", "sim", "se", "theory", "z"]
    lines = [",".join(cols)]
    for r in rows:
        pt = ";".join(f"{k}={v}" for k, v in r["point"].items())
        for q, v in r["quantities"].items():
            lines.append(
                ",".join(
                    str(x)
                    for x in (
                        r["preset"],
                        pt,
                        r["width"],
                        r["draws"],
                        r["seed"],
                        r["phase"],
                        q,
                        f"{v['sim']:.6g}",
                        f"{v['se']:.3g}",
                        f"{v['theory']:.6g}",
                        f"{v['z']:+.2f}",
                    )
                )
            )
    _atomic_write(out + ".csv", "\n".join(lines) + "\n")


def table(rows) -> str:
    out = [f"{'preset':<11} {'point':<20} {'phase':<19} {'quantity':<17} {'sim':>10} {'se':>8} {'theory':>10} {'z':>6}"]
    for r in rows:
        pt = ",".join(f"{k}={v}" for k, v in r["point"].items())
        for q, v in r["quantities"].items():
            out.append(
                f"{r['preset']:<11} {pt:<20} {r['phase']:<19} {q:<17} {v['sim']:>10.5f} {v['se']:>8.1e} "
                f"{v['theory']:>10.5f} {v['z']:>+6.2f}"
            )
    return "\n".join(out)


def compilation_cache(path):
    """Keep XLA's compilations in ``path`` (as the CLI does): a rerun (a resumed run, another
    --presets slice on the same machine) does not compile the kernels again."""
    if path and path.lower() not in ("off", "none", "0"):
        import jax

        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presets", default=",".join(POINTS))
    ap.add_argument("--out", default="docs/data/blocks/simulate_validation", help="writes OUT.json and OUT.csv")
    ap.add_argument(
        "--cache",
        default=os.environ.get(
            "PHASEFIELD_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "phasefield", "jax")
        ),
        help="XLA compilation cache folder ('off': none)",
    )
    a = ap.parse_args(argv)
    compilation_cache(a.cache)
    presets = [p.strip() for p in a.presets.split(",") if p.strip()]
    bad = [p for p in presets if p not in POINTS]
    if bad or a.width < 2 or a.draws < 2:
        print(
            f"validate_simulate_blocks: bad --presets {bad} (choose from {', '.join(POINTS)}), or --width/--draws < 2",
            file=sys.stderr,
        )
        return 2
    rows = load(a.out + ".json")
    done = {key(r) for r in rows}
    todo = [
        (p, pt)
        for p in presets
        for pt in POINTS[p]
        if key(dict(preset=p, point=pt, width=a.width, draws=a.draws, seed=a.seed)) not in done
    ]
    t0 = time.perf_counter()
    for i, (preset, pt) in enumerate(todo):
        r = run_point(preset, pt, a.width, a.draws, a.seed)
        rows.append(r)
        save(rows, a.out)
        worst = max(abs(v["z"]) for v in r["quantities"].values())
        print(
            f"[{i + 1}/{len(todo)}] {preset} {pt} width {a.width}, {a.draws} draws: {r['seconds']} s, "
            f"max |z| {worst:.2f}  (elapsed {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    sel = [
        r
        for r in rows
        if r["width"] == a.width and r["draws"] == a.draws and r["seed"] == a.seed and r["preset"] in presets
    ]
    print(table(sel))
    zs = [abs(v["z"]) for r in sel for v in r["quantities"].values()]
    if zs:
        print(f"{len(zs)} quantities at {len(sel)} points: max |z| {max(zs):.2f}, {sum(z > 3 for z in zs)} above 3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
