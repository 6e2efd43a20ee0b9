"""Training a study: its blocks of configurations, their projected cost, and the resumable run."""

from __future__ import annotations

import time

from . import registry as R


def plan_cost(st: dict) -> list[dict]:
    """The study's blocks in training order: depth, configurations lo-hi, runs, projected seconds
    (:data:`registry.SEC_PER_RUN_PER_BLOCK`) and their running total."""
    plan, settings = R.parse_plan(st["plan"]), R.parse_settings(st["settings"])
    n_set = sum(len(v) for v in settings.values())
    total, out = 0.0, []
    for d, lo, hi in R.blocks(plan):
        cost = (hi - lo) * st["seeds"] * n_set * R.SEC_PER_RUN_PER_BLOCK * d
        total += cost
        out.append(dict(depth=d, lo=lo, hi=hi, runs=(hi - lo) * st["seeds"] * n_set, seconds=cost, cumulative=total))
    return out


def run_study(
    st: dict, chunk: int = 12, until: float | None = None, progress: bool = True, theory: bool = True, log=print
) -> bool:
    """Train the study ``st`` (:func:`registry.study`) block by block, depths interleaved, every
    optimizer's learning rates (:func:`phasefield.vit.sweep.run_sweep`: runs already in the
    results table are skipped, so a rerun resumes); no checkpoints, no per-step metrics.
    ``until``: start no new block after this many seconds (False is returned then).
    ``theory=False`` leaves the rows' lambda columns empty (the feature cache holds the theory)."""
    from .. import data as vdata
    from .. import design
    from .. import sweep as vsweep

    plan, settings = R.parse_plan(st["plan"]), R.parse_settings(st["settings"])
    dirs = R.sweep_dirs(st)
    dataset = R.dataset_of(st)
    data = vdata.load(dataset, R.DATA[dataset]["image_size"])
    trainers = {opt: {} for opt in settings}
    t0 = time.time()
    for d, lo, hi in R.blocks(plan):
        for opt, lrs in settings.items():
            if until and time.time() - t0 > until:
                log(f"stopping: --until {until:.0f} s reached (resume by rerunning)", flush=True)
                return False
            runs = design.expand(R.study_configs(st, d, hi)[lo:hi], lrs=lrs, seeds=st["seeds"])
            log(
                f"[{time.time() - t0:7.0f} s] depth {d}, configurations {lo}-{hi}, {opt} lr "
                f"{', '.join(f'{v:g}' for v in lrs)}",
                flush=True,
            )
            s = vsweep.run_sweep(
                R.train_config(opt, dataset, st.get("block", "paper")),
                runs,
                dirs[opt],
                data,
                chunk=chunk,
                progress=progress,
                metrics=False,
                checkpoints=False,
                trainers=trainers[opt],
                theory=theory,
            )
            log(
                f"   trained {s['trained']} ({s['already_done']} done before, {s['diverged']} diverged) "
                f"in {s['seconds']:.0f} s",
                flush=True,
            )
    for opt, out in dirs.items():
        log(f"{opt}: {len(vsweep.read_results(out))} runs in {out}")
    return True
