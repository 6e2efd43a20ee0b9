"""Computing the datasets behind the figures, and the whole resumable computation.

:func:`compute` writes two netCDF files (:mod:`.files`): ``sweep.nc`` with the theory
groups (``alpha_sigma_w``, ``sigma_a_alpha``, their ``*_sim`` points, ``causal``) and
``sim.nc`` with the simulations (``alpha_sigma_w``, ``sigma_a_alpha``, ``causal``,
``fig2``, ``fig3``). Each finished dataset goes to ``DIR/.parts-<settings>-<hash>/`` at
once (the simulated sweeps their chunks too), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import numpy as np

from .. import io
from ..theory.precision import float64
from .files import SIM_FILE, THEORY_FILE, save_groups
from .settings import Settings, lin


# ------------------------------------------------------------------ theory
def theory_grids(s: Settings, progress: bool = False) -> dict:
    """The fine theory slices (``alpha_sigma_w``, ``sigma_a_alpha``) and the theory at
    the simulated grids' points (``*_sim``)."""
    from .. import diagram

    common = dict(n_tokens=s.n_tokens, depth=s.depth, progress=progress)
    out = {
        "alpha_sigma_w": diagram.sweep(
            sigma_w=lin(s.theory_sigma_w), alpha=lin(s.theory_alpha), sigma_a=s.sigma_a, **common
        ),
        "sigma_a_alpha": diagram.sweep(
            sigma_w=s.slice_sigma_w, sigma_a=lin(s.theory_sigma_a), alpha=lin(s.theory_alpha), **common
        ),
        "alpha_sigma_w_sim": diagram.sweep(
            sigma_w=lin(s.sim_sigma_w), alpha=lin(s.sim_alpha), sigma_a=s.sigma_a, **common
        ),
        "sigma_a_alpha_sim": diagram.sweep(
            sigma_w=s.slice_sigma_w, sigma_a=lin(s.sim_sigma_a), alpha=lin(s.sim_alpha_b), **common
        ),
    }
    for ds in out.values():
        ds.attrs["settings"] = s.name
    return out


@float64
def causal_theory(s: Settings) -> object:
    """``gram.causal_exponents`` on the causal simulated grid (vmapped, float64)."""
    import jax
    import jax.numpy as jnp
    import xarray as xr

    from .. import HParams

    gram = _paper().gram

    sw, al = lin(s.sim_sigma_w), lin(s.sim_alpha)
    SW, AL = np.meshgrid(sw, al, indexing="ij")
    base = HParams(sigma_a=s.sigma_a, n_tokens=s.n_tokens, depth=s.depth)

    def point(w, a):
        out = gram.causal_exponents(base.replace(sigma_w=w, alpha_a=a, alpha_m=a))
        return out["lambda_a"], out["lambda_g_collapse"]

    # jit: outputs not used here (e.g. the spectral lambda_a) are compiled away
    la, lg = jax.jit(jax.vmap(point))(jnp.asarray(SW.ravel()), jnp.asarray(AL.ravel()))
    la, lg = np.asarray(la, float), np.asarray(lg, float)
    ds = xr.Dataset(
        {
            "lambda_a": (("sigma_w", "alpha"), la.reshape(SW.shape)),
            "lambda_g_collapse": (("sigma_w", "alpha"), lg.reshape(SW.shape)),
        },
        coords={"sigma_w": sw, "alpha": al},
    )
    ds.attrs.update(
        source="phasefield.layers.paper.gram.causal_exponents",
        causal=1,
        sigma_a=s.sigma_a,
        n_tokens=s.n_tokens,
        depth=s.depth,
    )
    return ds


