"""Causal stacks per position: the theory (:func:`phasefield.layers.causal_rates`, causal
mask) against the finite-width network (:func:`phasefield.simulate.causal_positions`) for
the standard presets, at two widths, with z-scores and a d -> infinity extrapolation.

Presets and points (n = 8 tokens, L = 6 blocks, 4 heads, exact-softmax attention map with
the softmax path, the presets' defaults; from (q0, rho0) = (1, 0.5)): pre-ln, post-ln and
rms-swiglu at sigma 0.55, 0.9, 1.2, 1.5 with alpha 1 (every one ordered: negative angle
rate), rms-swiglu also at sigma 2, alpha 0.2 (chaotic: angle rate +0.14); deepscalelm at the
same logit scales (sigma_a = sigma^2: 0.3025, 0.81, 1.44, 2.25, k = 2) and at k = 8,
sigma_a = 2.25 (its block's depth option is L). dyt and qk-norm are left out: their
tokenwise Gram maps are NaN at unequal token norms (docs/theory.md, "Gram maps of the
layers"), which the causal mask makes.

For every (preset, point, width) one JSON line in ``--out`` (default
``scripts/results/causal_check.jsonl``): per quantity (``q_L_pos``, ``rho_L_pos`` per
position, ``angle_rate_last``, ``lambda_g_last``) the theory, the network's mean and se
(``--draws`` draws of weights and inputs, seed ``--seed`` + width: independent draws at the
two widths), z = (sim - theory) / se (se floored at 1e-6 max(1, |theory|), as
:func:`phasefield.simulate.compare.z_scores`: a LayerNorm's epsilon moves post-LN's q by up
to 1e-6), and the acausal (q, p) theory's value (:func:`phasefield.layers.rates`: q_L,
rho_L, angle_rate, lambda_g_input) with its z at every position. A rerun skips the lines
already there (a torn last line is ignored); Ctrl-C stops after the current point (twice: at once). Then
the summary: the largest |z| per preset and quantity at each width, the mask's size (the
acausal theory's largest |z| at the last position), and the extrapolation linear in 1/d
through the two widths (``2 x_512 - x_256``, se ``sqrt(4 se_512^2 + se_256^2)``) against the
theory, over every preset in ``OUT`` at these draws and seed, printed and written to
``OUT`` with ``.seed<SEED>.summary.json``.

    nice python scripts/causal_check.py [--draws 256] [--widths 256 512] [--seed 0]
        [--presets pre-ln,post-ln,rms-swiglu,deepscalelm] [--out scripts/results/causal_check.jsonl]
    python scripts/causal_check.py --theory-only [--reference 65536] [--out ...]

``--theory-only`` runs no network: it recomputes the theory at every point of ``OUT`` and
prints, per preset and quantity, the largest change from the theory stored there in units of
the stored se (how far a change of the maps moves the table's z-scores), in seconds.
``--reference S`` also computes the theory with S whitened Monte-Carlo fields in float64
(the exact maps' sampling error against many more fields; seed ``MC_SEED + 1``, ~1 min at
65,536) and prints how far the theory now and the stored one lie from it, in the same se.

Cost on the 2-core CPU (shared): ~30 s of compilation per (preset, width), 2-8 s per point
at 256 draws.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

N, L, HEADS, Q0, RHO0 = 8, 6, 4, 1.0, 0.5
SIGMAS = (0.55, 0.9, 1.2, 1.5)
POINTS = {
    "pre-ln": [dict(sigma=s, alpha=1.0) for s in SIGMAS],
    "post-ln": [dict(sigma=s, alpha=1.0) for s in SIGMAS],
    "rms-swiglu": [dict(sigma=s, alpha=1.0) for s in SIGMAS] + [dict(sigma=2.0, alpha=0.2)],
    "deepscalelm": [dict(sigma_a=round(s * s, 4), k=2.0) for s in SIGMAS] + [dict(sigma_a=2.25, k=8.0)],
}
QUANTITIES = ("q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last")
ACAUSAL = dict(q_L_pos="q_L", rho_L_pos="rho_L", angle_rate_last="angle_rate", lambda_g_last="lambda_g_input")
RESOLUTION = 1e-6  # phasefield.simulate.compare.RESOLUTION


def options(preset, point) -> dict:
    kw = dict(point, heads=HEADS, attention="exact")
    if preset == "deepscalelm":
        kw["depth"] = L
    return kw


def z_of(sim, se, theory):
    from phasefield.simulate.compare import z_of as z

    return z(sim, se, theory)


def theory(preset, point) -> dict:
    from phasefield import layers
    from phasefield.layers import spec

    block = spec.build(preset, options(preset, point))
    causal = {k: np.asarray(v, float) for k, v in layers.causal_rates(block, N, L, Q0, RHO0, causal=True).items()}
    qp = layers.rates(block, Q0, RHO0, n_tokens=N, depth=L)
    acausal = {k: np.full(np.shape(causal[k]), float(qp[v])) for k, v in ACAUSAL.items()}
    acausal["rho_L_pos"][0] = 0.0
    return dict(block=block, causal=causal, acausal=acausal)


def run_point(preset, point, width, draws, seed, th) -> dict:
    from phasefield.simulate import causal_positions

    t0 = time.perf_counter()
    sim = causal_positions(
        th["block"], n_tokens=N, width=width, depth=L, draws=draws, seed=seed + width, q0=Q0, rho0=RHO0
    )
    rows = {}
    for q in QUANTITIES:
        want, wrong = th["causal"][q], th["acausal"][q]
        rows[q] = dict(
            theory=np.atleast_1d(want).tolist(),
            sim=np.atleast_1d(sim[q]).tolist(),
            se=np.atleast_1d(sim[q + "_se"]).tolist(),
            z=np.atleast_1d(z_of(sim[q], sim[q + "_se"], want)).tolist(),
            acausal=np.atleast_1d(wrong).tolist(),
            z_acausal=np.atleast_1d(z_of(sim[q], sim[q + "_se"], wrong)).tolist(),
        )
    # rho at position 0 is 0 by definition (se 0): no z
    for k in ("z", "z_acausal"):
        rows["rho_L_pos"][k][0] = None
    return dict(
        preset=preset,
        point=point,
        width=width,
        draws=draws,
        seed=seed,
        n_tokens=N,
        depth=L,
        heads=HEADS,
        q0=Q0,
        rho0=RHO0,
        quantities=rows,
        seconds=round(time.perf_counter() - t0, 1),
    )


def key(r):
    return (r["preset"], json.dumps(r["point"], sort_keys=True), r["width"], r["draws"], r["seed"])


def _abs_max(values):
    v = np.abs(np.array([x for x in values if x is not None], float))
    return float(np.max(v)) if v.size else float("nan")


def _at(q, i) -> dict:
    """The position of a per-position quantity's entry (none for the last token's rates)."""
    return dict(position=i) if q.endswith("_pos") else {}


def summary(rows, widths) -> dict:
    """Largest |z| per preset, quantity and width (with where it is), the acausal theory's
    largest |z| at the last position, and the 1/d extrapolation's z."""
    out = {}
    by = {}
    for r in rows:
        by.setdefault((r["preset"], json.dumps(r["point"], sort_keys=True)), {})[r["width"]] = r
    for (preset, pt), per in by.items():
        for q in QUANTITIES:
            s = out.setdefault(preset, {}).setdefault(q, {})
            for w, r in per.items():
                v = r["quantities"][q]
                zs = [np.nan if z is None else abs(z) for z in v["z"]]
                i = int(np.nanargmax(zs))
                cell = s.setdefault(f"max_abs_z_d{w}", dict(value=-1.0))
                if zs[i] > cell["value"]:
                    s[f"max_abs_z_d{w}"] = dict(value=round(zs[i], 2), point=json.loads(pt), **_at(q, i))
                last = abs(v["z_acausal"][-1])
                cell = s.setdefault(f"acausal_last_abs_z_d{w}", dict(value=-1.0))
                if last > cell["value"]:
                    s[f"acausal_last_abs_z_d{w}"] = dict(value=round(last, 1), point=json.loads(pt))
            if len(widths) == 2 and all(w in per for w in widths):
                lo, hi = (per[w]["quantities"][q] for w in sorted(widths))
                ratio = sorted(widths)[1] / sorted(widths)[0]  # x(h) = a + b h, h = 1/d
                a = (ratio * np.array(hi["sim"]) - np.array(lo["sim"])) / (ratio - 1)
                se = np.hypot(ratio * np.array(hi["se"]), np.array(lo["se"])) / (ratio - 1)
                gap = a - np.array(hi["theory"])
                z = z_of(a, se, np.array(hi["theory"]))
                if q == "rho_L_pos":
                    z[0] = np.nan
                i = int(np.nanargmax(np.abs(z)))
                cell = s.setdefault("extrapolated_max_abs_z", dict(value=-1.0))
                if abs(z[i]) > cell["value"]:
                    s["extrapolated_max_abs_z"] = dict(
                        value=round(float(abs(z[i])), 2),
                        gap=float(gap[i]),
                        se=float(se[i]),
                        point=json.loads(pt),
                        **_at(q, i),
                    )
    return out


