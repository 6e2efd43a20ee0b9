"""The fix's search: multipliers of a model's init found by measuring it, on a continuous
scale, within a fixed number of measured points.

A point is a multiplier per knob (:data:`.recipes.KNOBS`): ``weights`` (every weight matrix),
``residual`` (the residual output projections, on top), ``attention`` (an attention's
other matrices, on top) and ``mlp`` (the MLP's other matrices, on top). Its cost is
``sum |log m|`` over the knobs (the distance from the model as it is); its distance to the
criteria is ``d = max(|L lambda_g_input| / log F, |angle_rate| / r)``. The fix is the point
of least cost with ``d <= margin``. The search:

1. the model as it is (1 everywhere): the fix when ``d <= margin`` there;
2. along each knob alone: nodes at 2^t (t = -1, +1, -2, +2, ... inside the knob's range)
   until one meets ``d <= margin``, then ``bisect`` halvings of the bracket in log between
   it and its neighbour toward 1 (the boundary to 2^(1/32) of the bracket's factor 2);
3. weights and residual together: the nodes 2^(a, b) off the axes whose cost is below the
   best found so far, nearest first; a node that meets the margin is refined by bisection
   toward 1 on each axis in turn.

Every point is measured with the same initialization keys (a deterministic function of the
multipliers, not blurred by the draws), at most :data:`MAX_POINTS` points.

A causal model's points read the last token's rates instead (``angle_rate_last``,
``lambda_g_last``, :mod:`.positions`), with the same distance and criteria.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import recipes as rc
from .paths import param_path

WEIGHTS_RANGE = (1 / 16, 8.0)
RESIDUAL_RANGE = (1 / 32, 4.0)
GROUP_RANGE = (1 / 8, 8.0)
BISECT = 5
MAX_POINTS = 62
MARGIN = 0.8
NORMALIZED = 1e-3  # relative spread of the tokens' norms below which a block's output is normalized


def index(sel: dict) -> dict:
    """``{path: position}`` of the weight matrices in a multiplier vector."""
    return {p: i for i, p in enumerate(sel)}


def scale_vector(params, vec, idx: dict):
    """``params`` with each weight matrix ``p`` times ``vec[idx[p]]`` (traceable)."""

    def f(path, leaf):
        i = idx.get(param_path(path))
        return leaf if i is None else leaf * vec[i].astype(jnp.result_type(leaf))

    return jax.tree_util.tree_map_with_path(f, params)


def vector(mult: dict, idx: dict) -> np.ndarray:
    """The multiplier vector of ``{path: m}``."""
    v = np.ones(len(idx), np.float32)
    for p, i in idx.items():
        v[i] = mult.get(p, 1.0)
    return v


def knob_multipliers(knobs: dict, roles: dict) -> dict:
    """``{path: m}`` of a point ``{knob: m}``: the product of the knobs whose roles hold the
    matrix's."""
    out = {}
    for p, role in roles.items():
        m = 1.0
        for k, v in knobs.items():
            if role in rc.KNOBS[k]:
                m *= v
        out[p] = m
    return out


def cost(knobs: dict) -> float:
    return float(sum(abs(math.log(v)) for v in knobs.values()))


def _spread(x):
    """The relative spread over tokens of the tokens' squared norm per component, centred
    (LayerNorm) and not (RMSNorm): the smaller of the two."""
    c = x - jnp.mean(x, -1, keepdims=True)
    out = []
    for y in (c, x):
        v = jnp.mean(jnp.square(y), -1)
        out.append(jnp.std(v) / jnp.maximum(jnp.mean(v), 1e-30))
    return jnp.minimum(*out)


