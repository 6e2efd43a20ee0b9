"""The files of the figures' datasets: writing them and loading them back.

Two netCDF files (h5netcdf, one group per dataset) hold everything a figure draws, so
``phasefield figures --from sweep.nc --sim sim.nc`` redraws without recomputing:

``sweep.nc`` (theory, :func:`phasefield.diagram.sweep`)
    ``alpha_sigma_w``      λ's on a fine (σ_w, α) grid at σ_A = 1 (Figs. 4–5, phase diagram)
    ``sigma_a_alpha``      λ's on a fine (σ_A, α) grid at fixed σ_w (Figs. 4–5)
    ``alpha_sigma_w_sim``  the theory at the simulated grid's points (agreement numbers)
    ``sigma_a_alpha_sim``  likewise for the (σ_A, α) simulated grid
    ``causal``             full-Gram causal theory on the causal simulated grid (Fig. 6)
``sim.nc`` (finite-width simulation, :mod:`phasefield.simulate`)
    ``alpha_sigma_w``, ``sigma_a_alpha``  simulated λ_a, λ_g(L) with ``_se`` (Figs. 4–5)
    ``causal``             simulated causal-attention exponents (Fig. 6)
    ``fig2``               per-layer token norms / cosines (samples) for two σ_w, with the
                           theory trajectories and (q, ρ) map iterates
    ``fig3``               two-group (Eq. 12) intra/inter cosines per layer, simulated and
                           full-Gram theory

A plain single-group grid written by ``phasefield sweep`` or ``phasefield simulate
sweep`` is accepted too; its slice is recognised from its dimensions.

They are computed by :mod:`.compute`.
"""

from __future__ import annotations

import os

from .. import io, schema

THEORY_FILE = "sweep.nc"
SIM_FILE = "sim.nc"
SLICES = {  # group name -> (x, y) axes of the slice
    "alpha_sigma_w": ("alpha", "sigma_w"),
    "sigma_a_alpha": ("sigma_a", "alpha"),
}


def save_groups(groups: dict, path: str) -> None:
    """Write ``{name: Dataset}`` as the groups of one netCDF file (atomically)."""
    io.write_netcdf_groups(groups, path)


def _recognise(ds, path):
    dims = set(k for k, n in ds.sizes.items() if n > 1)
    for name, (x, y) in SLICES.items():
        if {x, y} == dims:
            if name == "alpha_sigma_w" and int(ds.attrs.get("causal", 0)):
                return "causal"
            return name
    raise ValueError(
        f"{path}: expected a 2-D grid over (alpha, sigma_w) or (sigma_a, alpha); "
        f"got dimensions ({', '.join(ds.dims) or 'none'})"
    )


def load_groups(path: str, kind: str = "theory") -> dict:
    """``{name: Dataset}`` from a file written by :func:`save_groups`, or from a plain
    grid (``phasefield sweep`` / ``phasefield simulate sweep``) whose slice is recognised
    from its dimensions. Raises ``ValueError`` with one line on unusable input."""
    import xarray as xr

    if not os.path.isfile(path):
        raise ValueError(f"no such file: {path}")
    try:
        groups = xr.open_groups(path, engine="h5netcdf")
    except Exception as exc:
        raise ValueError(f"cannot read {path} as netCDF ({type(exc).__name__})") from None
    out = {}
    for name, ds in groups.items():
        if not ds.data_vars:
            continue
        ds = ds.load()
        key = name.strip("/")
        if not key:  # plain single-group grid
            key = _recognise(ds, path)
        out[key] = schema.canonical(ds, schema.EARLIER_COLLAPSE)  # perhaps a file of an earlier release
    for ds in groups.values():
        ds.close()
    if not out:
        raise ValueError(f"{path} holds no data variables")
    need = ("lambda_a", "lambda_g_collapse")
    for name, ds in out.items():
        if name in ("fig2", "fig3"):
            continue
        missing = [v for v in need if v not in ds]
        if missing:
            raise ValueError(f"{path} ({name}): missing variable(s) {', '.join(missing)}")
    return out
