#!/usr/bin/env python
"""Closed-form lambda_a and lambda_g(L) at the collapsed point (docs/theory.md §6-7; tanh, one
hidden layer) on the agreement report's grid, written as a theory-format netCDF. An
independent stand-in for ``phasefield.diagram.sweep`` when checking the simulator:

    python scripts/closed_form_grid.py out/agreement/closed_form.nc
    phasefield compare out/agreement/closed_form.nc out/agreement/sim.nc
"""

import sys

import numpy as np
import xarray as xr

from phasefield import HParams
from phasefield.theory.reference import closed_form_exponents

SW = np.linspace(0.5, 3.0, 16)
ALPHA = np.linspace(0.1, 0.9, 16)
la = np.zeros((16, 16))
lg = np.zeros((16, 16))
for i, sw in enumerate(SW):
    for j, a in enumerate(ALPHA):
        _, la[i, j], lg[i, j] = closed_form_exponents(HParams(sigma_w=sw, alpha_a=a, alpha_m=a), 16)
ds = xr.Dataset(
    {"lambda_a": (("sigma_w", "alpha"), la), "lambda_g": (("sigma_w", "alpha"), lg)},
    coords={"sigma_w": SW, "alpha": ALPHA},
)
ds.to_netcdf(sys.argv[1], engine="h5netcdf")