def point_fn(init_fn, run, idx: dict, eps: float, keys, causal: bool = False):
    """``f(vec) -> {"log_gap": log gap ratio, "grad": |J^T u|^2 / |x0|, "spread": normalized
    spread}`` per init at the multiplier vector ``vec``: one compiled program for every point.
    ``causal``: the last token's ``gap0``, ``gapL`` (its gap to the earlier tokens before and
    after the stack), ``g`` (its squared gradient) and ``u`` (its cotangent's) instead of
    ``log_gap`` and ``grad``."""
    from . import positions
    from .geometry import q_rho_gap, symmetric_tokens

    def one(vec, key):
        kp, kn, ku = jax.random.split(key, 3)
        params = scale_vector(init_fn(kp), vec, idx)
        x_shape = jax.eval_shape(lambda: run(params)[0])
        zero = jnp.zeros(x_shape.shape, x_shape.dtype)
        (x0, outs), vjp = jax.vjp(lambda s: run(params, shift=s), zero)
        u = jax.random.normal(ku, outs.shape[1:], outs.dtype)
        (g0,) = vjp((jnp.zeros_like(x0), jnp.zeros_like(outs).at[-1].set(u)))
        grad = jnp.sum(jnp.square(g0)) / x0.size
        x0 = jax.lax.stop_gradient(x0)
        q0 = q_rho_gap(x0)[0]
        xn = symmetric_tokens(kn, x0.shape, q0, 1.0 - eps).astype(x0.dtype)
        _, outs_n = run(params, xn)
        gap0 = q_rho_gap(xn)[2]
        gapL = q_rho_gap(outs_n[-1])[2]
        ok = jnp.all(jnp.isfinite(outs)) & jnp.all(jnp.isfinite(outs_n)) & jnp.isfinite(grad)
        spread = jnp.max(jax.vmap(_spread)(jax.lax.stop_gradient(outs)))
        nan = lambda v: jnp.where(ok, v, jnp.nan)
        if causal:
            return dict(
                gap0=nan(positions.gap_last(xn)),
                gapL=nan(positions.gap_last(outs_n[-1])),
                g=nan(positions.sq_last(g0)),
                u=nan(positions.sq_last(u)),
                spread=spread,
            )
        return dict(log_gap=nan(jnp.log(gapL / gap0)), grad=nan(grad), spread=spread)

    return jax.jit(lambda vec: jax.lax.map(lambda k: one(vec, k), keys))


