"""Which initialization should I use? The theory's answer under a user's constraints.

:func:`recommend` searches the box of free hyperparameters (those the user did not fix)
for

* the **critical set** lambda_a = lambda_g(L) = 0 (the paper's recommendation): scrambled
  Sobol candidates, the best refined with ``scipy.optimize.least_squares`` on the two
  exponents inside the box; when the box holds no exact zero, the points nearest to it;
* the point of **lowest predicted loss** under a loss model (the packaged one by default),
  evaluated on the candidates nearest to criticality and on a Sobol subset of the box.

Every point proposed (critical or lowest-loss) has P(fails to train) <= ``max_fail_prob``
(default :data:`MAX_FAIL_PROB` = 0.1) under the model's failure model
(:mod:`phasefield.vit.failure`); points above it are dropped (``excluded`` counts them) and
:class:`RecommendError` is raised when no evaluated point qualifies. A model without a failure
model (an older fit file) cannot be filtered: the result then says so in its warnings.

Exponents are the collapsed-point lambda_a and lambda_g(L) of :func:`phasefield.layers.paper.exponents`
at the given number of tokens, depth and activation.
"""

from __future__ import annotations

import math

import numpy as np

BOX = dict(sigma_w=(0.3, 3.0), sigma_a=(0.3, 4.0), alpha_a=(0.05, 0.95), alpha_m=(0.05, 0.95))
NAMES = ("sigma_w", "sigma_a", "alpha_a", "alpha_m")
MAX_FAIL_PROB = 0.1


class RecommendError(ValueError):
    """No point satisfies the constraints (one-line message)."""


def exponents_of(points: np.ndarray, n_tokens: int, depth: int, activation: str):
    """Collapsed-point (lambda_a, lambda_g(depth)) at points [k, 4]: the two closed forms alone
    (:func:`phasefield.vit.predict.compiled_collapsed`; one compiled program per padded
    batch size and activation, for every depth)."""
    import jax

    from .. import HParams
    from .predict import compiled_collapsed

    points = np.atleast_2d(np.asarray(points, float))
    k = len(points)
    m = 1 << max(0, (k - 1).bit_length())
    p = np.pad(points, ((0, m - k), (0, 0)), mode="edge")
    # numpy leaves (no eager jnp ops: least_squares calls this ~2,000 times)
    hp = HParams(
        sigma_w=p[:, 0],
        sigma_a=p[:, 1],
        alpha_a=p[:, 2],
        alpha_m=p[:, 3],
        sigma_v=np.ones(m),
        n_tokens=np.full(m, float(n_tokens)),
        depth=np.full(m, float(depth)),
        activation=activation,
    )
    with jax.enable_x64(True):
        la, lg = jax.device_get(compiled_collapsed()(hp))
    return np.asarray(la, float)[:k], np.asarray(lg, float)[:k]


