"""``phasefield recommend --block NAME``: the (sigma, alpha_attn, alpha_mlp) of a standard block
(pre-ln, post-ln, rms-swiglu) that keep a stack of ``depth`` blocks closest to critical.

Criteria (both over the whole stack, from the input geometry (q0, rho0) = (1, 0.5)):

* **gradient**: the gradient grows or shrinks by at most a factor ``F`` over the stack,
  ``|lambda_g(L)| L <= log F`` (``lambda_g(L)`` the block's gradient rate from the input);
* **angles**: nearby tokens neither merge nor separate faster than ``r`` per block,
  ``|angle_rate| <= r``.

Distance to criticality: ``d = max(|lambda_g(L)| L / log F, |angle_rate| / r)`` (d <= 1: both
criteria met). A causal block (``NAME:causal=true``) is judged by its last token, the one that
sees the whole sequence: ``lambda_g_last`` and ``angle_rate_last`` (docs/theory.md, "Causal
stacks") stand for the two rates, under their own names in the result. The block's theory
is evaluated on a coarse grid of the box (:func:`phasefield.layers.sweep.sweep_grid`), then
on a finer grid around the best coarse point (same size and largest sigma, so the compiled
program is reused); the points are ranked by d.
"""

from __future__ import annotations

import math

import numpy as np

BLOCKS = ("pre-ln", "post-ln", "rms-swiglu", "dyt")
BOX = dict(sigma=(0.3, 2.0), alpha_attn=(0.2, 1.0), alpha_mlp=(0.2, 1.0))
COARSE = dict(sigma=4, alpha_attn=6, alpha_mlp=6)  # the exact map's tables cost ~1 CPU s per distinct sigma
KEYS = ("sigma", "alpha_attn", "alpha_mlp")


def _read(ds, *names):
    for n in names:
        if n in ds:
            return np.asarray(ds[n].values, float)
    raise KeyError(names[0])


def rate_names(causal: bool) -> tuple[str, str]:
    """(gradient rate, angle rate) the criteria read: the last token's for a causal block."""
    return ("lambda_g_last", "angle_rate_last") if causal else ("lambda_g_input", "angle_rate")


def _points(ds, depth, log_f, rate, names):
    g_name, a_name = names
    lg = np.asarray(ds[g_name].values, float)
    ar = np.asarray(ds[a_name].values, float)
    grids = np.meshgrid(*[np.asarray(ds[k].values, float) for k in KEYS], indexing="ij")
    d = np.maximum(np.abs(lg) * depth / log_f, np.abs(ar) / rate)
    d = np.where(np.isfinite(d), d, np.inf)
    return [
        dict(
            sigma=float(s),
            alpha_attn=float(a),
            alpha_mlp=float(m),
            **{g_name: float(g)},
            gradient_factor=float(math.exp(g * depth)) if abs(g * depth) < 700 else float("inf"),
            **{a_name: float(r)},
            distance=float(x),
        )
        for s, a, m, g, r, x in zip(*(v.ravel() for v in (*grids, lg, ar, d)))
    ]


def _local(values, best, lo, hi, n):
    """n values around ``best`` (one coarse step either side), inside [lo, hi]."""
    step = (values[-1] - values[0]) / max(len(values) - 1, 1)
    return np.linspace(max(lo, best - step), min(hi, best + step), n)


def default_axes() -> dict:
    """The coarse grid of :data:`BOX` (:data:`COARSE` values per number)."""
    return {k: np.linspace(*BOX[k], COARSE[k]) for k in KEYS}


def _refined(coarse: dict, best: dict) -> dict:
    """A grid of the coarse grid's size around ``best``; the largest sigma stays on it (the
    same table scales and point count: the compiled program is reused)."""
    fine = {}
    for k, v in coarse.items():
        if len(v) == 1:
            fine[k] = v
            continue
        lo, hi = float(v[0]), float(v[-1])
        if k == "sigma":
            loc = _local(v, best[k], lo, hi, len(v) - 1)
            fine[k] = np.r_[loc, hi] if loc[-1] < hi else _local(v, best[k], lo, hi, len(v))
        else:
            fine[k] = _local(v, best[k], lo, hi, len(v))
    return fine


