"""The seed paper's Figs. 2–6 and the phase diagram, drawn from saved datasets
(:mod:`phasefield.figures.files`). Every function takes datasets, writes
``out_dir/<name>.png`` and ``.pdf`` and returns the paths; nothing here computes theory
or simulations."""

from __future__ import annotations

import numpy as np

from . import phase, style
from .style import symbol

PHASE_COLORS = ("#9ecae1", "#cbb8e0", "#a1d99b", "#fdae6b")  # codes 0..3 of phase.PHASES


# ------------------------------------------------------------------ helpers
def _fixed(ds, names):
    """'σ_A = 1, n = 32' from a grid's scalar coordinates (the sweeps' convention) or a
    figure dataset's attributes."""
    parts = []
    for n in names:
        v = None
        if n in ds.coords and ds[n].size == 1:
            v = float(ds[n].values)
        elif n in ds.attrs and np.ndim(ds.attrs[n]) == 0:
            try:
                v = float(ds.attrs[n])
            except (TypeError, ValueError):
                v = None
        if v is not None:
            parts.append(f"{symbol(n)} = {v:g}")
    return ", ".join(parts)


def _depth(ds, default=None):
    if "depth" in ds.coords and ds["depth"].size == 1:
        return int(ds["depth"].values)
    try:
        return int(float(ds.attrs["depth"]))
    except (KeyError, TypeError, ValueError):
        return default


def _heat(ax, da, x, y, norm, cmap=style.CMAP):
    z = phase.slice2d(da.to_dataset(name="v"), x, y, "v")
    return ax.pcolormesh(z[x].values, z[y].values, z.values, norm=norm, cmap=cmap, shading="nearest", rasterized=True)


def _zero(ax, da, x, y, **kw):
    z = phase.slice2d(da.to_dataset(name="v"), x, y, "v")
    vals = np.asarray(z.values, float)
    fin = vals[np.isfinite(vals)]
    if fin.size == 0 or fin.min() >= 0 or fin.max() <= 0 or min(z.shape) < 2:
        return None
    return ax.contour(z[x].values, z[y].values, vals, levels=[0.0], **kw)


def _sim_label(ds):
    w, s = ds.attrs.get("width"), ds.attrs.get("seeds")
    return f"simulation (d = {int(w)}, {int(s)} draws)" if w and s else "simulation"


def _err_text(th, si, var, x, y):
    try:
        from .agreement import theory_at

        t, _ = theory_at(th, si)
        a = phase.slice2d(si, x, y, var).values
        b = phase.slice2d(t, x, y, var).values
        e = np.abs(a - b)[np.isfinite(a - b)]
        if e.size:
            return f"|Δ| median {np.median(e):.3f}, max {e.max():.3f}"
    except Exception:
        return None
    return None


