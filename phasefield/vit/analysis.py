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
COLLAPSED = ("lambda_a", "lambda_g_collapse")
# features predict computes in about a millisecond at any depth (raw values and the two
# collapsed-point closed forms; a standard block's angle rate from collapsed tokens beside its
# lambda_a): the shipped model is chosen among models on these alone
EFFECTIVE = ("effective_depth", "effective_depth_attention", "effective_depth_mlp")
CHEAP = frozenset(RAW + COLLAPSED + ("angle_rate", "L_lambda_a", "L_angle_rate", "L_lambda_g_collapse") + EFFECTIVE)
LISTS = ("config", "run_losses", "run_failed", "lrs")
# a run "fails to train" when it diverged or ended within 5 % of chance (test loss >= 0.95 log C)
CHANCE_FRACTION = 0.95


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
        bad = [run_failed(r, target, l_sat) for r in rs]
        y = np.array([l_sat if b else float(r[target]) for r, b in zip(rs, bad)])
        out["config"].append(cid)
        for k in RAW + ("lr",):
            out[k].append(float(rs[0][k]))
        out["loss"].append(float(y.mean()))
        out["run_losses"].append(y.tolist())
        out["loss_var"].append(float(y.var(ddof=1)) if len(y) > 1 else math.nan)
        out["n_seeds"].append(len(y))
        out["n_diverged"].append(sum(bad))
        failed = [at_chance(r, l_sat, target) for r in rs]
        out["run_failed"].append([int(f) for f in failed])
        out["n_failed"].append(sum(failed))
        out["acc"].append(float(np.mean([float(r.get("test_acc") or 0.0) for r in rs])))
    tab = {k: (np.array(v) if k not in LISTS else v) for k, v in out.items()}
    tab["L_sat"] = l_sat
    tab["lrs"] = sorted(lrs)
    return tab


def run_failed(r: dict, target: str, l_sat: float) -> bool:
    """Diverged: flagged by the sweep, a missing or non-finite loss, or a loss that ended far
    above chance (> 2 log C; tables of older sweeps flagged only NaN)."""
    v = r.get(target)
    return bool(r.get("diverged")) or v is None or not math.isfinite(float(v)) or float(v) > 2 * l_sat


def at_chance(r: dict, l_sat: float, target: str = "test_loss") -> bool:
    """The run failed to train: it diverged (:func:`failed`) or its final ``target`` loss is
    within 5 % of chance, >= ``CHANCE_FRACTION`` x log C (the criterion of
    :mod:`phasefield.vit.failure`; the study's losses leave a gap below it)."""
    return run_failed(r, target, l_sat) or float(r[target]) >= CHANCE_FRACTION * l_sat


def noise_floor(tab: dict) -> dict:
    """The RMSE and R^2 that seed noise allows a perfect model of the seed means."""
    ok = tab["n_seeds"] > 1
    if not ok.any():
        return dict(rmse=math.nan, r2_max=math.nan, seed_sd=math.nan, n_configs=0)
    noise = float(np.mean(tab["loss_var"][ok] / tab["n_seeds"][ok]))
    var = float(np.var(tab["loss"]))
    return dict(
        rmse=math.sqrt(noise),
        r2_max=1.0 - noise / var if var > 0 else math.nan,
        seed_sd=float(np.sqrt(np.mean(tab["loss_var"][ok]))),
        seed_sd_max=float(np.sqrt(np.max(tab["loss_var"][ok]))),
        n_configs=int(ok.sum()),
        seeds=int(np.median(tab["n_seeds"])),
    )


def effective_depth(depth, alpha_a, alpha_m):
    """L (alpha_A^2 + alpha_M^2): the variance fraction the residual branches write into the
    stream, summed over the L blocks (a block keeps beta^2 = 1 - alpha^2 of its input and adds
    alpha^2 of new signal per branch; DeepScaleLM's scalings hold this sum at O(1))."""
    return np.asarray(depth, float) * (np.asarray(alpha_a, float) ** 2 + np.asarray(alpha_m, float) ** 2)


