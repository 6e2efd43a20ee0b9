"""Predicting the final loss from the two exponents (the paper's Fig. 7, bottom left).

The model fitted (``form = "max-abs"``)::

    loss = min( L_sat,  b + max( w_a |lambda_a - c_a| , w_g |lambda_g - c_g| ) ),   w_a, w_g >= 0

with L_sat = log C the chance-level loss of C classes (fixed, not fitted): the loss grows with
the larger of the two weighted departures from criticality (c_a, c_g ~ 0 in the paper) and
saturates at uniform guessing. lambda_g is the finite-depth gradient exponent at the trained
depth. Parameters (b, w_a, c_a, w_g, c_g) are fitted with ``scipy.optimize.least_squares`` from
several deterministic and random starts, keeping the lowest cost.

Baselines, scored the same way (in-sample R^2 and k-fold cross-validated RMSE / R^2):
    lambda_a    min(L_sat, b + w |lambda_a - c|)
    lambda_g    min(L_sat, b + w |lambda_g - c|)
    linear_hp   ordinary least squares in the raw hyperparameters (sigma_w, alpha_a, alpha_m, sigma_a)
    quad_hp     least squares on all degree-<=2 monomials of the raw hyperparameters
    constant    the mean (R^2 = 0; its CV RMSE is the spread of the data)
Hyperparameters that are constant over the data set, or equal to another one (alpha_M = alpha_A
on a tied grid), are dropped from the raw baselines.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

HP_COLUMNS = ("sigma_w", "alpha_a", "alpha_m", "sigma_a")
FORM = "min(L_sat, b + max(w_a*|lambda_a - c_a|, w_g*|lambda_g - c_g|))"


class FitError(ValueError):
    """Not enough or malformed data to fit (one-line message)."""


# ---------------------------------------------------------------------------- model forms
def predict_max(theta, la, lg, l_sat):
    b, wa, ca, wg, cg = theta
    return np.minimum(l_sat, b + np.maximum(abs(wa) * np.abs(la - ca), abs(wg) * np.abs(lg - cg)))


def predict_one(theta, lam, l_sat):
    b, w, c = theta
    return np.minimum(l_sat, b + abs(w) * np.abs(lam - c))


def _least_squares(fun, starts):
    from scipy.optimize import least_squares

    best = None
    for x0 in starts:
        try:
            r = least_squares(fun, x0, method="trf", loss="linear", max_nfev=2000)
        except Exception:
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None:
        raise FitError("least squares failed from every start")
    return best.x


def fit_max(la, lg, y, l_sat, n_random: int = 24, seed: int = 0):
    rng = np.random.default_rng(seed)
    b0 = float(np.min(y))
    sa, sg = float(np.std(la) or 1.0), float(np.std(lg) or 1.0)
    span = float(np.ptp(y) or 1.0)
    starts = [np.array([b0, span / sa, 0.0, span / sg, 0.0]),
              np.array([b0, span / sa, 0.0, 0.0, 0.0]), np.array([b0, 0.0, 0.0, span / sg, 0.0]),
              np.array([b0, span / sa, float(np.median(la)), span / sg, float(np.median(lg))])]
    for _ in range(n_random):
        starts.append(np.array([rng.uniform(np.min(y) - span / 2, np.min(y) + span / 2),
                                rng.uniform(0, 3) * span / sa, rng.choice(la) if la.size else 0.0,
                                rng.uniform(0, 3) * span / sg, rng.choice(lg) if lg.size else 0.0]))
    theta = _least_squares(lambda t: predict_max(t, la, lg, l_sat) - y, starts)
    theta[1], theta[3] = abs(theta[1]), abs(theta[3])
    return theta


def fit_one(lam, y, l_sat, n_random: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    s = float(np.std(lam) or 1.0)
    span = float(np.ptp(y) or 1.0)
    starts = [np.array([float(np.min(y)), span / s, 0.0]), np.array([float(np.min(y)), span / s, float(np.median(lam))])]
    for _ in range(n_random):
        starts.append(np.array([rng.uniform(np.min(y) - span / 2, np.min(y) + span / 2), rng.uniform(0, 3) * span / s,
                                rng.choice(lam)]))
    theta = _least_squares(lambda t: predict_one(t, lam, l_sat) - y, starts)
    theta[1] = abs(theta[1])
    return theta


def _design(h, degree):
    cols = [np.ones(len(h))]
    k = h.shape[1]
    cols += [h[:, i] for i in range(k)]
    if degree >= 2:
        cols += [h[:, i] * h[:, j] for i in range(k) for j in range(i, k)]
    return np.stack(cols, 1)


def fit_poly(h, y, degree):
    coef, *_ = np.linalg.lstsq(_design(h, degree), y, rcond=None)
    return coef


# ------------------------------------------------------------------------ model registry
@dataclass
class _Model:
    name: str
    fit: callable  # (X dict, y, l_sat) -> params
    predict: callable  # (params, X dict, l_sat) -> yhat
    n_params: callable


def _models(hp_cols):
    def raw(X):
        return np.stack([X[c] for c in hp_cols], 1) if hp_cols else np.zeros((len(X["lambda_a"]), 0))

    return {
        "max": _Model("max", lambda X, y, L: fit_max(X["lambda_a"], X["lambda_g"], y, L),
                      lambda t, X, L: predict_max(t, X["lambda_a"], X["lambda_g"], L), lambda: 5),
        "lambda_a": _Model("lambda_a", lambda X, y, L: fit_one(X["lambda_a"], y, L),
                           lambda t, X, L: predict_one(t, X["lambda_a"], L), lambda: 3),
        "lambda_g": _Model("lambda_g", lambda X, y, L: fit_one(X["lambda_g"], y, L),
                           lambda t, X, L: predict_one(t, X["lambda_g"], L), lambda: 3),
        "linear_hp": _Model("linear_hp", lambda X, y, L: fit_poly(raw(X), y, 1),
                            lambda t, X, L: _design(raw(X), 1) @ t, lambda: 1 + len(hp_cols)),
        "quad_hp": _Model("quad_hp", lambda X, y, L: fit_poly(raw(X), y, 2),
                          lambda t, X, L: _design(raw(X), 2) @ t,
                          lambda: 1 + len(hp_cols) + len(hp_cols) * (len(hp_cols) + 1) // 2),
        "constant": _Model("constant", lambda X, y, L: np.array([float(np.mean(y))]),
                           lambda t, X, L: np.full(len(X["lambda_a"]), t[0]), lambda: 1),
    }


def r2(y, yhat) -> float:
    ss = float(np.sum((y - np.mean(y)) ** 2))
    return float(1.0 - np.sum((y - yhat) ** 2) / ss) if ss > 0 else float("nan")


def kfold_indices(n: int, k: int, seed: int = 0):
    idx = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(idx, k)]


# ---------------------------------------------------------------------------- main entry
def load_rows(path: str) -> list[dict]:
    """Rows of a results table: a sweep directory, results.json(l) or results.csv."""
    if os.path.isdir(path):
        for name in ("results.jsonl", "results.json", "results.csv"):
            if os.path.exists(os.path.join(path, name)):
                if name == "results.jsonl":
                    from .sweep import read_results

                    return read_results(path)
                path = os.path.join(path, name)
                break
        else:
            raise FitError(f"{path} holds no results table (results.jsonl/.json/.csv)")
    if not os.path.exists(path):
        raise FitError(f"no such file or directory: {path}")
    try:
        if path.endswith(".csv"):
            import csv

            with open(path) as f:
                rows = [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]
        elif path.endswith(".jsonl"):
            with open(path) as f:
                rows = [json.loads(l) for l in f if l.strip()]
        else:
            with open(path) as f:
                rows = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FitError(f"cannot read results table {path}: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FitError(f"{path} is not a results table (a list of runs)")
    return rows


def _num(v):
    if v in ("", None):
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return float(v)
    except ValueError:
        return v


def fit_rows(rows: list[dict], num_classes: int, target: str = "test_loss", k: int = 5, seed: int = 0,
             context: dict | None = None) -> dict:
    """Fit every model to the finished, non-diverged runs; return the fit document."""
    need = ("lambda_a", "lambda_g", target) + HP_COLUMNS
    for c in need:
        if rows and c not in rows[0]:
            raise FitError(f"results table has no column {c!r}")
    ok = [r for r in rows if not r.get("diverged") and all(r.get(c) is not None and math.isfinite(float(r[c])) for c in need)]
    n_div = sum(bool(r.get("diverged")) for r in rows)
    if len(ok) < max(8, k):
        raise FitError(f"need at least {max(8, k)} finished runs with exponents to fit (have {len(ok)}; "
                       f"{n_div} diverged, {len(rows)} in the table)")
    X = {c: np.array([float(r[c]) for r in ok]) for c in ("lambda_a", "lambda_g") + HP_COLUMNS}
    y = np.array([float(r[target]) for r in ok])
    l_sat = math.log(num_classes)
    hp_cols = []  # raw hyperparameters that vary, without duplicates (alpha_m == alpha_a on a tied grid)
    for c in HP_COLUMNS:
        if np.ptp(X[c]) > 0 and not any(np.array_equal(X[c], X[o]) for o in hp_cols):
            hp_cols.append(c)
    models = _models(hp_cols)
    folds = kfold_indices(len(y), k, seed)
    out = {}
    for name, m in models.items():
        theta = np.asarray(m.fit(X, y, l_sat), float)
        yhat = m.predict(theta, X, l_sat)
        cv = np.empty_like(y)
        for f in folds:
            tr = np.setdiff1d(np.arange(len(y)), f)
            Xtr = {c: v[tr] for c, v in X.items()}
            Xte = {c: v[f] for c, v in X.items()}
            t = np.asarray(m.fit(Xtr, y[tr], l_sat), float)
            cv[f] = m.predict(t, Xte, l_sat)
        out[name] = dict(params=theta.tolist(), n_params=m.n_params(), r2=r2(y, yhat),
                         rmse=float(np.sqrt(np.mean((y - yhat) ** 2))),
                         cv_rmse=float(np.sqrt(np.mean((y - cv) ** 2))), cv_r2=r2(y, cv))
    b, wa, ca, wg, cg = out["max"]["params"]
    doc = dict(form=FORM, target=target, L_sat=l_sat, num_classes=num_classes,
               params=dict(b=b, w_a=wa, c_a=ca, w_g=wg, c_g=cg),
               n_runs=len(ok), n_diverged=n_div, n_table=len(rows), k_folds=k, hp_columns=hp_cols,
               models=out, context=context or {})
    return doc


def predict_loss(fit: dict, lambda_a, lambda_g):
    p = fit["params"]
    theta = [p["b"], p["w_a"], p["c_a"], p["w_g"], p["c_g"]]
    return predict_max(theta, np.asarray(lambda_a, float), np.asarray(lambda_g, float), float(fit["L_sat"]))


def load_fit(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise FitError(f"cannot read fit file {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FitError(f"{path} is not a fit file (not JSON)") from None
    if not isinstance(doc, dict) or not {"params", "L_sat", "form"} <= set(doc):
        raise FitError(f"{path} is not a fit file written by 'phasefield fit'")
    p = doc["params"]
    if not isinstance(p, dict) or not all(isinstance(p.get(k), (int, float)) for k in ("b", "w_a", "c_a", "w_g", "c_g")):
        raise FitError(f"{path}: malformed fit parameters")
    return doc
