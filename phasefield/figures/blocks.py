"""Phase diagrams of any block (:mod:`phasefield.layers.sweep` datasets): the angle rate
and the gradient rate over two of its numbers (or one number and depth), each with its
zero contour, and the simulation's measured signs beside the theory where given. A causal
block's dataset (``NAME:causal=true``) draws the last token's rates, ``angle_rate_last`` and
``lambda_g_last`` (:data:`phasefield.layers.sweep.CAUSAL_OUTPUTS`).

``sim``: rows of ``scripts/validate_blocks.py`` (``docs/data/blocks/rows.jsonl``; rows of an
earlier release, whose ``lambda_g`` was ``lambda_g_input``, are read too); the points of this
block at the widest width are drawn as markers, filled where the measured rate is positive
(chaotic / exploding), open where negative.
"""

from __future__ import annotations

import numpy as np

from .. import schema
from .style import context, diverging_norm, extend, save

TITLES = {
    "angle_rate": "angle rate (1/L) log[(1-ρ_L)/(1-ρ_0)]",
    "lambda_g_input": "gradient rate λ_g(L)",
    "angle_rate_last": "last token's angle rate (1/L) log[(1-ρ_L)/(1-ρ_0)]",
    "lambda_g_last": "last token's gradient rate λ_g(L)",
}
RATES = ("angle_rate", "lambda_g_input")  # a block's (q, p) rates
CAUSAL_RATES = ("angle_rate_last", "lambda_g_last")  # a causal block's: the last token's


def _sim_points(sim, block, x, y):
    if not sim:
        return []
    rows = [r for r in sim if r["preset"] == block and x in r["point"] and y in r["point"]]
    if not rows:
        return []
    wmax = max(r["width"] for r in rows)
    return [dict(r, sim=schema.canonical(r["sim"], schema.EARLIER_INPUT)) for r in rows if r["width"] == wmax]


def phase_diagram(ds, out_dir: str, name: str, sim=None, formats=("png",)) -> list[str]:
    """Two panels (angle rate, gradient rate) of the 2-D dataset ``ds``: a causal block's
    (its variables :data:`CAUSAL_RATES`) the last token's, which ``sim`` rows (the (q, p)
    rates of unmasked networks) cannot accompany."""
    causal = CAUSAL_RATES[1] in ds.data_vars
    rates = CAUSAL_RATES if causal else RATES
    if causal and sim:
        raise ValueError(
            "sim rows measure the (q, p) rates of blocks without the mask; a causal block's diagram takes none"
        )
    grad = rates[1]
    dims = list(ds[grad].dims)
    if len(dims) != 2:
        raise ValueError(f"a phase diagram needs a 2-D sweep (got axes {', '.join(dims) or 'none'})")
    y, x = dims
    block = ds.attrs.get("block", "block")
    pts = _sim_points(sim, block, x, y)
    with context() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.0), constrained_layout=True)
        for ax, var in zip(axes, rates):
            z = np.asarray(ds[var].transpose(y, x), float)
            xs, ys = np.asarray(ds[x], float), np.asarray(ds[y], float)
            norm = diverging_norm(z, clip_percentile=98)
            im = ax.pcolormesh(xs, ys, z, norm=norm, shading="auto")
            if np.nanmin(z) < 0 < np.nanmax(z):
                ax.contour(xs, ys, z, levels=[0.0], colors="k", linewidths=1.0)
            fig.colorbar(im, ax=ax, extend=extend(norm, z))
            for r in pts:
                v = r["sim"].get(var)
                if v is None or not np.isfinite(v):  # not measurable (e.g. below float32 resolution)
                    ax.plot(r["point"][x], r["point"][y], "x", ms=6, color="k")
                    continue
                ax.plot(r["point"][x], r["point"][y], "o", ms=6, mec="k", mfc="k" if v > 0 else "white")
            depth = ds.attrs.get("depth")
            ax.set_title(
                TITLES[var] + (f", L = {depth}" if depth is not None and x != "depth" and y != "depth" else ""),
                fontsize=8,
            )
            ax.set_xlabel(x)
            ax.set_ylabel(y)
            if y == "depth":
                ax.set_yscale("log", base=2)
        n = ds.attrs.get("n_tokens")
        last = f" (causal, n = {n}: the last token's rates)" if n is not None else " (causal: the last token's rates)"
        fig.suptitle(
            f"{block}{last if causal else ''}: theory (colour, black line: zero)"
            + (f"; simulation at d = {pts[0]['width']} (filled: > 0, x: not measurable)" if pts else ""),
            fontsize=8,
        )
        return save(fig, out_dir, name, formats)


BLOCK_DIAGRAM_POINTS_MAX = 1 << 16  # points of one block phase diagram (``figures --block``)


def block_phase_diagram(name: str, axes: dict, fixed: dict, out_dir: str, n_tokens: int, depth: int) -> list[str]:
    """Sweep block ``name`` (keywords ``fixed``) over two ``axes`` (two of its numbers, or one
    and ``depth``) at ``n_tokens`` tokens and ``depth`` blocks, and write its phase diagram
    ``out_dir/phase_<name>.png`` and the data ``phase_<name>.nc``; returns the paths written.
    A causal block (``fixed["causal"]``) draws the last token's rates.
    Everything is checked before any work (ValueError, one line): ``depth``, ``n_tokens``,
    the axes, the grid's size and the output folder."""
    import os

    from .. import grid, io
    from ..layers import sweep

    grid.check_option("--depth", depth, 1, 10_000, integer=True)
    grid.check_option("--n-tokens", n_tokens, 2, 1_000_000, integer=True)
    if len(axes) != 2:
        raise ValueError(f"a phase diagram needs two --axis NAME=start:stop:count (got {len(axes)})")
    sweep.check(name, axes, fixed)
    npts = grid.check_grid([len(v) for v in axes.values()], 8 * 8)
    if npts > BLOCK_DIAGRAM_POINTS_MAX:
        raise ValueError(f"a --block phase diagram takes at most {BLOCK_DIAGRAM_POINTS_MAX:,} points (got {npts:,})")
    io.check_output(out_dir, kind="dir", need_bytes=16 << 20)
    ds = sweep.sweep_grid(name, axes, fixed, n_tokens=int(n_tokens), depth=int(depth))
    base = f"phase_{name}"
    os.makedirs(out_dir, exist_ok=True)
    data = os.path.join(out_dir, base + ".nc")
    io.write_netcdf(ds, data)
    return phase_diagram(ds, out_dir, base) + [data]
