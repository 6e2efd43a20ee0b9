"""The standard blocks' loss predictors (pre-LN, post-LN): the paper block's candidate families
and shipping procedure (:func:`phasefield.vit.predict.fit_sweep`: grouped CV, nested CV,
conformal interval) on a block study with the block's own theory features
(:mod:`.feature_cache`), whether those rates carry the loss beyond the raw numbers
(:func:`rates_vs_raw`), the failure part (:func:`block_failure_doc`), the shipped model
(``phasefield/vit/trainability_model_<block>.json``) and its figures.
"""

from __future__ import annotations

import datetime
import os

from ... import io
from . import provenance as P
from . import registry as R
from .feature_cache import BLOCK_ATTENTION

# the pairs of the rates-vs-raw comparison: a model on the raw numbers against the same form with the
# block's own rates added (hybrid), and the best rates-only model against the best raw one
BLOCK_PAIRS = (
    ("linear_hybrid", "linear_hp"),
    ("forest_hybrid", "forest_hp"),
    ("two_part_forest_hybrid", "two_part_forest_hp"),
    ("linear_hybrid_eff", "linear_hp_eff"),
)


def rates_vs_raw(rep: dict) -> dict:
    """Do the block's own rates carry the trained loss beyond the raw numbers? Paired differences
    of the configurations' squared out-of-fold errors (negative: the first model is better), with
    their standard errors, overall and per depth, for the best rates-only model against the best
    raw model and for each raw form against the same form with the rates added."""
    import numpy as np

    from .. import analysis

    m, tab = rep["models"], rep["table"]
    y, L = np.asarray(tab["loss"]), np.asarray(tab["depth"])
    sq = lambda name: (np.asarray(m[name]["oof"]) - y) ** 2
    pairs = [(rep["best_exponent_model"], rep["best_raw_model"])] + [p for p in BLOCK_PAIRS if p[0] in m and p[1] in m]
    out = []
    for a, b in pairs:
        e = dict(
            with_rates=a,
            raw=b,
            cv_r2=[m[a]["cv_r2"], m[b]["cv_r2"]],
            cv_rmse=[m[a]["cv_rmse"], m[b]["cv_rmse"]],
            all=analysis.paired(sq(a), sq(b)),
            by_depth={},
        )
        for d in sorted(set(L.tolist())):
            k = L == d
            e["by_depth"][str(int(d))] = dict(n=int(k.sum()), **analysis.paired(sq(a)[k], sq(b)[k]))
        for split, t in rep.get("transfer", {}).items():
            if "sq_err" in t.get(a, {}) and "sq_err" in t.get(b, {}):
                e.setdefault("transfer", {})[split] = dict(
                    rmse=[t[a]["rmse"], t[b]["rmse"]], **analysis.paired(t[a]["sq_err"], t[b]["sq_err"])
                )
        out.append(e)
    return dict(
        pairs=out,
        note="paired mean of (squared OOF error with rates) - (squared OOF error raw) over "
        "configurations, +- its standard error; negative: the rates help",
    )


def block_failure_doc(rep: dict, model: dict, folds: int, repeats: int) -> tuple[dict, dict]:
    """The failure part of a block's model and its grouped-CV scores: Platt scaling of the loss
    model's out-of-fold predictions (the paper block's procedure) where failures were seen; where
    none was (pre-LN), a constant P(fail) = 3 / N (the rule of three: the 95 % upper bound on a
    failure rate after N runs without one)."""
    import numpy as np

    from .. import analysis, failure
    from .. import predict as vpredict

    tab = {
        k: (np.asarray(v) if isinstance(v, list) and k not in analysis.LISTS else v) for k, v in rep["table"].items()
    }
    n_runs = int(sum(len(r) for r in tab["run_failed"]))
    n_failed = int(sum(sum(r) for r in tab["run_failed"]))
    if n_failed == 0:
        bound = 3.0 / n_runs
        platt = failure.Logistic(
            ["predicted_loss"],
            degree=1,
            mean=[0.0],
            std=[1.0],
            coef=[0.0],
            intercept=float(np.log(bound / (1 - bound))),
        )
        doc = dict(
            name="rule_of_three",
            model=platt.to_json(),
            loss_model=model["name"],
            criterion=f"diverged, or final test loss >= {analysis.CHANCE_FRACTION:g} log C "
            f"(= {analysis.CHANCE_FRACTION * rep['L_sat']:.4f})",
            chance_fraction=analysis.CHANCE_FRACTION,
            threshold_loss=analysis.CHANCE_FRACTION * rep["L_sat"],
            n_configs=len(tab["run_failed"]),
            n_runs=n_runs,
            n_failed=0,
            note=f"no run failed in {n_runs} ({len(tab['run_failed'])} configurations): P(fail) is the rule "
            f"of three's 95 % upper bound 3/{n_runs} = {bound:.4f}, the same at every point of the box",
        )
        return doc, dict(n_runs=n_runs, n_failed=0, bound=bound)
    doc = vpredict.failure_doc(
        np.asarray(rep["models"][model["name"]]["oof"]), tab["run_failed"], rep["L_sat"], model["name"]
    )
    specs = analysis.model_specs(tab)
    T = failure.run_table(tab)
    st = failure.cross_validate_stacked(tab, T, specs[model["name"]], folds, repeats)
    cv = {
        k: v
        for k, v in st.items()
        if k
        in (
            "auc",
            "brier",
            "log_loss",
            "brier_base",
            "base_rate",
            "n_runs",
            "n_failed",
            "k_folds",
            "repeats",
            "reliability",
        )
    }
    cv["n_configs"] = len(tab["loss"])
    cands = {}
    for name in failure.CANDIDATES:
        cols = failure.CANDIDATES[name][1]
        # a candidate on lambda_a is left out where the block has no fixed point (lambda_a NaN)
        if set(cols) <= set(T) and all(np.isfinite(np.asarray(T[c], float)).all() for c in cols):
            c = failure.cross_validate(name, T, folds, repeats)
            cands[name] = {k: c[k] for k in ("auc", "brier") if k in c}
    doc["cv"] = cv
    return doc, dict(shipped=cv, candidates=cands)