def print_summary(s, widths):
    cols = [f"max|z| d={w}" for w in widths] + ["extrap. |z| (gap, se)"] + [f"acausal last |z| d={widths[-1]}"]
    print(f"{'preset':<12} {'quantity':<16} " + " | ".join(cols))
    for preset, qs in s.items():
        for q, v in qs.items():
            cells = []
            for w in widths:
                c = v.get(f"max_abs_z_d{w}")
                cells.append(f"{c['value']:.2f} {_where(c)}" if c else "-")
            e = v.get("extrapolated_max_abs_z")
            cells.append(f"{e['value']:.2f} ({e['gap']:+.2g}, {e['se']:.2g}) {_where(e)}" if e else "-")
            a = v.get(f"acausal_last_abs_z_d{widths[-1]}")
            cells.append(f"{a['value']:.1f}" if a else "-")
            print(f"{preset:<12} {q:<16} " + " | ".join(cells))


def _where(c):
    pt = ",".join(f"{k}={v:g}" for k, v in c["point"].items())
    return f"[{pt}" + (f" @{c['position']}]" if "position" in c else "]")


def _stop_after_point() -> list:
    """A list that the first Ctrl-C fills: the loop stops after the current point (an XLA
    compilation interrupted in mid-flight can crash the process at exit); a second Ctrl-C
    stops at once."""
    stop: list = []

    def handler(signum, frame):  # noqa: ARG001 - the signal handler's signature
        if stop:
            raise KeyboardInterrupt
        stop.append(True)
        print("\ncausal_check: stopping after this point (Ctrl-C again: now)", file=sys.stderr)

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)
    return stop


