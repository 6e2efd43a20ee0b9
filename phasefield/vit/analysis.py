"""Does the initialization predict the trained loss? The analysis of a training sweep.

Input: the runs of a sweep (several seeds per configuration) and the theory features of
each configuration (:mod:`phasefield.vit.features`). Everything is scored on the
**seed-averaged** final test loss of each configuration, under k-fold cross-validation over
configurations (so the seeds of one configuration are always in the same fold), repeated
over several fold shuffles:

* the noise floor: seed-to-seed variance limits how well any model can predict a seed mean
  (RMSE_floor^2 = mean_c s_c^2 / n_c, best R^2 = 1 - RMSE_floor^2 / var(seed means));
* models on exponents alone (the paper's claim is that the hyperparameters act only
  through them) against the same kinds of model on the raw hyperparameters;
* transfer tests: fit on depths 8 and 16, predict depth 32; fit on sigma_A <= 2, predict
  sigma_A > 2 — where a theory should beat a regression that never saw the region.

A run that diverged (non-finite or far above chance) counts as chance loss log C in its
configuration's mean.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from . import models as M
from .design import config_id

RAW = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")
COLLAPSED = ("lambda_a", "lambda_g")


class AnalysisError(ValueError):
    """Not enough, or inconsistent, data (one-line message)."""


# ------------------------------------------------------------------------ the table
def configurations(rows: list[dict], num_classes: int, target: str = "test_loss") -> dict:
    """Seed-averaged table: one entry per configuration, columns as arrays."""
    l_sat = math.log(num_classes)
    groups = defaultdict(list)
    for r in rows:
        if r.get("depth") is None:
            raise AnalysisError("results table has no depth column")
        groups[config_id(r)].append(r)
    lrs = {float(r["lr"]) for r in rows}
    out = defaultdict(list)
    for cid, rs in groups.items():
        y = np.array([l_sat if (r.get("diverged") or r.get(target) is None or not math.isfinite(float(r[target])))
                      else float(r[target]) for r in rs])
        out["config"].append(cid)
        for k in RAW + ("lr",):
            out[k].append(float(rs[0][k]))
        out["loss"].append(float(y.mean()))
        out["loss_var"].append(float(y.var(ddof=1)) if len(y) > 1 else math.nan)
        out["n_seeds"].append(len(y))
        out["n_diverged"].append(sum(bool(r.get("diverged")) for r in rs))
        out["acc"].append(float(np.mean([float(r.get("test_acc") or 0.0) for r in rs])))
    tab = {k: (np.array(v) if k != "config" else v) for k, v in out.items()}
    tab["L_sat"] = l_sat
    tab["lrs"] = sorted(lrs)
    return tab


def noise_floor(tab: dict) -> dict:
    """The RMSE and R^2 that seed noise allows a perfect model of the seed means."""
    ok = tab["n_seeds"] > 1
    if not ok.any():
        return dict(rmse=math.nan, r2_max=math.nan, seed_sd=math.nan, n_configs=0)
    noise = float(np.mean(tab["loss_var"][ok] / tab["n_seeds"][ok]))
    var = float(np.var(tab["loss"]))
    return dict(rmse=math.sqrt(noise), r2_max=1.0 - noise / var if var > 0 else math.nan,
                seed_sd=float(np.sqrt(np.mean(tab["loss_var"][ok]))),
                seed_sd_max=float(np.sqrt(np.max(tab["loss_var"][ok]))), n_configs=int(ok.sum()),
                seeds=int(np.median(tab["n_seeds"])))


def add_features(tab: dict, feats: dict) -> dict:
    """Attach theory features (arrays aligned with the table) and the depth-aware products
    L*lambda."""
    tab = dict(tab, **feats)
    L = tab["depth"]
    for k in list(feats):
        if k.startswith("lambda_"):
            tab["L_" + k] = L * tab[k]
    return tab


# ------------------------------------------------------------------------ model specs
def model_specs(tab: dict) -> dict:
    """name -> (kind, features, group). Groups: 'exponents' (theory outputs only), 'raw'."""
    specs = {
        "paper_max": ("max", ("lambda_a", "lambda_g"), "exponents"),
        "lambda_a_only": ("one", ("lambda_a",), "exponents"),
        "lambda_g_only": ("one", ("lambda_g",), "exponents"),
        "depth_max": ("max", ("L_lambda_a", "L_lambda_g"), "exponents"),
    }
    for m in ("paper", "exact"):
        if f"lambda_a_in_{m}" not in tab:
            continue
        for corr in ("", "_corr"):
            specs[f"input_{m}{corr}_max"] = ("max", (f"lambda_a_in_{m}", f"lambda_g_in_{m}{corr}"), "exponents")
    specs["trees_collapsed"] = ("trees", ("lambda_a", "lambda_g"), "exponents")
    specs["trees_collapsed_L"] = ("trees", ("lambda_a", "lambda_g", "L_lambda_a", "L_lambda_g"), "exponents")
    inputs = [k for k in ("lambda_a_in_exact", "lambda_g_in_exact_corr", "rho_out_exact") if k in tab]
    if inputs:
        specs["trees_input_exact"] = ("trees", tuple(inputs), "exponents")
        specs["trees_all_exponents"] = ("trees", ("lambda_a", "lambda_g", "lambda_g_inf") + tuple(inputs)
                                        + ("L_lambda_a", "L_lambda_g"), "exponents")
        specs["poly2_all_exponents"] = ("poly", ("lambda_a", "lambda_g") + tuple(inputs), "exponents")
        specs["two_part_exponents"] = ("two_part", ("lambda_a", "lambda_g") + tuple(inputs), "exponents")
    specs["poly2_collapsed"] = ("poly", ("lambda_a", "lambda_g", "L_lambda_a", "L_lambda_g"), "exponents")
    raw = tuple(k for k in RAW if np.ptp(tab[k]) > 0)
    specs["linear_hp"] = ("poly", raw, "raw", dict(degree=1))
    specs["quad_hp"] = ("poly", raw, "raw", dict(degree=2))
    specs["trees_hp"] = ("trees", raw, "raw")
    specs["two_part_hp"] = ("two_part", raw, "raw")
    specs["constant"] = ("poly", (), "raw", dict(degree=0))
    return {k: (v[0], tuple(v[1]), v[2], v[3] if len(v) > 3 else {}) for k, v in specs.items()}


def _X(tab, feats):
    return np.stack([tab[f] for f in feats], 1) if feats else np.zeros((len(tab["loss"]), 0))


def fit_model(spec, tab, mask=None, seed=0) -> M.Model:
    kind, feats, _, kw = spec
    mask = np.ones(len(tab["loss"]), bool) if mask is None else mask
    X, y = _X(tab, feats)[mask], tab["loss"][mask]
    return M.make(kind, feats, tab["L_sat"], **kw).fit(X, y, seed=seed)


def cross_validate(spec, tab, k=5, repeats=5, seed=0) -> dict:
    """k-fold CV over configurations, ``repeats`` shuffles; pooled out-of-fold predictions."""
    from sklearn.model_selection import KFold

    y = tab["loss"]
    X = _X(tab, spec[1])
    rmses, preds = [], np.zeros((repeats, len(y)))
    for rep in range(repeats):
        for tr, te in KFold(n_splits=k, shuffle=True, random_state=seed + rep).split(X):
            mask = np.zeros(len(y), bool)
            mask[tr] = True
            preds[rep, te] = fit_model(spec, tab, mask, seed=seed).predict(X[te])
        rmses.append(M.rmse(y, preds[rep]))
    return dict(cv_rmse=float(np.mean(rmses)), cv_rmse_sd=float(np.std(rmses)), cv_r2=M.r2(y, preds.mean(0)),
                oof=preds.mean(0))


def transfer(spec, tab, train, test, seed=0) -> dict:
    if train.sum() < 8 or test.sum() < 1:
        return dict(rmse=math.nan, n_train=int(train.sum()), n_test=int(test.sum()))
    m = fit_model(spec, tab, train, seed)
    yhat = m.predict(_X(tab, spec[1])[test])
    return dict(rmse=M.rmse(tab["loss"][test], yhat), n_train=int(train.sum()), n_test=int(test.sum()),
                sq_err=((tab["loss"][test] - yhat) ** 2).tolist())


def transfer_splits(tab) -> dict:
    L, sa = tab["depth"], tab["sigma_a"]
    out = {}
    if (L == 32).any() and (L < 32).any():
        out["depth_8_16_to_32"] = (L < 32, L == 32)
    if (sa > 2).any() and (sa <= 2).any():
        out["sigma_a_le2_to_gt2"] = (sa <= 2, sa > 2)
    return out


def paired(sq_a, sq_b) -> dict:
    """Mean difference of squared errors (a - b) and its standard error (paired over points)."""
    d = np.asarray(sq_a) - np.asarray(sq_b)
    return dict(mean=float(d.mean()), se=float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else math.nan)


def analyze(rows: list[dict], num_classes: int, feats: dict, configs_order: list[str], k: int = 5,
            repeats: int = 5, seed: int = 0) -> dict:
    """The whole report. ``feats`` are arrays aligned with ``configs_order`` (config ids)."""
    tab = configurations(rows, num_classes)
    if len(tab["lrs"]) > 1:
        raise AnalysisError(f"the table mixes learning rates {tab['lrs']}; fit each separately")
    idx = {c: i for i, c in enumerate(configs_order)}
    try:
        order = np.array([idx[c] for c in tab["config"]])
    except KeyError as exc:
        raise AnalysisError(f"no theory features for configuration {exc}") from None
    tab = add_features(tab, {kk: np.asarray(v)[order] for kk, v in feats.items()})
    n = len(tab["loss"])
    if n < max(10, 2 * k):
        raise AnalysisError(f"need at least {max(10, 2 * k)} configurations to cross-validate (have {n})")
    specs = model_specs(tab)
    floor = noise_floor(tab)
    res = {}
    for name, spec in specs.items():
        cv = cross_validate(spec, tab, k, repeats, seed)
        full = fit_model(spec, tab, seed=seed)
        yhat = full.predict(_X(tab, spec[1]))
        res[name] = dict(kind=spec[0], features=list(spec[1]), group=spec[2], r2=M.r2(tab["loss"], yhat),
                         cv_rmse=cv["cv_rmse"], cv_rmse_sd=cv["cv_rmse_sd"], cv_r2=cv["cv_r2"],
                         cv_over_floor=cv["cv_rmse"] / floor["rmse"] if floor["rmse"] > 0 else math.nan,
                         oof=cv["oof"].tolist())
    transfers = {}
    for split, (tr, te) in transfer_splits(tab).items():
        transfers[split] = {name: transfer(spec, tab, tr, te, seed) for name, spec in specs.items()}
        te_floor = np.sqrt(np.nanmean(tab["loss_var"][te] / tab["n_seeds"][te]))
        transfers[split]["_noise_floor"] = dict(rmse=float(te_floor))
    expo = [m for m in res if res[m]["group"] == "exponents"]
    raw = [m for m in res if res[m]["group"] == "raw" and m != "constant"]
    best = min(expo, key=lambda m: res[m]["cv_rmse"])
    best_raw = min(raw, key=lambda m: res[m]["cv_rmse"])
    y = tab["loss"]
    comparisons = {}
    for r in raw:
        comparisons[r] = paired((np.array(res[best]["oof"]) - y) ** 2, (np.array(res[r]["oof"]) - y) ** 2)
    for split, t in transfers.items():
        t["_best_vs_raw"] = {r: paired(t[best]["sq_err"], t[r]["sq_err"]) for r in raw
                             if "sq_err" in t[best] and "sq_err" in t[r]}
    return dict(n_configs=n, n_runs=len(rows), seeds=floor.get("seeds"), L_sat=tab["L_sat"], lr=tab["lrs"][0],
                depths=sorted({int(v) for v in tab["depth"]}), k_folds=k, repeats=repeats, noise_floor=floor,
                models=res, transfer=transfers, best_exponent_model=best, best_raw_model=best_raw,
                best_vs_raw_cv=comparisons, table={kk: (v.tolist() if isinstance(v, np.ndarray) else v)
                                                   for kk, v in tab.items()})
