"""The probe's per-block figure: token norm q, mean cosine rho, angle growth of nearby tokens
and the gradient's energy per block, with standard-error bands over initializations, the
bands of the criteria on the rates, the first block that leaves its band marked, and the
theory's curves beside them when the model is (or is declared as) a phasefield block.
Drawn from a :class:`phasefield.probing.ProbeResult` only (no computation)."""

from __future__ import annotations

import numpy as np

from . import style


def probe_figure(res, path: str) -> None:
    """Write the figure of ``res`` to ``path`` (PNG or PDF by extension)."""
    ds, th = res.ds, res.theory
    blocks = ds["block"].values
    diag = res.diagnosis()
    first = diag["first_failing_block"]
    with style.context() as plt:
        fig, axes = plt.subplots(1, 4, figsize=(2 * style.COLUMN, 1.8))
        panels = [
            ("q", [("q_data", "your inputs", "o"), ("q_sym", "symmetric start", "s")], "q", True),
            ("mean cosine ρ", [("rho_data", "your inputs", "o"), ("rho_sym", "symmetric start", "s")], "rho", False),
            ("angle growth per block", [("angle", "nearby tokens", "o")], "angle", False),
            ("gradient energy |∂(u·x_L)/∂x_l|²", [("grad", "your inputs", "o")], "grad", True),
        ]
        for ax, (title, series, tkey, logy) in zip(axes, panels):
            for var, label, marker in series:
                if var not in ds:
                    continue
                y, se = ds[var].values, ds[var + "_se"].values
                color = style.SIM_COLOR if marker == "o" else "tab:green"
                ok = np.isfinite(y)
                ax.plot(blocks[ok], y[ok], marker=marker, ms=2.5, lw=0.8, color=color, label=label)
                lo, hi = y - se, y + se
                if logy:
                    lo = np.where(lo > 0, lo, y * 0.5)
                ax.fill_between(blocks[ok], lo[ok], hi[ok], color=color, alpha=0.25, lw=0)
            if th is not None:
                t = np.exp(th["log_grad"]) if tkey == "grad" else th[tkey]
                ax.plot(blocks, t, "--", color=style.THEORY_COLOR, label="theory")
            if tkey == "angle":
                ax.axhline(0.0, color="0.6", lw=0.5)
                ax.axhspan(-diag["angle_band"], diag["angle_band"], color="0.85", alpha=0.5, lw=0, label="band")
            if first is not None:
                ax.axvline(
                    first["block"], color="tab:red", lw=0.7, ls=":", label=f"first out of band ({first['block']})"
                )
            if logy:
                from matplotlib.ticker import NullFormatter

                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_title(title)
            ax.set_xlabel("block")
        handles, labels = [], []
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        fig.legend(handles, labels, loc="lower center", ncol=6, frameon=False, bbox_to_anchor=(0.5, -0.1))
        ang, grad = res.phase
        la, lg = res.angle_rate[0], res.lambda_g_input[0]
        fig.suptitle(f"{res.name}: {ang}/{grad}   λ_a = {la:+.3f}, λ_g(L) = {lg:+.3f}", y=1.04)
        fig.tight_layout()
        fig.savefig(path, dpi=style.DPI)
        plt.close(fig)
