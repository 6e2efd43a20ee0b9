"""The datasets behind the figures: computing them, saving them, loading them back.

Two netCDF files (h5netcdf, one group per dataset) hold everything a figure draws, so
``phasefield figures --from sweep.nc --sim sim.nc`` redraws without recomputing:

``sweep.nc`` (theory, :func:`phasefield.sweep.sweep`)
    ``alpha_sigma_w``      λ's on a fine (σ_w, α) grid at σ_A = 1 (Figs. 4–5, phase diagram)
    ``sigma_a_alpha``      λ's on a fine (σ_A, α) grid at fixed σ_w (Figs. 4–5)
    ``alpha_sigma_w_sim``  the theory at the simulated grid's points (agreement numbers)
    ``sigma_a_alpha_sim``  likewise for the (σ_A, α) simulated grid
    ``causal``             full-Gram causal theory on the causal simulated grid (Fig. 6),
                           only when :mod:`phasefield.theory.gram` is available
``sim.nc`` (finite-width simulation, :mod:`phasefield.simulate`)
    ``alpha_sigma_w``, ``sigma_a_alpha``  simulated λ_a, λ_g(L) with ``_se`` (Figs. 4–5)
    ``causal``             simulated causal-attention exponents (Fig. 6)
    ``fig2``               per-layer token norms / cosines (samples) for two σ_w, with the
                           theory trajectories and (q, ρ) map iterates
    ``fig3``               two-group (Eq. 12) intra/inter cosines per layer, simulated and
                           (when available) full-Gram theory

A plain single-group grid written by ``phasefield sweep`` or ``phasefield simulate
sweep`` is accepted too; its slice is recognised from its dimensions.

Long computations write each finished dataset to ``DIR/.parts-<hash>/`` at once (and
the simulated sweeps their chunks), so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from typing import Callable

import numpy as np

THEORY_FILE = "sweep.nc"
SIM_FILE = "sim.nc"
SLICES = {  # group name -> (x, y) axes of the slice
    "alpha_sigma_w": ("alpha", "sigma_w"),
    "sigma_a_alpha": ("sigma_a", "alpha"),
}


def _lin(spec):
    lo, hi, k = spec
    return np.round(np.linspace(lo, hi, int(k)), 10)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Grid sizes, simulation widths and the figures' fixed hyperparameters."""

    name: str = "full"
    # theory grids: (start, stop, count)
    theory_sigma_w: tuple = (0.3, 4.0, 241)
    theory_alpha: tuple = (0.01, 0.99, 197)
    theory_sigma_a: tuple = (0.1, 5.0, 197)
    slice_sigma_w: float = 2.0        # sigma_w of the (sigma_A, alpha) slice
    # simulated grids
    sim_sigma_w: tuple = (0.5, 3.5, 13)
    sim_alpha: tuple = (0.1, 0.9, 9)
    sim_sigma_a: tuple = (0.25, 4.0, 7)
    sim_alpha_b: tuple = (0.1, 0.9, 7)
    width: int = 512
    seeds: int = 16
    causal_width: int = 512
    causal_seeds: int = 16
    # Figs. 2-3
    fig_sigma_w: tuple = (1.0, 3.0)   # either side of the transition at alpha = .5
    geometry_width: int = 512
    geometry_seeds: int = 16
    q0: float = 1.0
    rho0: float = 0.7
    rho_intra: float = 0.8            # Eq. 12 two-group input (q0 = 1)
    rho_inter: float = 0.2
    # fixed hyperparameters
    sigma_a: float = 1.0
    alpha: float = 0.5
    n_tokens: int = 32
    depth: int = 16
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]


