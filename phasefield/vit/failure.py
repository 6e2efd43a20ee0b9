"""P(fails to train): the probability that one run of a configuration ends at chance.

**Criterion** (:func:`phasefield.vit.analysis.at_chance`, the one definition the analysis,
the study and this model share): a run *fails* when it diverged (flagged by the sweep, a
missing or non-finite loss, or a loss above 2 log C) or its final test loss is within 5 % of
chance, ``test_loss >= 0.95 log C`` (digits: C = 10, chance log 10 = 2.303, so >= 2.187).
On the study's runs the losses leave a gap there: on the first 579 (the main, depth,
corners and faces studies) none lies in [0.90, 0.95) log C.

**Model** (``SHIPPED`` = "platt_loss", chosen by the grouped CV below among the
``CANDIDATES``): Platt scaling of the shipped loss model's prediction,
P(fail) = expit(a + b (predicted_loss - m) / s), a logistic regression (scikit-learn) fitted
to the runs' 0/1 outcomes (each seed a row) against the loss model's *cross-validated*
(out-of-fold, configurations held out) predictions of their configurations, so the
calibration is that of predictions on unseen configurations. It uses the loss model's cheap
features (raw hyperparameters and effective depths) through its prediction, is monotone in
the predicted loss (b > 0), and is serialized as a few numbers beside the loss model in the
model file (no pickle). The other candidates are logistic regressions on the raw
hyperparameters, effective depths and collapsed exponents (degree 1 or 2) and a forest of
regression trees on the 0/1 outcome (:class:`Logistic`, :class:`ForestClassifier`).

**Scores** under grouped cross-validation (:func:`grouped_folds`: the groups are the
configurations, so the seeds of one configuration are never split between the training and
the test folds): AUC over runs, Brier score, log loss and a reliability table
(:func:`reliability`: predicted probability bins against the observed failure rate).
"""

from __future__ import annotations

import math

import numpy as np

from . import models as M

# the family, chosen among ``CANDIDATES`` by grouped 5-fold CV x 5 repeats on the 193
# configurations x 3 seeds of the main, depth, corners and faces studies, before any run of the
# boundary ('edges') study (stacked "platt_loss": AUC 0.961, Brier 0.037; the best direct
# logistic: AUC 0.951-0.955, Brier 0.037-0.038). The shipped model's data, fit and scores are in
# its file (its "provenance" and "failure" entries).
SHIPPED = "platt_loss"


class Logistic:
    """P(fail) = expit(w . monomials_{<= degree}((x - mean) / std) + b)."""

    kind = "logistic"

    def __init__(self, features, degree=1, C=1.0, mean=None, std=None, coef=None, intercept=None, log=()):
        self.features = list(features)
        self.degree, self.C = int(degree), float(C)
        self.log = [f for f in log]
        self.mean = None if mean is None else np.asarray(mean, float)
        self.std = None if std is None else np.asarray(std, float)
        self.coef = None if coef is None else np.asarray(coef, float)
        self.intercept = None if intercept is None else float(intercept)

    def _z(self, X):
        X = np.array(X, float, copy=True)
        for i, f in enumerate(self.features):
            if f in self.log:
                X[:, i] = np.log(np.maximum(X[:, i], 1e-12))
        return X

    def _design(self, X):
        return M.monomials((self._z(X) - self.mean) / self.std, self.degree)[:, 1:]

    def fit(self, X, y, seed=0):
        from sklearn.linear_model import LogisticRegression

        Z = self._z(X)
        self.mean, self.std = Z.mean(0), Z.std(0)
        self.std[self.std == 0] = 1.0
        y = np.asarray(y, int)
        if y.min() == y.max():  # one class only: a constant probability
            self.coef = np.zeros(self._design(X[:1]).shape[1])
            p = float(np.clip(y.mean(), 1e-3, 1 - 1e-3))
            self.intercept = math.log(p / (1 - p))
            return self
        lr = LogisticRegression(C=self.C, max_iter=5000).fit(self._design(X), y)
        self.coef, self.intercept = lr.coef_[0].astype(float), float(lr.intercept_[0])
        return self

    def score(self, X):
        return self._design(X) @ self.coef + self.intercept

    def predict_proba(self, X):
        return M.expit(self.score(np.atleast_2d(np.asarray(X, float))))

    def to_json(self) -> dict:
        return dict(
            kind=self.kind,
            features=self.features,
            degree=self.degree,
            C=self.C,
            log=self.log,
            mean=self.mean.tolist(),
            std=self.std.tolist(),
            coef=self.coef.tolist(),
            intercept=self.intercept,
        )


