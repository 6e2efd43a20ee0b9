"""Loss models: fitted functions from a feature table to the (seed-averaged) final loss.

Every model is a :class:`Model` with ``fit(X, y) -> self``, ``predict(X)`` and
``to_json()`` / :func:`from_json`, so the best one can ship inside the package as a JSON
resource. ``X`` is a 2-d array whose columns are the model's named features.

    MaxForm      min(L_sat, b + max(w_a |x_1 - c_a|, w_g |x_2 - c_g|))   the paper's form
    OneForm      min(L_sat, b + w |x - c|)                               one exponent
    Poly         ridge regression on all monomials of degree <= k of the standardized features
    Trees        gradient-boosted regression trees (scikit-learn), serialized tree by tree
    Forest       a random forest (scikit-learn), serialized tree by tree
    TwoPart      P(train) (logistic on degree-2 monomials) x loss-if-trained (Poly or Forest) +
                 (1 - P(train)) x the mean loss of the runs that did not train
    GP           Gaussian-process regression (scikit-learn; a Matern kernel with one length per
                 feature, plus white noise for the seeds' scatter) on standardized, partly
                 log-scaled features, evaluated from its training points and weights
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def expit(x):
    """The logistic function 1 / (1 + exp(-x)) (scipy.special.expit's formula, in NumPy:
    predict reads it without importing scipy.special, ~0.1 CPU s of a fresh process)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-np.asarray(x, float)))


class Model:
    kind = "model"

    def __init__(self, features, l_sat: float):
        self.features = list(features)
        self.l_sat = float(l_sat)

    def to_json(self) -> dict:
        return dict(kind=self.kind, features=self.features, L_sat=self.l_sat, **self._state())

    def _state(self) -> dict:
        raise NotImplementedError

    def clip(self, y):
        return np.clip(y, 0.0, None)


# ------------------------------------------------------------------ parametric V-shapes
def forward_differences(curve, theta, y):
    """The Jacobian of the residuals ``curve(theta) - y`` by forward differences, bit for bit
    what ``scipy.optimize.least_squares(jac="2-point")`` computes (scipy's
    ``approx_derivative``: step sqrt(eps) sign(theta) max(1, |theta|), one evaluation per
    parameter, m x n as the transpose of an n x m array), but with the curve at ``theta``
    and its n perturbations evaluated in one call: ``curve`` maps a (k, n) stack of parameter
    vectors to (k, m) curves, element by element, so every entry is the same floating-point
    operations as one vector at a time. scipy's per-column calls were ~38 % of a fit's time (a V-shape
    fit of ~20 points takes a median of 23 evaluations from a start, so the calls' overhead
    dominates: tests/test_trainability.py)."""
    theta = np.asarray(theta, float)
    h = np.finfo(float).eps ** 0.5 * ((theta >= 0).astype(float) * 2 - 1) * np.maximum(1.0, np.abs(theta))
    rows = np.repeat(theta[None], theta.size + 1, axis=0)  # theta, then theta + h_i e_i
    idx = np.arange(theta.size)
    rows[idx + 1, idx] = theta + h
    res = curve(rows) - y
    dx = (theta + h) - theta
    return ((res[1:] - res[0]) / dx[:, None]).T


def _least_squares(curve, y, starts):
    """The best of ``least_squares(method="trf")`` from each start, for the residuals
    ``curve(theta) - y`` (``curve``: see :func:`forward_differences`)."""
    from scipy.optimize import least_squares

    y = np.asarray(y, float)
    fun = lambda t: curve(np.asarray(t)[None])[0] - y
    jac = lambda t: forward_differences(curve, t, y)
    best = None
    for x0 in starts:
        try:
            r = least_squares(fun, x0, jac=jac, method="trf", max_nfev=2000)
        except (ValueError, np.linalg.LinAlgError):
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None:
        raise ValueError("least squares failed from every start")
    return best.x