def rates(log_gap, grad, L):
    """(angle_rate, its se, lambda_g_input, its se) from per-init measurements."""
    la = np.asarray(log_gap, float) / L
    g = np.asarray(grad, float)
    n = la.size
    la_se = float(la.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    gm = float(g.mean())
    lg = math.log(gm) / L if gm > 0 and math.isfinite(gm) else float("nan")
    lg_se = float(g.std(ddof=1) / math.sqrt(n) / gm / L) if n > 1 and gm > 0 else float("nan")
    return float(la.mean()), la_se, lg, lg_se


def rates_of(out: dict, L: int) -> tuple:
    """(angle rate, its se, gradient rate, its se) of a point's per-init measurements
    (:func:`point_fn`): the last token's where it measured them."""
    if "gap0" in out:
        from .positions import last_rates

        r = last_rates(out["gap0"], out["gapL"], out["g"], out["u"], L)
        return r["angle_rate_last"], r["angle_rate_last_se"], r["lambda_g_last"], r["lambda_g_last_se"]
    return rates(out["log_gap"], out["grad"], L)


def distance(angle_rate, lambda_g_input, L, max_factor, max_angle_rate) -> float:
    """``max(|L lambda_g_input| / log F, |angle_rate| / r)`` (inf where not finite)."""
    d = max(abs(lambda_g_input) * L / math.log(max_factor), abs(angle_rate) / max_angle_rate)
    return d if math.isfinite(d) else float("inf")


def pick(points, margin):
    """The point of least cost within the margin (ties: the smaller distance), else the one
    of least distance."""
    ok = [p for p in points if p["distance"] <= margin]
    if ok:
        return min(ok, key=lambda p: (cost(p["knobs"]), p["distance"]))
    return min(points, key=lambda p: p["distance"])


class Search:
    """The search (module docstring) of one model; ``run()`` returns its record."""

    def __init__(
        self,
        f,
        roles,
        idx,
        L,
        max_factor,
        max_angle_rate,
        margin,
        inits,
        progress,
        max_points,
        bisect,
        names=("angle_rate", "lambda_g_input"),
    ):
        self.f, self.roles, self.idx, self.L = f, roles, idx, L
        self.names = tuple(names)  # the point's keys of the two rates
        self.crit = (float(max_factor), float(max_angle_rate))
        self.margin, self.inits, self.progress = float(margin), int(inits), progress
        self.max_points, self.bisect = int(max_points), int(bisect)
        self.points, self.seen, self.spread = [], {}, None

    def left(self):
        return self.max_points - len(self.points)

    def evaluate(self, knobs: dict):
        knobs = {k: float(v) for k, v in knobs.items() if v != 1.0}
        key = tuple(sorted((k, round(math.log(v), 9)) for k, v in knobs.items()))
        if key in self.seen:
            return self.seen[key]
        if self.left() <= 0:
            return None
        vec = vector(knob_multipliers(knobs, self.roles), self.idx)
        out = jax.device_get(self.f(jnp.asarray(vec)))
        if not knobs:
            self.spread = float(np.max(out["spread"]))
        la, la_se, lg, lg_se = rates_of(out, self.L)
        a, g = self.names
        p = {
            "knobs": knobs,
            "weights": knobs.get("weights", 1.0),
            "residual": knobs.get("residual", 1.0),
            a: la,
            a + "_se": la_se,
            g: lg,
            g + "_se": lg_se,
            "distance": distance(la, lg, self.L, *self.crit),
        }
        self.points.append(p)
        self.seen[key] = p
        if self.progress is not None:
            self.progress(self.inits)
        return p

    def ok(self, p):
        return p is not None and p["distance"] <= self.margin

    def refine(self, knobs: dict, k: str, t_out: float, t_in: float):
        """Bisection in log2 of knob ``k`` between ``t_out`` (meets the margin) and ``t_in``
        (toward 1, does not): the last point that meets it."""
        best = self.evaluate({**knobs, k: 2.0**t_out})
        for _ in range(self.bisect):
            mid = 0.5 * (t_out + t_in)
            p = self.evaluate({**knobs, k: 2.0**mid})
            if p is None:
                break
            if self.ok(p):
                t_out, best = mid, p
            else:
                t_in = mid
        return best, t_out

    def axis(self, k: str, rng):
        """Step 2 for knob ``k``: ``(point, log2 multiplier)`` or None."""
        lo, hi = math.log2(rng[0]), math.log2(rng[1])
        ts = sorted(
            (t for t in range(math.floor(lo), math.ceil(hi) + 1) if t != 0 and lo <= t <= hi), key=lambda t: (abs(t), t)
        )
        for t in ts:
            p = self.evaluate({k: 2.0**t})
            if p is None:
                return None
            if self.ok(p):
                inner = t - (1 if t > 0 else -1)
                return self.refine({}, k, float(t), float(inner))
        return None

    def run(self, knobs=("weights", "residual", "attention", "mlp")) -> dict:
        p0 = self.evaluate({})
        axes = {}
        if not self.ok(p0):
            ranges = dict(weights=WEIGHTS_RANGE, residual=RESIDUAL_RANGE, attention=GROUP_RANGE, mlp=GROUP_RANGE)
            have = set(self.roles.values())
            for k in knobs:
                if not have & set(rc.KNOBS[k]):
                    continue
                found = self.axis(k, ranges[k])
                axes[k] = None if found is None else found[0]
            self.joint()
        best = pick(self.points, self.margin)
        if self.progress is not None and self.left() > 0:
            self.progress(self.inits * self.left())  # the points not needed: the bar ends full
        return dict(best=best, points=self.points, axes=axes, spread=self.spread)

    def joint(self):
        ok = [p for p in self.points if self.ok(p)]
        c_best = min((cost(p["knobs"]) for p in ok), default=float("inf"))
        lw = [t for t in range(-3, 4) if t != 0]
        lr = [t for t in range(-5, 3) if t != 0]
        nodes = sorted(((a, b) for a in lw for b in lr), key=lambda ab: (abs(ab[0]) + abs(ab[1]), ab))
        ln2 = math.log(2.0)
        for a, b in nodes:
            if (abs(a) + abs(b)) * ln2 >= c_best - 1e-12:
                continue
            p = self.evaluate(dict(weights=2.0**a, residual=2.0**b))
            if p is None:
                return
            if not self.ok(p):
                continue
            q, ta = self.refine(dict(residual=2.0**b), "weights", float(a), float(a - np.sign(a)))
            q, _ = self.refine(dict(weights=2.0**ta), "residual", float(b), float(b - np.sign(b)))
            c_best = min(c_best, cost(q["knobs"]))
