"""A pair of held-out sets pooled (``heldout``): the paper block's packaged models scored on the
runs of both sets together, with bootstrap intervals over configurations."""

from __future__ import annotations

import os

from ... import io
from . import registry as R


def report_path(name: str) -> str:
    """docs/data/trainability/heldout<N>.json of the pair ``holdout<N>``."""
    return os.path.join(R.DEFAULT_OUT, "held" + name.removeprefix("hold") + ".json")


def pool(name: str, resamples: int = 2000, seed: int = 0) -> dict:
    """The pair ``name`` of :data:`registry.HELDOUT` (``holdout2``, ``holdout3``): the packaged
    models' scores (``score`` and ``failure --study``, which must have run first) pooled over
    the runs of both sets: loss R^2 over runs and over seed means, the interval's coverage,
    P(fail) AUC, Brier score and reliability, with 95 % bootstrap intervals over
    configurations (``resamples`` resamples, ``seed``: the seeds of a configuration are
    resampled together). Written to :func:`report_path`."""
    if name not in R.HELDOUT:
        raise R.StudyError(f"heldout pools {' or '.join(R.HELDOUT)} (--study), not {name}")
    sets = R.HELDOUT[name]
    import numpy as np

    from .. import failure, models

    runs, model = [], None
    for sname in sets:
        out = R.STUDIES[sname]["out"]
        for fn, cmd in (("score.json", "score"), ("failure_score.json", "failure")):
            if not os.path.exists(os.path.join(out, fn)):
                raise R.StudyError(f"{out} has no {fn} yet ('{cmd} --study {sname}' first)")
        sc = io.read_json(os.path.join(out, "score.json"))
        fs = io.read_json(os.path.join(out, "failure_score.json"))
        model = model or sc["model"]
        pf = {r["run"]: r for r in fs["runs"]}
        for r in sc["runs"]:
            runs.append(
                dict(
                    r,
                    study=sname,
                    config=r["run"].rsplit("_s", 1)[0],
                    failed=pf[r["run"]]["failed"],
                    p_fail=pf[r["run"]]["p_fail"],
                )
            )
    cfgs = list(dict.fromkeys(r["config"] for r in runs))
    by = {c: [i for i, r in enumerate(runs) if r["config"] == c] for c in cfgs}
    y = np.array([r["loss"] for r in runs])
    p = np.array([r["pred"] for r in runs])
    lo, hi = np.array([r["interval"] for r in runs]).T
    f = np.array([r["failed"] for r in runs])
    q = np.array([r["p_fail"] for r in runs])

    def summary(sel_cfgs):
        ii = np.concatenate([by[c] for c in sel_cfgs])
        ym = np.array([y[by[c]].mean() for c in sel_cfgs])
        pm = np.array([p[by[c][0]] for c in sel_cfgs])
        return dict(
            r2_runs=models.r2(y[ii], p[ii]),
            r2_means=models.r2(ym, pm),
            rmse_runs=models.rmse(y[ii], p[ii]),
            coverage_runs=float(np.mean((lo[ii] <= y[ii]) & (y[ii] <= hi[ii]))),
            auc=failure.auc(f[ii], q[ii]),
            brier=failure.brier(f[ii], q[ii]),
        )

    rep = dict(studies=list(sets), n_configs=len(cfgs), n_runs=len(runs), n_failed=int(f.sum()), model=model)
    rep.update(summary(cfgs))
    rep["brier_base"] = failure.brier(f, np.full(len(f), f.mean()))
    rep["reliability"] = failure.reliability(f, q)
    rng = np.random.default_rng(seed)
    boot = [summary([cfgs[j] for j in rng.integers(0, len(cfgs), len(cfgs))]) for _ in range(resamples)]
    rep["bootstrap_95"] = {
        k: [float(np.nanpercentile([b[k] for b in boot], 2.5)), float(np.nanpercentile([b[k] for b in boot], 97.5))]
        for k in boot[0]
    }
    rep["bootstrap"] = f"{resamples:,} resamples of the configurations (seeds kept together), seed {seed}"
    rep["per_study"] = {n: summary([c for c in cfgs if runs[by[c][0]]["study"] == n]) for n in sets}
    with io.atomic_path(report_path(name)) as tmp:
        with open(tmp, "w") as fh:
            fh.write(io.dumps(rep, indent=1))
    return rep