class MaxForm(Model):
    """min(L_sat, b + max(w_a |x_1 - c_a|, w_g |x_2 - c_g|)), w >= 0; 28 starts, best kept."""

    kind = "max"

    def __init__(self, features, l_sat, theta=None):
        super().__init__(features, l_sat)
        self.theta = None if theta is None else np.asarray(theta, float)

    @staticmethod
    def curve(theta, X, l_sat):
        """The curve at ``theta`` (5 numbers; or a (k, 5) stack: k curves, (k, len(X)))."""
        b, wa, ca, wg, cg = (np.asarray(theta, float)[..., i, None] for i in range(5))
        return np.minimum(l_sat, b + np.maximum(abs(wa) * np.abs(X[:, 0] - ca), abs(wg) * np.abs(X[:, 1] - cg)))

    def fit(self, X, y, seed=0):
        rng = np.random.default_rng(seed)
        la, lg = X[:, 0], X[:, 1]
        b0, span = float(np.min(y)), float(np.ptp(y) or 1.0)
        sa, sg = float(np.std(la) or 1.0), float(np.std(lg) or 1.0)
        starts = [
            np.array([b0, span / sa, 0.0, span / sg, 0.0]),
            np.array([b0, span / sa, 0.0, 0.0, 0.0]),
            np.array([b0, 0.0, 0.0, span / sg, 0.0]),
            np.array([b0, span / sa, float(np.median(la)), span / sg, float(np.median(lg))]),
        ]
        for _ in range(24):
            starts.append(
                np.array(
                    [
                        rng.uniform(b0 - span / 2, b0 + span / 2),
                        rng.uniform(0, 3) * span / sa,
                        rng.choice(la),
                        rng.uniform(0, 3) * span / sg,
                        rng.choice(lg),
                    ]
                )
            )
        t = _least_squares(lambda t: self.curve(t, X, self.l_sat), y, starts)
        t[1], t[3] = abs(t[1]), abs(t[3])
        self.theta = t
        return self

    def predict(self, X):
        return self.clip(self.curve(self.theta, X, self.l_sat))

    def _state(self):
        return dict(
            theta=self.theta.tolist(),
            form="min(L_sat, b + max(w_a|x1 - c_a|, w_g|x2 - c_g|))",
            names=["b", "w_a", "c_a", "w_g", "c_g"],
        )


class OneForm(Model):
    kind = "one"

    def __init__(self, features, l_sat, theta=None):
        super().__init__(features, l_sat)
        self.theta = None if theta is None else np.asarray(theta, float)

    @staticmethod
    def curve(theta, X, l_sat):
        """The curve at ``theta`` (3 numbers; or a (k, 3) stack: k curves, (k, len(X)))."""
        b, w, c = (np.asarray(theta, float)[..., i, None] for i in range(3))
        return np.minimum(l_sat, b + abs(w) * np.abs(X[:, 0] - c))

    def fit(self, X, y, seed=0):
        rng = np.random.default_rng(seed)
        x = X[:, 0]
        b0, span, s = float(np.min(y)), float(np.ptp(y) or 1.0), float(np.std(x) or 1.0)
        starts = [np.array([b0, span / s, 0.0]), np.array([b0, span / s, float(np.median(x))])]
        starts += [
            np.array([rng.uniform(b0 - span / 2, b0 + span / 2), rng.uniform(0, 3) * span / s, rng.choice(x)])
            for _ in range(12)
        ]
        t = _least_squares(lambda t: self.curve(t, X, self.l_sat), y, starts)
        t[1] = abs(t[1])
        self.theta = t
        return self

    def predict(self, X):
        return self.clip(self.curve(self.theta, X, self.l_sat))

    def _state(self):
        return dict(theta=self.theta.tolist(), form="min(L_sat, b + w|x - c|)", names=["b", "w", "c"])


# ------------------------------------------------------------------ polynomial ridge
def monomials(Z, degree):
    cols = [np.ones(len(Z))]
    for d in range(1, degree + 1):
        for idx in itertools.combinations_with_replacement(range(Z.shape[1]), d):
            cols.append(np.prod(Z[:, list(idx)], axis=1))
    return np.stack(cols, 1)


class Poly(Model):
    """Ridge (penalty ``ridge``, intercept free) on the monomials of degree <= ``degree``
    of the features standardized with the training mean and std."""

    kind = "poly"

    def __init__(self, features, l_sat, degree=2, ridge=1e-3, mean=None, std=None, coef=None):
        super().__init__(features, l_sat)
        self.degree, self.ridge = int(degree), float(ridge)
        self.mean = None if mean is None else np.asarray(mean, float)
        self.std = None if std is None else np.asarray(std, float)
        self.coef = None if coef is None else np.asarray(coef, float)

    def _design(self, X):
        return monomials((X - self.mean) / self.std, self.degree)

    def fit(self, X, y, seed=0):
        self.mean, self.std = X.mean(0), X.std(0)
        self.std[self.std == 0] = 1.0
        A = self._design(X)
        pen = self.ridge * len(y) * np.eye(A.shape[1])
        pen[0, 0] = 0.0
        self.coef = np.linalg.solve(A.T @ A + pen, A.T @ y)
        return self

    def predict(self, X):
        return self.clip(self._design(X) @ self.coef)

    def _state(self):
        return dict(
            degree=self.degree,
            ridge=self.ridge,
            mean=self.mean.tolist(),
            std=self.std.tolist(),
            coef=self.coef.tolist(),
        )