# ------------------------------------------------------------------ Figs. 4 and 5
def fig_exponent(var: str, theory: dict, sim: dict, out_dir: str, name: str):
    """λ (``var``) theory beside simulation on the (α, σ_w) and (σ_A, α) slices, with the
    λ = 0 contours (theory solid, simulation dashed)."""
    rows = [r for r in ("alpha_sigma_w", "sigma_a_alpha") if r in theory or r in sim]
    if not rows:
        return []
    has_sim = any(r in sim for r in rows)
    ncols = 2 if has_sim else 1
    depth = None
    for r in rows:
        depth = depth or _depth(theory.get(r, sim.get(r)))
    label = symbol(var, depth)
    with style.context() as plt:
        fig, axes = plt.subplots(
            len(rows), ncols, figsize=(style.COLUMN, 1.65 * len(rows) + 0.35), squeeze=False, constrained_layout=True
        )
        for i, r in enumerate(rows):
            x, y = {"alpha_sigma_w": ("alpha", "sigma_w"), "sigma_a_alpha": ("sigma_a", "alpha")}[r]
            th, si = theory.get(r), sim.get(r)
            vals = [d[var].values for d in (th, si) if d is not None and var in d]
            norm = style.diverging_norm(*vals, clip_percentile=99)
            mappable = None
            ax = axes[i, 0]
            if th is not None and var in th:
                mappable = _heat(ax, th[var], x, y, norm)
                _zero(ax, th[var], x, y, colors="k", linewidths=1.0)
                fixed = _fixed(th, ("sigma_a",) if r == "alpha_sigma_w" else ("sigma_w",))
                if i == 0:
                    ax.set_title("theory")
                if fixed:
                    style.panel_label(ax, fixed)
            else:
                ax.text(0.5, 0.5, "no theory grid", ha="center", va="center", transform=ax.transAxes)
            if ncols == 2:
                ax2 = axes[i, 1]
                if si is not None and var in si:
                    m2 = _heat(ax2, si[var], x, y, norm)
                    mappable = mappable if mappable is not None else m2
                    _zero(ax2, si[var], x, y, colors="k", linewidths=1.0, linestyles="--")
                    if th is not None:
                        _zero(ax2, th[var], x, y, colors="0.35", linewidths=0.6)
                        txt = _err_text(th, si, var, x, y)
                        if txt:
                            ax2.text(
                                0.5,
                                0.02,
                                txt,
                                transform=ax2.transAxes,
                                ha="center",
                                va="bottom",
                                fontsize=5.5,
                                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8),
                            )
                    if i == 0:
                        ax2.set_title(_sim_label(si))
                else:
                    ax2.text(0.5, 0.5, "no simulation", ha="center", va="center", transform=ax2.transAxes)
                ax2.set_xlabel(symbol(x))
                ax2.tick_params(labelleft=False)
                if th is not None:
                    ax2.set_xlim(ax.get_xlim())
                    ax2.set_ylim(ax.get_ylim())
            ax.set_xlabel(symbol(x))
            ax.set_ylabel(symbol(y))
            if mappable is not None:
                cb = fig.colorbar(
                    mappable, ax=list(axes[i]), shrink=0.95, pad=0.02, aspect=15, extend=style.extend(norm, *vals)
                )
                cb.set_label(label)
                cb.ax.axhline(0.0, color="k", lw=0.6)
        what = {"lambda_a": "angle exponent", "lambda_g_collapse": "gradient exponent"}.get(var, var)
        fig.suptitle(f"{what} {label}")
        from matplotlib.lines import Line2D

        h = [Line2D([], [], color="k", lw=1.0, label=f"theory {label} = 0")]
        if ncols == 2:
            h += [
                Line2D([], [], color="k", lw=1.0, ls="--", label="simulation = 0"),
                Line2D([], [], color="0.35", lw=0.6, label="theory (on sim. panel)"),
            ]
        fig.legend(handles=h, loc="outside lower center", ncol=3, frameon=False, handlelength=1.8, columnspacing=0.8)
        return style.save(fig, out_dir, name)