FULL = Settings()
QUICK = Settings(
    name="quick",
    theory_sigma_w=(0.3, 4.0, 149), theory_alpha=(0.01, 0.99, 99), theory_sigma_a=(0.1, 5.0, 99),
    sim_sigma_w=(0.5, 3.5, 7), sim_alpha=(0.1, 0.9, 5), sim_sigma_a=(0.25, 4.0, 4),
    sim_alpha_b=(0.1, 0.9, 4),
    width=256, seeds=16, causal_width=256, causal_seeds=16,  # width 128 biases lambda_a by
    geometry_width=256, geometry_seeds=8,                    # -0.25 at alpha = .9
)
TINY = Settings(  # tests and notebooks: seconds, not minutes
    name="tiny",
    theory_sigma_w=(0.3, 4.0, 24), theory_alpha=(0.01, 0.99, 16), theory_sigma_a=(0.1, 5.0, 12),
    sim_sigma_w=(1.0, 3.0, 3), sim_alpha=(0.3, 0.7, 2), sim_sigma_a=(0.5, 3.0, 2),
    sim_alpha_b=(0.3, 0.7, 2),
    width=32, seeds=2, causal_width=32, causal_seeds=2,
    geometry_width=32, geometry_seeds=2, n_tokens=8, depth=4,
)
PRESETS = {"full": FULL, "quick": QUICK, "tiny": TINY}


# ------------------------------------------------------------------ optional full-Gram theory
def gram_module():
    """:mod:`phasefield.theory.gram` if it is installed, else ``None``."""
    try:
        from ..theory import gram
    except ImportError:
        return None
    return gram


# ------------------------------------------------------------------ theory
def theory_grids(s: Settings, progress: bool = False) -> dict:
    """The fine theory slices (``alpha_sigma_w``, ``sigma_a_alpha``) and the theory at
    the simulated grids' points (``*_sim``)."""
    from .. import sweep as thsweep

    common = dict(n_tokens=s.n_tokens, depth=s.depth, progress=progress)
    out = {
        "alpha_sigma_w": thsweep.sweep(sigma_w=_lin(s.theory_sigma_w), alpha=_lin(s.theory_alpha),
                                       sigma_a=s.sigma_a, **common),
        "sigma_a_alpha": thsweep.sweep(sigma_w=s.slice_sigma_w, sigma_a=_lin(s.theory_sigma_a),
                                       alpha=_lin(s.theory_alpha), **common),
        "alpha_sigma_w_sim": thsweep.sweep(sigma_w=_lin(s.sim_sigma_w), alpha=_lin(s.sim_alpha),
                                           sigma_a=s.sigma_a, **common),
        "sigma_a_alpha_sim": thsweep.sweep(sigma_w=s.slice_sigma_w, sigma_a=_lin(s.sim_sigma_a),
                                           alpha=_lin(s.sim_alpha_b), **common),
    }
    for ds in out.values():
        ds.attrs["settings"] = s.name
    return out


def causal_theory(s: Settings, gram) -> "object":
    """``gram.causal_exponents`` on the causal simulated grid (vmapped when possible)."""
    import jax
    import jax.numpy as jnp
    import xarray as xr

    from ..config import HParams

    sw, al = _lin(s.sim_sigma_w), _lin(s.sim_alpha)
    SW, AL = np.meshgrid(sw, al, indexing="ij")
    base = HParams(sigma_a=s.sigma_a, n_tokens=s.n_tokens, depth=s.depth)

    def point(w, a):
        out = gram.causal_exponents(base.replace(sigma_w=w, alpha_a=a, alpha_m=a))
        return out["lambda_a"], out["lambda_g"]

    try:  # jit: outputs not used here (e.g. the spectral lambda_a) are compiled away
        la, lg = jax.jit(jax.vmap(point))(jnp.asarray(SW.ravel()), jnp.asarray(AL.ravel()))
        la, lg = np.asarray(la, float), np.asarray(lg, float)
    except Exception:  # not vmappable: one point at a time
        vals = [point(float(w), float(a)) for w, a in zip(SW.ravel(), AL.ravel())]
        la = np.array([float(v[0]) for v in vals])
        lg = np.array([float(v[1]) for v in vals])
    ds = xr.Dataset({"lambda_a": (("sigma_w", "alpha"), la.reshape(SW.shape)),
                     "lambda_g": (("sigma_w", "alpha"), lg.reshape(SW.shape))},
                    coords={"sigma_w": sw, "alpha": al})
    ds.attrs.update(source="phasefield.theory.gram.causal_exponents", causal=1,
                    sigma_a=s.sigma_a, n_tokens=s.n_tokens, depth=s.depth)
    return ds