# ------------------------------------------------------------------ boosted trees
TREE_PARAMS = dict(n_estimators=300, learning_rate=0.05, max_depth=2, subsample=0.8, min_samples_leaf=3)


class Trees(Model):
    """scikit-learn GradientBoostingRegressor (squared error, ``TREE_PARAMS``); evaluated
    from its serialized trees, so a shipped model needs no scikit-learn pickle."""

    kind = "trees"

    def __init__(self, features, l_sat, init=None, rate=None, trees=None):
        super().__init__(features, l_sat)
        self.init, self.rate, self.trees = init, rate, trees

    def fit(self, X, y, seed=0):
        from sklearn.ensemble import GradientBoostingRegressor

        g = GradientBoostingRegressor(random_state=seed, **TREE_PARAMS).fit(X, y)
        self.init = float(g.init_.predict(X[:1])[0]) if hasattr(g.init_, "predict") else float(np.mean(y))
        self.rate = float(g.learning_rate)
        self.trees = []
        for est in g.estimators_[:, 0]:
            t = est.tree_
            self.trees.append(
                dict(
                    left=t.children_left.tolist(),
                    right=t.children_right.tolist(),
                    feature=t.feature.tolist(),
                    threshold=t.threshold.tolist(),
                    value=t.value[:, 0, 0].tolist(),
                )
            )
        return self

    def predict(self, X):
        X = np.asarray(X, float)
        out = np.full(len(X), self.init)
        for t in self.trees:
            out += self.rate * tree_predict(t, X)
        return self.clip(out)

    def _state(self):
        return dict(init=self.init, rate=self.rate, trees=self.trees, params=TREE_PARAMS)


# ------------------------------------------------------------------ random forest
FOREST_PARAMS = dict(n_estimators=200, min_samples_leaf=3, max_features=0.6)


def tree_doc(t) -> dict:
    return dict(
        left=t.children_left.tolist(),
        right=t.children_right.tolist(),
        feature=t.feature.tolist(),
        threshold=t.threshold.tolist(),
        value=t.value[:, 0, 0].tolist(),
    )


def tree_predict(t: dict, X: np.ndarray) -> np.ndarray:
    left, right = np.asarray(t["left"]), np.asarray(t["right"])
    feat, thr, val = np.asarray(t["feature"]), np.asarray(t["threshold"]), np.asarray(t["value"])
    node = np.zeros(len(X), int)
    while True:
        leaf = left[node] == -1
        if leaf.all():
            return val[node]
        go_left = X[np.arange(len(X)), np.maximum(feat[node], 0)] <= thr[node]
        node = np.where(leaf, node, np.where(go_left, left[node], right[node]))


class Forest(Model):
    """scikit-learn RandomForestRegressor (``FOREST_PARAMS``), evaluated from its serialized
    trees (the mean of the trees' leaf values)."""

    kind = "forest"

    def __init__(self, features, l_sat, trees=None):
        super().__init__(features, l_sat)
        self.trees = trees

    def fit(self, X, y, seed=0):
        from sklearn.ensemble import RandomForestRegressor

        f = RandomForestRegressor(random_state=seed, **FOREST_PARAMS).fit(X, y)
        self.trees = [tree_doc(est.tree_) for est in f.estimators_]
        return self

    def predict(self, X):
        X = np.asarray(X, float)
        return self.clip(np.mean([tree_predict(t, X) for t in self.trees], axis=0))

    def _state(self):
        return dict(trees=self.trees, params=FOREST_PARAMS)


