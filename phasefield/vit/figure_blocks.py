"""Figures of the standard blocks' loss predictors (matplotlib, Agg backend).

predicted_vs_measured  per block: the shipped model's cross-validated (out-of-fold) prediction
           of each configuration against its measured seed-mean loss (seed standard errors),
           colored by depth, with the model's conformal interval for one run's loss as a band
block_failure_slice    P(fails to train) of a block's model over (sigma, alpha) with
           alpha_attn = alpha_mlp = alpha, one panel per depth, and the measured failure
           fraction of each trained configuration of that depth at (sigma, the root mean
           square of its two alphas: the same effective depth L (alpha_attn^2 + alpha_mlp^2))
"""

from __future__ import annotations

import numpy as np

from .figure import depth_color, pyplot


def predicted_vs_measured(reports: dict, path: str, dpi: int = 150) -> None:
    """``reports``: {block: (analysis report, model document)}."""
    from .analysis import interval_bounds

    plt = pyplot()
    fig, axes = plt.subplots(1, len(reports), figsize=(5.2 * len(reports), 4.6), squeeze=False)
    for ax, (block, (rep, doc)) in zip(axes[0], reports.items()):
        tab = rep["table"]
        y = np.asarray(tab["loss"])
        se = np.sqrt(np.asarray(tab["loss_var"], float) / np.asarray(tab["n_seeds"], float))
        p = np.asarray(rep["models"][doc["name"]]["oof"])
        lo_ax, hi_ax = 0.0, max(float(y.max()), float(p.max())) * 1.05
        grid = np.linspace(max(0.0, float(p.min()) * 0.9), float(p.max()) * 1.02, 200)
        lo, hi = interval_bounds(doc["interval"], grid)
        ax.fill_between(grid, lo, hi, color="0.85", label=f"{100 * doc['interval']['level']:.0f} % interval (one run)")
        ax.plot([lo_ax, hi_ax], [lo_ax, hi_ax], color="0.4", lw=0.8)
        for L in sorted(set(np.asarray(tab["depth"]).astype(int).tolist())):
            m = np.asarray(tab["depth"]) == L
            ax.errorbar(p[m], y[m], yerr=se[m], fmt="o", ms=3.5, color=depth_color(L), elinewidth=0.7, label=f"L = {L}")
        nest = rep.get("nested") or {}
        ax.set_title(
            f"{block}: {doc['name']} (CV R$^2$ {rep['models'][doc['name']]['cv_r2']:.2f}, nested "
            f"{nest.get('r2', float('nan')):.2f})",
            fontsize=9,
        )
        ax.set_xlabel("predicted loss (out of fold)")
        ax.set_ylabel("measured test loss (seed mean)")
        ax.set_xlim(lo_ax, hi_ax)
        ax.set_ylim(lo_ax, hi_ax)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def block_failure_slice(
    doc: dict, tab: dict, path: str, depths=(16, 32), n: int = 21, dpi: int = 150, held_out: dict | None = None
) -> None:
    """P(fail) of ``doc`` over sigma x alpha (alpha_attn = alpha_mlp = alpha) at each of
    ``depths`` (an n x n grid over the fitted box), contours at 0.1 and 0.5, the measured failure
    fraction of ``tab``'s configurations of that depth as circles at (sigma, rms alpha) and of
    ``held_out`` (a configuration table of another set) as squares."""
    from .predict import predict

    plt = pyplot()
    (s0, s1), (a0, a1) = doc["region"]["sigma_w"], doc["region"]["alpha_a"]
    sw, al = np.meshgrid(np.linspace(s0, s1, n), np.linspace(a0, a1, n))
    fig, axes = plt.subplots(1, len(depths), figsize=(5.3 * len(depths), 4.3), sharey=True, squeeze=False)
    rms = lambda t: np.sqrt((np.asarray(t["alpha_a"]) ** 2 + np.asarray(t["alpha_m"]) ** 2) / 2)
    im = None
    for ax, L in zip(axes[0], depths):
        res = predict(sw.ravel(), 1.0, al.ravel(), al.ravel(), L, doc)
        p = np.array([r["p_fail"] for r in res]).reshape(sw.shape)
        im = ax.pcolormesh(sw, al, p, vmin=0, vmax=1, cmap="magma_r", shading="auto")
        if p.min() < 0.5 < p.max() or p.min() < 0.1 < p.max():
            cs = ax.contour(sw, al, p, levels=[0.1, 0.5], colors=["tab:cyan", "white"], linewidths=1.2)
            ax.clabel(cs, fmt="%.1f", fontsize=8)
        for t, marker, edge, label in ((tab, "o", "tab:green", "trained"), (held_out, "s", "tab:blue", "held out")):
            if t is None:
                continue
            m = np.asarray(t["depth"]) == L
            frac = np.array([np.mean(r) for r in t["run_failed"]])
            ax.scatter(
                np.asarray(t["sigma_w"])[m],
                rms(t)[m],
                c=frac[m],
                vmin=0,
                vmax=1,
                cmap="magma_r",
                marker=marker,
                edgecolors=edge,
                s=36,
                linewidths=1.0,
                label=f"{label} (fraction failed)",
            )
        ax.set_xlabel(r"$\sigma$")
        ax.set_title(
            rf"{doc.get('block', '')}: P(fail), L = {L}, $\alpha_{{attn}} = \alpha_{{mlp}} = \alpha$", fontsize=10
        )
    axes[0][0].set_ylabel(r"$\alpha$ (measured: rms of $\alpha_{attn}$, $\alpha_{mlp}$)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.colorbar(im, ax=axes[0].tolist(), label="P(fails to train)")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
