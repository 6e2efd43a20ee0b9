#!/usr/bin/env python
"""The finite-width bias of the blocks' exponents, extrapolated to d -> infinity.

For every preset of ``--presets`` (default ``dyt`` and ``pre-ln``), every point of
``--sigmas`` at branch scale ``--alpha`` (4 heads; DyT's ``a`` at its default 0.5) and
every width of ``--widths``, measures the block's own network with the block simulator
(:func:`phasefield.simulate.measure.rates`: n = 16 tokens, L = 8 blocks from
(q0, rho0) = (1, 0.5), ``--draws`` independent draws, ``--weights`` lazy by default: exact
in distribution, one vector-Jacobian product per draw included, at O(n^2 d) per block),
then fits ``y(d) = a + b / d`` per quantity by weighted least squares (weights 1 / se^2;
the standard errors of a and b multiplied by sqrt(chi^2 / dof) when that exceeds 1, as
``scripts/infinite_width.py``) and compares the intercept a (the network at d -> infinity)
with the theory (:func:`phasefield.simulate.compare.theory`): z = (a - theory) / se(a).
For a block whose attention runs without the softmax-derivative path (e.g.
``dyt:softmax_correction=false``) the report also gives the theory with that path added at
the point's own logit scale.

    python scripts/width_extrapolation.py run    [--out docs/data/width_extrapolation]
        [--presets dyt,pre-ln] [--sigmas 0.5,0.9,1.3,1.5] [--alpha 0.3]
        [--widths 512,1024,2048,4096] [--draws 32] [--weights lazy] [--seed 0] [--a A]
    python scripts/width_extrapolation.py report [--out docs/data/width_extrapolation]

``run`` appends one JSON line per (preset, point, width) to ``OUT/rows.jsonl`` as each
finishes (a rerun skips the rows present; a kill leaves at most a torn last line, which is
skipped), then writes the report. ``report`` writes ``OUT/extrapolated.json`` (every fit)
and ``OUT/table.md`` (the markdown tables) and prints the tables. Every draw's seed is
fixed: ``--seed`` times 100003 plus the width (every point of a width shares its draws;
widths draw independently). Plain JAX: the same command runs on a CPU or an accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

N_TOKENS, DEPTH, HEADS = 16, 8, 4
QUANTITIES = ("lambda_g_input", "lambda_g_collapse", "angle_rate", "rho_L", "q_L")
ROWS, FITS, TABLE = "rows.jsonl", "extrapolated.json", "table.md"


# ---------------------------------------------------------------- the fit
def fit_inverse_width(widths, y, se):
    """Weighted least squares ``y = a + b / d`` (weights 1 / se^2): a dict with ``a``,
    ``a_se``, ``b``, ``b_se``, ``chi2_dof`` (chi^2 per degree of freedom; NaN with two
    widths) and ``inflation`` (sqrt(chi^2 / dof) when above 1, by which both standard errors
    are multiplied; 1 with two widths, where the fit is exact). Needs two distinct widths
    and positive standard errors."""
    d, y, se = (np.asarray(v, np.float64) for v in (widths, y, se))
    if len(np.unique(d)) < 2:
        raise ValueError(f"the 1/d fit needs two or more distinct widths (got {sorted(set(d.tolist()))})")
    if not np.all(np.isfinite(y)) or not np.all(se > 0):
        raise ValueError("the 1/d fit needs finite values and positive standard errors")
    x = np.stack([np.ones_like(d), 1.0 / d], 1)
    w = 1.0 / np.square(se)
    cov = np.linalg.inv(x.T @ (w[:, None] * x))
    coef = cov @ x.T @ (w * y)
    dof = len(y) - 2
    chi2 = float(np.sum(w * np.square(y - x @ coef)) / dof) if dof > 0 else float("nan")
    scale = float(np.sqrt(chi2)) if dof > 0 and chi2 > 1.0 else 1.0
    return dict(
        a=float(coef[0]),
        a_se=scale * float(np.sqrt(cov[0, 0])),
        b=float(coef[1]),
        b_se=scale * float(np.sqrt(cov[1, 1])),
        chi2_dof=chi2,
        inflation=scale,
    )


# ---------------------------------------------------------------- rows
def spec(preset, sigma, alpha, heads=HEADS, a=None):
    """The block's spec string (``a``: DyT's, None for the preset's default)."""
    return f"{preset}:sigma={sigma:g},alpha={alpha:g},heads={heads}" + ("" if a is None else f",a={a:g}")


def row_key(r):
    return (
        r["spec"],
        int(r["width"]),
        int(r["draws"]),
        r["weights"],
        int(r["seed"]),
        int(r["n_tokens"]),
        int(r["depth"]),
    )