# ------------------------------------------------------------------ simulation
def sim_grid(s: Settings, which: str, parts_dir: str | None = None, progress: bool = False):
    """Simulated λ_a, λ_g(L) on the ``alpha_sigma_w`` / ``sigma_a_alpha`` / ``causal`` grid."""
    import jax.numpy as jnp  # noqa: F401

    from ..config import HParams
    from ..simulate import sweep as simsweep

    base = HParams(sigma_a=s.sigma_a, n_tokens=s.n_tokens, depth=s.depth)
    if which == "sigma_a_alpha":
        base = base.replace(sigma_w=s.slice_sigma_w)
        axes = dict(sigma_a=_lin(s.sim_sigma_a), alpha=_lin(s.sim_alpha_b))
    else:
        axes = dict(sigma_w=_lin(s.sim_sigma_w), alpha=_lin(s.sim_alpha))
    causal = which == "causal"
    width, seeds = (s.causal_width, s.causal_seeds) if causal else (s.width, s.seeds)
    n_points = int(np.prod([len(v) for v in axes.values()]))
    ds = simsweep.sweep(width=width, seeds=seeds, causal=causal, seed=s.seed, base=base,
                        chunk=min(n_points, 64), parts_dir=parts_dir, progress=progress, **axes)
    ds.attrs["settings"] = s.name
    return ds


def _hp(s: Settings, sigma_w: float):
    from ..config import HParams

    return HParams(sigma_w=float(sigma_w), sigma_a=s.sigma_a, alpha_a=s.alpha, alpha_m=s.alpha,
                   n_tokens=s.n_tokens, depth=s.depth)


MAP_STARTS = ((1.0, 0.1), (1.0, 0.4), (1.0, 0.7), (1.0, 0.95), (3.0, 0.5), (0.3, 0.5))


def fig2_data(s: Settings):
    """Token norm / cosine samples per layer (simulation) and the theory curves for Fig. 2."""
    import xarray as xr

    from .. import theory
    from ..simulate import measure

    L = s.depth
    parts = []
    for sw in s.fig_sigma_w:
        hp = _hp(s, sw)
        geo = measure.token_geometry(hp, s.q0, s.q0 * s.rho0, width=s.geometry_width,
                                     seeds=s.geometry_seeds, seed=s.seed)
        q, p = (np.asarray(v, float) for v in theory.trajectory(hp, s.q0, s.q0 * s.rho0, L))
        mq, mr = [], []
        for q0, r0 in MAP_STARTS:
            tq, tp = (np.asarray(v, float) for v in theory.trajectory(hp, q0, q0 * r0, L))
            mq.append(tq)
            mr.append(tp / tq)
        fq, frho, _, _ = (float(v) for v in theory.stable_fixed_point(hp))
        la = float(theory.angle_exponent(hp))
        parts.append(xr.Dataset(
            {"norms": (("layer", "token"), geo["norms"].astype(np.float32)),
             "cosines": (("layer", "pair"), geo["cosines"].astype(np.float32)),
             "q_theory": ("layer", q), "rho_theory": ("layer", p / q),
             "map_q": (("start", "layer"), np.array(mq)),
             "map_rho": (("start", "layer"), np.array(mr)),
             "q_fixed": ((), fq), "rho_fixed": ((), frho), "lambda_a": ((), la)},
            coords={"layer": np.arange(L + 1), "start": np.arange(len(MAP_STARTS))}))
    ds = xr.concat(parts, dim="sigma_w")
    ds = ds.assign_coords(sigma_w=np.asarray(s.fig_sigma_w, float),
                          start_q=("start", [a for a, _ in MAP_STARTS]),
                          start_rho=("start", [b for _, b in MAP_STARTS]))
    ds.attrs.update(width=s.geometry_width, seeds=s.geometry_seeds, q0=s.q0, rho0=s.rho0,
                    sigma_a=s.sigma_a, alpha=s.alpha, n_tokens=s.n_tokens, depth=s.depth,
                    settings=s.name)
    return ds


