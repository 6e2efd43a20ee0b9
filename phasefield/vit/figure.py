"""Figures of a trainability analysis (matplotlib, Agg backend).

fig7       the paper's Fig. 7 with seed error bars, colored by depth: seed-mean loss against
           lambda_a and lambda_g (collapsed point), and cross-validated prediction of the
           best exponent model against measurement
plane      the seed-mean loss over the (lambda_a, lambda_g) plane, one panel per depth
transfer   the transfer tests: RMSE of every model on the held-out region against its noise floor
shipped    the seed-mean loss against the effective depth L (alpha_A^2 + alpha_M^2), and the
           shipped model's cross-validated predictions (configurations held out marked)
failure_slice  P(fails to train) of a model document over (sigma_w, alpha_M) at L = 16, the
           other two at mid-box and at the corner alpha_A = 0.95, sigma_A = 4, with the
           measured failure fraction of every L = 16 configuration marked
"""

from __future__ import annotations

import numpy as np

DEPTH_COLORS = {4: "tab:purple", 8: "tab:green", 16: "tab:blue", 32: "tab:red"}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def depth_color(L):
    return DEPTH_COLORS.get(int(L), "tab:gray")


def fig7(report: dict, path: str, dpi: int = 150, dataset: str = "digits") -> None:
    plt = pyplot()
    t = report["table"]
    y = np.asarray(t["loss"])
    se = np.sqrt(np.asarray(t["loss_var"]) / np.asarray(t["n_seeds"]))
    L = np.asarray(t["depth"])
    best = report["best_exponent_model"]
    oof = np.asarray(report["models"][best]["oof"])
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.2))
    for ax, key, name in ((axes[0], "lambda_a", r"$\lambda_a$"), (axes[1], "lambda_g_collapse", r"$\lambda_g(L)$")):
        x = np.asarray(t[key])
        for d in sorted(set(L.tolist())):
            m = L == d
            ax.errorbar(
                x[m],
                y[m],
                yerr=se[m],
                fmt="o",
                ms=4,
                color=depth_color(d),
                ecolor=depth_color(d),
                elinewidth=0.8,
                capsize=1.5,
                label=f"L = {int(d)}",
            )
        ax.axvline(0.0, color="0.6", lw=0.8, ls="--")
        ax.axhline(report["L_sat"], color="0.6", lw=0.8, ls=":")
        ax.set_xlabel(name + " (collapsed point)")
        ax.set_ylabel("test loss (seed mean ± se)")
        ax.legend(fontsize=8, frameon=False)
    ax = axes[2]
    for d in sorted(set(L.tolist())):
        m = L == d
        ax.errorbar(
            y[m], oof[m], xerr=se[m], fmt="o", ms=4, color=depth_color(d), elinewidth=0.8, label=f"L = {int(d)}"
        )
    lo, hi = float(min(y.min(), oof.min())), float(max(y.max(), oof.max()))
    ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8)
    mm = report["models"][best]
    ax.set_title(
        f"{best}: CV RMSE {mm['cv_rmse']:.3f} (floor {report['noise_floor']['rmse']:.3f}), CV $R^2$ {mm['cv_r2']:.2f}",
        fontsize=9,
    )
    ax.set_xlabel("measured test loss (seed mean)")
    ax.set_ylabel("cross-validated prediction")
    seeds = report.get("seeds") or int(np.median(np.asarray(report["table"]["n_seeds"])))
    fig.suptitle(f"{dataset} ViT, {report['n_configs']} configurations x {seeds} seed{'s' * (seeds != 1)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plane(report: dict, path: str, dpi: int = 150) -> None:
    plt = pyplot()
    t = report["table"]
    y, L = np.asarray(t["loss"]), np.asarray(t["depth"])
    depths = sorted(set(L.tolist()))
    fig, axes = plt.subplots(1, len(depths), figsize=(4.4 * len(depths), 3.9), squeeze=False)
    for ax, d in zip(axes[0], depths):
        m = L == d
        sc = ax.scatter(
            np.asarray(t["lambda_a"])[m],
            np.asarray(t["lambda_g_collapse"])[m],
            c=y[m],
            cmap="viridis",
            vmin=float(y.min()),
            vmax=float(min(y.max(), report["L_sat"])),
            s=40,
            edgecolor="k",
            linewidth=0.3,
        )
        ax.axvline(0, color="0.6", lw=0.8, ls="--")
        ax.axhline(0, color="0.6", lw=0.8, ls="--")
        ax.set_xlabel(r"$\lambda_a$")
        ax.set_ylabel(r"$\lambda_g(L)$")
        ax.set_title(f"L = {int(d)}", fontsize=10)
        fig.colorbar(sc, ax=ax, label="test loss (seed mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


GROUP_COLORS = {"exponents": "tab:blue", "raw": "tab:orange", "hybrid": "tab:green"}


def transfer(report: dict, path: str, dpi: int = 150, top: int | None = None) -> None:
    """Held-out RMSE of every model (or the ``top`` best) on each transfer split."""
    plt = pyplot()
    from matplotlib.patches import Patch

    splits = list(report["transfer"])
    if not splits:
        return
    n_bars = max(sum(not m.startswith("_") for m in report["transfer"][s]) for s in splits)
    n_bars = n_bars if top is None else min(top, n_bars)
    fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 1.6 + 0.22 * n_bars), squeeze=False)
    for ax, s in zip(axes[0], splits):
        t = report["transfer"][s]
        items = sorted(
            ((m, d["rmse"]) for m, d in t.items() if not m.startswith("_") and np.isfinite(d["rmse"])),
            key=lambda kv: kv[1],
        )[:top]
        names = [m for m, _ in items]
        colors = [GROUP_COLORS.get(report["models"][m]["group"], "tab:gray") for m in names]
        vals = np.array([v for _, v in items])
        ax.barh(range(len(items)), vals, color=colors)
        if len(vals) > 1 and vals[-1] > 1.5 * vals[-2]:  # an outlier would squash the rest: clip it
            xmax = 1.25 * vals[-2]
            ax.set_xlim(0, xmax)
            for i in np.nonzero(vals > xmax)[0]:
                ax.text(0.98 * xmax, i, f"{vals[i]:.2f} →", ha="right", va="center", fontsize=7, color="w")
        ax.set_yticks(range(len(items)), names, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(t["_noise_floor"]["rmse"], color="k", lw=1, ls="--", label="noise floor")
        n = next(iter(v for k, v in t.items() if not k.startswith("_")))
        ax.set_title(f"{s}: train {n['n_train']}, test {n['n_test']} configurations", fontsize=9)
        ax.set_xlabel("RMSE on the held-out configurations")
        floor = ax.get_legend_handles_labels()[0]
        ax.legend(
            floor + [Patch(color=c) for c in GROUP_COLORS.values()],
            ["noise floor", "exponents only", "raw hyperparameters", "both (hybrid)"],
            fontsize=8,
            frameon=False,
            loc="upper right",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def shipped(report: dict, path: str, dpi: int = 150, held_out=None) -> None:
    """Left: seed-mean loss (± se) against the effective depth, by depth. Right: the shipped
    model's out-of-fold predictions against measurement; ``held_out`` (config ids) are the
    configurations trained after the candidate families were fixed (open markers)."""
    plt = pyplot()
    t = report["table"]
    y = np.asarray(t["loss"])
    se = np.sqrt(np.asarray(t["loss_var"]) / np.asarray(t["n_seeds"]))
    L, eff = np.asarray(t["depth"]), np.asarray(t["effective_depth"])
    best = report["best_model"]
    oof = np.asarray(report["models"][best]["oof"])
    new = np.array([c in set(held_out or ()) for c in t["config"]])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for d in sorted(set(L.tolist())):
        m = L == d
        for ax, x, xe, yy, ye in ((axes[0], eff, None, y, se), (axes[1], y, se, oof, None)):
            for sel, face in ((m & ~new, depth_color(d)), (m & new, "none")):
                if sel.any():
                    ax.errorbar(
                        x[sel],
                        yy[sel],
                        xerr=None if xe is None else xe[sel],
                        yerr=None if ye is None else ye[sel],
                        fmt="o",
                        ms=4,
                        mfc=face,
                        color=depth_color(d),
                        elinewidth=0.8,
                        capsize=1.5,
                        label=f"L = {int(d)}" if face != "none" else None,
                    )
    axes[0].axhline(report["L_sat"], color="0.6", lw=0.8, ls=":")
    axes[0].set_xlabel(r"effective depth $L(\alpha_A^2 + \alpha_M^2)$")
    axes[0].set_ylabel("test loss (seed mean ± se)")
    axes[0].legend(fontsize=8, frameon=False)
    lo, hi = float(min(y.min(), oof.min())), float(max(y.max(), oof.max()))
    axes[1].plot([lo, hi], [lo, hi], color="0.4", lw=0.8)
    mm = report["models"][best]
    axes[1].set_title(
        f"shipped {best} ({mm['group']}): CV RMSE {mm['cv_rmse']:.3f}, CV $R^2$ {mm['cv_r2']:.2f}"
        + (
            f"\nopen markers: {int(new.sum())} configurations trained after the families were fixed"
            if new.any()
            else ""
        ),
        fontsize=9,
    )
    axes[1].set_xlabel("measured test loss (seed mean)")
    axes[1].set_ylabel("cross-validated prediction")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def failure_slice(doc: dict, tab: dict, path: str, dpi: int = 150, held_out: dict | None = None) -> None:
    """P(fail) of ``doc`` over sigma_w x alpha_M at L = 16 in two panels (sigma_A, alpha_A at
    the box's middle; at sigma_A = 4, alpha_A = 0.95), contours at 0.1 and 0.5; the measured
    failure fraction of the L = 16 configurations of ``tab`` (all sigma_A, alpha_A: a
    projection) as circles, and of ``held_out`` ({sigma_w, alpha_m, frac} arrays) as squares."""
    from .predict import predict

    plt = pyplot()
    sw, am = np.meshgrid(np.linspace(0.3, 3.0, 46), np.linspace(0.05, 0.95, 46))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    L = np.asarray(tab["depth"])
    m = L == 16
    frac = np.array([np.mean(r) for r in tab["run_failed"]])
    for ax, (sa, aa) in zip(axes, ((2.15, 0.5), (4.0, 0.95))):
        res = predict(sw.ravel(), sa, aa, am.ravel(), 16, doc)
        p = np.array([r["p_fail"] for r in res]).reshape(sw.shape)
        im = ax.pcolormesh(sw, am, p, vmin=0, vmax=1, cmap="magma_r", shading="auto")
        cs = ax.contour(sw, am, p, levels=[0.1, 0.5], colors=["tab:cyan", "white"], linewidths=1.2)
        ax.clabel(cs, fmt="%.1f", fontsize=8)
        ax.scatter(
            np.asarray(tab["sigma_w"])[m],
            np.asarray(tab["alpha_m"])[m],
            c=frac[m],
            vmin=0,
            vmax=1,
            cmap="magma_r",
            edgecolors="tab:green",
            s=36,
            linewidths=1.0,
            label="trained (L = 16; fraction failed)",
        )
        if held_out is not None:
            ax.scatter(
                held_out["sigma_w"],
                held_out["alpha_m"],
                c=held_out["frac"],
                vmin=0,
                vmax=1,
                cmap="magma_r",
                marker="s",
                edgecolors="tab:blue",
                s=40,
                linewidths=1.0,
                label="held out (edges)",
            )
        ax.set_xlabel(r"$\sigma_w$")
        ax.set_title(rf"P(fail), L = 16, $\sigma_A$ = {sa:g}, $\alpha_A$ = {aa:g}", fontsize=10)
    axes[0].set_ylabel(r"$\alpha_M$")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.colorbar(im, ax=axes, label="P(fails to train)")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