def read_rows(path):
    """The complete rows of ``path`` ([] when absent); a torn last line is skipped."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def append_row(path, row):
    """One JSON line, written in one call and flushed to disk; a torn last line left by an
    earlier kill is first closed with a newline, so it cannot swallow this one."""
    text = json.dumps(row) + "\n"
    torn = False
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a") as f:
        f.write(("\n" if torn else "") + text)
        f.flush()
        os.fsync(f.fileno())


def plan(args):
    """Every (preset, spec, width) of the command line, widths outermost (each width's
    points share their draws and compiled programs)."""
    sigmas = [float(s) for s in args.sigmas.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    presets = args.presets.split(",")
    if args.a is not None and presets != ["dyt"]:
        raise SystemExit("--a is DyT's number: use it with --presets dyt alone")
    return [(p, spec(p, s, args.alpha, a=args.a), s, d) for d in widths for p in presets for s in sigmas]


def measure_row(preset, text, sigma, width, args):
    from phasefield.simulate import measure

    t = time.perf_counter()
    r = measure.rates(
        text,
        width=width,
        draws=args.draws,
        n_tokens=N_TOKENS,
        depth=DEPTH,
        weights=args.weights,
        seed=args.seed * 100003 + width,
    )
    import jax

    return dict(
        preset=preset,
        spec=text,
        sigma=sigma,
        alpha=args.alpha,
        heads=HEADS,
        width=width,
        draws=args.draws,
        weights=args.weights,
        seed=args.seed * 100003 + width,
        n_tokens=N_TOKENS,
        depth=DEPTH,
        sim={k: r[k] for q in QUANTITIES for k in (q, q + "_se")},
        seconds=round(time.perf_counter() - t, 2),
        backend=jax.default_backend(),
    )


def run(args, measure=measure_row):
    """Measure every row of the plan not in ``OUT/rows.jsonl``, appending each as it
    finishes; returns the number measured. ``measure(preset, spec, sigma, width, args)``
    gives a row (a stand-in in the script's test)."""
    from tqdm import tqdm

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, ROWS)
    base = dict(draws=args.draws, weights=args.weights, n_tokens=N_TOKENS, depth=DEPTH)
    done = {row_key(r) for r in read_rows(path)}
    todo = [
        item
        for item in plan(args)
        if row_key(dict(base, spec=item[1], width=item[3], seed=args.seed * 100003 + item[3])) not in done
    ]
    skipped = len(plan(args)) - len(todo)
    if skipped:
        print(f"{skipped} rows done before ({path})", flush=True)
    for preset, text, sigma, width in tqdm(todo, desc="widths x points", unit="row"):
        append_row(path, measure(preset, text, sigma, width, args))
    return len(todo)


# ---------------------------------------------------------------- report
def with_softmax_path(layer):
    """The block with the softmax-derivative path switched on in every attention layer
    (evaluated per point at the point's own logit scale sigma_A q: valid at any norm)."""
    from phasefield.layers.attention import Attention

    if isinstance(layer, Attention):
        return layer.replace(softmax_correction=True)
    return layer.map_children(with_softmax_path)


def theories(text):
    """The theory at the spec (``plain``) and, where the block's attention leaves the
    softmax-derivative path out, with it (``softmax``; else None)."""
    from phasefield.layers.attention import Attention
    from phasefield.simulate import compare, stack

    plain = compare.theory(text, n_tokens=N_TOKENS, depth=DEPTH)
    _, blk = stack.resolve(text)

    def attentions(layer):
        if isinstance(layer, Attention):
            return [layer]
        return [a for c in layer.children() for a in attentions(c)]

    if all(a.softmax_correction for a in attentions(blk)):
        return plain, None
    return plain, compare.theory(with_softmax_path(blk), n_tokens=N_TOKENS, depth=DEPTH)


def fits(rows):
    """Per (spec, weights): the widths (per width the row with the most draws) and per
    quantity the fit, the theory and z."""
    groups = {}
    for r in rows:
        if (r["n_tokens"], r["depth"]) == (N_TOKENS, DEPTH):
            groups.setdefault((r["spec"], r["weights"]), []).append(r)
    out = []
    for (text, weights), rs in groups.items():
        best = {}
        for r in rs:
            if r["width"] not in best or r["draws"] > best[r["width"]]["draws"]:
                best[r["width"]] = r
        rs = sorted(best.values(), key=lambda r: r["width"])
        if len(rs) < 2:
            continue
        plain, soft = theories(text)
        ds = [r["width"] for r in rs]
        for q in QUANTITIES:
            y = [r["sim"][q] for r in rs]
            se = [r["sim"][q + "_se"] for r in rs]
            f = fit_inverse_width(ds, y, se)
            out.append(
                dict(
                    preset=rs[0]["preset"],
                    spec=text,
                    sigma=rs[0]["sigma"],
                    alpha=rs[0]["alpha"],
                    weights=weights,
                    quantity=q,
                    widths=ds,
                    draws=[r["draws"] for r in rs],
                    values=y,
                    ses=se,
                    theory=plain[q],
                    theory_softmax=None if soft is None else soft[q],
                    z=(f["a"] - plain[q]) / f["a_se"],
                    **f,
                )
            )
    return out