def fig3_data(s: Settings, gram=None):
    """Two-group (Eq. 12) symmetry restoration: simulated intra/inter cosines per layer,
    and the full-Gram theory when ``gram`` is given."""
    import xarray as xr

    from ..simulate import measure

    L = s.depth
    parts, note = [], "unavailable (phasefield.theory.gram not installed)"
    for sw in s.fig_sigma_w:
        hp = _hp(s, sw)
        g = measure.group_cosines(hp, s.q0, s.q0 * s.rho_intra, s.q0 * s.rho_inter,
                                  width=s.geometry_width, seeds=s.geometry_seeds, seed=s.seed)
        data = {k: ("layer", np.asarray(g[k], float)) for k in
                ("intra", "intra_se", "inter", "inter_se", "ratio", "ratio_se")}
        th_intra = th_inter = np.full(L + 1, np.nan)
        if gram is not None:
            try:
                th_intra, th_inter = _two_group(gram, hp, s, L)
                note = "full-Gram mean field (phasefield.theory.gram)"
            except Exception as exc:  # a sibling module's failure must not stop the figures
                note = f"failed ({type(exc).__name__}: {exc})"[:200]
        data["theory_intra"] = ("layer", th_intra)
        data["theory_inter"] = ("layer", th_inter)
        data["theory_ratio"] = ("layer", th_inter / th_intra)
        parts.append(xr.Dataset(data, coords={"layer": np.arange(L + 1)}))
    ds = xr.concat(parts, dim="sigma_w").assign_coords(sigma_w=np.asarray(s.fig_sigma_w, float))
    ds.attrs.update(width=s.geometry_width, seeds=s.geometry_seeds, q0=s.q0,
                    rho_intra=s.rho_intra, rho_inter=s.rho_inter, sigma_a=s.sigma_a,
                    alpha=s.alpha, n_tokens=s.n_tokens, depth=s.depth, theory=note,
                    settings=s.name)
    return ds


def _two_group(gram, hp, s, L):
    res = gram.two_group_trajectory(hp, s.q0, s.rho_intra, s.rho_inter, L)
    if isinstance(res, dict):
        intra = next(res[k] for k in ("intra", "rho_intra", "cos_intra") if k in res)
        inter = next(res[k] for k in ("inter", "rho_inter", "cos_inter") if k in res)
    else:
        intra, inter = res[0], res[1]
    intra, inter = np.asarray(intra, float).ravel(), np.asarray(inter, float).ravel()
    if intra.size == L:  # without the input layer
        intra = np.concatenate([[s.rho_intra], intra])
        inter = np.concatenate([[s.rho_inter], inter])
    return intra, inter


# ------------------------------------------------------------------ files
def _clean_attrs(ds):
    """netCDF attributes must be str / numbers / arrays of numbers."""
    for obj in [ds] + [ds[v] for v in ds.variables]:
        for k, v in list(obj.attrs.items()):
            if isinstance(v, bool):
                obj.attrs[k] = int(v)
            elif v is None:
                obj.attrs[k] = ""
            elif isinstance(v, dict):
                obj.attrs[k] = json.dumps(v)
    return ds


def save_groups(groups: dict, path: str) -> None:
    """Write ``{name: Dataset}`` as the groups of one netCDF file (atomically)."""
    import xarray as xr

    from ..cli.common import atomic_path

    tree = xr.DataTree.from_dict({f"/{k}": _clean_attrs(v.copy()) for k, v in groups.items()})
    with atomic_path(path) as tmp:
        tree.to_netcdf(tmp, engine="h5netcdf")


def _recognise(ds, path):
    dims = set(k for k, n in ds.sizes.items() if n > 1)
    for name, (x, y) in SLICES.items():
        if {x, y} == dims:
            if name == "alpha_sigma_w" and int(ds.attrs.get("causal", 0)):
                return "causal"
            return name
    raise ValueError(f"{path}: expected a 2-D grid over (alpha, sigma_w) or (sigma_a, alpha); "
                     f"got dimensions ({', '.join(ds.dims) or 'none'})")


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
        out[key] = ds
    for ds in groups.values():
        ds.close()
    if not out:
        raise ValueError(f"{path} holds no data variables")
    need = ("lambda_a", "lambda_g")
    for name, ds in out.items():
        if name in ("fig2", "fig3"):
            continue
        missing = [v for v in need if v not in ds]
        if missing:
            raise ValueError(f"{path} ({name}): missing variable(s) {', '.join(missing)}")
    return out