# ------------------------------------------------------------------ phase diagram
def phase_diagram(theory_ds, out_dir: str, name: str = "phase_diagram", gradient: str = "lambda_g_collapse"):
    """The four phases of the (α, σ_w) slice, both zero contours and the point where
    both exponents vanish (the recommended initialization)."""
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    x, y = "alpha", "sigma_w"
    codes = phase.slice2d(phase.classify(theory_ds, gradient=gradient).to_dataset(name="p"), x, y, "p")
    cp = phase.critical_point(theory_ds, x, y, gradient=gradient)
    depth = _depth(theory_ds)
    glabel = symbol(gradient, depth)
    with style.context() as plt:
        fig, ax = plt.subplots(figsize=(style.COLUMN, 3.3), constrained_layout=True)
        cmap = ListedColormap(PHASE_COLORS).with_extremes(under="white")
        z = np.ma.masked_less(codes.values.astype(float), 0)
        ax.pcolormesh(
            codes[x].values,
            codes[y].values,
            z,
            cmap=cmap,
            norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 3.5], 4),
            shading="nearest",
            rasterized=True,
        )
        _zero(ax, theory_ds["lambda_a"], x, y, colors="k", linewidths=1.3)
        _zero(ax, theory_ds[gradient], x, y, colors="k", linewidths=1.1, linestyles="--")
        bi = phase.bistable(theory_ds, x, y)
        if bi is not None:  # coexistence of two attractors: hatched cells
            _hatch_cells(ax, bi[x].values, bi[y].values, bi.values)
        present = set(np.unique(codes.values).tolist())
        handles = [
            Patch(facecolor=c, edgecolor="0.5", lw=0.3, label=phase.PHASES[k] + ("" if k in present else " (absent)"))
            for k, c in enumerate(PHASE_COLORS)
        ]
        handles += [
            Line2D([], [], color="k", lw=1.3, label=r"$\lambda_a = 0$ (edge of chaos)"),
            Line2D([], [], color="k", lw=1.1, ls="--", label=f"{glabel} = 0"),
        ]
        if bi is not None:
            handles.append(
                Patch(
                    facecolor="none",
                    edgecolor="k",
                    hatch="////",
                    lw=0.3,
                    label=r"bistable: two attractors ($\rho^*$ from $\rho_0 = 1/2$)",
                )
            )
        if cp is not None:
            ax.plot(cp[x], cp[y], marker="*", ms=11, mfc="gold", mec="k", mew=0.7, clip_on=False, zorder=5, ls="none")
            if cp["kind"] == "crossing":
                star = r"$\lambda_a = \lambda_g = 0$: recommended init."
                note = f"{symbol(x)} = {cp[x]:.2f}, {symbol(y)} = {cp[y]:.2f}"
            else:
                star = r"$\lambda_a \approx \lambda_g \approx 0$: recommended init."
                if cp.get("at_edge") and cp[x] <= codes[x].values.min() + 1e-9:
                    note = f"the contours meet only as {symbol(x)}" + r"$\to 0$" + f", at {symbol(y)} ≈ {cp[y]:.2f}"
                else:
                    note = (
                        f"closest approach: {symbol(x)} = {cp[x]:.2f}, {symbol(y)} = {cp[y]:.2f}\n"
                        f"({glabel} = {cp[gradient]:+.3f} there)"
                    )
            handles.append(Line2D([], [], marker="*", ms=9, mfc="gold", mec="k", mew=0.6, ls="none", label=star))
            xr_ = codes[x].values
            ax.annotate(
                note,
                xy=(cp[x], cp[y]),
                xytext=(0.5 * (xr_.min() + xr_.max()), cp[y] + 0.12 * np.ptp(codes[y].values)),
                fontsize=6,
                ha="center",
                va="bottom",
                arrowprops=dict(arrowstyle="->", lw=0.6, color="k"),
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="0.6", lw=0.4, alpha=0.9),
            )
        ax.set_xlabel(symbol(x) + r"  ($\alpha_A = \alpha_M$)")
        ax.set_ylabel(symbol(y))
        fixed = _fixed(theory_ds, ("sigma_a", "n_tokens", "depth"))
        ax.set_title(f"phase diagram ({fixed})" if fixed else "phase diagram")
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncol=2,
            frameon=False,
            handlelength=1.6,
            columnspacing=1.0,
        )
        return style.save(fig, out_dir, name)


def _hatch_cells(ax, xs, ys, mask):
    """Hatch the region where mask is True (one filled contour; per-cell rectangles on a grid
    too small for contouring)."""
    from matplotlib.patches import Rectangle

    m = np.asarray(mask, float)
    if m.shape[0] >= 2 and m.shape[1] >= 2:
        ax.contourf(
            np.asarray(xs, float),
            np.asarray(ys, float),
            m,
            levels=[0.5, 1.5],
            colors="none",
            hatches=["////"],
            zorder=3,
        )
        return

    def edges(v):
        v = np.asarray(v, float)
        if v.size == 1:
            return np.array([v[0] - 0.5, v[0] + 0.5])
        mid = 0.5 * (v[1:] + v[:-1])
        return np.concatenate([[2 * v[0] - mid[0]], mid, [2 * v[-1] - mid[-1]]])

    ex, ey = edges(xs), edges(ys)
    for j, i in zip(*np.nonzero(np.asarray(mask))):
        x0, x1 = sorted((ex[i], ex[i + 1]))
        y0, y1 = sorted((ey[j], ey[j + 1]))
        ax.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, facecolor="none", edgecolor="k", hatch="////", lw=0, zorder=3)
        )