def effective_depths(depth, alpha_a, alpha_m) -> dict:
    """The :data:`EFFECTIVE` columns: the effective depth and its attention (L alpha_A^2) and
    MLP (L alpha_M^2) parts."""
    L = np.asarray(depth, float)
    return dict(
        effective_depth=effective_depth(L, alpha_a, alpha_m),
        effective_depth_attention=L * np.asarray(alpha_a, float) ** 2,
        effective_depth_mlp=L * np.asarray(alpha_m, float) ** 2,
    )


def add_features(tab: dict, feats: dict) -> dict:
    """Attach theory features (arrays aligned with the table), the depth-aware products
    L*lambda (and L*angle_rate) and the effective depths (:func:`effective_depths`)."""
    tab = dict(tab, **feats)
    L = tab["depth"]
    for k in list(feats):
        if k.startswith(("lambda_", "angle_rate")):
            tab["L_" + k] = L * tab[k]
    tab.update(effective_depths(L, tab["alpha_a"], tab["alpha_m"]))
    return tab


# ------------------------------------------------------------------------ model specs
def varying_raw(tab: dict) -> tuple:
    """The raw numbers (:data:`RAW`) that vary in ``tab``: a model's features."""
    return tuple(k for k in RAW if np.ptp(tab[k]) > 0)


def angle_feature(tab: dict) -> str:
    """The table's collapsed-point angle feature: ``lambda_a`` (the exponent at the collapsed
    fixed point) where every configuration has one, else ``angle_rate`` (a standard block's
    finite-depth angle rate from collapsed tokens: lambda_a is NaN where the block has no fixed
    point), where the table has it."""
    if "lambda_a" in tab and not np.isnan(np.asarray(tab["lambda_a"], float)).any():
        return "lambda_a"
    return "angle_rate" if "angle_rate" in tab else "lambda_a"