# ------------------------------------------------------------------ two-part model
class TwoPart(Model):
    """Bimodal outcomes: P(trains) from a logistic regression on degree-2 monomials of the
    standardized features; the loss of a run that trains from :class:`Poly` (degree 2) fitted
    to those runs; a run that does not train gets the mean loss of such runs.
    A configuration "trains" when its seed-mean loss is below ``threshold`` x L_sat."""

    kind = "two_part"
    threshold = 0.5

    def __init__(self, features, l_sat, clf=None, reg=None, untrained=None, reg_kind="poly"):
        super().__init__(features, l_sat)
        self.clf, self.reg, self.untrained, self.reg_kind = clf, reg, untrained, reg_kind

    def fit(self, X, y, seed=0):
        from sklearn.linear_model import LogisticRegression

        ok = y < self.threshold * self.l_sat
        self.reg = None
        if ok.sum() > 8:
            self.reg = (
                Forest(self.features, self.l_sat) if self.reg_kind == "forest" else Poly(self.features, self.l_sat)
            ).fit(X[ok], y[ok], seed=seed)
        self.untrained = float(np.mean(y[~ok])) if (~ok).any() else self.l_sat
        if ok.all() or not ok.any():
            self.clf = dict(constant=float(ok.mean()))
            return self
        mean, std = X.mean(0), X.std(0)
        std[std == 0] = 1.0
        Z = monomials((X - mean) / std, 2)[:, 1:]
        lr = LogisticRegression(C=1.0, max_iter=2000).fit(Z, ok)
        self.clf = dict(
            mean=mean.tolist(), std=std.tolist(), coef=lr.coef_[0].tolist(), intercept=float(lr.intercept_[0])
        )
        return self

    def p_train(self, X):
        if "constant" in self.clf:
            return np.full(len(X), self.clf["constant"])
        Z = monomials((X - np.asarray(self.clf["mean"])) / np.asarray(self.clf["std"]), 2)[:, 1:]
        s = Z @ np.asarray(self.clf["coef"]) + self.clf["intercept"]
        return expit(s)

    def predict(self, X):
        p = self.p_train(X)
        trained = self.reg.predict(X) if self.reg is not None else np.full(len(X), self.untrained)
        return self.clip(p * trained + (1 - p) * self.untrained)

    def _state(self):
        return dict(
            clf=self.clf,
            reg=None if self.reg is None else self.reg.to_json(),
            untrained=self.untrained,
            threshold=self.threshold,
            reg_kind=self.reg_kind,
        )


# ------------------------------------------------------------------ ensemble
class Ensemble(Model):
    """The mean of member models (each on its own subset of the features): averaging models
    of different families cuts the variance a small, bimodal table gives any single one."""

    kind = "ensemble"

    def __init__(self, features, l_sat, members=None, fitted=None):
        super().__init__(features, l_sat)
        self.members = [tuple(m) if not isinstance(m, dict) else m for m in (members or [])]
        self.fitted = fitted

    def _cols(self, feats):
        return [self.features.index(f) for f in feats]

    def fit(self, X, y, seed=0):
        self.fitted = []
        for kind, feats, kw in self.members:
            self.fitted.append(make(kind, feats, self.l_sat, **kw).fit(X[:, self._cols(feats)], y, seed=seed))
        return self

    def predict(self, X):
        X = np.asarray(X, float)
        return self.clip(np.mean([m.predict(X[:, self._cols(m.features)]) for m in self.fitted], axis=0))

    def _state(self):
        return dict(members=[m.to_json() for m in self.fitted])


# ------------------------------------------------------------------ Gaussian process
def matern(A, B, length_scale, nu: float = 1.5) -> np.ndarray:
    """The Matern kernel of smoothness ``nu`` (0.5: exp(-d); 1.5: (1 + sqrt(3) d) exp(-sqrt(3) d);
    2.5: (1 + sqrt(5) d + 5 d^2 / 3) exp(-sqrt(5) d)), d the distance of the rows of ``A`` and
    ``B`` with each coordinate divided by its length scale (the formulas of
    sklearn.gaussian_process.kernels.Matern)."""
    A = np.asarray(A, float) / length_scale
    B = np.asarray(B, float) / length_scale
    d = np.sqrt(np.maximum(np.sum(A * A, 1)[:, None] + np.sum(B * B, 1)[None, :] - 2.0 * A @ B.T, 0.0))
    if nu == 0.5:
        return np.exp(-d)
    if nu == 1.5:
        d = math.sqrt(3.0) * d
        return (1.0 + d) * np.exp(-d)
    if nu == 2.5:
        d = math.sqrt(5.0) * d
        return (1.0 + d + d * d / 3.0) * np.exp(-d)
    raise ValueError(f"Matern smoothness nu must be 0.5, 1.5 or 2.5 (got {nu})")