def theory_at_points(rows) -> dict:
    """The causal theory now at every (preset, point) of ``rows``."""
    out = {}
    for r in rows:
        k = (r["preset"], json.dumps(r["point"], sort_keys=True))
        if k not in out:
            out[k] = theory(r["preset"], r["point"])["causal"]
    return out


def reference_theories(rows, samples: int) -> dict:
    """:func:`theory_at_points` with ``samples`` whitened fields in float64 (seed MC_SEED + 1): this
    process's exact maps are switched to them (call it last)."""
    import functools

    import jax
    import jax.numpy as jnp

    from phasefield.theory.attention import full_gram as fg

    draw = fg.mc_normals.__wrapped__
    fg.mc_samples = lambda n: samples
    fg.SAMPLE_DTYPE = jnp.float64
    fg.mc_normals = functools.lru_cache(maxsize=4)(lambda n, s=None, seed=None: draw(n, samples, fg.MC_SEED + 1))
    jax.clear_caches()
    return theory_at_points(rows)


def max_gap(rows, have: dict, want: dict | None = None) -> dict:
    """Per (preset, quantity): the largest |have - want| / se (positions with se > 0; ``have``
    by point, or a function of (row, quantity); ``want`` None: the theory stored in ``rows``)
    and the largest relative gap."""
    out = {}
    for r in rows:
        k = (r["preset"], json.dumps(r["point"], sort_keys=True))
        for q in QUANTITIES:
            old, se = (np.asarray(r["quantities"][q][x], float) for x in ("theory", "se"))
            ref = old if want is None else np.atleast_1d(want[k][q])
            d = np.atleast_1d(have(r, q) if callable(have) else have[k][q]) - ref
            cell = out.setdefault((r["preset"], q), [0.0, 0.0])
            cell[0] = max(cell[0], float(np.max(np.abs(d[se > 0]) / se[se > 0], initial=0.0)))
            cell[1] = max(cell[1], float(np.max(np.abs(d) / np.maximum(np.abs(ref), 1e-300))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=256)
    ap.add_argument("--widths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presets", default=",".join(POINTS))
    ap.add_argument("--out", default=os.path.join("scripts", "results", "causal_check.jsonl"))
    ap.add_argument("--theory-only", action="store_true", help="the theory's change at OUT's points, in se")
    ap.add_argument("--reference", type=int, default=0, help="with --theory-only: against S whitened fields")
    a = ap.parse_args(argv)
    presets = [p.strip() for p in a.presets.split(",") if p.strip()]
    bad = [p for p in presets if p not in POINTS]
    if bad or a.draws < 2 or min(a.widths) < HEADS or any(w % HEADS for w in a.widths):
        print(
            f"causal_check: bad --presets {bad} (choose from {', '.join(POINTS)}), --draws < 2, "
            f"or a width not a multiple of {HEADS}",
            file=sys.stderr,
        )
        return 2

    from tqdm import tqdm

    from phasefield import io

    if a.theory_only:
        rows = io.read_jsonl(a.out)
        if not rows:
            print(f"causal_check: no points in {a.out}", file=sys.stderr)
            return 2
        now = theory_at_points(rows)
        for (preset, q), (z, rel) in max_gap(rows, now).items():
            print(f"{preset:<12} {q:<16} max |theory now - stored| / se = {z:.3f}  (relative {rel:.1e})")
        if a.reference:
            ref = reference_theories(rows, a.reference)
            stored = lambda r, q: np.asarray(r["quantities"][q]["theory"], float)  # noqa: E731
            gap_now, gap_stored = max_gap(rows, now, ref), max_gap(rows, stored, ref)
            print(f"against {a.reference} whitened float64 fields, max |theory - reference| / se:")
            for key, (z, _) in gap_now.items():
                print(f"{key[0]:<12} {key[1]:<16} now {z:.3f}  stored {gap_stored[key][0]:.3f}")
        return 0

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    rows = io.read_jsonl(a.out)
    done = {key(r) for r in rows}
    todo = [
        (p, pt, w)
        for p in presets
        for w in a.widths
        for pt in POINTS[p]
        if key(dict(preset=p, point=pt, width=w, draws=a.draws, seed=a.seed)) not in done
    ]
    theories = {}
    stop = _stop_after_point()
    bar = tqdm(todo, desc="points", unit="point", file=sys.stderr)
    for preset, pt, w in bar:
        bar.set_postfix_str(f"{preset} " + ",".join(f"{k}={v:g}" for k, v in pt.items()) + f" d={w}")
        tk = (preset, json.dumps(pt, sort_keys=True))
        if tk not in theories:
            theories[tk] = theory(preset, pt)
        r = run_point(preset, pt, w, a.draws, a.seed, theories[tk])
        io.append_jsonl(a.out, r)
        rows.append(r)
        if stop:
            bar.close()
            print(f"causal_check: stopped; {len(rows)} points kept in {a.out} (rerun to resume)", file=sys.stderr)
            return 130
    bar.close()
    keep = [r for r in rows if r["draws"] == a.draws and r["seed"] == a.seed]  # every preset run so
    s = summary(keep, a.widths)
    with open(f"{os.path.splitext(a.out)[0]}.seed{a.seed}.summary.json", "w") as f:
        json.dump(dict(draws=a.draws, seed=a.seed, widths=a.widths, n_tokens=N, depth=L, summary=s), f, indent=1)
        f.write("\n")
    print_summary(s, a.widths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
