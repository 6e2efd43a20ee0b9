#!/usr/bin/env python
"""The infinite-width limit of the simulated exponents and transients.

At every width d of ``--widths`` (default 256, 512, ..., 16384) and every point of
:data:`POINTS` (sigma_A in {1, 3}; ordered/vanishing, ordered/exploding, chaotic/exploding
near and far from the boundary), measures with lazily sampled weights (exact in
distribution, O(n^2 d) per block):

  lambda_a      one block, rho = 1 - eps at q*  (``measure.angle_draws``)
  lambda_g(16)  VJP from the collapsed point    (``measure.gradient_draws``)
  rho_l         per-layer cosine over 16 blocks from q0 = 1, rho0 = 0.5 (exact input Gram)

All points of a width share their draws (one vmapped chunk). The number of draws falls
with d (``--draws-top`` at the top width, times 16384 / d, capped at ``--draws-max``): the
per-draw spread of each quantity scales like d^{-1/2}, so every width costs about the
same. Each width is stored under ``OUT/parts/`` as soon as it finishes (rerunning
resumes). ``report`` fits ``y(d) = a + b / d`` by weighted least squares (weights
1 / se^2) per quantity, gives ``a`` (the d -> infinity value) with its standard error
(multiplied by sqrt(chi^2 / dof) when that exceeds 1) and compares it with the theory's
paper map and exact-softmax map (``HParams(attention='paper'|'exact')``); it writes
``OUT/extrapolated.csv`` and a figure.

    python scripts/infinite_width.py run    [--out docs/data/infinite_width] [--widths ...]
    python scripts/infinite_width.py report [--out docs/data/infinite_width]
                                            [--figure docs/images/infinite_width.png]
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from phasefield import HParams
from phasefield.layers.presets import paper as paper_block
from phasefield.simulate import measure

# (sigma_w, sigma_A, alpha): theory phases at n = 32, L = 16 (lambda_a, lambda_g(16)):
# (1.0, ., .5) ordered/vanishing (-0.386, -0.188); (1.8, ., .7) ordered/exploding
# (-0.198, +0.050); (2.0, ., .3) chaotic/exploding near the boundary (+0.021, +0.024);
# (3.0, ., .5) deep chaotic/exploding (+0.286, +0.290). Chaotic/vanishing needs
# 0 < lambda_a < -log(1 - 1/n)/L = 0.002 at n = 32, L = 16: a sliver, left out.
POINTS = [(sw, sa, a) for sa in (1.0, 3.0) for sw, a in ((1.0, 0.5), (1.8, 0.7), (2.0, 0.3), (3.0, 0.5))]
N, DEPTH, EPS, Q0, RHO0 = 32, 16, 1e-3, 1.0, 0.5
WIDTHS = tuple(256 * 2**k for k in range(7))


def hparams(points=POINTS):
    sw, sa, a = (np.array(v, float) for v in zip(*points))
    return HParams(
        sigma_w=sw,
        sigma_a=sa,
        alpha_a=a,
        alpha_m=a,
        sigma_v=np.ones(len(sw)),
        n_tokens=np.full(len(sw), N),
        depth=np.full(len(sw), DEPTH),
    )


def point(i, points=POINTS):
    sw, sa, a = points[i]
    return HParams(sigma_w=sw, sigma_a=sa, alpha_a=a, alpha_m=a, n_tokens=N, depth=DEPTH)


@partial(jax.jit, static_argnames=("d", "draw_batch"))
def _kernel(hp, q_star, keys_g, keys_t, *, d, draw_batch):
    opts = dict(n=N, d=d, weights="lazy")
    a, b = jax.vmap(
        lambda h, qs: measure.gradient_draws(paper_block(h), keys_g, qs, depth=DEPTH, draw_batch=draw_batch, **opts)
    )(hp, q_star)
    q, p, _ = jax.vmap(lambda h: measure.transient_draws(paper_block(h), keys_t, Q0, Q0 * RHO0, depth=DEPTH, **opts))(
        hp
    )
    return a, b, p / q


@partial(jax.jit, static_argnames=("d",))
def _angle(hp, q_star, keys, *, d):
    return jax.vmap(lambda h, qs: measure.angle_draws(paper_block(h), keys, qs, eps=EPS, n=N, d=d, weights="lazy"))(
        hp, q_star
    )


def angle_in_batches(hp, q_star, keys, d):
    """lambda_a draws [points, draws], vmapped in batches that fit the memory budget (one
    block per draw: cheap, so it gets many more draws than lambda_g and the transients)."""
    from phasefield import grid

    per_draw = grid.simulation_bytes(d, N, 1, None, 4, len(POINTS), "lazy")
    size = int(max(1, min(len(keys), measure.MEMORY_BUDGET // per_draw)))
    size = -(-len(keys) // -(-len(keys) // size))  # equal batches
    out = [_angle(hp, q_star, keys[i : i + size], d=d) for i in range(0, len(keys), size)]
    return jnp.concatenate(out, axis=1)


def draws_at(d, top, cap):
    return int(min(cap, max(top, round(top * WIDTHS[-1] / d))))


def run(args):
    from phasefield.layers import registry

    paper = registry.lookup("paper").engine.namespace
    parts = os.path.join(args.out, "parts")
    os.makedirs(parts, exist_ok=True)
    hp = hparams()
    q_star = np.array([float(paper.collapsed_fixed_point(point(i))[0]) for i in range(len(POINTS))])
    for d in (int(w) for w in args.widths.split(",")):
        path = os.path.join(parts, f"w{d:06d}.npz")
        if os.path.exists(path):
            print(f"width {d}: done before ({path})", flush=True)
            continue
        m = draws_at(d, args.draws_top, args.draws_max)
        ma = args.angle_factor * m
        key = jax.random.key(args.seed * 100003 + d)
        ka, kg, kt = jax.random.split(key, 3)
        ka, kg, kt = jax.random.split(ka, ma), jax.random.split(kg, m), jax.random.split(kt, m)
        t = time.perf_counter()
        db = measure.batch_size(paper_block(point(0)), N, d, DEPTH, "lazy", m, points=len(POINTS))
        hp32, qs32 = hp.astype(jnp.float32), jnp.asarray(q_star, jnp.float32)
        a, b, rho = (np.asarray(v, np.float64) for v in _kernel(hp32, qs32, kg, kt, d=d, draw_batch=db))
        la = np.asarray(angle_in_batches(hp32, qs32, ka, d), np.float64)
        la_m, la_se = measure.mean_se(la, axis=1)
        lg_m, lg_se = measure.log_ratio_of_means(a, b, scale=1.0 / DEPTH, axis=1)
        rho_m, rho_se = measure.mean_se(rho, axis=1)
        np.savez(
            path + ".tmp.npz",
            width=d,
            draws=m,
            draws_a=ma,
            lambda_a=la_m,
            lambda_a_se=la_se,
            lambda_g=lg_m,
            lambda_g_se=lg_se,
            rho=rho_m,
            rho_se=rho_se,
            seconds=time.perf_counter() - t,
        )
        os.replace(path + ".tmp.npz", path)
        print(
            f"width {d}: {m} draws ({ma} for lambda_a), {time.perf_counter() - t:.1f} s; "
            f"lambda_a se {la_se.max():.4f}, lambda_g se {lg_se.max():.4f}",
            flush=True,
        )


def wls(d, y, se):
    """Fit y = a + b / d with weights 1/se^2: (a, se_a, b, se_b, chi2/dof); standard
    errors multiplied by sqrt(chi2/dof) when that exceeds 1."""
    x = np.stack([np.ones_like(d), 1.0 / d], 1)
    w = 1.0 / np.square(se)
    cov = np.linalg.inv(x.T @ (w[:, None] * x))
    coef = cov @ x.T @ (w * y)
    dof = max(len(y) - 2, 1)
    chi2 = float(np.sum(w * np.square(y - x @ coef))) / dof
    scale = np.sqrt(max(chi2, 1.0))
    return coef[0], scale * np.sqrt(cov[0, 0]), coef[1], scale * np.sqrt(cov[1, 1]), chi2


def load(out):
    parts = os.path.join(out, "parts")
    files = sorted(f for f in os.listdir(parts) if f.endswith(".npz") and ".tmp" not in f)
    rows = [dict(np.load(os.path.join(parts, f))) for f in files]
    return sorted(rows, key=lambda r: int(r["width"]))


def theory_values():
    from phasefield.layers import registry

    paper = registry.lookup("paper").engine.namespace
    out = {}
    for att in ("paper", "exact"):
        vals = []
        for i in range(len(POINTS)):
            hp = point(i).replace(attention=att)
            ex = paper.exponents(hp)
            q, p = (np.asarray(v, float) for v in paper.trajectory(hp, Q0, Q0 * RHO0, DEPTH))
            vals.append((float(ex["lambda_a"]), float(ex["lambda_g_collapse"]), p / q))
        out[att] = vals
    return out


def report(args):
    rows = load(args.out)
    d = np.array([float(r["width"]) for r in rows])
    th = theory_values()
    lines = ["point,sigma_w,sigma_a,alpha,quantity,layer,extrapolated,se,chi2_dof,slope_b,widest,widest_se,paper,exact"]
    table = []
    for i, (sw, sa, a) in enumerate(POINTS):
        quantities = [("lambda_a", None, "lambda_a", 0), ("lambda_g", None, "lambda_g", 1)]
        quantities += [("rho", l, "rho", 2) for l in range(1, DEPTH + 1)]
        for name, layer, key, ti in quantities:
            y = np.array([r[key][i] if layer is None else r[key][i, layer] for r in rows])
            se = np.array([r[key + "_se"][i] if layer is None else r[key + "_se"][i, layer] for r in rows])
            a0, a_se, b, _, chi2 = wls(d, y, se)
            tp, te = (th[m][i][ti] if layer is None else th[m][i][ti][layer] for m in ("paper", "exact"))
            lines.append(
                f"{i},{sw},{sa},{a},{name},{'' if layer is None else layer},{a0:.6f},"
                f"{a_se:.6f},{chi2:.3f},{b:.4f},{y[-1]:.6f},{se[-1]:.6f},{tp:.6f},{te:.6f}"
            )
            table.append(
                dict(
                    i=i,
                    sw=sw,
                    sa=sa,
                    a=a,
                    name=name,
                    layer=layer,
                    value=a0,
                    se=a_se,
                    chi2=chi2,
                    b=b,
                    y=y,
                    yse=se,
                    paper=tp,
                    exact=te,
                )
            )
    with open(os.path.join(args.out, "extrapolated.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # summary: lambda's per point; rho: the layer with the largest |extrapolated - better|
    print(
        f"widths {', '.join(str(int(x)) for x in d)}; draws "
        f"{', '.join(str(int(r['draws'])) for r in rows)} (lambda_a: --angle-factor x)"
    )
    print(
        "| sigma_w | sigma_A | alpha | quantity | d -> inf | se | chi2/dof | paper | exact | "
        "(inf - paper)/se | (inf - exact)/se |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i in range(len(POINTS)):
        sel = [t for t in table if t["i"] == i]
        rho = [t for t in sel if t["name"] == "rho"]
        worst = max(rho, key=lambda t: min(abs(t["value"] - t["paper"]), abs(t["value"] - t["exact"])))
        for t in [s for s in sel if s["name"] != "rho"] + [worst]:
            label = t["name"] if t["layer"] is None else f"rho_{t['layer']} (worst layer)"
            print(
                f"| {t['sw']} | {t['sa']} | {t['a']} | {label} | {t['value']:+.4f} | {t['se']:.4f} | "
                f"{t['chi2']:.2f} | {t['paper']:+.4f} | {t['exact']:+.4f} | "
                f"{(t['value'] - t['paper']) / t['se']:+.1f} | {(t['value'] - t['exact']) / t['se']:+.1f} |"
            )
    if args.figure:
        figure(table, d, args.figure)


def figure(table, d, path):
    """(a, b) lambda_a and lambda_g(16) minus theory against 1/d with the a + b/d fits, one
    colour per (sigma_w, alpha) point (sigma_A does not enter at the collapsed point, so only
    sigma_A = 1 is drawn); (c) the extrapolated rho transients minus the exact-softmax map at
    sigma_A = 3 (solid, with standard errors) and the paper map minus the exact map (dotted)."""
    from phasefield.figures import style

    colours = {}
    with style.context() as plt:
        fig, axes = plt.subplots(1, 3, figsize=(2 * style.COLUMN, 2.0))
        xs = np.linspace(0, 1.05e3 / d.min(), 50)
        for ax, name, lab in zip(axes[:2], ("lambda_a", "lambda_g"), ("a", "b")):
            for t in (t for t in table if t["name"] == name and t["sa"] == 1.0):
                c = colours.setdefault((t["sw"], t["a"]), f"C{len(colours)}")
                ax.errorbar(
                    1e3 / d,
                    t["y"] - t["paper"],
                    yerr=t["yse"],
                    fmt="o",
                    ms=2,
                    lw=0.6,
                    color=c,
                    label=rf"$\sigma_w$={t['sw']:g}, $\alpha$={t['a']:g}",
                )
                ax.plot(xs, t["value"] + t["b"] * xs / 1e3 - t["paper"], color=c, lw=0.6)
            ax.axhline(0, color="k", lw=0.4)
            ax.set_xlabel("1000 / d")
            ax.set_ylabel(style.symbol(name, DEPTH) + " − theory")
            style.panel_label(ax, lab)
        axes[0].legend(loc="lower right", frameon=False, fontsize=5)
        ax = axes[2]
        for i in sorted({t["i"] for t in table}):
            rho = [t for t in table if t["i"] == i and t["name"] == "rho"]
            if rho[0]["sa"] != 3.0:
                continue
            c = colours[(rho[0]["sw"], rho[0]["a"])]
            layers = [t["layer"] for t in rho]
            ax.errorbar(
                layers,
                [t["value"] - t["exact"] for t in rho],
                yerr=[t["se"] for t in rho],
                color=c,
                lw=0.6,
                ms=1.5,
                fmt="o-",
            )
            ax.plot(layers, [t["paper"] - t["exact"] for t in rho], color=c, lw=0.6, ls=":")
        ax.axhline(0, color="k", lw=0.4)
        ax.set_xlabel("layer")
        ax.set_ylabel(r"$\rho_\ell$ − exact map ($\sigma_A$ = 3)")
        style.panel_label(ax, "c")
        ax.text(
            0.98,
            0.04,
            "solid: simulation, d → ∞\ndotted: paper map",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=5,
        )
        fig.tight_layout()
        fig.savefig(path, dpi=style.DPI)
        plt.close(fig)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("run", "report"))
    ap.add_argument("--out", default="docs/data/infinite_width")
    ap.add_argument("--widths", default=",".join(str(w) for w in WIDTHS))
    ap.add_argument("--draws-top", type=int, default=8, help="draws at the widest width")
    ap.add_argument("--draws-max", type=int, default=256)
    ap.add_argument(
        "--angle-factor", type=int, default=32, help="lambda_a draws per lambda_g draw (one block each: cheap)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--figure", default="docs/images/infinite_width.png")
    args = ap.parse_args()
    (run if args.command == "run" else report)(args)


if __name__ == "__main__":
    main()