# ------------------------------------------------------------------ the whole computation
def compute(out_dir: str, s: Settings, echo: Callable[[str], None] = print,
            progress: bool = True, with_sim: bool = True) -> tuple[dict, dict]:
    """Compute every dataset (resuming from ``out_dir/.parts-<key>/``), write
    ``out_dir/sweep.nc`` and (``with_sim``) ``out_dir/sim.nc``, and return the
    ``(theory, sim)`` groups."""
    import xarray as xr

    parts = os.path.join(out_dir, f".parts-{s.name}-{s.key()}")
    os.makedirs(parts, exist_ok=True)
    gram = gram_module()

    def step(name, fn):
        path = os.path.join(parts, f"{name}.nc")
        if os.path.exists(path):
            echo(f"  {name}: reusing {path}")
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                return ds.load()
        t = time.time()
        ds = fn()
        _save_one(ds, path)
        echo(f"  {name}: {time.time() - t:.1f} s")
        return ds

    t0 = time.time()
    echo(f"theory sweeps ({s.name} settings)")
    th = theory_grids(s, progress=progress)
    echo(f"  4 grids, {sum(int(np.prod(list(d.sizes.values()))) for d in th.values())} points: "
         f"{time.time() - t0:.1f} s")
    if gram is not None:
        try:
            th["causal"] = step("theory_causal", lambda: causal_theory(s, gram))
        except Exception as exc:
            echo(f"  causal theory (phasefield.theory.gram) failed, skipped: {type(exc).__name__}: {exc}")
    else:
        echo("  causal theory: phasefield.theory.gram not available (Fig. 6 shows simulation only)")
    save_groups(th, os.path.join(out_dir, THEORY_FILE))
    if not with_sim:
        shutil.rmtree(parts, ignore_errors=True)
        return th, {}

    echo(f"simulations (width {s.width}, {s.seeds} draws; n = {s.n_tokens}, L = {s.depth})")
    sim = {}
    for which in ("alpha_sigma_w", "sigma_a_alpha", "causal"):
        sim[which] = step(f"sim_{which}", lambda w=which: sim_grid(
            s, w, parts_dir=os.path.join(parts, f"sim_{w}.parts"), progress=progress))
    sim["fig2"] = step("fig2", lambda: fig2_data(s))
    sim["fig3"] = step("fig3", lambda: fig3_data(s, gram))
    save_groups(sim, os.path.join(out_dir, SIM_FILE))
    shutil.rmtree(parts, ignore_errors=True)
    return th, sim


def _save_one(ds, path):
    from ..cli.common import atomic_path

    with atomic_path(path) as tmp:
        _clean_attrs(ds.copy()).to_netcdf(tmp, engine="h5netcdf")


# ------------------------------------------------------------------ agreement
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
        tv = np.round(th[d].values.astype(float), 8)
        sv = np.round(sim_ds[d].values.astype(float), 8)
        sel[d] = sv
        if not np.all(np.isin(sv, tv)):
            return th.interp({d: sim_ds[d].values for d in dims}), "interpolated"
    th = th.assign_coords({d: np.round(th[d].values.astype(float), 8) for d in dims})
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
    out = dict(grid=name, theory=how, points=int(np.prod([sim.sizes[d] for d in sim.dims])),
               width=int(sim.attrs.get("width", 0)), seeds=int(sim.attrs.get("seeds", 0)))
    for v in ("lambda_a", "lambda_g"):
        a = np.asarray(sim[v].transpose(*th[v].dims).values, float)
        b = np.asarray(th[v].values, float)
        err = np.abs(a - b)[np.isfinite(a - b)]
        out[v] = dict(median=float(np.median(err)) if err.size else float("nan"),
                      max=float(np.max(err)) if err.size else float("nan"))
        if f"{v}_se" in sim:
            se = np.asarray(sim[f"{v}_se"].values, float)
            out[v]["median_se"] = float(np.nanmedian(se))
    return out
