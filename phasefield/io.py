"""Files: every output appears atomically (complete or not at all) and honours the umask.

    with atomic_path("out.nc") as tmp:      # write tmp; moved onto out.nc only on success
        ds.to_netcdf(tmp, engine="h5netcdf")

:func:`write_netcdf`, :func:`write_netcdf_groups`, :func:`write_npz`, :func:`write_json` are
the common cases; :func:`read_netcdf` / :func:`read_netcdf_groups` read them back.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager

import numpy as np

ENGINE = "h5netcdf"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path`` (same extension, so writers that go by the
    extension work); on success give it the permissions a new file gets (0666 minus the
    umask, not mkstemp's 0600) and move it onto ``path``; on failure remove it."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    ext = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".part" + ext, dir=d)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _netcdf_attrs(ds):
    """A copy of ``ds`` whose attributes netCDF can store (bool -> int, None -> '',
    dict -> JSON)."""
    ds = ds.copy()
    for obj in [ds] + [ds[v] for v in ds.variables]:
        for k, v in list(obj.attrs.items()):
            if isinstance(v, bool):
                obj.attrs[k] = int(v)
            elif v is None:
                obj.attrs[k] = ""
            elif isinstance(v, dict):
                obj.attrs[k] = json.dumps(v)
    return ds


def write_netcdf(ds, path) -> None:
    """One dataset -> netCDF (h5netcdf), atomically."""
    with atomic_path(path) as tmp:
        _netcdf_attrs(ds).to_netcdf(tmp, engine=ENGINE)


def write_netcdf_groups(groups: dict, path) -> None:
    """``{name: Dataset}`` -> the groups of one netCDF file, atomically."""
    import xarray as xr

    tree = xr.DataTree.from_dict({f"/{k}": _netcdf_attrs(v) for k, v in groups.items()})
    with atomic_path(path) as tmp:
        tree.to_netcdf(tmp, engine=ENGINE)


def read_netcdf(path):
    """A netCDF file as an in-memory ``xarray.Dataset`` (the file is closed)."""
    import xarray as xr

    with xr.open_dataset(path, engine=ENGINE) as ds:
        return ds.load()


def write_npz(path, arrays: dict) -> None:
    """``{name: array}`` -> ``.npz``, atomically."""
    with atomic_path(path) as tmp:
        np.savez(tmp, **arrays)


def read_npz(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def json_default(o):
    """``json.dumps(default=...)`` for NumPy/JAX scalars and arrays."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    try:
        return float(o)
    except Exception:
        return str(o)


def write_json(path, obj, indent=1) -> None:
    """``obj`` -> JSON file, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=indent, default=json_default)


def read_json(path):
    with open(path) as f:
        return json.load(f)
