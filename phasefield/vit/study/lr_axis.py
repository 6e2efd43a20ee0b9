"""The learning-rate axis (the ``lr`` study): does the initialization carry the trained loss at
other learning rates and optimizers?"""

from __future__ import annotations

import os

from . import feature_cache as FC
from . import registry as R


def analyze_lr(st: dict, folds: int = 5, repeats: int = 5, log=print) -> dict:
    """Per (optimizer, lr), the cross-validated families on the same L = 16 configurations
    (Adam 1e-3: the main study's runs, seed 0 alone to match the one seed of the others, and
    all three seeds), and the exponents' share of the explained variance,
    max(0, R2_CV(best exponent model)) / R2_CV(best model). Written to OUT/analysis.json."""
    import math

    import numpy as np

    from ... import io
    from .. import analysis
    from .. import sweep as vsweep
    from ..design import config_id

    main_feats = FC.read_feature_rows(FC.feature_path(R.DEFAULT_OUT))
    fe = {FC.hp_key(cid): r for cid, r in main_feats.items()}
    names = [k for k in next(iter(main_feats.values())) if k != "config"]
    main_rows = vsweep.read_results(R.DEFAULT_OUT)
    design_ids = {FC.hp_key(config_id(dict(c, lr=1e-3))) for c in R.configs(16, 24)}
    sets = {}
    for opt, out in R.sweep_dirs(st).items():
        for r in vsweep.read_results(out) if os.path.exists(os.path.join(out, "results.jsonl")) else []:
            sets.setdefault((opt, float(r["lr"])), []).append(r)
    ids_done = {k: {FC.hp_key(config_id(r)) for r in v} for k, v in sets.items()}
    common = set.intersection(*ids_done.values()) if ids_done else set()
    base = [r for r in main_rows if FC.hp_key(config_id(r)) in design_ids]
    sets[("adam", 1e-3)] = [r for r in base if int(r["seed"]) == 0]
    sets[("adam (3 seeds)", 1e-3)] = base
    width = R.train_config().width
    res = {}
    for (opt, lr), rows in sorted(sets.items(), key=lambda kv: (kv[0][0].startswith("sgd"), kv[0][1], kv[0][0])):
        rows = [r for r in rows if FC.hp_key(config_id(r)) in common] if common else rows
        order = sorted({config_id(r) for r in rows})
        feats = {k: np.array([float(fe[FC.hp_key(c)][k]) for c in order]) for k in names}
        rep = analysis.analyze(rows, 10, feats, order, k=folds, repeats=repeats, nested_cv=False)
        if not rep["cross_validated"]:
            log(f"{opt:15s} lr {lr:<7g}: {rep['message']}")
            continue
        m = rep["models"]
        r2 = lambda nm: m[nm]["cv_r2"]
        be, br, bh = rep["best_exponent_model"], rep["best_raw_model"], rep["best_hybrid_model"]
        best = max((be, br, bh), key=r2)
        tab = rep["table"]
        sw = np.asarray(tab["sigma_w"])
        res[f"{opt} {lr:g}"] = dict(
            optimizer=opt,
            lr=lr,
            n_configs=rep["n_configs"],
            n_runs=rep["n_runs"],
            relative_update=float(np.median(lr * math.sqrt(width) / sw)) if not opt.startswith("sgd") else None,
            mean_loss=float(np.mean(tab["loss"])),
            at_chance=int(np.sum(tab["n_failed"])),
            loss_sd=float(np.std(tab["loss"])),
            best_exponent=be,
            best_exponent_r2=r2(be),
            best_exponent_rmse=m[be]["cv_rmse"],
            best_raw=br,
            best_raw_r2=r2(br),
            best_raw_rmse=m[br]["cv_rmse"],
            best_hybrid=bh,
            best_hybrid_r2=r2(bh),
            constant_rmse=m["constant"]["cv_rmse"],
            exponent_share=float(max(0.0, r2(be)) / r2(best)) if r2(best) > 0 else None,
            exponent_vs_raw=rep["best_vs_raw_cv"].get(br),
            noise_floor=rep["noise_floor"].get("rmse"),
            r2={nm: v["cv_r2"] for nm, v in m.items()},
        )
        e = res[f"{opt} {lr:g}"]
        log(
            f"{opt:15s} lr {lr:<7g} {e['n_configs']:3d} configs  mean loss {e['mean_loss']:.3f} (sd {e['loss_sd']:.3f}, "
            f"{e['at_chance']} at chance)  CV R2: exponents {e['best_exponent_r2']:+.3f} ({be}), raw "
            f"{e['best_raw_r2']:+.3f} ({br}), hybrid {e['best_hybrid_r2']:+.3f} ({bh}); exponents' share "
            + ("-" if e["exponent_share"] is None else f"{e['exponent_share']:.2f}")
            + f"; paired sq. err. exp - raw {e['exponent_vs_raw']['mean']:+.4f} +- {e['exponent_vs_raw']['se']:.4f}",
            flush=True,
        )
    with open(os.path.join(st["out"], "analysis.json"), "w") as f:
        f.write(io.dumps(res, indent=1))
    return res