class ForestClassifier:
    """A random forest of regression trees on the 0/1 outcome (its mean leaf value is a
    probability), serialized tree by tree like :class:`phasefield.vit.models.Forest`."""

    kind = "forest"

    def __init__(self, features, trees=None, min_samples_leaf=6):
        self.features, self.trees, self.min_samples_leaf = list(features), trees, int(min_samples_leaf)

    def fit(self, X, y, seed=0):
        from sklearn.ensemble import RandomForestRegressor

        f = RandomForestRegressor(
            n_estimators=200, min_samples_leaf=self.min_samples_leaf, max_features=0.6, random_state=seed
        ).fit(X, np.asarray(y, float))
        self.trees = [M.tree_doc(e.tree_) for e in f.estimators_]
        return self

    def predict_proba(self, X):
        X = np.atleast_2d(np.asarray(X, float))
        return np.clip(np.mean([M.tree_predict(t, X) for t in self.trees], axis=0), 0.0, 1.0)

    def to_json(self) -> dict:
        return dict(kind=self.kind, features=self.features, trees=self.trees, min_samples_leaf=self.min_samples_leaf)


def from_json(doc: dict):
    if not isinstance(doc, dict):
        raise ValueError("failure model: not an object")
    if doc.get("kind") == "logistic":
        m = Logistic(
            doc["features"],
            doc["degree"],
            doc["C"],
            doc["mean"],
            doc["std"],
            doc["coef"],
            doc["intercept"],
            doc.get("log", ()),
        )
        if len(m.mean) != len(m.features) or len(m.std) != len(m.features):
            raise ValueError("failure model: mean/std do not match its features")
        if len(m.coef) != M.monomials(np.zeros((1, len(m.features))), m.degree).shape[1] - 1:
            raise ValueError("failure model: coefficients do not match its features and degree")
        return m
    if doc.get("kind") == "forest":
        return ForestClassifier(doc["features"], doc["trees"], doc.get("min_samples_leaf", 6))
    raise ValueError(f"unknown failure model kind {doc.get('kind')!r}")


# ------------------------------------------------------------------------ candidates
RAW4 = ("sigma_w", "sigma_a", "alpha_a", "alpha_m")
# name -> (class, features, options). Chosen among on the existing data only (see SHIPPED).
CANDIDATES = {
    "logistic_raw": ("logistic", RAW4 + ("depth",), dict(degree=1)),
    "logistic_raw_eff": ("logistic", RAW4 + ("depth", "effective_depth"), dict(degree=1)),
    "logistic_branches": (
        "logistic",
        ("sigma_w", "sigma_a", "effective_depth_attention", "effective_depth_mlp"),
        dict(degree=1),
    ),
    "logistic_sw_sa_eff2": (
        "logistic",
        ("sigma_w", "sigma_a", "effective_depth_attention", "effective_depth_mlp"),
        dict(degree=2),
    ),
    "logistic_raw_eff2": ("logistic", RAW4 + ("depth", "effective_depth"), dict(degree=2)),
    "logistic_log_branches2": (
        "logistic",
        ("sigma_w", "sigma_a", "effective_depth_attention", "effective_depth_mlp"),
        dict(degree=2, log=("sigma_w", "sigma_a", "effective_depth_attention", "effective_depth_mlp")),
    ),
    "logistic_hybrid": (
        "logistic",
        ("sigma_w", "sigma_a", "effective_depth_attention", "effective_depth_mlp", "lambda_a", "lambda_g_collapse"),
        dict(degree=1),
    ),
    "logistic_raw_eff_C01": ("logistic", RAW4 + ("depth", "effective_depth"), dict(degree=1, C=0.1)),
    "logistic_raw_eff_C10": ("logistic", RAW4 + ("depth", "effective_depth"), dict(degree=1, C=10.0)),
    "logistic_log_raw_eff": (
        "logistic",
        RAW4 + ("depth", "effective_depth"),
        dict(degree=1, log=("sigma_w", "sigma_a", "depth", "effective_depth")),
    ),
    "logistic_raw_branches": (
        "logistic",
        RAW4 + ("depth", "effective_depth_attention", "effective_depth_mlp"),
        dict(degree=1),
    ),
    "logistic_eff3": ("logistic", ("effective_depth", "sigma_a", "sigma_w"), dict(degree=1)),
    "logistic_raw_eff2_C01": ("logistic", RAW4 + ("depth", "effective_depth"), dict(degree=2, C=0.05)),
    "logistic_raw_eff_lambda": (
        "logistic",
        RAW4 + ("depth", "effective_depth", "lambda_a", "lambda_g_collapse"),
        dict(degree=1),
    ),
    "forest_raw_eff_leaf12": ("forest", RAW4 + ("depth", "effective_depth"), dict(min_samples_leaf=12)),
    "forest_branches": ("forest", RAW4 + ("depth", "effective_depth_attention", "effective_depth_mlp"), {}),
}


