"""A shipped model scored on a study's runs it never saw (``score``): the loss R^2 over single
runs and over seed means, RMSE, the interval's coverage and (a standard block's) P(fail)."""

from __future__ import annotations

import os

from . import registry as R


def _write(out: str, rep: dict) -> None:
    from ... import io

    with io.atomic_path(os.path.join(out, "score.json")) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(rep, indent=1))


def _seed_means(rows, y, p):
    import numpy as np

    from ..design import config_id

    ids = [config_id(r) for r in rows]
    groups = {c: [i for i, d in enumerate(ids) if d == c] for c in dict.fromkeys(ids)}
    return groups, np.array([y[g].mean() for g in groups.values()]), np.array([p[g[0]] for g in groups.values()])


def score_study(st: dict, name: str, fit: str | None = None) -> dict:
    """The paper block's packaged model (or the fit file ``fit``) on the runs of the study ``st``
    (named ``name``): R^2 of its predictions over single runs and over seed means, and the
    coverage of its interval. Written to OUT/score.json."""
    import numpy as np

    from .. import analysis, models
    from .. import predict as vpredict
    from .. import sweep as vsweep

    out = st["out"]
    rows = vsweep.read_results(out)
    if not rows:
        raise R.StudyError(f"{out} has no runs yet ('run --study {name}' first)")
    doc = vpredict.load_model(fit)
    col = lambda k: np.array([float(r[k]) for r in rows])
    res = vpredict.predict(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc)
    l_sat = doc["L_sat"]
    y = np.array([l_sat if analysis.run_failed(r, "test_loss", l_sat) else float(r["test_loss"]) for r in rows])
    p = np.array([r["predicted_loss"] for r in res])
    lo, hi = np.array([r["interval"] for r in res]).T
    r2 = models.r2
    groups, ym, pm = _seed_means(rows, y, p)
    rep = dict(
        model=doc.get("name"),
        family=doc.get("family"),
        fitted_on=doc.get("n_configs"),
        n_runs=len(rows),
        n_configs=len(groups),
        r2_means=r2(ym, pm) if len(groups) < len(rows) else None,
        rmse_means=float(np.sqrt(np.mean((ym - pm) ** 2))),
        r2_runs=r2(y, p),
        rmse_runs=float(np.sqrt(np.mean((y - p) ** 2))),
        coverage_runs=float(np.mean((lo <= y) & (y <= hi))),
        mean_loss=float(y.mean()),
        at_chance=int(sum(analysis.at_chance(r, l_sat) for r in rows)),  # the shared failure criterion
        warned=int(sum(bool(r["warnings"]) for r in res)),
        runs=[
            dict(run=r["run"], loss=float(a), pred=float(b), interval=[float(c), float(d)])
            for r, a, b, c, d in zip(rows, y, p, lo, hi)
        ],
    )
    _write(out, rep)
    return rep


def score_block(st: dict, name: str, fit: str | None = None) -> dict:
    """A standard block's shipped model (or ``fit``, which must be of that block) on a block
    study's runs (a held-out set ``<block>-holdout``, trained after the families and the
    shipping procedure were fixed, must share no configuration with its training study): loss
    R^2 over runs and seed means, RMSE, interval coverage; P(fail) AUC, Brier and its
    reliability table. Written to OUT/score.json."""
    import datetime

    import numpy as np

    from .. import analysis, failure, models
    from .. import predict as vpredict
    from .. import sweep as vsweep
    from ..design import config_id

    out, cfg = st["out"], R.block_cfg(st)
    rows = vsweep.read_results(out) if os.path.exists(os.path.join(out, "results.jsonl")) else []
    if not rows:
        raise R.StudyError(f"{out} has no runs yet ('run --study {name} --no-theory' first)")
    doc = vpredict.load_model(fit, block=cfg.block)
    train = st.get("holdout_of")
    if train:
        seen = {config_id(r) for r in vsweep.read_results(R.STUDIES[train]["out"])}
        overlap = seen & {config_id(r) for r in rows}
        if overlap:
            raise R.StudyError(f"{len(overlap)} configurations of {out} are in the training study {train}")
    col = lambda k: np.array([float(r[k]) for r in rows])
    res = vpredict.predict(
        col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc, block=cfg.block
    )
    l_sat = doc["L_sat"]
    y = np.array([l_sat if analysis.run_failed(r, "test_loss", l_sat) else float(r["test_loss"]) for r in rows])
    failed = np.array([int(analysis.at_chance(r, l_sat)) for r in rows])
    p = np.array([r["predicted_loss"] for r in res])
    pf = np.array([r["p_fail"] for r in res])
    lo, hi = np.array([r["interval"] for r in res]).T
    groups, ym, pm = _seed_means(rows, y, p)
    rep = dict(
        date=datetime.date.today().isoformat(),
        block=doc.get("block"),
        model=doc.get("name"),
        family=doc.get("family"),
        fitted_on=doc.get("n_configs"),
        n_runs=len(rows),
        n_configs=len(groups),
        r2_runs=models.r2(y, p),
        rmse_runs=float(np.sqrt(np.mean((y - p) ** 2))),
        r2_means=models.r2(ym, pm),
        rmse_means=float(np.sqrt(np.mean((ym - pm) ** 2))),
        coverage_runs=float(np.mean((lo <= y) & (y <= hi))),
        interval_level=doc["interval"]["level"],
        mean_loss=float(y.mean()),
        failure_model=doc["failure"]["name"],
        failure=failure.scores(failed, pf),
        warned=int(sum(bool(r["warnings"]) for r in res)),
        runs=[
            dict(
                run=r["run"],
                loss=float(a),
                pred=float(b),
                interval=[float(c), float(d)],
                failed=int(f),
                p_fail=float(q),
            )
            for r, a, b, c, d, f, q in zip(rows, y, p, lo, hi, failed, pf)
        ],
    )
    _write(out, rep)
    return rep
