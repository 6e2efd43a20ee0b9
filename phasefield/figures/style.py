"""Shared look of the figures: single-column sizes, symbols, diverging colour scales
centred at zero, and PNG + PDF output (matplotlib, Agg backend)."""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..io import atomic_path

COLUMN = 3.4  # single-column width (inches)
DPI = 200  # PNG resolution
CMAP = "RdBu_r"  # diverging: blue < 0 < red
SYMBOLS = {
    "sigma_w": r"$\sigma_w$",
    "sigma_a": r"$\sigma_A$",
    "alpha": r"$\alpha$",
    "alpha_a": r"$\alpha_A$",
    "alpha_m": r"$\alpha_M$",
    "n_tokens": r"$n$",
    "depth": r"$L$",
    "lambda_a": r"$\lambda_a$",
    "lambda_g_collapse": r"$\lambda_g(L)$",
    "lambda_g_input": r"$\lambda_g(L; q_0, \rho_0)$",
    "lambda_g_inf": r"$\lambda_g^{\infty}$",
    "q_star": r"$q^*$",
    "rho_star": r"$\rho^*$",
}
THEORY_COLOR = "tab:red"
SIM_COLOR = "tab:blue"

RC = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "figure.titlesize": 8,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 3,
    "xtick.major.width": 0.5,
    "ytick.major.width": 0.5,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "pdf.fonttype": 42,
    "image.cmap": CMAP,
}


def plt():
    """matplotlib.pyplot with the Agg backend (never a display)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


@contextlib.contextmanager
def context():
    """rcParams of every phasefield figure."""
    pyplot = plt()
    with pyplot.rc_context(RC):
        yield pyplot


def symbol(name: str, depth=None) -> str:
    """Axis / colorbar label of a variable; ``lambda_g_collapse`` names its depth when known."""
    if name == "lambda_g_collapse" and depth is not None:
        return rf"$\lambda_g(L{{=}}{int(depth)})$"
    return SYMBOLS.get(name, name.replace("_", " "))


def diverging_norm(*arrays, clip_percentile: float | None = None):
    """A ``TwoSlopeNorm`` centred at zero spanning the finite values of ``arrays``
    (optionally clipped at a percentile of |values| so a far tail does not wash out the
    colours near zero). Always valid: vmin < 0 < vmax."""
    from matplotlib.colors import TwoSlopeNorm

    vals = np.concatenate([np.asarray(a, float).ravel() for a in arrays]) if arrays else np.zeros(1)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        vals = np.zeros(1)
    lo, hi = float(vals.min()), float(vals.max())
    if clip_percentile is not None:
        lo = max(lo, float(np.percentile(vals, 100 - clip_percentile)))
        hi = min(hi, float(np.percentile(vals, clip_percentile)))
    span = max(abs(lo), abs(hi), 1e-6)
    # one-signed data: keep zero at the centre, with a short stretch of the other sign
    if lo > -0.05 * span:
        lo = -0.25 * span
    if hi < 0.05 * span:
        hi = 0.25 * span
    return TwoSlopeNorm(vmin=lo, vcenter=0.0, vmax=hi)


def extend(norm, *arrays) -> str:
    """The colorbar ``extend`` for values beyond ``norm``'s range."""
    vals = np.concatenate([np.asarray(a, float).ravel() for a in arrays])
    vals = vals[np.isfinite(vals)]
    below = vals.size and vals.min() < norm.vmin
    above = vals.size and vals.max() > norm.vmax
    return "both" if below and above else "min" if below else "max" if above else "neither"


def save(fig, out_dir: str, name: str, formats=("png", "pdf")) -> list[str]:
    """Write ``out_dir/name.{png,pdf}`` (each atomically) and close the figure."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for fmt in formats:
        path = os.path.join(out_dir, f"{name}.{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI)
        paths.append(path)
    plt().close(fig)
    return paths


def panel_label(ax, text):
    ax.text(
        0.02,
        0.98,
        text,
        transform=ax.transAxes,
        ha="left",
        va="top",
        fontsize=7,
        fontweight="bold",
        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.7),
    )