def fit_platt(pred, run_failed, C: float = 1.0) -> Logistic:
    """The "platt_loss" model: a degree-1 logistic regression of the runs' outcomes
    (``run_failed``: per configuration, a list of 0/1) on their configuration's predicted loss
    ``pred`` (out-of-fold predictions, one per configuration)."""
    counts = [len(r) for r in run_failed]
    x = np.repeat(np.asarray(pred, float), counts)[:, None]
    y = np.concatenate([np.asarray(r, int) for r in run_failed])
    return Logistic(["predicted_loss"], degree=1, C=C).fit(x, y)


def cross_validate_stacked(
    tab: dict, table: dict, loss_spec, k: int = 5, repeats: int = 5, seed: int = 0, inner_k: int = 5
) -> dict:
    """Grouped CV of "platt_loss" (nested): per outer fold, the loss model (``loss_spec``, a
    :func:`analysis.model_specs` entry) is cross-validated on the training configurations
    alone (``inner_k`` folds) to get their out-of-fold predictions, Platt's logistic is fitted
    to those, the loss model is refitted on the training configurations and its predictions
    on the held-out configurations are scaled. ``tab``: the configuration table, ``table``:
    its :func:`run_table`."""
    from . import analysis

    y, g = np.asarray(table["failed"], int), np.asarray(table["group"])
    n = len(tab["loss"])
    P = np.zeros((repeats, len(y)))
    for rep in range(repeats):
        for tr, te in grouped_folds(g, k, seed + rep):
            m = np.zeros(n, bool)
            m[np.unique(g[tr])] = True
            inner = analysis.cross_validate(loss_spec, analysis.subset(tab, m), inner_k, 1, seed)
            platt = fit_platt(inner["oof"], [r for r, keep in zip(tab["run_failed"], m) if keep])
            full = analysis.fit_model(loss_spec, tab, m, seed=seed).predict(analysis.design_matrix(tab, loss_spec[1]))
            P[rep, te] = platt.predict_proba(full[g[te]][:, None])
    p = P.mean(0)
    out = scores(y, p)
    out.update(
        auc_repeats=[auc(y, q) for q in P],
        brier_repeats=[brier(y, q) for q in P],
        oof=p.tolist(),
        k_folds=k,
        repeats=repeats,
    )
    return out


def make(name_or_spec):
    kind, feats, kw = CANDIDATES[name_or_spec] if isinstance(name_or_spec, str) else name_or_spec
    return Logistic(feats, **kw) if kind == "logistic" else ForestClassifier(feats, **kw)


# ------------------------------------------------------------------------ run table
def run_table(tab: dict) -> dict:
    """One row per run from a configuration table of :func:`analysis.configurations` (with
    features attached): every per-configuration column repeated over its runs, ``failed`` (0/1,
    :func:`analysis.at_chance`) and ``group`` (the configuration's index)."""
    n = len(tab["loss"])
    counts = np.array([len(r) for r in tab["run_failed"]])
    out = {k: np.repeat(v, counts) for k, v in tab.items() if isinstance(v, np.ndarray) and v.shape[:1] == (n,)}
    out["failed"] = np.concatenate([np.asarray(r, int) for r in tab["run_failed"]])
    out["group"] = np.repeat(np.arange(n), counts)
    out["config"] = [c for c, k in zip(tab["config"], counts) for _ in range(k)]
    return out