def recommend(
    name: str,
    depth: int = 16,
    n_tokens: int = 32,
    max_factor: float = 10.0,
    max_angle_rate: float = 0.05,
    axes: dict | None = None,
    fixed: dict | None = None,
    top: int = 5,
) -> dict:
    """The ``top`` points nearest to criticality (module docstring) of the grid ``axes``
    (sigma, alpha_attn, alpha_mlp -> ascending values; default :func:`default_axes`; one value
    fixes a number) and a refined grid around the best; ``fixed`` the block's other keywords
    (heads, ...)."""
    from . import sweep

    coarse = dict(default_axes(), **{k: np.asarray(v, float) for k, v in (axes or {}).items()})
    fixed = dict(fixed or {})
    log_f = math.log(max_factor)
    ds = sweep.sweep_grid(name, coarse, fixed, n_tokens=n_tokens, depth=depth)
    g_name, a_name = names = rate_names("lambda_g_last" in ds)  # a causal block's sweep: its last token's
    pts = _points(ds, depth, log_f, max_angle_rate, names)
    best = min(pts, key=lambda p: p["distance"])
    if any(len(v) > 1 for v in coarse.values()) and math.isfinite(best["distance"]):
        ds = sweep.sweep_grid(name, _refined(coarse, best), fixed, n_tokens=n_tokens, depth=depth)
        pts += _points(ds, depth, log_f, max_angle_rate, names)
    seen, finite = set(), []
    for p in pts:
        key = tuple(round(p[k], 12) for k in KEYS)
        if math.isfinite(p["distance"]) and key not in seen:
            seen.add(key)
            finite.append(p)
    if not finite:
        raise ValueError(f"block {name}: the theory gives no finite rate on the grid")
    ranked = sorted(finite, key=lambda p: p["distance"])
    met = [p for p in ranked if p["distance"] <= 1.0]
    res = dict(
        block=name,
        depth=int(depth),
        n_tokens=int(n_tokens),
        max_gradient_factor=float(max_factor),
        max_angle_rate=float(max_angle_rate),
        box={k: [float(v.min()), float(v.max())] for k, v in coarse.items()},
        fixed=fixed,
        found=bool(met),
        points=(met or ranked)[:top],
        evaluated=len(pts),
    )
    lows = [k for k, v in coarse.items() if len(v) > 1 and all(p[k] == v.min() for p in res["points"][:1])]
    res["at_lower_edge"] = lows
    res["rates"] = [g_name, a_name]
    if not met:
        res["best_gradient"] = min(finite, key=lambda p: abs(p[g_name]))
        res["best_angle"] = min(finite, key=lambda p: abs(p[a_name]))
        res["message"] = no_point_message(res)
    return res


def _at(p):
    return f"sigma {p['sigma']:.3g}, alpha_attn {p['alpha_attn']:.3g}, alpha_mlp {p['alpha_mlp']:.3g}"


def no_point_message(res) -> str:
    """One paragraph: no point meets both criteria, and the trade-off the user faces."""
    g, a, L = res["best_gradient"], res["best_angle"], res["depth"]
    f, angle = res["max_gradient_factor"], res["rates"][1]
    whose = "the last token's " if angle.endswith("_last") else "the "
    return (
        f"No point of the box keeps {whose}gradient within a factor {f:g} over {L} blocks and {whose}angle rate "
        f"within +-{res['max_angle_rate']:g} per block at once ({res['block']}, n = {res['n_tokens']}). "
        f"The trade-off: the gradient factor closest to 1 is {g['gradient_factor']:.3g} ({_at(g)}), where "
        f"nearby tokens change their distance at {g[angle]:+.3g} per block; the smallest angle rate is "
        f"{a[angle]:+.3g} ({_at(a)}), where the gradient changes by a factor "
        f"{a['gradient_factor']:.3g}. Choose which to keep, or relax --max-gradient-factor / "
        f"--max-angle-rate, widen the box (--axis sigma=LO:HI:N ...) or use fewer blocks."
    )