class GP(Model):
    """Gaussian-process regression of the seed-mean loss: a constant times a Matern kernel
    (smoothness ``nu``: 1.5, or 0.5 for a rougher surface) with one length scale per feature
    (automatic relevance) plus white noise (the seeds' scatter and what the features do not
    carry), hyperparameters by maximum marginal likelihood (scikit-learn's
    GaussianProcessRegressor, ``restarts`` random restarts, normalized targets). Features
    named in ``log`` are log-scaled (the scales and depths: a factor matters, not a
    difference), then every feature is standardized. The shipped form
    is the posterior mean, ``c k(x, X) alpha`` rescaled, evaluated in NumPy from the training
    points and weights (no pickle), clipped to [0, L_sat]."""

    kind = "gp"
    restarts = 2

    def __init__(self, features, l_sat, log=("sigma_w", "sigma_a", "depth"), nu: float = 1.5, state=None):
        super().__init__(features, l_sat)
        self.log = [f for f in log if f in self.features]
        self.nu = float(nu)
        self.state = state

    def _logged(self, X):
        """``X`` with the features named in ``log`` log-scaled."""
        Z = np.array(X, float, copy=True)
        for i, f in enumerate(self.features):
            if f in self.log:
                Z[:, i] = np.log(Z[:, i])
        return Z

    def fit(self, X, y, seed=0):
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        Z = self._logged(X)
        mean, std = Z.mean(0), Z.std(0)
        std[std == 0] = 1.0
        Z = (Z - mean) / std
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(Z.shape[1]), (1e-2, 1e3), nu=self.nu) + WhiteKernel(
            0.1, (1e-4, 1.0)
        )
        with warnings.catch_warnings():  # a feature that does not matter ends at the length's upper bound
            warnings.simplefilter("ignore", ConvergenceWarning)
            g = GaussianProcessRegressor(
                kernel, normalize_y=True, n_restarts_optimizer=self.restarts, random_state=seed
            ).fit(Z, np.asarray(y, float))
        k = g.kernel_
        self.state = dict(
            mean=mean.tolist(),
            std=std.tolist(),
            constant=float(k.k1.k1.constant_value),
            length_scale=np.atleast_1d(k.k1.k2.length_scale).astype(float).tolist(),
            noise=float(k.k2.noise_level),
            X=Z.tolist(),
            alpha=np.asarray(g.alpha_, float).tolist(),
            y_mean=float(g._y_train_mean),
            y_std=float(g._y_train_std),
            log_marginal_likelihood=float(g.log_marginal_likelihood_value_),
        )
        return self

    def mean(self, X):
        """The posterior mean at the rows of ``X``, unclipped."""
        s = self.state
        Z = (self._logged(X) - np.asarray(s["mean"])) / np.asarray(s["std"])
        K = s["constant"] * matern(Z, np.asarray(s["X"]), np.asarray(s["length_scale"]), self.nu)
        return s["y_std"] * (K @ np.asarray(s["alpha"])) + s["y_mean"]

    def predict(self, X):
        return np.clip(self.mean(X), 0.0, self.l_sat)

    def _state(self):
        return dict(log=self.log, nu=self.nu, state=self.state)


KINDS = {
    "max": MaxForm,
    "one": OneForm,
    "poly": Poly,
    "trees": Trees,
    "forest": Forest,
    "two_part": TwoPart,
    "ensemble": Ensemble,
    "gp": GP,
}


def make(kind: str, features, l_sat: float, **kw) -> Model:
    return KINDS[kind](features, l_sat, **kw)


def from_json(doc: dict) -> Model:
    kind = doc["kind"]
    f, L = doc["features"], doc["L_sat"]
    if kind in ("max", "one"):
        return KINDS[kind](f, L, theta=doc["theta"])
    if kind == "poly":
        return Poly(f, L, doc["degree"], doc["ridge"], doc["mean"], doc["std"], doc["coef"])
    if kind == "trees":
        return Trees(f, L, doc["init"], doc["rate"], doc["trees"])
    if kind == "forest":
        return Forest(f, L, doc["trees"])
    if kind == "ensemble":
        return Ensemble(f, L, fitted=[from_json(m) for m in doc["members"]])
    if kind == "gp":
        return GP(f, L, doc["log"], doc["nu"], doc["state"])
    if kind == "two_part":
        reg = None if doc["reg"] is None else from_json(doc["reg"])
        return TwoPart(f, L, doc["clf"], reg, doc["untrained"], doc.get("reg_kind", "poly"))
    raise ValueError(f"unknown model kind {kind!r}")


def r2(y, yhat) -> float:
    ss = float(np.sum((y - np.mean(y)) ** 2))
    return float(1.0 - np.sum((y - yhat) ** 2) / ss) if ss > 0 else math.nan


def rmse(y, yhat) -> float:
    return float(np.sqrt(np.mean((np.asarray(y) - np.asarray(yhat)) ** 2)))