def X_of(table: dict, features) -> np.ndarray:
    return np.stack([np.asarray(table[f], float) for f in features], 1)


# ------------------------------------------------------------------------ grouped CV
def grouped_folds(groups, k: int = 5, seed: int = 0):
    """k folds of row indices with every group (configuration) whole in one fold: the groups
    are shuffled (``seed``) and dealt round-robin. Yields (train, test) index arrays."""
    groups = np.asarray(groups)
    uniq = np.unique(groups)
    if len(uniq) < k:
        raise ValueError(f"{len(uniq)} groups: too few for {k} folds")
    perm = np.random.default_rng(seed).permutation(uniq)
    fold_of = {g: i % k for i, g in enumerate(perm)}
    f = np.array([fold_of[g] for g in groups])
    for j in range(k):
        yield np.flatnonzero(f != j), np.flatnonzero(f == j)


def auc(y, p) -> float:
    """Area under the ROC curve (ties count one half; nan without both classes)."""
    y, p = np.asarray(y, int), np.asarray(p, float)
    pos, neg = p[y == 1], p[y == 0]
    if not len(pos) or not len(neg):
        return math.nan
    from scipy.stats import rankdata

    r = rankdata(np.concatenate([pos, neg]))
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def brier(y, p) -> float:
    return float(np.mean((np.asarray(p, float) - np.asarray(y, float)) ** 2))


def log_loss(y, p) -> float:
    p = np.clip(np.asarray(p, float), 1e-12, 1 - 1e-12)
    y = np.asarray(y, float)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


RELIABILITY_EDGES = (0.0, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98, 1.0)


def reliability(y, p, edges=RELIABILITY_EDGES) -> list[dict]:
    """Predicted-probability bins: runs, mean predicted P(fail), observed failure rate."""
    y, p = np.asarray(y, float), np.asarray(p, float)
    b = np.clip(np.searchsorted(np.asarray(edges)[1:-1], p, side="right"), 0, len(edges) - 2)
    out = []
    for j in range(len(edges) - 1):
        m = b == j
        out.append(
            dict(
                lo=float(edges[j]),
                hi=float(edges[j + 1]),
                n=int(m.sum()),
                mean_pred=float(p[m].mean()) if m.any() else None,
                observed=float(y[m].mean()) if m.any() else None,
                failed=int(y[m].sum()),
            )
        )
    return out


def scores(y, p) -> dict:
    y = np.asarray(y, int)
    return dict(
        auc=auc(y, p),
        brier=brier(y, p),
        log_loss=log_loss(y, p),
        n_runs=int(len(y)),
        n_failed=int(y.sum()),
        base_rate=float(np.mean(y)),
        brier_base=brier(y, np.full(len(y), np.mean(y))),
        reliability=reliability(y, p),
    )


def cross_validate(spec, table: dict, k: int = 5, repeats: int = 5, seed: int = 0) -> dict:
    """Grouped k-fold CV (configurations whole), ``repeats`` shuffles: the out-of-fold
    probabilities (mean over repeats) and their scores; AUC and Brier per repeat too."""
    y = np.asarray(table["failed"], int)
    X = X_of(table, make(spec).features)
    P = np.zeros((repeats, len(y)))
    for rep in range(repeats):
        for tr, te in grouped_folds(table["group"], k, seed + rep):
            P[rep, te] = make(spec).fit(X[tr], y[tr], seed=seed).predict_proba(X[te])
    p = P.mean(0)
    out = scores(y, p)
    out.update(
        auc_repeats=[auc(y, q) for q in P],
        brier_repeats=[brier(y, q) for q in P],
        oof=p.tolist(),
        k_folds=k,
        repeats=repeats,
    )
    return out


def fit(spec, table: dict, seed: int = 0):
    m = make(spec)
    return m.fit(X_of(table, m.features), np.asarray(table["failed"], int), seed=seed)