def model_specs(tab: dict) -> dict:
    """name -> (kind, features, group, options). Groups: 'exponents' (theory outputs only),
    'raw' (the hyperparameters alone), 'hybrid' (both). The angle feature is
    :func:`angle_feature`'s (``lambda_a`` or ``angle_rate``; ``a`` below)."""
    a = angle_feature(tab)
    collapsed = (a, "lambda_g_collapse")
    collapsed_l = collapsed + (f"L_{a}", "L_lambda_g_collapse")
    specs = {
        "paper_max": ("max", collapsed, "exponents"),
        f"{a}_only": ("one", (a,), "exponents"),
        "lambda_g_only": ("one", ("lambda_g_collapse",), "exponents"),
        "depth_max": ("max", (f"L_{a}", "L_lambda_g_collapse"), "exponents"),
    }
    for m in ("paper", "exact"):
        if f"angle_rate_in_{m}" not in tab:
            continue
        for corr in ("", "_corr"):
            specs[f"input_{m}{corr}_max"] = ("max", (f"angle_rate_in_{m}", f"lambda_g_in_{m}{corr}"), "exponents")
    specs["trees_collapsed"] = ("trees", collapsed, "exponents")
    specs["trees_collapsed_L"] = ("trees", collapsed_l, "exponents")
    inputs = [k for k in ("angle_rate_in_exact", "lambda_g_in_exact_corr", "rho_out_exact") if k in tab]
    if inputs:
        specs["trees_input_exact"] = ("trees", tuple(inputs), "exponents")
        specs["trees_all_exponents"] = (
            "trees",
            collapsed + ("lambda_g_inf",) + tuple(inputs) + collapsed_l[2:],
            "exponents",
        )
        specs["poly2_all_exponents"] = ("poly", collapsed + tuple(inputs), "exponents")
        specs["two_part_exponents"] = ("two_part", collapsed + tuple(inputs), "exponents")
    specs["poly2_collapsed"] = ("poly", collapsed_l, "exponents")
    specs["forest_collapsed_L"] = ("forest", collapsed_l, "exponents")
    specs["two_part_collapsed_L"] = ("two_part", collapsed_l, "exponents", dict(reg_kind="forest"))
    raw = varying_raw(tab)
    specs["linear_hp"] = ("poly", raw, "raw", dict(degree=1))
    specs["quad_hp"] = ("poly", raw, "raw", dict(degree=2))
    specs["trees_hp"] = ("trees", raw, "raw")
    specs["forest_hp"] = ("forest", raw, "raw")
    specs["two_part_hp"] = ("two_part", raw, "raw")
    specs["two_part_forest_hp"] = ("two_part", raw, "raw", dict(reg_kind="forest"))
    # the raw values with the effective depths (functions of them: group 'raw'): the
    # linear/two-part/ensemble forms chosen on the first 64 configurations (study.registry.
    # FAMILIES_FIXED_ON), the forest on the branches' effective depths and its ensemble after the
    # box's corners; every configuration trained later scores them as a held-out set
    if "effective_depth" in tab:
        eff = raw + ("effective_depth",)
        branches = raw + ("effective_depth_attention", "effective_depth_mlp")
        specs["linear_hp_eff"] = ("poly", eff, "raw", dict(degree=1))
        specs["two_part_hp_eff"] = ("two_part", eff, "raw")
        specs["two_part_eff"] = ("two_part", ("effective_depth", "sigma_a", "sigma_w"), "raw")
        specs["forest_hp_eff"] = ("forest", branches, "raw")
    # Gaussian processes: the held-out sets 'holdout' and 'holdout-boundary' showed every
    # tree/linear family at R2 0.4-0.6 on fresh configurations
    specs["gp_hp"] = ("gp", raw, "raw")
    specs["gp_hp_rough"] = ("gp", raw, "raw", dict(nu=0.5))
    # hybrids: the raw values and the collapsed exponents together
    hyb = raw + collapsed + (collapsed_l[2:] if "depth" in raw else ())
    specs["linear_hybrid"] = ("poly", hyb, "hybrid", dict(degree=1))
    specs["trees_hybrid"] = ("trees", hyb, "hybrid")
    specs["forest_hybrid"] = ("forest", hyb, "hybrid")
    specs["two_part_forest_hybrid"] = ("two_part", hyb, "hybrid", dict(reg_kind="forest"))
    specs["gp_hybrid"] = ("gp", hyb, "hybrid")
    # means of models of different families (lower variance on a small, bimodal table)
    if "effective_depth" in tab:
        specs["linear_hybrid_eff"] = ("poly", hyb + ("effective_depth",), "hybrid", dict(degree=1))
    ensembles = [
        ("ensemble_hp", ("two_part_hp", "quad_hp", "linear_hp"), "raw"),
        ("ensemble_hybrid", ("two_part_hp", "linear_hybrid", "depth_max"), "hybrid"),
    ]
    if "effective_depth" in tab:
        ensembles += [
            ("ensemble_hp_eff", ("linear_hp_eff", "two_part_hp_eff"), "raw"),
            ("ensemble_eff_forest", ("linear_hp_eff", "two_part_eff", "forest_hp_eff"), "raw"),
        ]
    for name, members, group in ensembles:
        mem = [(specs[m][0], tuple(specs[m][1]), specs[m][3] if len(specs[m]) > 3 else {}) for m in members]
        specs[name] = ("ensemble", tuple(dict.fromkeys(f for m in mem for f in m[1])), group, dict(members=mem))
    specs["constant"] = ("poly", (), "raw", dict(degree=0))
    return {k: (v[0], tuple(v[1]), v[2], v[3] if len(v) > 3 else {}) for k, v in specs.items()}


def design_matrix(tab, feats):
    return np.stack([tab[f] for f in feats], 1) if feats else np.zeros((len(tab["loss"]), 0))


def fit_model(spec, tab, mask=None, seed=0) -> M.Model:
    kind, feats, _, kw = spec
    mask = np.ones(len(tab["loss"]), bool) if mask is None else mask
    X, y = design_matrix(tab, feats)[mask], tab["loss"][mask]
    return M.make(kind, feats, tab["L_sat"], **kw).fit(X, y, seed=seed)


def cross_validate(spec, tab, k=5, repeats=5, seed=0) -> dict:
    """k-fold CV over configurations, ``repeats`` shuffles; pooled out-of-fold predictions."""
    from sklearn.model_selection import KFold

    y = tab["loss"]
    X = design_matrix(tab, spec[1])
    rmses, preds = [], np.zeros((repeats, len(y)))
    for rep in range(repeats):
        for tr, te in KFold(n_splits=k, shuffle=True, random_state=seed + rep).split(X):
            mask = np.zeros(len(y), bool)
            mask[tr] = True
            preds[rep, te] = fit_model(spec, tab, mask, seed=seed).predict(X[te])
        rmses.append(M.rmse(y, preds[rep]))
    return dict(
        cv_rmse=float(np.mean(rmses)), cv_rmse_sd=float(np.std(rmses)), cv_r2=M.r2(y, preds.mean(0)), oof=preds.mean(0)
    )


