"""Phase-diagram figures of the seed paper (Figs. 2–6) and the phase diagram itself.

from phasefield import figures
figures.make_figures("out/figs", quick=True)              # compute, save data, draw
figures.make_figures("out/figs2", from_path="out/figs/sweep.nc",
                     sim_path="out/figs/sim.nc")          # redraw, no recomputation
figures.phase.critical_point(ds)                          # where lambda_a = lambda_g = 0

settings   what to compute: grid sizes, widths, presets (full, quick, tiny)
compute    computing the datasets (theory sweeps, simulations), resumably
files      the datasets' netCDF files: writing, loading
agreement  theory vs simulation on the simulated grids
paper   the figure functions (matplotlib, Agg backend), drawn from datasets only
phase   phase classification, zero contours and their intersection
style   sizes (single column, 3.4 in), symbols, diverging colour scales
demo    ``phasefield demo``: sweep + quick simulation + figures + summary
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import phase  # noqa: F401  (light: numpy only at import)

__all__ = ["make_figures", "load_inputs", "phase"]


def load_inputs(from_path: str | None, sim_path: str | None, echo: Callable = print):
    """Load the saved datasets (``ValueError`` with one line if unusable). Without
    ``sim_path``, a ``sim.nc`` next to ``from_path`` is used when present."""
    from . import files

    theory = files.load_groups(from_path, "theory") if from_path else None
    if sim_path is None and from_path is not None:
        sibling = os.path.join(os.path.dirname(os.path.abspath(from_path)), files.SIM_FILE)
        if os.path.isfile(sibling) and os.path.abspath(sibling) != os.path.abspath(from_path):
            sim_path = sibling
            echo(f"using the simulation data next to it: {sibling}")
    sim = files.load_groups(sim_path, "sim") if sim_path else None
    return theory, sim


def make_figures(
    out_dir: str,
    quick: bool = False,
    from_path: str | None = None,
    sim_path: str | None = None,
    settings=None,
    echo: Callable = print,
    progress: bool = True,
    inputs: tuple | None = None,
) -> dict:
    """Write the figures (PNG + PDF) and the datasets they were drawn from
    (``sweep.nc``, ``sim.nc``) into ``out_dir``.

    ``from_path``: a saved theory file (this function's ``sweep.nc`` or a ``phasefield
    sweep`` grid) — nothing is recomputed; ``sim_path``: saved simulations (else the
    ``sim.nc`` beside ``from_path``, else none: simulation panels are left out).
    Without ``from_path`` the theory is swept and (unless ``sim_path`` is given) the
    simulations run, with ``quick`` or full :class:`settings.Settings`.
    ``inputs``: the ``(theory, sim)`` groups already returned by :func:`load_inputs`.
    Returns ``dict(paths, theory, sim, settings, seconds)``.
    """
    from . import settings as presets

    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} exists and is not a directory")
    s = settings or (presets.QUICK if quick else presets.FULL)
    t0 = time.time()
    # load (and so validate) the inputs before writing anything
    theory, sim = inputs if inputs is not None else load_inputs(from_path, sim_path, echo)
    created = not os.path.exists(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    try:
        return _make(out_dir, s, t0, theory, sim, from_path, sim_path, echo, progress)
    except BaseException:
        if created:  # a failed first run leaves no empty folder (resumable parts stay)
            from ..io import remove_empty_dirs

            remove_empty_dirs(out_dir)
        raise


def _make(out_dir, s, t0, theory, sim, from_path, sim_path, echo, progress):
    from . import compute, files, paper

    if theory is None:
        theory, computed_sim = compute.compute(out_dir, s, echo=echo, progress=progress, with_sim=sim is None)
        if sim is None:
            sim = computed_sim
        else:
            files.save_groups(sim, os.path.join(out_dir, files.SIM_FILE))
    else:
        for groups, fname, src in ((theory, files.THEORY_FILE, from_path), (sim, files.SIM_FILE, sim_path)):
            if groups and not _same(src, os.path.join(out_dir, fname)):
                files.save_groups(groups, os.path.join(out_dir, fname))
    sim = sim or {}
    echo(f"figures -> {out_dir}")
    paths = paper.draw_all(theory, sim, out_dir, echo=echo)
    return dict(paths=paths, theory=theory, sim=sim, settings=s, seconds=time.time() - t0)


def _same(a, b):
    return a is not None and os.path.exists(b) and os.path.samefile(a, b)
