"""Theory-vs-simulation agreement tables from two grid datasets (netCDF).

Both datasets are aligned on their common coordinates (inner join); each grid point is
classified by the theory: ordered/chaotic by the sign of ``lambda_a`` (``angle_rate`` where
the block has no finite fixed point), vanishing/exploding by the sign of ``lambda_g_input``
(a block grid) or ``lambda_g_collapse`` (the paper grid). Quantities are matched by name: every
variable present in both grids that the simulation measures with a standard error
(``<name>_se``), or one of :data:`QUANTITIES`, under the names of :mod:`phasefield.schema`
for every grid, theory and simulation (:func:`theory_names` reads files of an earlier
release). The table gives the median, 90th percentile and maximum absolute
error and, where the simulation carries ``<name>_se``, the same statistics of
|z| = |error| / se and the mean signed z, overall and by phase. The se is floored at
:data:`RESOLUTION` times max(1, |theory|): below that the network and the theory differ by
design (a LayerNorm's epsilon moves q after the norm by up to 1e-6, which the theory leaves
out), not by noise.
"""

from __future__ import annotations

import jax
import numpy as np
import xarray as xr

from .. import grid, layers, schema
from ..layers import depth as depth_fns
from ..theory.precision import float64
from .measure import QUANTITIES as BLOCK_QUANTITIES
from .stack import resolve

RESOLUTION = 1e-6  # relative floor of the standard errors in z-scores (z_scores)
_angle_exponent = jax.jit(depth_fns.angle_exponent)

QUANTITIES = ("lambda_a", "lambda_g_collapse", "lambda_g_inf", "rho_star")  # q_star: an input of the simulation
INPUTS = ("q_star",)


def theory_names(ds: xr.Dataset) -> xr.Dataset:
    """A grid under the canonical names (:mod:`phasefield.schema`): the deprecated copies a
    file carries dropped, and a file of an earlier release renamed (a block grid's
    ``lambda_g`` was ``lambda_g_input``; the paper grids' ``lambda_g`` ``lambda_g_collapse``)."""
    return schema.canonical(ds, schema.EARLIER_INPUT if "block" in ds.attrs else schema.EARLIER_COLLAPSE)


def common_quantities(theory: xr.Dataset, sim: xr.Dataset, quantities=None) -> list:
    """The quantities compared: ``quantities`` if given, else every variable of both grids
    that the simulation gives with ``<name>_se`` or that is one of :data:`QUANTITIES`
    (inputs such as ``q_star`` and the ``_se`` variables themselves excluded)."""
    if quantities is not None:
        return [q for q in quantities if q in theory and q in sim]
    out = []
    for q in sim.data_vars:
        if q.endswith("_se") or q in INPUTS or q not in theory.data_vars:
            continue
        if q + "_se" in sim or q in QUANTITIES:
            out.append(q)
    return out


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
    """Boolean masks of the theory's phases (module docstring)."""
    shape_of = next(
        (
            k
            for k in ("lambda_a", "angle_rate", "lambda_g_input", "lambda_g_collapse", "angle_rate_last")
            if k in theory
        ),
        next(iter(theory.data_vars)),
    )
    out = {"all": xr.ones_like(theory[shape_of], dtype=bool)}
    angle = theory["lambda_a"] if "lambda_a" in theory else None
    for k in ("angle_rate", "angle_rate_last"):  # a causal grid: its last token's
        if k in theory:
            angle = theory[k] if angle is None else angle.where(np.isfinite(angle), theory[k])
    if angle is not None:
        out["ordered"] = angle < 0
        out["chaotic"] = angle >= 0
    grad = next((theory[k] for k in ("lambda_g_input", "lambda_g_collapse", "lambda_g_last") if k in theory), None)
    if grad is not None:
        out["vanishing"] = grad < 0
        out["exploding"] = grad >= 0
    return out


def agreement(theory: xr.Dataset, sim: xr.Dataset, quantities=None) -> list[dict]:
    """Rows ``{quantity, phase, points, median, p90, max, median_z, p90_z, max_z, mean_z}``
    of absolute errors |sim - theory| (quantities finite nowhere on the common grid, such as
    ``lambda_a`` of a block without a fixed point, are left out) (``*_z``: |error| in units of the simulation's
    standard error, floored at :data:`RESOLUTION`; ``mean_z`` the signed mean of
    (sim - theory)/se)."""
    th, si = align(theory_names(theory), theory_names(sim))
    quantities = common_quantities(th, si, quantities)
    if not quantities:
        raise ValueError(
            "the two grids have no quantity in common "
            f"(theory: {sorted(theory.data_vars)}, simulation: {sorted(sim.data_vars)})"
        )
    rows = []
    masks = phases(th)
    for q in quantities:
        diff = si[q] - th[q]
        err = np.abs(diff)
        if not np.any(np.isfinite(np.asarray(err.values))):
            continue  # nothing to compare (e.g. lambda_a of a block without a fixed point)
        z = None
        if q + "_se" in si:
            floor = RESOLUTION * np.maximum(1.0, np.abs(th[q]))
            z = diff / np.maximum(si[q + "_se"], floor)
        for phase, mask in masks.items():
            mask = mask.broadcast_like(err)  # a value per position: the point's phase at each
            m = np.asarray(mask.transpose(*err.dims).values, bool) & np.isfinite(np.asarray(err.values))
            e = np.asarray(err.values)[m]
            row = {"quantity": q, "phase": phase, "points": int(e.size)}
            row.update(_stats(e, ""))
            if z is not None:
                zs = np.asarray(z.values)[m]
                row.update(_stats(np.abs(zs), "_z"))
                row["mean_z"] = float(np.mean(zs)) if zs.size else float("nan")
            rows.append(row)
    return rows