def transfer(spec, tab, train, test, seed=0) -> dict:
    if train.sum() < 8 or test.sum() < 1:
        return dict(rmse=math.nan, n_train=int(train.sum()), n_test=int(test.sum()))
    m = fit_model(spec, tab, train, seed)
    yhat = m.predict(design_matrix(tab, spec[1])[test])
    return dict(
        rmse=M.rmse(tab["loss"][test], yhat),
        n_train=int(train.sum()),
        n_test=int(test.sum()),
        sq_err=((tab["loss"][test] - yhat) ** 2).tolist(),
    )


def transfer_splits(tab) -> dict:
    L, sa = tab["depth"], tab["sigma_a"]
    out = {}
    if (L == 32).any() and ((L == 8) | (L == 16)).any():
        out["depth_8_16_to_32"] = ((L == 8) | (L == 16), L == 32)
    if (L <= 8).any() and (L >= 16).any():  # fit shallow, predict deep
        out["depth_le8_to_ge16"] = (L <= 8, L >= 16)
    if (sa > 2).any() and (sa <= 2).any():
        out["sigma_a_le2_to_gt2"] = (sa <= 2, sa > 2)
    return out


def paired(sq_a, sq_b) -> dict:
    """Mean difference of squared errors (a - b) and its standard error (paired over points)."""
    d = np.asarray(sq_a) - np.asarray(sq_b)
    return dict(mean=float(d.mean()), se=float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else math.nan)


# ------------------------------------------------------------------------ intervals
def subset(tab: dict, mask) -> dict:
    """The configurations of ``tab`` where ``mask`` holds (every per-configuration column)."""
    n = len(tab["loss"])
    idx = np.flatnonzero(mask)
    out = {}
    for k, v in tab.items():
        if isinstance(v, np.ndarray) and v.shape[:1] == (n,):
            out[k] = v[idx]
        elif k in ("config", "run_losses", "run_failed"):
            out[k] = [v[i] for i in idx]
        else:
            out[k] = v
    return out


def _quantiles(e: np.ndarray, level: float) -> dict:
    """Split-conformal two-sided quantiles of residuals ``e``: the floor(a (n+1))-th and
    ceil((1-a)(n+1))-th smallest, a = (1 - level)/2 (finite-sample coverage >= level for
    exchangeable residuals, up to the two tails' rounding)."""
    e = np.sort(np.asarray(e, float))
    n, a = len(e), (1 - level) / 2
    klo = min(max(int(np.floor(a * (n + 1))), 1), n)
    khi = min(max(int(np.ceil((1 - a) * (n + 1))), 1), n)
    return dict(lo=float(e[klo - 1]), hi=float(e[khi - 1]), n=int(n))


