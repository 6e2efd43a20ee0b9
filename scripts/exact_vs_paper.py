"""Measurements of the exact-softmax map: paper vs exact-softmax attention map vs finite-width simulation,
the softmax-derivative correction of lambda_g, and the causal full-Gram theory.

    .venv/bin/python scripts/exact_vs_paper.py [--quick] [--out out/exact]

Writes (under --out): theory_paper.nc, theory_exact.nc, sim.nc (grid over sigma_A x sigma_w
x alpha), agreement.md (the `phasefield compare` tables side by side), causal.json and
report.json. Variables of the grids:

    rho_L, q_L       cosine and squared norm after L blocks from (q0, rho0) = (1, .3)
    lambda_a         angle exponent (identical for both maps: attention enters via beta_A^2)
    lambda_g         lambda_g(L) from the collapsed point (identical for both maps)
    lambda_g_rho0    lambda_g(L) from the input (1, .3) (values path; the simulation's full VJP)
    lambda_g_corr    theory only: lambda_g_rho0 with the softmax-path correction
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

import phasefield
from phasefield import HParams
from phasefield.layers import registry
from phasefield.layers.presets import paper as paper_block
from phasefield.simulate import compare, measure
from phasefield.simulate.stack import simplex_tokens, stack_forward
from phasefield.theory import mlp

# this script owns its process: every core a device, float64 for its own jit of the theory
phasefield.use_all_cpu_cores()
paper = registry.lookup("paper").engine.namespace  # the paper engine's own modules
block, gram = paper.block, paper.gram
jax.config.update("jax_enable_x64", True)

Q0, RHO0 = 1.0, 0.3


@partial(jax.jit, static_argnames=("n", "d", "depth"))
def _grad_draws(hp, keys, *, n, d, depth):
    """(|J^T u|^2, |u|^2) per draw from simplex tokens (Q0, RHO0), float32."""
    hp = hp.astype(jnp.float32)

    def one(key):
        kx, kw, ku = jax.random.split(key, 3)
        x = simplex_tokens(kx, n, d, Q0, RHO0 * Q0, jnp.float32, exact=True)
        y, vjp = jax.vjp(lambda x0: stack_forward(paper_block(hp), kw, x0, depth), x)
        u = jax.random.normal(ku, y.shape, jnp.float32)
        (g,) = vjp(u)
        return jnp.sum(g * g), jnp.sum(u * u)

    return jax.lax.map(one, keys)


def theory_point(hp, kern, depth, corrected):
    qs, ps = block.trajectory(hp, Q0, RHO0 * Q0, depth, kern)
    out = dict(
        rho_L=ps[-1] / qs[-1],
        q_L=qs[-1],
        lambda_a=paper.angle_exponent(hp, kern),
        lambda_g=paper.gradient_exponent(hp, None, None, depth, kern),
        lambda_g_rho0=paper.gradient_exponent(hp, Q0, RHO0 * Q0, depth, kern),
    )
    if corrected:
        out["lambda_g_corr"] = paper.gradient_exponent(hp.replace(softmax_correction=True), Q0, RHO0 * Q0, depth, kern)
    return out


def grid(args):
    sig_a, sig_w, alphas = args.sigma_a, args.sigma_w, args.alpha
    n, depth = args.n_tokens, args.depth
    dims = ("sigma_a", "sigma_w", "alpha")
    shape = (len(sig_a), len(sig_w), len(alphas))
    coords = dict(sigma_a=sig_a, sigma_w=sig_w, alpha=alphas)
    th = {m: {} for m in ("paper", "exact")}
    sim = {}
    fns = {}
    keys = jax.random.split(jax.random.key(args.seed), args.seeds)
    t0 = time.time()
    for ia, sa in enumerate(sig_a):
        for iw, sw in enumerate(sig_w):
            for il, al in enumerate(alphas):
                hp = HParams(sigma_w=sw, sigma_a=sa, alpha_a=al, alpha_m=al, n_tokens=n, depth=depth)
                kern = mlp.kernel(hp)
                for mode in ("paper", "exact"):
                    if mode not in fns:
                        fns[mode] = jax.jit(partial(theory_point, depth=depth, corrected=mode == "exact"))
                    res = fns[mode](hp.replace(attention=mode), kern)
                    for k, v in res.items():
                        th[mode].setdefault(k, np.full(shape, np.nan))[ia, iw, il] = float(v)
                sim = dict(n_tokens=n, depth=depth, width=args.width, draws=args.seeds, seed=args.seed)
                tr = measure.transients(paper_block(hp), Q0, RHO0 * Q0, **sim)
                ea = measure.fixed_point_exponents(paper_block(hp), **sim)
                a, b = _grad_draws(hp, keys, n=n, d=args.width, depth=depth)
                lg, lg_se = measure.log_ratio_of_means(np.asarray(a), np.asarray(b), 1.0 / depth)
                vals = dict(
                    rho_L=tr["rho"][-1],
                    rho_L_se=tr["rho_se"][-1],
                    q_L=tr["q"][-1],
                    q_L_se=tr["q_se"][-1],
                    lambda_a=ea["lambda_a"],
                    lambda_a_se=ea["lambda_a_se"],
                    lambda_g=ea["lambda_g_collapse"],
                    lambda_g_se=ea["lambda_g_collapse_se"],
                    lambda_g_rho0=lg,
                    lambda_g_rho0_se=lg_se,
                )
                for k, v in vals.items():
                    sim.setdefault(k, np.full(shape, np.nan))[ia, iw, il] = float(v)
                print(
                    f"sa={sa} sw={sw} a={al}: rho_L paper {th['paper']['rho_L'][ia, iw, il]:.3f} "
                    f"exact {th['exact']['rho_L'][ia, iw, il]:.3f} sim {vals['rho_L']:.3f} | "
                    f"lg0 paper {th['paper']['lambda_g_rho0'][ia, iw, il]:+.3f} exact "
                    f"{th['exact']['lambda_g_rho0'][ia, iw, il]:+.3f} corr "
                    f"{th['exact']['lambda_g_corr'][ia, iw, il]:+.3f} sim {lg:+.3f}  "
                    f"[{time.time() - t0:.0f}s]",
                    flush=True,
                )

    def ds(d):
        return xr.Dataset({k: (dims, v) for k, v in d.items()}, coords=coords)

    return ds(th["paper"]), ds(th["exact"]), ds(sim)


QUANTS = ("rho_L", "q_L", "lambda_a", "lambda_g", "lambda_g_rho0")


def tables(paper, exact_, sim, out):
    lines = []
    for label, sel in (("all sigma_A", {}), ("sigma_A >= 2", {"sigma_a": [s for s in paper.sigma_a.values if s >= 2]})):
        p, e, s = (d.sel(sel) if sel else d for d in (paper, exact_, sim))
        rows_p = compare.agreement(p, s, QUANTS)
        rows_e = compare.agreement(e, s, QUANTS)
        ec = e.copy()
        ec["lambda_g_rho0"] = e["lambda_g_corr"]
        rows_c = compare.agreement(ec, s, ["lambda_g_rho0"])
        lines.append(f"\n### {label}: |sim - theory| (paper map | exact map)\n")
        lines.append(
            "| quantity | phase | points | paper median | paper p90 | paper max | exact median "
            "| exact p90 | exact max | exact/paper (median) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for rp, re_ in zip(rows_p, rows_e):
            if rp["points"] == 0:
                continue
            ratio = re_["median"] / rp["median"] if rp["median"] > 0 else float("nan")
            lines.append(
                f"| {rp['quantity']} | {rp['phase']} | {rp['points']} | {rp['median']:.4f} | "
                f"{rp['p90']:.4f} | {rp['max']:.4f} | {re_['median']:.4f} | {re_['p90']:.4f} | "
                f"{re_['max']:.4f} | {ratio:.2f} |"
            )
        lines.append(f"\n{label}: lambda_g_rho0 with the softmax correction (exact map + correction)\n")
        lines.append(compare.format_markdown(rows_c))
    text = "\n".join(lines)
    with open(os.path.join(out, "agreement.md"), "w") as f:
        f.write(text + "\n")
    return text


def causal(args):
    """Per-position cosines and norms after 12 blocks (n=16, width 512) against the causal
    full-Gram theory in both modes, and the causal exponents."""
    res = []
    n, depth, seeds = 16, 12, args.causal_seeds
    iu = np.triu_indices(n, 1)
    for sa in args.causal_sigma_a:
        for sw in (1.0, 2.0):
            hp = HParams(sigma_w=sw, sigma_a=sa, alpha_a=0.5, alpha_m=0.7, n_tokens=n, depth=depth)
            sim = measure.token_geometry(
                paper_block(hp),
                Q0,
                RHO0 * Q0,
                n_tokens=n,
                width=args.width,
                draws=seeds,
                depth=depth,
                causal=True,
                seed=args.seed,
            )
            cs = sim["cosines"].reshape(depth + 1, seeds, -1)[-1]
            c_mean, c_se = cs.mean(0), cs.std(0, ddof=1) / np.sqrt(seeds)
            nm = sim["norms"].reshape(depth + 1, seeds, n)[-1].mean(0)
            row = dict(
                sigma_a=sa,
                sigma_w=sw,
                seeds=seeds,
                cos_se_median=float(np.median(c_se)),
                cos_first_pair_sim=float(c_mean[0]),
                cos_last_pair_sim=float(c_mean[-1]),
            )
            for mode in ("paper", "exact"):
                geo = gram.causal_geometry(hp.replace(attention=mode), Q0, RHO0, depth)
                th = np.asarray(geo["cosines"])[-1][iu]
                err = np.abs(c_mean - th)
                z = err / c_se
                th_n = np.asarray(geo["norms"])[-1]
                row.update(
                    {
                        f"{mode}_cos_err_max": float(err.max()),
                        f"{mode}_cos_err_mean": float(err.mean()),
                        f"{mode}_cos_z_max": float(z.max()),
                        f"{mode}_cos_z_rms": float(np.sqrt(np.mean(z * z))),
                        f"{mode}_norm_relerr_max": float(np.max(np.abs(nm - th_n) / th_n)),
                        f"{mode}_cos_first_pair": float(th[0]),
                        f"{mode}_cos_last_pair": float(th[-1]),
                    }
                )
            # the non-causal (q, p) engine, for contrast
            qs, ps = block.trajectory(hp, Q0, RHO0 * Q0, depth)
            row["noncausal_cos_err_max"] = float(np.abs(c_mean - float(ps[-1] / qs[-1])).max())
            hpe = hp.replace(depth=16, n_tokens=16)
            th = gram.causal_exponents(hpe)
            se = measure.fixed_point_exponents(
                paper_block(hpe), n_tokens=16, depth=16, width=args.width, draws=args.seeds, causal=True, seed=args.seed
            )
            row.update(
                lambda_a_theory=float(th["lambda_a"]),
                lambda_a_spectral=float(th["lambda_a_spectral"]),
                lambda_a_sim=se["lambda_a"],
                lambda_a_se=se["lambda_a_se"],
                lambda_g_theory=float(th["lambda_g_collapse"]),
                lambda_g_sim=se["lambda_g_collapse"],
                lambda_g_se=se["lambda_g_collapse_se"],
                lambda_a_noncausal=float(paper.angle_exponent(hpe)),
                lambda_g_noncausal=float(paper.gradient_exponent(hpe, num_layers=16)),
            )
            print(json.dumps(row), flush=True)
            res.append(row)
    with open(os.path.join(args.out, "causal.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/exact")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--causal-seeds",
        type=int,
        default=64,
        help="draws for the per-position cosines (120 pairs: the max needs small se)",
    )
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-causal", action="store_true")
    ap.add_argument("--sigma-w", default="1,2,3", help="comma-separated sigma_w values")
    ap.add_argument("--alpha", default="0.5,0.8", help="comma-separated alpha_A = alpha_M values")
    args = ap.parse_args()
    args.n_tokens, args.depth = 32, 16
    args.sigma_a = [0.5, 1.0, 2.0, 3.0, 4.0]
    args.sigma_w = [float(v) for v in args.sigma_w.split(",")]
    args.alpha = [float(v) for v in args.alpha.split(",")]
    args.causal_sigma_a = [0.5, 1.0, 1.5]
    if args.quick:
        args.sigma_a, args.sigma_w, args.alpha, args.width, args.seeds = [1.0, 3.0], [2.0], [0.5], 128, 2
        args.causal_sigma_a, args.causal_seeds = [1.0], 8
    os.makedirs(args.out, exist_ok=True)
    if not args.skip_grid:
        paper, exact_, sim = grid(args)
        for name, d in (("theory_paper", paper), ("theory_exact", exact_), ("sim", sim)):
            d.attrs.update(width=args.width, seeds=args.seeds, n_tokens=args.n_tokens, depth=args.depth)
            d.to_netcdf(os.path.join(args.out, f"{name}.nc"), engine="h5netcdf")
        print(tables(paper, exact_, sim, args.out))
    if not args.skip_causal:
        causal(args)


if __name__ == "__main__":
    main()
