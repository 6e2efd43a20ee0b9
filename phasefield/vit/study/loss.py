"""The paper block's loss predictor on a study: the cross-validated analysis, its score on the
configurations trained after the candidate families were fixed, the figures and the shipped
model (``analyze``)."""

from __future__ import annotations

import os

from . import pooled
from . import provenance as P
from . import registry as R


def interval_kind(name: str) -> str:
    """The interval of a study's model: the main (pooled) analysis's follows the configuration
    ("scaled"; bins of the predicted loss under-covered the boundary box's runs), any other
    study's is binned by the predicted loss."""
    return "scaled" if name == "main" else "binned"


def analyze(st: dict, name: str, folds: int = 5, repeats: int = 5, log=print) -> dict:
    """Cross-validated analysis of whatever the study ``st`` (named ``name``) has trained so far:
    :func:`phasefield.vit.predict.fit_sweep` on its runs (the main study: pooled with every
    :data:`registry.POOLED` study trained so far) and their cached features. Where the table
    holds configurations beyond :data:`registry.FAMILIES_FIXED_ON` (trained after the model
    families were chosen), the shipping procedure fitted on those is scored on the rest
    (``report["holdout"]``: as shipped, and without the effective-depth candidates). Returns
    the fit document (``report``, ``model``) with ``studies`` (the names pooled) and
    ``interval_kind``."""
    import numpy as np

    from .. import analysis, features, models, predict
    from ..design import config_id

    cfg, dirs, rows, source = pooled.pooled_rows(st["out"], pool=name == "main")
    geometry, feats, order = features.read_caches(dirs, cfg)
    missing = {config_id(r) for r in rows} - set(order or [])
    if missing:
        log(f"{len(missing)} configurations have no features yet (run 'features' first); left out")
        rows = [r for r in rows if config_id(r) not in missing]
    log(
        f"{len({config_id(r) for r in rows})} configurations, {len(rows)} runs from "
        + ", ".join(os.path.relpath(d, R.ROOT) for d in dirs),
        flush=True,
    )
    interval = interval_kind(name)
    doc = predict.fit_sweep(rows, 10, cfg, geometry, feats, order, k=folds, repeats=repeats, interval=interval)
    rep = doc["report"]
    planned = pooled.planned_first()
    tab = {
        k: (np.asarray(v) if isinstance(v, list) and k not in analysis.LISTS else v) for k, v in rep["table"].items()
    }
    extra = np.array([c not in planned for c in tab["config"]])
    if extra.any() and (~extra).sum() >= 10:
        specs = analysis.model_specs(tab)
        ship = analysis.shippable(specs)
        rep["holdout"] = {}
        # the procedure as shipped, and as it was before the effective-depth candidates
        for variant, names in (
            ("shipped", ship),
            ("without_effective_depth", [n for n in ship if not set(analysis.EFFECTIVE) & set(specs[n][1])]),
        ):
            h = analysis.evaluate_split(tab, ~extra, extra, names, specs, folds, interval=interval)
            y, p = np.asarray(h["loss"]), np.asarray(h["pred"])
            held = [c for c, e in zip(tab["config"], extra) if e]
            r2 = models.r2
            by_study = {}
            for sname in dict.fromkeys(source[c] for c in held):
                m = np.array([source[c] == sname for c in held])
                lo, hi = (np.asarray(b)[m] for b in h["bounds"])
                by_study[sname] = dict(
                    n=int(m.sum()),
                    r2=r2(y[m], p[m]) if m.sum() > 1 else None,
                    rmse=float(np.sqrt(np.mean((y[m] - p[m]) ** 2))),
                    coverage=analysis.bounds_coverage(lo, hi, [h["run_losses"][i] for i in np.flatnonzero(m)]),
                )
            rep["holdout"][variant] = dict(
                n_train=int((~extra).sum()),
                n_test=int(extra.sum()),
                chosen=h["chosen"],
                r2=r2(y, p),
                rmse=float(np.sqrt(np.mean((y - p) ** 2))),
                coverage=h["coverage"],
                by_study=by_study,
                configs=held,
                pred=h["pred"],
                loss=h["loss"],
            )
        doc["model"]["holdout"] = {
            k: v for k, v in rep["holdout"]["shipped"].items() if k not in ("configs", "pred", "loss")
        }
    doc["studies"] = [R.study_name(d) for d in dirs]
    doc["interval_kind"] = interval
    return doc


def write_report(out: str, rep: dict) -> str:
    """OUT/analysis.json."""
    from ... import io

    path = os.path.join(out, "analysis.json")
    with open(path, "w") as f:
        f.write(io.dumps(rep, indent=1))
    return path


def figures(rep: dict, name: str, dataset: str = "digits") -> None:
    """docs/images/trainability[_<study>]_{fig7,plane,transfer}.png and, for the main study,
    trainability_shipped.png (the held-out configurations marked)."""
    from .. import figure

    tag = "" if name == "main" else f"_{name}"
    figure.fig7(rep, os.path.join(R.IMAGES, f"trainability{tag}_fig7.png"), dataset=dataset)
    figure.plane(rep, os.path.join(R.IMAGES, f"trainability{tag}_plane.png"))
    figure.transfer(rep, os.path.join(R.IMAGES, f"trainability{tag}_transfer.png"))
    if "effective_depth" in rep["table"] and name == "main":
        figure.shipped(
            rep,
            os.path.join(R.IMAGES, "trainability_shipped.png"),
            held_out=rep.get("holdout", {}).get("shipped", {}).get("configs"),
        )


def ship(doc: dict, folds: int, repeats: int) -> str:
    """Write the paper block's packaged model (``doc["model"]``, with its provenance) into the
    package; returns its path."""
    from ... import io

    model = P.with_provenance(doc["model"], P.paper(doc["model"], doc["studies"], folds, repeats, doc["interval_kind"]))
    path = R.model_path("paper")
    with open(path, "w") as f:
        f.write(io.dumps(model, indent=1))
    return path