def analyze_block(
    st: dict, name: str, folds: int = 5, repeats: int = 5, subset: int | None = None, available: bool = False
) -> tuple[dict, dict]:
    """A standard block's study ``st`` (named ``name``): the paper block's candidate families and
    shipping procedure on its runs and cached features, the rates-vs-raw comparison and the
    failure model. Returns (report, model document); the report goes to OUT/analysis.json
    unless ``subset`` (a quick look: the first ``subset`` configurations). ``available``: the
    configurations whose features are cached so far."""
    from .. import features
    from .. import predict as vpredict
    from .. import sweep as vsweep
    from ..design import config_id

    if st.get("holdout_of"):
        raise R.StudyError(f"{name} is a held-out set: score it ('score --study {name}')")
    out, cfg = st["out"], R.block_cfg(st)
    geometry, feats, order = features.read_cache(out, cfg)
    rows = vsweep.read_results(out)
    if subset:  # a quick look (tests): the first N configurations
        keep = set(list(dict.fromkeys(config_id(r) for r in rows))[:subset])
        rows = [r for r in rows if config_id(r) in keep]
    if available and feats is not None:  # the configurations with features so far
        rows = [r for r in rows if config_id(r) in set(order)]
    if feats is None or {config_id(r) for r in rows} - set(order):
        raise R.StudyError(f"{out}: features missing ('features --study {name}' first)")
    doc = vpredict.fit_sweep(rows, 10, cfg, geometry, feats, order, k=folds, repeats=repeats)
    rep, model = doc["report"], doc["model"]
    block = cfg.block_spec()[0]
    model.update(
        block=block,
        attention=BLOCK_ATTENTION,
        date=datetime.date.today().isoformat(),
        study=os.path.relpath(out, R.ROOT),
    )
    fdoc, fcv = block_failure_doc(rep, model, folds, repeats)
    model["failure"] = fdoc
    rep["failure"] = fcv
    rep["rates_vs_raw"] = rates_vs_raw(rep)
    rep["date"] = model["date"]
    if not subset:
        with io.atomic_path(os.path.join(out, "analysis.json")) as tmp:
            with open(tmp, "w") as f:
                f.write(io.dumps(rep, indent=1))
    return rep, model


def ship(model: dict, name: str, folds: int, repeats: int, available: bool = False) -> str:
    """Write a block's model document (with its provenance) into the package; returns its path."""

    path = R.model_path(model["block"])
    doc = P.with_provenance(model, P.block(model, name, folds, repeats, available=available))
    with io.atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(doc, indent=1))
    return path


def figures() -> None:
    """docs/images/blocks_predicted.png (every block with an analysis and a shipped model) and
    docs/images/blocks_failure_post-ln.png (P(fail) over sigma x alpha, measured failures marked)."""
    import numpy as np

    from .. import figure_blocks
    from .. import predict as vpredict

    reports = {}
    for name in ("pre-ln", "post-ln"):
        path = os.path.join(R.STUDIES[name]["out"], "analysis.json")
        if os.path.exists(path) and name in vpredict.shipped_blocks():
            reports[name] = (io.read_json(path), vpredict.load_model(block=name))
    if reports:
        figure_blocks.predicted_vs_measured(reports, os.path.join(R.IMAGES, "blocks_predicted.png"))
    if "post-ln" in reports:
        rep, doc = reports["post-ln"]
        held = None
        hdir = R.STUDIES["post-ln-holdout"]["out"]
        if os.path.exists(os.path.join(hdir, "results.jsonl")):
            from .. import analysis
            from .. import sweep as vsweep

            held = analysis.configurations(vsweep.read_results(hdir), 10)
        tab = {
            k: (np.asarray(v) if isinstance(v, list) and k not in ("config", "run_losses", "run_failed", "lrs") else v)
            for k, v in rep["table"].items()
        }
        figure_blocks.block_failure_slice(doc, tab, os.path.join(R.IMAGES, "blocks_failure_post-ln.png"), held_out=held)
