"""The paper block's failure model on the studies (``failure``): P(fails to train) under grouped
cross-validation on the pooled studies (configurations whole), shipped beside the loss model,
and scored on a study's runs none of its candidates saw."""

from __future__ import annotations

import os

from ... import io
from . import pooled
from . import provenance as P
from . import registry as R

FAILURE_FIGURE = os.path.join(R.IMAGES, "trainability_failure.png")


def _slim(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "oof"}


def main_report() -> dict:
    """The main analysis's report (OUT/analysis.json of the main study): the shipped loss model's
    out-of-fold predictions."""
    return io.read_json(os.path.join(R.DEFAULT_OUT, "analysis.json"))


def cross_validate(folds: int = 5, repeats: int = 5, table=None, log=print) -> dict:
    """Grouped CV of the failure candidates (:data:`phasefield.vit.failure.CANDIDATES`) and of
    the shipped stacked model (Platt scaling of the main analysis's loss model) on the pooled
    studies, written to OUT/failure.json. ``table``: :func:`pooled.pooled_table`'s result."""
    import datetime

    import numpy as np

    from .. import analysis, failure

    tab, T, cfg = table or pooled.pooled_table()
    specs = analysis.model_specs(tab)
    rep = dict(
        date=datetime.date.today().isoformat(),
        criterion="diverged, or test loss >= 0.95 log C",
        n_configs=int(len(tab["loss"])),
        n_runs=int(len(T["failed"])),
        n_failed=int(T["failed"].sum()),
        seeds=int(np.median(tab["n_seeds"])),
        k_folds=folds,
        repeats=repeats,
        shipped=failure.SHIPPED,
        candidates={},
    )
    main_rep = main_report()
    # Platt scaling of the shipped loss model (the main analysis's choice)
    rep["stacked_on"] = main_rep["best_model"]
    st = failure.cross_validate_stacked(tab, T, specs[main_rep["best_model"]], folds, repeats)
    rep["candidates"]["platt_loss"] = _slim(st)
    oof = dict(zip(main_rep["table"]["config"], main_rep["models"][main_rep["best_model"]]["oof"]))
    # the loss model's own out-of-fold ranking (what a user of 'predict' had before)
    rank = np.array([oof[c] for c in T["config"]])
    rep["loss_ranking"] = dict(
        auc=failure.auc(T["failed"], rank),
        model=main_rep["best_model"],
        note="AUC of ranking runs by the loss model's out-of-fold predicted loss",
    )
    for name in failure.CANDIDATES:
        rep["candidates"][name] = _slim(failure.cross_validate(name, T, folds, repeats))
        log(
            f"{name:26s} AUC {rep['candidates'][name]['auc']:.3f}  Brier {rep['candidates'][name]['brier']:.4f}",
            flush=True,
        )
    rep["oof_shipped"] = dict(config=T["config"], failed=T["failed"].tolist(), p=st["oof"])
    with io.atomic_path(os.path.join(R.DEFAULT_OUT, "failure.json")) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(rep, indent=1))
    return rep


def ship(rep: dict, tab: dict, folds: int, repeats: int) -> str:
    """Put the failure model (Platt scaling of the shipped loss model's out-of-fold predictions
    in the main analysis.json, with the grouped-CV scores of ``rep``) into the packaged model,
    and record it in the model's provenance; returns the model's path."""
    from .. import predict as vpredict

    path = R.model_path("paper")
    doc = io.read_json(path)
    main_rep = main_report()
    oof = dict(zip(main_rep["table"]["config"], main_rep["models"][main_rep["best_model"]]["oof"]))
    order = main_rep["table"]["config"]
    run_failed = dict(zip(tab["config"], tab["run_failed"]))
    doc["failure"] = vpredict.failure_doc(
        [oof[c] for c in order], [run_failed[c] for c in order], doc["L_sat"], main_rep["best_model"]
    )
    doc["failure"]["cv"] = {
        k: v
        for k, v in rep["candidates"]["platt_loss"].items()
        if k in ("auc", "brier", "log_loss", "brier_base", "n_runs", "n_failed", "k_folds", "repeats", "reliability")
    }
    doc["failure"]["cv"]["n_configs"] = rep["n_configs"]
    doc = P.with_provenance(doc, P.with_failure(doc, [R.study_name(d) for d in R.pooled_dirs()], folds, repeats))
    with io.atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(doc, indent=1))
    return path


def figure(doc: dict, tab: dict, held_out: dict | None = None) -> str:
    """docs/images/trainability_failure.png: P(fail) of ``doc`` over sigma_w x alpha_M, the
    pooled configurations' failures (and ``held_out``'s) marked."""
    from .. import figure as vfigure

    vfigure.failure_slice(doc, tab, FAILURE_FIGURE, **({} if held_out is None else dict(held_out=held_out)))
    return FAILURE_FIGURE


def score_study(st: dict, name: str, fit: str | None = None, table=None, draw: bool = False) -> dict:
    """The packaged failure model (or ``fit``'s) and the candidates fitted on the pooled studies
    (chosen before: the shipped one is fixed) scored on the runs of the study ``st`` (named
    ``name``), which none of them saw. Written to OUT/failure_score.json; ``draw``: the P(fail)
    figure with the study's configurations marked."""
    import datetime

    import numpy as np

    from .. import analysis, failure
    from .. import predict as vpredict
    from .. import sweep as vsweep
    from ..design import config_id

    tab, T, cfg = table or pooled.pooled_table()
    out = st["out"]
    rows = vsweep.read_results(out)
    doc = vpredict.load_model(fit)
    l_sat = doc["L_sat"]
    col = lambda k: np.array([float(r[k]) for r in rows])
    res = vpredict.predict(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc)
    y = np.array([int(analysis.at_chance(r, l_sat)) for r in rows])
    p = np.array([r["p_fail"] for r in res])
    rep = dict(
        date=datetime.date.today().isoformat(),
        study=name,
        n_runs=len(rows),
        n_configs=len({config_id(r) for r in rows}),
        model=doc["failure"]["name"],
        fitted_on=doc["failure"]["n_configs"],
    )
    rep["shipped"] = failure.scores(y, p)
    tab_new = analysis.add_features(analysis.configurations(rows, 10), {})
    T_new = failure.run_table(tab_new)
    rep["candidates"] = {}
    for cname in failure.CANDIDATES:
        m = failure.fit(cname, T)
        if not set(m.features) <= set(T_new):
            continue
        rep["candidates"][cname] = {
            k: v
            for k, v in failure.scores(T_new["failed"], m.predict_proba(failure.X_of(T_new, m.features))).items()
            if k != "reliability"
        }
    rep["runs"] = [
        dict(
            run=r["run"],
            failed=int(a),
            p_fail=float(b),
            loss=float(r["test_loss"]),
            predicted_loss=float(q["predicted_loss"]),
        )
        for r, a, b, q in zip(rows, y, p, res)
    ]
    with io.atomic_path(os.path.join(out, "failure_score.json")) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(rep, indent=1))
    if draw:
        ids = [config_id(r) for r in rows]
        cs = {c: [i for i, d in enumerate(ids) if d == c] for c in dict.fromkeys(ids)}
        held = dict(
            sigma_w=[float(rows[g[0]]["sigma_w"]) for g in cs.values()],
            alpha_m=[float(rows[g[0]]["alpha_m"]) for g in cs.values()],
            frac=[float(np.mean(y[g])) for g in cs.values()],
        )
        figure(doc, tab, held_out=held)
    return rep