# ------------------------------------------------------------------ simulation
def sim_grid(s: Settings, which: str, parts_dir: str | None = None, progress: bool = False):
    """Simulated λ_a, λ_g(L) on the ``alpha_sigma_w`` / ``sigma_a_alpha`` / ``causal`` grid."""
    import jax.numpy as jnp  # noqa: F401

    from ..simulate import sweep as simsweep

    base = dict(sigma_a=s.sigma_a)
    if which == "sigma_a_alpha":
        base.update(sigma_w=s.slice_sigma_w)
        axes = dict(sigma_a=lin(s.sim_sigma_a), alpha=lin(s.sim_alpha_b))
    else:
        axes = dict(sigma_w=lin(s.sim_sigma_w), alpha=lin(s.sim_alpha))
    causal = which == "causal"
    width, seeds = (s.causal_width, s.causal_seeds) if causal else (s.width, s.seeds)
    n_points = int(np.prod([len(v) for v in axes.values()]))
    ds = simsweep.fixed_point_grid(
        ("paper", base),
        n_tokens=s.n_tokens,
        depth=s.depth,
        width=width,
        draws=seeds,
        causal=causal,
        seed=s.seed,
        chunk=min(n_points, 64),
        parts_dir=parts_dir,
        progress=progress,
        **axes,
    )
    ds.attrs["settings"] = s.name
    return ds


def _hp(s: Settings, sigma_w: float):
    from .. import HParams

    return HParams(
        sigma_w=float(sigma_w), sigma_a=s.sigma_a, alpha_a=s.alpha, alpha_m=s.alpha, n_tokens=s.n_tokens, depth=s.depth
    )


MAP_STARTS = ((1.0, 0.1), (1.0, 0.4), (1.0, 0.7), (1.0, 0.95), (3.0, 0.5), (0.3, 0.5))


def fig2_data(s: Settings):
    """Token norm / cosine samples per layer (simulation) and the theory curves for Fig. 2."""
    import xarray as xr

    paper = _paper()
    from ..layers import presets
    from ..simulate import measure

    L = s.depth
    parts = []
    for sw in s.fig_sigma_w:
        hp = _hp(s, sw)
        geo = measure.token_geometry(
            presets.paper(hp),
            s.q0,
            s.q0 * s.rho0,
            n_tokens=s.n_tokens,
            depth=L,
            width=s.geometry_width,
            draws=s.geometry_seeds,
            seed=s.seed,
        )
        q, p = (np.asarray(v, float) for v in paper.trajectory(hp, s.q0, s.q0 * s.rho0, L))
        mq, mr = [], []
        for q0, r0 in MAP_STARTS:
            tq, tp = (np.asarray(v, float) for v in paper.trajectory(hp, q0, q0 * r0, L))
            mq.append(tq)
            mr.append(tp / tq)
        fq, frho, _, _ = (float(v) for v in paper.stable_fixed_point(hp))
        la = float(paper.angle_exponent(hp))
        parts.append(
            xr.Dataset(
                {
                    "norms": (("layer", "token"), geo["norms"].astype(np.float32)),
                    "cosines": (("layer", "pair"), geo["cosines"].astype(np.float32)),
                    "q_theory": ("layer", q),
                    "rho_theory": ("layer", p / q),
                    "map_q": (("start", "layer"), np.array(mq)),
                    "map_rho": (("start", "layer"), np.array(mr)),
                    "q_fixed": ((), fq),
                    "rho_fixed": ((), frho),
                    "lambda_a": ((), la),
                },
                coords={"layer": np.arange(L + 1), "start": np.arange(len(MAP_STARTS))},
            )
        )
    ds = xr.concat(parts, dim="sigma_w")
    ds = ds.assign_coords(
        sigma_w=np.asarray(s.fig_sigma_w, float),
        start_q=("start", [a for a, _ in MAP_STARTS]),
        start_rho=("start", [b for _, b in MAP_STARTS]),
    )
    ds.attrs.update(
        width=s.geometry_width,
        seeds=s.geometry_seeds,
        q0=s.q0,
        rho0=s.rho0,
        sigma_a=s.sigma_a,
        alpha=s.alpha,
        n_tokens=s.n_tokens,
        depth=s.depth,
        settings=s.name,
    )
    return ds