def recommend(
    n_tokens: int = 17,
    depth: int = 16,
    activation: str = "tanh",
    fixed: dict | None = None,
    box: dict | None = None,
    candidates: int = 1024,
    top: int = 5,
    model: dict | None = None,
    predict_loss: bool = True,
    seed: int = 0,
    max_fail_prob: float = MAX_FAIL_PROB,
) -> dict:
    """Recommended initializations (see the module doc). ``fixed``: {name: value} for any of
    sigma_w, sigma_a, alpha_a, alpha_m; ``box``: {name: (lo, hi)} for the free ones."""
    from scipy.optimize import least_squares
    from scipy.stats import qmc

    fixed = {k: float(v) for k, v in (fixed or {}).items() if v is not None}
    box = dict(BOX, **(box or {}))
    free = [k for k in NAMES if k not in fixed]
    lo = np.array([box[k][0] for k in free])
    hi = np.array([box[k][1] for k in free])

    def full(u):
        u = np.atleast_2d(u)
        out = np.empty((len(u), 4))
        for j, k in enumerate(NAMES):
            out[:, j] = fixed[k] if k in fixed else u[:, free.index(k)]
        return out

    if free:
        m = max(1, math.ceil(math.log2(candidates)))
        u = lo + (hi - lo) * qmc.Sobol(len(free), scramble=True, seed=seed).random_base2(m)[:candidates]
    else:
        u = np.zeros((1, 0))
    pts = full(u)
    la, lg = exponents_of(pts, n_tokens, depth, activation)
    score = np.hypot(la, lg)
    crit = []
    if free:
        for i in np.argsort(score)[: 4 * top]:
            f = lambda x: np.array(exponents_of(full(x), n_tokens, depth, activation))[:, 0]
            try:
                r = least_squares(f, u[i], bounds=(lo, hi), xtol=1e-12, ftol=1e-12, max_nfev=60)
            except ValueError:
                continue
            crit.append((float(np.hypot(*r.fun)), r.x))
        crit.sort(key=lambda t: t[0])
    chosen = []
    for res, x in crit:  # distinct points (in units of the box)
        if all(np.max(np.abs((x - y) / (hi - lo))) > 0.05 for _, y in chosen):
            chosen.append((res, x))
        if len(chosen) == top:
            break
    if not free:
        chosen = [(float(score[0]), u[0])]
    critical = []
    for _res, x in chosen:
        p = full(x)[0]
        a, g = exponents_of(p[None], n_tokens, depth, activation)
        critical.append(
            dict(
                zip(NAMES, map(float, p)),
                lambda_a=float(a[0]),
                lambda_g_collapse=float(g[0]),
                exact=bool(np.hypot(a[0], g[0]) < 1e-6),
            )
        )
    out = dict(
        n_tokens=n_tokens,
        depth=depth,
        activation=activation,
        fixed=fixed,
        box={k: list(box[k]) for k in free},
        critical=critical,
        candidates=int(len(pts)),
        critical_found=bool(critical and critical[0]["exact"]),
    )
    if predict_loss:
        from . import predict as P

        doc = P.load_model() if model is None else model
        sub = np.unique(np.concatenate([np.argsort(score)[:32], np.arange(min(len(pts), 96))]))
        eval_pts = np.concatenate([pts[sub]] + [full(x) for _, x in chosen])
        preds = P.predict(eval_pts[:, 0], eval_pts[:, 1], eval_pts[:, 2], eval_pts[:, 3], depth, doc)
        preds = preds if isinstance(preds, list) else [preds]
        for c, pr in zip(critical, preds[len(sub) :]):
            c["predicted_loss"] = pr["predicted_loss"]
            c["p_fail"] = pr["p_fail"]
        filtered = preds[0]["p_fail"] is not None
        ok = lambda r: not filtered or r["p_fail"] <= max_fail_prob
        allowed = [r for r in preds if ok(r)]
        n_crit = len(critical)
        critical[:] = [c for c in critical if ok(c)]
        out["max_fail_prob"] = max_fail_prob if filtered else None
        out["excluded"] = dict(critical=n_crit - len(critical), evaluated=len(preds) - len(allowed))
        if not allowed:
            lowest = min(r["p_fail"] for r in preds)
            raise RecommendError(
                f"no point of the {len(preds)} evaluated has P(fail) <= {max_fail_prob:g} "
                f"(the lowest is {lowest:.3g}): raise --max-fail-prob or widen the box"
            )
        best = min(allowed, key=lambda r: r["predicted_loss"])
        warn = list(best["warnings"])
        if not filtered:
            warn.append("the loss model has no failure model (a fit file older than it): P(fail) not filtered")
        if n_tokens != doc["n_tokens"]:
            warn.append(f"the loss model was fitted at n_tokens = {doc['n_tokens']}, not {n_tokens}")
        if activation != doc["train_config"].get("activation", "tanh"):
            warn.append(f"the loss model was fitted with {doc['train_config'].get('activation')}, not {activation}")
        out["lowest_predicted_loss"] = dict(
            {k: best[k] for k in NAMES},
            predicted_loss=best["predicted_loss"],
            interval=best["interval"],
            p_fail=best["p_fail"],
            lambda_a=best["lambda_a"],
            lambda_g_collapse=best["lambda_g_collapse"],
            model=best["model"],
            warnings=warn,
            evaluated=int(len(eval_pts)),
        )
    return out