def label(text):
    """The point of a spec string, its numbers without the heads: ``sigma=1.3,alpha=0.3``."""
    return ",".join(kv for kv in text.split(":", 1)[1].split(",") if not kv.startswith("heads="))


def _cell(v, se):
    return f"{v:+.5f} ± {se:.5f}"


def tables(fs):
    """Markdown: per preset the lambda_g table (theory, each width, d -> inf, z, the fitted
    bias at d = 1024) and a summary of every quantity's z."""
    lines = []
    for preset in dict.fromkeys(f["preset"] for f in fs):
        mine = [f for f in fs if f["preset"] == preset]
        widths = sorted({d for f in mine for d in f["widths"]})
        soft = mine[0]["theory_softmax"] is not None
        lines += [f"### {preset}", "", "λ_g from the input (lambda_g_input):", ""]
        head = ["point", "theory"] + [f"d = {d}" for d in widths] + ["d → ∞", "χ²/dof", "z"]
        head += ["+ softmax path", "its z"] if soft else []
        head += ["bias at d = 1024 (b/1024)", "bias / se(1024)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f in (f for f in mine if f["quantity"] == "lambda_g_input"):
            at = dict(zip(f["widths"], zip(f["values"], f["ses"])))
            cells = [label(f["spec"]), f"{f['theory']:+.5f}"]
            cells += [_cell(*at[d]) if d in at else "" for d in widths]
            cells += [
                _cell(f["a"], f["a_se"]),
                "—" if not np.isfinite(f["chi2_dof"]) else f"{f['chi2_dof']:.2f}",
                f"{f['z']:+.1f}",
            ]
            if soft:
                cells += [f"{f['theory_softmax']:+.5f}", f"{(f['a'] - f['theory_softmax']) / f['a_se']:+.1f}"]
            se1024 = np.interp(1024.0, f["widths"], f["ses"])
            cells += [_cell(f["b"] / 1024, f["b_se"] / 1024), f"{f['b'] / 1024 / se1024:+.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "z = (d → ∞ − theory) / se of every quantity:", ""]
        head = ["point"] + list(QUANTITIES)
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for text in dict.fromkeys(f["spec"] for f in mine):
            zs = {f["quantity"]: f["z"] for f in mine if f["spec"] == text}
            lines.append(f"| {label(text)} | " + " | ".join(f"{zs[q]:+.1f}" for q in QUANTITIES) + " |")
        lines.append("")
    if fs:
        draws = sorted({d for f in fs for d in f["draws"]})
        lines.append(
            f"n = {N_TOKENS}, L = {DEPTH}, {HEADS} heads, weights "
            f"{fs[0]['weights']}, draws {', '.join(map(str, draws))} per width; fit y = a + b/d "
            "(weighted least squares, se × √(χ²/dof) when above 1)."
        )
    return lines


def report(args):
    rows = read_rows(os.path.join(args.out, ROWS))
    if not rows:
        print(f"no rows in {os.path.join(args.out, ROWS)}: run first", file=sys.stderr)
        return 2
    fs = fits(rows)
    with open(os.path.join(args.out, FITS + ".tmp"), "w") as f:
        json.dump(fs, f, indent=1)
    os.replace(os.path.join(args.out, FITS + ".tmp"), os.path.join(args.out, FITS))
    lines = tables(fs)
    with open(os.path.join(args.out, TABLE + ".tmp"), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(os.path.join(args.out, TABLE + ".tmp"), os.path.join(args.out, TABLE))
    print("\n".join(lines))
    return 0


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("run", "report"))
    ap.add_argument("--out", default="docs/data/width_extrapolation")
    ap.add_argument("--presets", default="dyt,pre-ln")
    ap.add_argument("--sigmas", default="0.5,0.9,1.3,1.5")
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--a", type=float, default=None, help="DyT's a (default: the preset's, 0.5)")
    ap.add_argument("--widths", default="512,1024,2048,4096")
    ap.add_argument("--draws", type=int, default=32, help="independent draws per (point, width)")
    ap.add_argument("--weights", choices=("lazy", "dense"), default="lazy")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.command == "run":
        try:
            run(args)
        except KeyboardInterrupt:
            print("\ninterrupted: the finished rows are kept; rerun to resume", file=sys.stderr)
            return 130
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