def fig3_data(s: Settings):
    """Two-group (Eq. 12) symmetry restoration: simulated intra/inter cosines per layer,
    and the full-Gram theory."""
    import xarray as xr

    from ..layers import presets

    gram = _paper().gram
    from ..simulate import measure

    L = s.depth
    parts, note = [], "full-Gram mean field (phasefield.layers.paper.gram)"
    for sw in s.fig_sigma_w:
        hp = _hp(s, sw)
        g = measure.group_cosines(
            presets.paper(hp),
            s.q0,
            s.q0 * s.rho_intra,
            s.q0 * s.rho_inter,
            n_tokens=s.n_tokens,
            depth=L,
            width=s.geometry_width,
            draws=s.geometry_seeds,
            seed=s.seed,
        )
        data = {
            k: ("layer", np.asarray(g[k], float))
            for k in ("intra", "intra_se", "inter", "inter_se", "ratio", "ratio_se")
        }
        th_intra, th_inter = (
            np.asarray(v, float) for v in gram.two_group_trajectory(hp, s.q0, s.rho_intra, s.rho_inter, L)
        )
        data["theory_intra"] = ("layer", th_intra)
        data["theory_inter"] = ("layer", th_inter)
        data["theory_ratio"] = ("layer", th_inter / th_intra)
        parts.append(xr.Dataset(data, coords={"layer": np.arange(L + 1)}))
    ds = xr.concat(parts, dim="sigma_w").assign_coords(sigma_w=np.asarray(s.fig_sigma_w, float))
    ds.attrs.update(
        width=s.geometry_width,
        seeds=s.geometry_seeds,
        q0=s.q0,
        rho_intra=s.rho_intra,
        rho_inter=s.rho_inter,
        sigma_a=s.sigma_a,
        alpha=s.alpha,
        n_tokens=s.n_tokens,
        depth=s.depth,
        theory=note,
        settings=s.name,
    )
    return ds


# ------------------------------------------------------------------ the whole computation
def compute(
    out_dir: str, s: Settings, echo: Callable[[str], None] = print, progress: bool = True, with_sim: bool = True
) -> tuple[dict, dict]:
    """Compute every dataset (resuming from ``out_dir/.parts-<key>/``), write
    ``out_dir/sweep.nc`` and (``with_sim``) ``out_dir/sim.nc``, and return the
    ``(theory, sim)`` groups."""
    parts = os.path.join(out_dir, f".parts-{s.name}-{s.key()}")
    os.makedirs(parts, exist_ok=True)

    def step(name, fn):
        path = os.path.join(parts, f"{name}.nc")
        if os.path.exists(path):
            echo(f"  {name}: reusing {path}")
            return io.read_netcdf(path)
        t = time.time()
        ds = fn()
        io.write_netcdf(ds, path)
        echo(f"  {name}: {time.time() - t:.1f} s")
        return ds

    t0 = time.time()
    echo(f"theory sweeps ({s.name} settings)")
    th = theory_grids(s, progress=progress)
    echo(
        f"  4 grids, {sum(int(np.prod(list(d.sizes.values()))) for d in th.values())} points: {time.time() - t0:.1f} s"
    )
    th["causal"] = step("theory_causal", lambda: causal_theory(s))
    save_groups(th, os.path.join(out_dir, THEORY_FILE))
    if not with_sim:
        shutil.rmtree(parts, ignore_errors=True)
        return th, {}

    echo(f"simulations (width {s.width}, {s.seeds} draws; n = {s.n_tokens}, L = {s.depth})")
    sim = {}
    for which in ("alpha_sigma_w", "sigma_a_alpha", "causal"):
        sim[which] = step(
            f"sim_{which}",
            lambda w=which: sim_grid(s, w, parts_dir=os.path.join(parts, f"sim_{w}.parts"), progress=progress),
        )
    sim["fig2"] = step("fig2", lambda: fig2_data(s))
    sim["fig3"] = step("fig3", lambda: fig3_data(s))
    save_groups(sim, os.path.join(out_dir, SIM_FILE))
    shutil.rmtree(parts, ignore_errors=True)
    return th, sim


def _paper():
    """The paper preset's closed-form engine: the theory of the paper's figures."""
    from ..layers import registry

    return registry.lookup("paper").engine.namespace
