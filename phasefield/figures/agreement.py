"""Theory vs simulation on the figures' simulated grids: the theory at the simulated points
(:func:`theory_at`) and the median / max errors (:func:`agreement`)."""

from __future__ import annotations

import numpy as np

from .. import grid


def theory_at(theory_ds, sim_ds):
    """The theory at the simulated grid's points: exact selection when the simulated
    coordinates are on the theory grid, else linear interpolation."""
    dims = [d for d in sim_ds.dims if sim_ds.sizes[d] > 1]
    th = theory_ds
    extra = [d for d in th.dims if d not in dims and th.sizes[d] == 1]
    if extra:
        th = th.isel({d: 0 for d in extra}, drop=True)
    sel = {}
    for d in dims:
        if d not in th.dims:
            raise ValueError(f"the theory grid has no {d} dimension")
        tv = grid.canonical(th[d].values)
        sv = grid.canonical(sim_ds[d].values)
        sel[d] = sv
        if not np.all(np.isin(sv, tv)):
            return th.interp({d: sim_ds[d].values for d in dims}), "interpolated"
    th = th.assign_coords({d: grid.canonical(th[d].values) for d in dims})
    return th.sel(sel), "exact"


def agreement(theory_groups: dict, sim_groups: dict, name: str = "alpha_sigma_w") -> dict | None:
    """Median / max |sim − theory| of λ_a and λ_g on the simulated grid ``name``."""
    if name not in sim_groups:
        return None
    sim = sim_groups[name]
    th = theory_groups.get(f"{name}_sim")
    how = "exact"
    if th is None:
        if name not in theory_groups:
            return None
        th, how = theory_at(theory_groups[name], sim)
    else:
        th, _ = theory_at(th, sim)
    out = dict(
        grid=name,
        theory=how,
        points=int(np.prod([sim.sizes[d] for d in sim.dims])),
        width=int(sim.attrs.get("width", 0)),
        seeds=int(sim.attrs.get("seeds", 0)),
    )
    for v in ("lambda_a", "lambda_g_collapse"):
        a = np.asarray(sim[v].transpose(*th[v].dims).values, float)
        b = np.asarray(th[v].values, float)
        err = np.abs(a - b)[np.isfinite(a - b)]
        out[v] = dict(
            median=float(np.median(err)) if err.size else float("nan"),
            max=float(np.max(err)) if err.size else float("nan"),
        )
        if f"{v}_se" in sim:
            se = np.asarray(sim[f"{v}_se"].values, float)
            out[v]["median_se"] = float(np.nanmedian(se))
    return out
