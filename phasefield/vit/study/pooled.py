"""The pooled studies: every digits run trained with the main study's config
(:data:`registry.POOLED`), the data of the paper block's shipped models."""

from __future__ import annotations

import os

from . import registry as R


def pooled_rows(out: str, pool: bool = True):
    """(training config, results directories, rows, {config id: study name}) of the study in
    ``out`` and, with ``pool``, every other :data:`registry.POOLED` study trained so far (each
    must have the same training config)."""
    from .. import sweep as vsweep
    from ..design import config_id
    from ..train import TrainConfig

    cfg = TrainConfig.from_dict(vsweep.read_sweep(out)["config"])
    dirs = [out]
    if pool:
        for name in R.POOLED[1:]:
            d = R.STUDIES[name]["out"]
            if os.path.exists(os.path.join(d, "results.jsonl")):
                if TrainConfig.from_dict(vsweep.read_sweep(d)["config"]) != cfg:
                    raise R.StudyError(f"{d} was trained with another config than {out}: cannot pool")
                dirs.append(d)
    rows, source = [], {}
    for d in dirs:
        for r in vsweep.read_results(d):
            rows.append(r)
            source[config_id(r)] = R.study_name(d)
    return cfg, dirs, rows, source


def pooled_table():
    """The configuration table of the pooled studies (:data:`registry.POOLED`; the shipped
    model's data) with their cached theory features attached, its run table, and the
    training config."""
    import numpy as np

    from .. import analysis, failure, features
    from .. import sweep as vsweep
    from ..design import config_id
    from ..train import TrainConfig

    dirs = R.pooled_dirs()
    cfg = TrainConfig.from_dict(vsweep.read_sweep(dirs[0])["config"])
    rows = [r for d in dirs for r in vsweep.read_results(d)]
    geometry, feats, order = features.read_caches(dirs, cfg)
    idx = {c: i for i, c in enumerate(order)}
    rows = [r for r in rows if config_id(r) in idx]
    tab = analysis.configurations(rows, 10)
    o = np.array([idx[c] for c in tab["config"]])
    tab = analysis.add_features(tab, {k: np.asarray(v)[o] for k, v in feats.items()})
    return tab, failure.run_table(tab), cfg


def planned_first() -> set:
    """The config ids of :data:`registry.FAMILIES_FIXED_ON` (Adam 1e-3): the configurations the
    candidate families were chosen on."""
    from ..design import config_id

    return {
        config_id(dict(c, lr=1e-3))
        for name, plan in R.FAMILIES_FIXED_ON.items()
        for d, lo, hi in R.blocks(R.parse_plan(plan))
        for c in R.configs(d, hi, R.STUDIES[name]["seed0"])[lo:hi]
    }