# ------------------------------------------------------------------ Fig. 2
def _hist_image(ax, samples, bins, cmap="Blues"):
    L = samples.shape[0]
    img = np.zeros((len(bins) - 1, L))
    for l in range(L):
        s = samples[l][np.isfinite(samples[l])]
        h, _ = np.histogram(s, bins=bins)
        img[:, l] = h / max(h.max(), 1)
    ax.pcolormesh(np.arange(L + 1) - 0.5, bins, img, cmap=cmap, vmin=0, vmax=1.05, rasterized=True)


def _bins(samples, lo=None, hi=None, k=48):
    s = np.asarray(samples, float)
    s = s[np.isfinite(s)]
    a = np.percentile(s, 0.5) if lo is None else lo
    b = np.percentile(s, 99.5) if hi is None else hi
    if not b > a:
        b = a + 1e-3
    pad = 0.03 * (b - a)
    return np.linspace(a - pad, b + pad, k + 1)


def fig2(ds, out_dir: str, name: str = "fig2"):
    """Iterates of the (q, ρ) map for two σ_w (one per column) and the theory's per-layer
    norms and cosines (red) over simulated histograms (blue)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    sws = ds["sigma_w"].values
    with style.context() as plt:
        fig, axes = plt.subplots(3, len(sws), figsize=(style.COLUMN, 4.6), squeeze=False, constrained_layout=True)
        for j, sw in enumerate(sws):
            d = ds.isel(sigma_w=j)
            L = d.sizes["layer"] - 1
            la = float(d["lambda_a"])
            kind = "ordered" if la < 0 else "chaotic"
            ax = axes[0, j]
            colors = plt.cm.viridis(np.linspace(0, 0.9, d.sizes["start"]))
            for k in range(d.sizes["start"]):
                ax.plot(d["map_rho"][k], d["map_q"][k], "-o", color=colors[k], ms=1.6, lw=0.6)
                ax.plot(d["map_rho"][k][0], d["map_q"][k][0], "o", mfc="white", mec=colors[k], ms=3)
            ax.plot(float(d["rho_fixed"]), float(d["q_fixed"]), "*", ms=9, mfc="gold", mec="k", mew=0.6)
            ax.set_title(f"{symbol('sigma_w')} = {sw:g} ({kind}, " + r"$\lambda_a$" + f" = {la:+.2f})")
            ax.set_xlabel(r"cosine $\rho$")
            ax.set_xlim(-0.02, 1.03)
            if j == 0:
                ax.set_ylabel(r"norm $q$")
            layers = d["layer"].values
            ax = axes[1, j]
            _hist_image(ax, d["norms"].values, _bins(d["norms"].values))
            ax.plot(layers, d["q_theory"], "-", color=style.THEORY_COLOR, lw=1.1)
            if j == 0:
                ax.set_ylabel(r"token norm $|x_i|^2/d$")
            ax = axes[2, j]
            cos = d["cosines"].values
            _hist_image(ax, cos, _bins(cos, hi=1.0))
            ax.plot(layers, d["rho_theory"], "-", color=style.THEORY_COLOR, lw=1.1)
            ax.set_xlabel("layer")
            if j == 0:
                ax.set_ylabel(r"token cosine $\rho_{ij}$")
            for ax in axes[1:, j]:
                ax.set_xlim(-0.5, L + 0.5)
        handles = [
            Line2D([], [], color=style.THEORY_COLOR, lw=1.1, label="theory"),
            Patch(
                facecolor=plt.cm.Blues(0.7),
                label=f"simulation (d = {int(ds.attrs.get('width', 0))}, {int(ds.attrs.get('seeds', 0))} draws)",
            ),
            Line2D([], [], marker="*", ms=7, mfc="gold", mec="k", ls="none", label="stable fixed point"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
        fig.suptitle(
            f"(q, ρ) map: {_fixed(ds, ('alpha', 'sigma_a', 'n_tokens'))}, "
            f"input ρ₀ = {float(ds.attrs.get('rho0', np.nan)):g}"
        )
        return style.save(fig, out_dir, name)


# ------------------------------------------------------------------ Fig. 3
def fig3(ds, out_dir: str, name: str = "fig3"):
    """Two-group input (Eq. 12): intra- and inter-group cosines and their ratio per layer."""
    from matplotlib.lines import Line2D

    has_theory = bool(np.isfinite(ds["theory_intra"].values).any())
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple")
    with style.context() as plt:
        fig, axes = plt.subplots(2, 1, figsize=(style.COLUMN, 3.4), sharex=True, constrained_layout=True)
        for j, sw in enumerate(ds["sigma_w"].values):
            d = ds.isel(sigma_w=j)
            c = colors[j % len(colors)]
            layers = d["layer"].values
            for v, ls, mk in (("intra", "-", "o"), ("inter", "--", "s")):
                axes[0].errorbar(
                    layers,
                    d[v],
                    yerr=d[f"{v}_se"],
                    fmt=mk,
                    ms=2.2,
                    color=c,
                    mfc="white" if v == "inter" else c,
                    lw=0.6,
                    capsize=0,
                )
                if has_theory:
                    axes[0].plot(layers, d[f"theory_{v}"], ls, color=c, lw=0.9)
            axes[1].errorbar(
                layers,
                d["ratio"],
                yerr=d["ratio_se"],
                fmt="o",
                ms=2.2,
                color=c,
                lw=0.6,
                capsize=0,
                label=f"{symbol('sigma_w')} = {sw:g}",
            )
            if has_theory:
                axes[1].plot(layers, d["theory_ratio"], "-", color=c, lw=0.9)
        axes[1].axhline(1.0, color="0.5", lw=0.6, ls=":")
        axes[0].set_ylabel("mean cosine")
        axes[1].set_ylabel("inter / intra")
        axes[1].set_xlabel("layer")
        h = [
            Line2D([], [], marker="o", color="0.3", ls="none", ms=3, label="intra-group"),
            Line2D([], [], marker="s", mfc="white", color="0.3", ls="none", ms=3, label="inter-group"),
        ]
        h.append(
            Line2D([], [], color="0.3", lw=0.9, label="theory (full Gram)")
            if has_theory
            else Line2D([], [], color="none", label="theory: gram.py not available")
        )
        h2, _ = axes[1].get_legend_handles_labels()
        fig.legend(handles=h + h2, loc="outside lower center", ncol=3, frameon=False, columnspacing=0.8)
        fig.suptitle(
            "two-group input: permutation symmetry is restored\n"
            rf"$\rho_{{intra}}$ = {float(ds.attrs.get('rho_intra', np.nan)):g}, "
            rf"$\rho_{{inter}}$ = {float(ds.attrs.get('rho_inter', np.nan)):g}; "
            f"{_fixed(ds, ('alpha',))}; "
            f"d = {int(ds.attrs.get('width', 0))}, {int(ds.attrs.get('seeds', 0))} draws"
        )
        return style.save(fig, out_dir, name)


# ------------------------------------------------------------------ Fig. 6
def fig6(sim_causal, out_dir: str, theory_causal=None, theory_acausal=None, name: str = "fig6"):
    """Causal-attention exponents on the (α, σ_w) slice: simulation, the full-Gram theory
    when available, and the acausal theory's zero contours for reference."""
    from matplotlib.lines import Line2D

    x, y = "alpha", "sigma_w"
    cols = [("simulation", sim_causal)]
    if theory_causal is not None:
        cols.insert(0, ("theory (full Gram)", theory_causal))
    depth = _depth(sim_causal, _depth(theory_acausal) if theory_acausal is not None else None)
    with style.context() as plt:
        fig, axes = plt.subplots(2, len(cols), figsize=(style.COLUMN, 3.5), squeeze=False, constrained_layout=True)
        for i, var in enumerate(("lambda_a", "lambda_g_collapse")):
            vals = [d[var].values for _, d in cols]
            norm = style.diverging_norm(*vals, clip_percentile=99)
            m = None
            for j, (title, d) in enumerate(cols):
                ax = axes[i, j]
                m = _heat(ax, d[var], x, y, norm)
                _zero(ax, d[var], x, y, colors="k", linewidths=1.0, linestyles="--" if title == "simulation" else "-")
                if theory_acausal is not None:
                    _zero(ax, theory_acausal[var], x, y, colors="0.3", linewidths=0.7, linestyles=":")
                    ax.set_xlim(float(d[x].min()) - 0.05, float(d[x].max()) + 0.05)
                    ax.set_ylim(float(d[y].min()) - 0.15, float(d[y].max()) + 0.15)
                if i == 0:
                    ax.set_title(_sim_label(d) if title == "simulation" else title)
                ax.set_xlabel(symbol(x))
                if j == 0:
                    ax.set_ylabel(symbol(y))
                else:
                    ax.tick_params(labelleft=False)
            cb = fig.colorbar(m, ax=list(axes[i]), pad=0.02, aspect=15, extend=style.extend(norm, *vals))
            cb.set_label(symbol(var, depth) + " (causal)")
            cb.ax.axhline(0.0, color="k", lw=0.6)
        h = [Line2D([], [], color="k", ls="--", lw=1.0, label="causal sim. = 0")]
        if theory_causal is not None:
            h.insert(0, Line2D([], [], color="k", lw=1.0, label="causal theory = 0"))
        if theory_acausal is not None:
            h.append(Line2D([], [], color="0.3", ls=":", lw=0.7, label="acausal theory = 0"))
        if theory_causal is None:
            h.append(Line2D([], [], color="none", label="(causal theory: gram.py not available)"))
        fig.legend(handles=h, loc="outside lower center", ncol=2, frameon=False)
        fig.suptitle(f"causal attention ({_fixed(sim_causal, ('sigma_a', 'n_tokens', 'depth'))})")
        return style.save(fig, out_dir, name)