def _stats(e, suffix):
    if e.size == 0:
        return {f"median{suffix}": float("nan"), f"p90{suffix}": float("nan"), f"max{suffix}": float("nan")}
    return {
        f"median{suffix}": float(np.median(e)),
        f"p90{suffix}": float(np.percentile(e, 90)),
        f"max{suffix}": float(np.max(e)),
    }


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of :func:`agreement` rows."""
    has_z = any("median_z" in r for r in rows)
    head = f"{'quantity':<17} {'phase':<10} {'points':>6} {'median':>9} {'p90':>9} {'max':>9}"
    if has_z:
        head += f" {'med/se':>7} {'p90/se':>7} {'max/se':>7} {'mean z':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['quantity']:<17} {r['phase']:<10} {r['points']:>6d} {r['median']:>9.4f} "
            f"{r['p90']:>9.4f} {r['max']:>9.4f}"
        )
        if has_z:
            line += "".join(f" {r.get(k, float('nan')):>7.2f}" for k in ("median_z", "p90_z", "max_z", "mean_z"))
        lines.append(line)
    return "\n".join(lines)


def format_markdown(rows: list[dict]) -> str:
    """The same table in Markdown."""
    has_z = any("median_z" in r for r in rows)
    cols = ["quantity", "phase", "points", "median", "p90", "max"] + (
        ["median_z", "p90_z", "max_z", "mean_z"] if has_z else []
    )
    names = {"median_z": "median/se", "p90_z": "p90/se", "max_z": "max/se", "mean_z": "mean z"}
    out = ["| " + " | ".join(names.get(c, c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(
                f"{v:.4f}"
                if isinstance(v, float) and not c.endswith("_z")
                else f"{v:.2f}"
                if isinstance(v, float)
                else str(v)
            )
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------- one point of any block
@float64
def theory(block, n_tokens=32, depth=16, q0=1.0, rho0=0.5) -> dict:
    """The theory's values of the finite-depth quantities (:data:`BLOCK_QUANTITIES`) (and ``q_star``) under these names, from
    :func:`phasefield.layers.finite_depth` and the collapsed fixed point."""
    _, block = resolve(block)
    fd = layers.finite_depth(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
    blk, ctx = layers.prepare(block, n_tokens)
    q_star = float(layers.q_star(block, n_tokens=n_tokens))
    la = float(_angle_exponent(blk, ctx)) if np.isfinite(q_star) else float("nan")
    return dict(
        angle_rate=float(fd["angle_rate"]),
        lambda_g_input=float(fd["lambda_g_input"]),
        lambda_g_collapse=float(fd["lambda_g_collapse"]),
        lambda_a=la,
        rho_L=float(fd["rho"][-1]),
        q_L=float(fd["q"][-1]),
        q_star=q_star,
    )


def z_of(value, se, theory) -> np.ndarray:
    """``(value - theory) / se`` elementwise, the se floored at :data:`RESOLUTION`
    max(1, |theory|) (float64 arrays; NaN where an input is)."""
    theory = np.asarray(theory, float)
    se = np.maximum(np.asarray(se, float), RESOLUTION * np.maximum(1.0, np.abs(theory)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.asarray(value, float) - theory) / se


def z_scores(sim: dict, th: dict) -> dict:
    """``(sim - theory) / se`` of every quantity both give (NaN where either is NaN), the se
    floored at :data:`RESOLUTION` max(1, |theory|) (a LayerNorm's epsilon moves q after the
    norm by up to 1e-6, which the theory leaves out: post-LN's q_L is 1 - 7e-7 with se 2e-8)."""
    out = {}
    for k in BLOCK_QUANTITIES:
        if k in sim and k in th and k + "_se" in sim:
            se = max(float(sim[k + "_se"]), RESOLUTION * max(1.0, abs(float(th[k]))))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[k] = float((sim[k] - th[k]) / se)
    return out
