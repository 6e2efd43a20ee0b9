"""Theory-vs-simulation agreement tables from two grid datasets (netCDF).

Both datasets are aligned on their common coordinates (inner join); each grid point is
classified by the theory's exponents: ordered/chaotic by the sign of ``lambda_a``,
vanishing/exploding by the sign of ``lambda_g``. For every quantity present in both,
the table gives the median, 90th percentile and maximum absolute error (and, where the
simulation carries ``<name>_se``, the same statistics of |error| / se), overall and by
phase.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from .. import grid

QUANTITIES = ("lambda_a", "lambda_g", "lambda_g_inf", "rho_star")  # q_star: an input of the simulation


def open_grid(path) -> xr.Dataset:
    try:
        return xr.open_dataset(path, engine="h5netcdf").load()
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except Exception as exc:  # unreadable / not netCDF
        raise ValueError(f"cannot read {path} as a netCDF grid ({type(exc).__name__})") from None


def align(theory: xr.Dataset, sim: xr.Dataset):
    """Inner-join the two grids on shared coordinates; length-1 dimensions present in
    only one of them are dropped (squeezed)."""
    def squeeze_extra(ds, other):
        extra = [d for d in ds.dims if d not in other.dims]
        bad = [d for d in extra if ds.sizes[d] != 1]
        if bad:
            raise ValueError(f"dimension(s) {', '.join(bad)} only in one grid; cannot align")
        return ds.isel({d: 0 for d in extra}, drop=True) if extra else ds

    theory = squeeze_extra(theory, sim)
    sim = squeeze_extra(sim, theory)
    # coordinates are floats written by different programs: round before joining
    for d in sim.dims:
        sim = sim.assign_coords({d: grid.canonical(sim[d].values)})
        theory = theory.assign_coords({d: grid.canonical(theory[d].values)})
    th, si = xr.align(theory, sim, join="inner")
    if th.sizes and min(th.sizes.values()) == 0:
        raise ValueError("the two grids share no points")
    return th, si


def phases(theory: xr.Dataset) -> dict:
    """Boolean masks of the theory's phases."""
    out = {"all": xr.ones_like(theory["lambda_a"], dtype=bool)}
    if "lambda_a" in theory:
        out["ordered"] = theory["lambda_a"] < 0
        out["chaotic"] = theory["lambda_a"] >= 0
    if "lambda_g" in theory:
        out["vanishing"] = theory["lambda_g"] < 0
        out["exploding"] = theory["lambda_g"] >= 0
    return out


def agreement(theory: xr.Dataset, sim: xr.Dataset, quantities=None) -> list[dict]:
    """Rows ``{quantity, phase, points, median, p90, max, median_z, p90_z, max_z}`` of
    absolute errors |sim - theory| (``*_z``: in units of the simulation's standard error)."""
    th, si = align(theory, sim)
    quantities = [q for q in (quantities or QUANTITIES) if q in th and q in si]
    if not quantities:
        raise ValueError("the two grids have no quantity in common "
                         f"(theory: {sorted(theory.data_vars)}, simulation: {sorted(sim.data_vars)})")
    rows = []
    masks = phases(th)
    for q in quantities:
        err = np.abs(si[q] - th[q])
        z = err / si[q + "_se"] if q + "_se" in si else None
        for phase, mask in masks.items():
            m = np.asarray(mask.values, bool) & np.isfinite(np.asarray(err.values))
            e = np.asarray(err.values)[m]
            row = {"quantity": q, "phase": phase, "points": int(e.size)}
            row.update(_stats(e, ""))
            if z is not None:
                row.update(_stats(np.asarray(z.values)[m], "_z"))
            rows.append(row)
    return rows


def _stats(e, suffix):
    if e.size == 0:
        return {f"median{suffix}": float("nan"), f"p90{suffix}": float("nan"), f"max{suffix}": float("nan")}
    return {f"median{suffix}": float(np.median(e)), f"p90{suffix}": float(np.percentile(e, 90)),
            f"max{suffix}": float(np.max(e))}


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of :func:`agreement` rows."""
    has_z = any("median_z" in r for r in rows)
    head = f"{'quantity':<12} {'phase':<10} {'points':>6} {'median':>9} {'p90':>9} {'max':>9}"
    if has_z:
        head += f" {'med/se':>7} {'p90/se':>7} {'max/se':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['quantity']:<12} {r['phase']:<10} {r['points']:>6d} {r['median']:>9.4f} "
                f"{r['p90']:>9.4f} {r['max']:>9.4f}")
        if has_z:
            line += "".join(f" {r.get(k, float('nan')):>7.2f}" for k in ("median_z", "p90_z", "max_z"))
        lines.append(line)
    return "\n".join(lines)


def format_markdown(rows: list[dict]) -> str:
    """The same table in Markdown."""
    has_z = any("median_z" in r for r in rows)
    cols = ["quantity", "phase", "points", "median", "p90", "max"] + (
        ["median_z", "p90_z", "max_z"] if has_z else [])
    names = {"median_z": "median/se", "p90_z": "p90/se", "max_z": "max/se"}
    out = ["| " + " | ".join(names.get(c, c) for c in cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.4f}" if isinstance(v, float) and not c.endswith("_z")
                         else f"{v:.2f}" if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