# ------------------------------------------------------------------ all of them
def draw_all(theory: dict, sim: dict, out_dir: str, echo=print) -> list[str]:
    """Every figure whose data are present; a line for each one skipped."""
    paths = []

    def run(label, fn, *args, **kw):
        paths.extend(fn(*args, **kw))
        echo(f"  {label}")

    if "fig2" in sim:
        run("fig2: (q, rho) map and token histograms", fig2, sim["fig2"], out_dir)
    else:
        echo("  fig2: skipped (no simulation data; pass --sim)")
    if "fig3" in sim:
        run("fig3: two-group symmetry restoration", fig3, sim["fig3"], out_dir)
    else:
        echo("  fig3: skipped (no simulation data; pass --sim)")
    for var, name in (("lambda_a", "fig4"), ("lambda_g_collapse", "fig5")):
        if any(k in theory or k in sim for k in ("alpha_sigma_w", "sigma_a_alpha")):
            run(f"{name}: {var} theory vs simulation", fig_exponent, var, theory, sim, out_dir, name)
        else:
            echo(f"  {name}: skipped (no grid)")
    if "causal" in sim:
        run("fig6: causal attention", fig6, sim["causal"], out_dir, theory.get("causal"), theory.get("alpha_sigma_w"))
    else:
        echo("  fig6: skipped (no causal simulation)")
    if "alpha_sigma_w" in theory:
        run("phase_diagram", phase_diagram, theory["alpha_sigma_w"], out_dir)
    else:
        echo("  phase_diagram: skipped (no (alpha, sigma_w) theory grid)")
    return paths