def conformal(pred, run_losses, level: float = 0.8, min_bin: int = 30, max_bins: int = 3) -> dict:
    """An interval for *one run's* final loss from out-of-fold predictions ``pred`` of the
    configurations' seed means and their runs' losses: residuals (run loss - prediction)
    pooled over runs, split into up to ``max_bins`` bins of the prediction (tertiles of the
    predictions; each bin >= ``min_bin`` residuals), with conformal quantiles per bin, since
    a run predicted near chance or at the edge of trainability scatters more (Mondrian
    conformal prediction, conditional on the predicted loss)."""
    pred = np.asarray(pred, float)
    counts = [len(r) for r in run_losses]
    p = np.repeat(pred, counts)
    e = np.concatenate([np.asarray(r, float) for r in run_losses]) - p
    n_bins = int(max(1, min(max_bins, len(e) // min_bin)))
    edges = np.quantile(pred, np.arange(1, n_bins) / n_bins) if n_bins > 1 else np.zeros(0)
    b = np.searchsorted(edges, p, side="right")
    overall = _quantiles(e, level)
    bins = [(_quantiles(e[b == j], level) if (b == j).sum() >= 10 else dict(overall)) for j in range(n_bins)]
    return dict(
        level=level,
        lo=overall["lo"],
        hi=overall["hi"],
        edges=edges.tolist(),
        bins=bins,
        n_residuals=int(len(e)),
        method=f"split conformal on out-of-fold residuals of single runs, {n_bins} bin(s) of the predicted loss",
    )


SCALE_OFFSET = 0.05  # x the median absolute residual: keeps log() finite without flattening small scales


def _scale_model(tab: dict, pred, mask, seed: int = 0) -> M.GP:
    """The local scale of one run's error: a GP of log(mean |run loss - prediction| + c) per
    configuration on the raw numbers that vary in ``tab``, c = SCALE_OFFSET x the median of
    those mean absolute residuals (so the scale is proportional to the residuals' own, in
    quiet and noisy regions alike)."""
    feats = varying_raw(tab)
    absres = np.array([np.mean(np.abs(np.asarray(r, float) - p)) for r, p in zip(tab["run_losses"], pred)])
    c = SCALE_OFFSET * float(np.median(absres[mask]))
    # L_sat 0: unused (the scale is read through GP.mean, never through the clipped predict)
    return M.GP(feats, 0.0).fit(design_matrix(tab, feats)[mask], np.log(absres[mask] + c), seed=seed)


def interval_scale(iv: dict, cols) -> np.ndarray:
    """The scaled interval's local scale at configurations ``cols`` (a mapping of the raw
    numbers to arrays: a configuration table, or predict's columns)."""
    g = M.from_json(iv["scale"])
    return np.exp(g.mean(np.stack([np.asarray(cols[f], float) for f in g.features], 1)))


def conformal_scaled(tab: dict, pred, level: float = 0.8, k: int = 5, seed: int = 0) -> dict:
    """An interval for *one run's* loss whose width follows the configuration (normalized
    split-conformal prediction): each run's residual (run loss - out-of-fold prediction
    ``pred`` of its configuration) is divided by a local scale s(x), the GP of
    :func:`_scale_model` fitted on the *other* folds' configurations (k-fold cross-fitting),
    and the interval is prediction + [q_lo, q_hi] s(x) with the conformal quantiles of those
    normalized residuals; the shipped s is refitted on every configuration. Near the failure
    boundary, where seeds split between training and chance, s is large; inside the box it is
    small (a Mondrian bin of the predicted loss cannot tell the two apart)."""
    from sklearn.model_selection import KFold

    pred = np.asarray(pred, float)
    n = len(pred)
    s = np.zeros(n)
    X = design_matrix(tab, varying_raw(tab))
    for tr, te in KFold(n_splits=min(k, n), shuffle=True, random_state=seed).split(X):
        mask = np.zeros(n, bool)
        mask[tr] = True
        s[te] = np.exp(_scale_model(tab, pred, mask, seed).mean(X[te]))
    counts = [len(r) for r in tab["run_losses"]]
    e = (np.concatenate([np.asarray(r, float) for r in tab["run_losses"]]) - np.repeat(pred, counts)) / np.repeat(
        s, counts
    )
    q = _quantiles(e, level)
    final = _scale_model(tab, pred, np.ones(n, bool), seed)
    # the CV coverage with the cross-fitted scales (the shipped scale has seen every configuration)
    inside = (q["lo"] <= e) & (e <= q["hi"])
    means = [q["lo"] * si <= float(np.mean(r)) - p <= q["hi"] * si for r, p, si in zip(tab["run_losses"], pred, s)]
    return dict(
        level=level,
        lo=q["lo"],
        hi=q["hi"],
        scale=final.to_json(),
        n_residuals=int(len(e)),
        cv_coverage=dict(
            runs=float(np.mean(inside)), means=float(np.mean(means)), n_runs=int(len(e)), n_configs=int(n)
        ),
        method="normalized split conformal on out-of-fold residuals of single runs, "
        "scaled by a Gaussian process of the mean absolute residual (cross-fitted)",
    )


def make_interval(kind: str, tab: dict, pred, level: float = 0.8, k: int = 5, seed: int = 0) -> dict:
    """The interval of the shipping procedure: ``"binned"`` (:func:`conformal`) or ``"scaled"``
    (:func:`conformal_scaled`)."""
    if kind == "scaled":
        return conformal_scaled(tab, pred, level, k, seed)
    if kind != "binned":
        raise ValueError(f"interval must be 'binned' or 'scaled' (got {kind!r})")
    return conformal(pred, tab["run_losses"], level)


def interval_bounds(iv: dict, y, cols=None) -> tuple[np.ndarray, np.ndarray]:
    """The interval at predictions ``y``: y + the residual quantiles of the bin ``y`` falls in
    (or of all residuals), or for a scaled interval y + [q_lo, q_hi] s(x) with s at the
    configurations ``cols`` (:func:`interval_scale`); the lower end clipped at 0."""
    y = np.asarray(y, float)
    if "scale" in iv:
        if cols is None:
            raise ValueError("a scaled interval needs the configurations' numbers (cols)")
        s = interval_scale(iv, cols)
        return np.maximum(0.0, y + iv["lo"] * s), y + iv["hi"] * s
    if iv.get("bins"):
        edges = np.asarray(iv["edges"], float)
        b = np.clip(np.searchsorted(edges, y, side="right"), 0, len(iv["bins"]) - 1)
        lo = y + np.array([iv["bins"][j]["lo"] for j in b])
        hi = y + np.array([iv["bins"][j]["hi"] for j in b])
    else:
        lo, hi = y + iv["lo"], y + iv["hi"]
    return np.maximum(0.0, lo), hi


def bounds_coverage(lo, hi, run_losses) -> dict:
    """Fraction of runs (and of seed means) inside intervals [lo, hi], one per configuration."""
    runs = [(a <= v <= b) for a, b, r in zip(lo, hi, run_losses) for v in r]
    means = [(a <= float(np.mean(r)) <= b) for a, b, r in zip(lo, hi, run_losses)]
    return dict(runs=float(np.mean(runs)), means=float(np.mean(means)), n_runs=len(runs), n_configs=len(means))


def coverage(iv: dict, pred, run_losses, cols=None) -> dict:
    """Fraction of runs (and of seed means) inside the interval at predictions ``pred``
    (``cols``: the configurations' numbers, for a scaled interval)."""
    return bounds_coverage(*interval_bounds(iv, pred, cols), run_losses)


def select_and_fit(
    tab: dict, names, specs, k: int = 5, repeats: int = 1, seed: int = 0, level: float = 0.8, interval: str = "binned"
):
    """The shipping procedure on a table: the model of ``names`` with the lowest CV RMSE,
    its conformal interval (``interval``: :func:`make_interval`) from its CV residuals,
    refitted on every configuration."""
    scores = {nm: cross_validate(specs[nm], tab, k, repeats, seed) for nm in names}
    best = min(names, key=lambda nm: scores[nm]["cv_rmse"])
    iv = make_interval(interval, tab, scores[best]["oof"], level, k, seed)
    return best, fit_model(specs[best], tab, seed=seed), iv


def evaluate_split(
    tab: dict, train, test, names, specs, k: int = 5, seed: int = 0, repeats: int = 2, interval: str = "binned"
) -> dict:
    """Run the whole shipping procedure (selection, interval, refit) on the ``train``
    configurations and score it on the ``test`` ones, which it never saw."""
    sub = subset(tab, train)
    kk = min(k, len(sub["loss"]))
    best, model, iv = select_and_fit(sub, names, specs, kk, repeats, seed, interval=interval)
    te = subset(tab, test)
    yhat = model.predict(design_matrix(te, specs[best][1]))
    lo, hi = interval_bounds(iv, yhat, te)
    return dict(
        chosen=best,
        pred=yhat.tolist(),
        loss=te["loss"].tolist(),
        run_losses=te["run_losses"],
        interval=iv,
        bounds=[lo.tolist(), hi.tolist()],
        coverage=bounds_coverage(lo, hi, te["run_losses"]),
    )


def nested(
    tab: dict,
    names,
    specs,
    k: int = 5,
    repeats: int = 1,
    seed: int = 0,
    inner_repeats: int = 2,
    interval: str = "binned",
) -> dict:
    """Grouped nested cross-validation of the shipping procedure: each outer fold of
    configurations is held out, the model is selected, its interval calibrated and the model
    refitted on the rest (inner k-fold CV), then scored on the held-out fold."""
    from sklearn.model_selection import KFold

    n = len(tab["loss"])
    preds, covered, covered_m, chosen = np.zeros((repeats, n)), [], [], []
    for rep in range(repeats):
        for tr, te in KFold(n_splits=k, shuffle=True, random_state=seed + 100 + rep).split(np.zeros(n)):
            m_tr = np.zeros(n, bool)
            m_tr[tr] = True
            r = evaluate_split(tab, m_tr, ~m_tr, names, specs, k, seed, inner_repeats, interval=interval)
            preds[rep, te] = r["pred"]
            lo, hi = r["bounds"]
            for a, b, runs in zip(lo, hi, r["run_losses"]):
                covered += [a <= v <= b for v in runs]
                covered_m.append(a <= float(np.mean(runs)) <= b)
            chosen.append(r["chosen"])
    y = tab["loss"]
    return dict(
        r2=M.r2(y, preds.mean(0)),
        rmse=float(np.mean([M.rmse(y, p) for p in preds])),
        coverage_runs=float(np.mean(covered)),
        coverage_means=float(np.mean(covered_m)),
        n_runs=len(covered),
        k_folds=k,
        repeats=repeats,
        chosen={c: chosen.count(c) for c in sorted(set(chosen))},
    )


# the candidates of the shipped model: a few per family, so that choosing among them by CV
# does not chase the noise of a table of ~100 configurations (every other model is scored and
# reported all the same; the selection's own noise is what the nested CV measures)
CANDIDATES = (
    "constant",
    "linear_hp",
    "quad_hp",
    "two_part_hp",
    "ensemble_hp",
    "linear_hp_eff",
    "two_part_hp_eff",
    "two_part_eff",
    "ensemble_hp_eff",
    "forest_hp_eff",
    "ensemble_eff_forest",
    "depth_max",
    "forest_collapsed_L",
    "linear_hybrid",
    "forest_hybrid",
    "two_part_forest_hybrid",
    "ensemble_hybrid",
    "linear_hybrid_eff",
    "gp_hp",
    "gp_hp_rough",
    "gp_hybrid",
)


def shippable(specs: dict) -> list[str]:
    """The candidates of the shipped model (:data:`CANDIDATES`) whose features predict
    computes cheaply (:data:`CHEAP`)."""
    return [nm for nm in CANDIDATES if nm in specs and set(specs[nm][1]) <= CHEAP]


def analyze(
    rows: list[dict],
    num_classes: int,
    feats: dict,
    configs_order: list[str],
    k: int = 5,
    repeats: int = 5,
    seed: int = 0,
    nested_cv: bool = True,
    interval: str = "binned",
) -> dict:
    """The whole report. ``feats`` are arrays aligned with ``configs_order`` (config ids);
    ``interval``: the shipped model's interval (:func:`make_interval`)."""
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
        return _uncrossvalidated(tab, rows, k)
    specs = model_specs(tab)
    floor = noise_floor(tab)
    res = {}
    for name, spec in specs.items():
        cv = cross_validate(spec, tab, k, repeats, seed)
        full = fit_model(spec, tab, seed=seed)
        yhat = full.predict(design_matrix(tab, spec[1]))
        res[name] = dict(
            kind=spec[0],
            features=list(spec[1]),
            group=spec[2],
            r2=M.r2(tab["loss"], yhat),
            cv_rmse=cv["cv_rmse"],
            cv_rmse_sd=cv["cv_rmse_sd"],
            cv_r2=cv["cv_r2"],
            cv_over_floor=cv["cv_rmse"] / floor["rmse"] if floor["rmse"] > 0 else math.nan,
            oof=cv["oof"].tolist(),
        )
    transfers = {}
    for split, (tr, te) in transfer_splits(tab).items():
        transfers[split] = {name: transfer(spec, tab, tr, te, seed) for name, spec in specs.items()}
        te_floor = np.sqrt(np.nanmean(tab["loss_var"][te] / tab["n_seeds"][te]))
        transfers[split]["_noise_floor"] = dict(rmse=float(te_floor))
    expo = [m for m in res if res[m]["group"] == "exponents"]
    raw = [m for m in res if res[m]["group"] == "raw" and m != "constant"]
    hyb = [m for m in res if res[m]["group"] == "hybrid"]
    best = min(expo, key=lambda m: res[m]["cv_rmse"])
    best_raw = min(raw, key=lambda m: res[m]["cv_rmse"])
    best_hyb = min(hyb, key=lambda m: res[m]["cv_rmse"])
    ship = shippable(specs)
    best_all = min(ship, key=lambda m: res[m]["cv_rmse"])
    iv = make_interval(interval, tab, res[best_all]["oof"], 0.8, k, seed)
    if "cv_coverage" not in iv:
        iv["cv_coverage"] = coverage(iv, res[best_all]["oof"], tab["run_losses"])
    nest = nested(tab, ship, specs, k, 1, seed, inner_repeats=min(2, repeats), interval=interval) if nested_cv else None
    y = tab["loss"]
    comparisons = {}
    for r in raw:
        comparisons[r] = paired((np.array(res[best]["oof"]) - y) ** 2, (np.array(res[r]["oof"]) - y) ** 2)
    for t in transfers.values():
        t["_best_vs_raw"] = {
            r: paired(t[best]["sq_err"], t[r]["sq_err"]) for r in raw if "sq_err" in t[best] and "sq_err" in t[r]
        }
        t["_best_hybrid_vs_raw"] = {
            r: paired(t[best_hyb]["sq_err"], t[r]["sq_err"])
            for r in raw
            if "sq_err" in t[best_hyb] and "sq_err" in t[r]
        }
    return dict(
        n_configs=n,
        n_runs=len(rows),
        seeds=floor.get("seeds"),
        L_sat=tab["L_sat"],
        lr=tab["lrs"][0],
        depths=sorted({int(v) for v in tab["depth"]}),
        k_folds=k,
        repeats=repeats,
        noise_floor=floor,
        models=res,
        transfer=transfers,
        best_exponent_model=best,
        best_raw_model=best_raw,
        best_hybrid_model=best_hyb,
        best_model=best_all,
        shippable=ship,
        interval=iv,
        nested=nest,
        best_vs_raw_cv=comparisons,
        cross_validated=True,
        table={kk: (v.tolist() if isinstance(v, np.ndarray) else v) for kk, v in tab.items()},
    )


def _uncrossvalidated(tab: dict, rows: list[dict], k: int) -> dict:
    """Fewer configurations than a k-fold CV needs: fit one fixed model on all of them (the
    linear model on the raw hyperparameters when there are enough configurations for its
    coefficients, else the constant), with an interval from its in-sample residuals
    (optimistic: nothing was held out)."""
    n = len(tab["loss"])
    specs = model_specs(tab)
    name = "linear_hp" if n >= len(specs["linear_hp"][1]) + 3 else "constant"
    model = fit_model(specs[name], tab)
    yhat = model.predict(design_matrix(tab, specs[name][1]))
    interval = conformal(yhat, tab["run_losses"], max_bins=1)
    interval["method"] = "in-sample residuals of single runs (not cross-validated: optimistic)"
    res = {
        name: dict(
            kind=specs[name][0],
            features=list(specs[name][1]),
            group=specs[name][2],
            r2=M.r2(tab["loss"], yhat),
            cv_rmse=None,
            cv_rmse_sd=None,
            cv_r2=None,
            cv_over_floor=None,
            oof=yhat.tolist(),
        )
    }
    return dict(
        n_configs=n,
        n_runs=len(rows),
        seeds=int(np.median(tab["n_seeds"])),
        L_sat=tab["L_sat"],
        lr=tab["lrs"][0],
        depths=sorted({int(v) for v in tab["depth"]}),
        k_folds=k,
        repeats=0,
        noise_floor=noise_floor(tab),
        models=res,
        transfer={},
        best_exponent_model=None,
        best_raw_model=name,
        best_hybrid_model=None,
        best_model=name,
        shippable=[name],
        interval=interval,
        nested=None,
        best_vs_raw_cv={},
        cross_validated=False,
        message=f"{n} configurations: too few to cross-validate (needs >= {max(10, 2 * k)}); "
        f"fitted {name} on all of them, with no CV score",
        table={kk: (v.tolist() if isinstance(v, np.ndarray) else v) for kk, v in tab.items()},
    )
