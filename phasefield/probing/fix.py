"""A fix for the model as it is: two multipliers on its initialization, found by measuring.

    res = phasefield.probe(model, inits=16, fix=True)
    res.fix["multipliers"]    # {"weights": m_w, "residual": m_res}
    res.fix["after"]          # the model re-probed at the fixed init, fresh seeds, +- se
    res.fix["meets"]          # whether the criteria hold there

Every transformer has two scales that move its rates: the init scale of its weight matrices
and the scale of its residual branches' output projections. The fix multiplies

* **every weight matrix** (a float parameter with two or more axes whose path does not match
  ``skip``, by default the embeddings: ``embed``, ``wte``, ``wpe``, ``position``) by
  ``m_w``; with ``weights=REGEX`` only the matching ones;
* **the residual branches' output projections** (paths matching ``residual``: by default
  GPT-2's ``c_proj``, BERT's and ViT's ``output/dense``, LLaMA's ``o_proj``/``down_proj``
  (and ``wo``/``w2``), ``out_proj``/``fc2``/``attn/proj``, and phasefield's own blocks'
  attention ``out`` and MLP ``dense_1``) by ``m_res`` on top,

and searches (m_w, m_res) on a log grid, then on a finer grid around the best point, by
measuring the model at each point (the same initialization keys at every point, so the
comparison is not blurred by the draws): the angle rate of nearby tokens ``angle_rate`` and
the whole stack's gradient rate ``lambda_g_input`` (lambda_g(L) from the inputs), with the criteria of
``phasefield recommend --block`` (:mod:`.blocks`): the gradient factor over the stack within
F (``|L lambda_g_input| <= log F``) and ``|angle_rate| <= r``. Distance to the criteria:
``d = max(|L lambda_g_input| / log F, |angle_rate| / r)``. Of the points with ``d <= margin`` (0.8:
room for the search's few inits), the one nearest the model as it is (smallest
``|log m_w| + |log m_res|``) is the fix; where no point qualifies, the one with the smallest
d. It is then verified: the model at the fixed initialization is probed again with fresh
seeds and ``verify_inits`` initializations.

For a phasefield preset (``--block`` or declared with ``--as``), the measured fix is also
written in the preset's numbers (sigma x m_w, alpha_attn and alpha_mlp x m_res) beside
``recommend --block``'s theory answer for the same depth and criteria, with the theory's
rates at the measured fix.
"""

from __future__ import annotations

import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import capture
from .blocks import MAX_ANGLE_RATE, MAX_FACTOR

RESIDUAL = (
    r"(^|/)(c_proj|o_proj|out_proj|down_proj|fc2|wo|w2)/(kernel|weight)$"
    r"|(^|/)output/dense/(kernel|weight)$"
    r"|(^|/)attn/proj/(kernel|weight)$"
    r"|(^|/)AttentionModule_\d+/out/kernel$|(^|/)GLUModule_\d+/out/kernel$|(^|/)MLPModule_\d+/dense_1/kernel$"
)
SKIP = r"embed|(^|/)(wte|wpe)(/|$)|position"
WEIGHTS_RANGE = (1 / 8, 8.0)
RESIDUAL_RANGE = (1 / 32, 4.0)
GRID = 6
FINE = 5
MARGIN = 0.8


def param_path(path) -> str:
    """``"h/0/attn/c_proj/kernel"`` from a pytree key path (Flax NNX's trailing ``value``
    attribute dropped)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    return "/".join(parts)


def _compile(text, what):
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"{what}: {text!r} is not a regular expression ({exc})") from None


def select(params, weights=None, residual=None, skip=None) -> dict:
    """``{path: (is_weight, is_residual)}`` of every weight matrix (module docstring)."""
    w_re = None if weights is None else _compile(weights, "the weights' pattern")
    r_re = _compile(RESIDUAL if residual is None else residual, "the residual projections' pattern")
    s_re = _compile(SKIP if skip is None else skip, "the skipped parameters' pattern")
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        shape, dtype = np.shape(leaf) if not hasattr(leaf, "shape") else leaf.shape, getattr(leaf, "dtype", None)
        if len(shape) < 2 or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            continue
        p = param_path(path)
        if s_re.search(p) or (w_re is not None and not w_re.search(p)):
            continue
        out[p] = (True, bool(r_re.search(p)))
    return out


def check_selection(params, weights=None, residual=None, skip=None) -> dict:
    """:func:`select`, with a one-line ValueError naming what was searched when no weight
    matrix or no residual projection is found."""
    sel = select(params, weights, residual, skip)
    leaves = [param_path(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    shown = ", ".join(leaves[:8]) + (f", ... ({len(leaves) - 8} more)" if len(leaves) > 8 else "")
    if not sel:
        raise ValueError(
            f"the fix found no weight matrix (a float parameter with 2+ axes, not matching {skip or SKIP!r}"
            + (f", matching {weights!r}" if weights else "")
            + f") among the {len(leaves)} parameters: {shown or '(none)'}"
        )
    if not any(r for _, r in sel.values()):
        mats = ", ".join(list(sel)[:8]) + (f", ... ({len(sel) - 8} more)" if len(sel) > 8 else "")
        raise ValueError(
            f"the fix found no residual output projection: no weight matrix's path matches "
            f"{residual or 'the default names (c_proj, o_proj, out_proj, down_proj, fc2, output/dense, ...)'} "
            f"(the weight matrices: {mats}); name them with a regular expression (residual=, --fix-residual)"
        )
    return sel


def scale(params, m_w, m_res, sel: dict):
    """``params`` with the weight matrices times ``m_w`` and the residual projections times
    ``m_w m_res`` (traceable in the multipliers)."""

    def f(path, leaf):
        hit = sel.get(param_path(path))
        if hit is None:
            return leaf
        m = m_w * m_res if hit[1] else m_w
        return leaf * jnp.asarray(m, jnp.result_type(leaf))

    return jax.tree_util.tree_map_with_path(f, params)


def groups(paths) -> dict:
    """``{path: group}``: a parameter group is the path with its block index replaced by
    ``*``: the outermost component that is a number, or ``name_k``, and takes more than one
    value after the same prefix (``h/3/attn/c_proj/kernel`` -> ``h/*/attn/c_proj/kernel``,
    ``block_3/.../dense_1/kernel`` -> ``block_*/.../dense_1/kernel``)."""

    def stem(c):
        if c.isdigit():
            return "*"
        m = re.fullmatch(r"(.*_)(\d+)", c)
        return m.group(1) + "*" if m else None

    parts = {p: p.split("/") for p in paths}
    values = {}
    for comps in parts.values():
        for i, c in enumerate(comps):
            if stem(c) is not None:
                values.setdefault((tuple(comps[:i]), stem(c)), set()).add(c)
    out = {}
    for p, comps in parts.items():
        g = list(comps)
        for i, c in enumerate(comps):
            if stem(c) is not None and len(values[(tuple(comps[:i]), stem(c))]) > 1:
                g[i] = stem(c)
                break
        out[p] = "/".join(g)
    return out


def init_std(init_fn, key, sel, m_w, m_res) -> dict:
    """The std of each parameter group (:func:`group`) at one initialization, as the model
    draws it and after the fix."""
    params = jax.device_get(jax.jit(init_fn)(key))
    names = groups(list(sel))
    acc = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        p = param_path(path)
        if p not in sel:
            continue
        g = names[p]
        a = acc.setdefault(g, dict(sq=0.0, n=0, residual=sel[p][1]))
        a["sq"] += float(np.sum(np.square(np.asarray(leaf, np.float64) - np.mean(leaf))))
        a["n"] += int(np.size(leaf))
    out = {}
    for g, a in acc.items():
        before = math.sqrt(a["sq"] / max(a["n"], 1))
        m = m_w * m_res if a["residual"] else m_w
        out[g] = dict(before=before, after=before * m, multiplier=m, residual_projection=a["residual"])
    return out


def _point_fn(init_fn, run, sel, eps, inits_keys):
    """``f(m) -> (log gap ratio [inits], |J^T u|^2 / |x0| [inits])`` at multipliers
    ``m = (m_w, m_res)``, one compiled program for every point."""
    from .geometry import q_rho_gap, symmetric_tokens

    def one(m, key):
        kp, kn, ku = jax.random.split(key, 3)
        params = scale(init_fn(kp), m[0], m[1], sel)
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
        return jnp.where(ok, jnp.log(gapL / gap0), jnp.nan), jnp.where(ok, grad, jnp.nan)

    return jax.jit(lambda m: jax.lax.map(lambda k: one(m, k), inits_keys))


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


def distance(angle_rate, lambda_g_input, L, max_factor=MAX_FACTOR, max_angle_rate=MAX_ANGLE_RATE) -> float:
    """``max(|L lambda_g_input| / log F, |angle_rate| / r)`` (inf where not finite)."""
    d = max(abs(lambda_g_input) * L / math.log(max_factor), abs(angle_rate) / max_angle_rate)
    return d if math.isfinite(d) else float("inf")


def _pick(points, margin):
    ok = [p for p in points if p["distance"] <= margin]
    if ok:
        return min(ok, key=lambda p: (abs(math.log(p["weights"])) + abs(math.log(p["residual"])), p["distance"]))
    return min(points, key=lambda p: p["distance"])


def search_size(grid: int = GRID, fine: int = FINE) -> int:
    """The points :func:`search` measures: the model as it is, the grid, the fine grid."""
    return 1 + grid * grid + fine * fine


def search(
    init_fn,
    run,
    L: int,
    sel: dict,
    eps: float,
    inits: int = 2,
    seed: int = 0,
    max_factor: float = MAX_FACTOR,
    max_angle_rate: float = MAX_ANGLE_RATE,
    grid: int = GRID,
    fine: int = FINE,
    weights_range=WEIGHTS_RANGE,
    residual_range=RESIDUAL_RANGE,
    margin: float = MARGIN,
    progress=None,
) -> dict:
    """The grid search (module docstring): ``{"best": point, "points": [...], "inits": ...}``,
    a point ``{"weights", "residual", "angle_rate", "lambda_g_input", "distance", ...}``.
    ``progress(n)`` is called after every point with its ``inits``."""
    keys = jax.random.split(jax.random.PRNGKey(int(seed) + 7919), int(inits))
    f = _point_fn(init_fn, run, sel, float(eps), keys)
    points = []

    def evaluate(mw, mr):
        lgap, g = jax.device_get(f(jnp.asarray([mw, mr], jnp.float32)))
        la, la_se, lg, lg_se = rates(lgap, g, L)
        p = dict(
            weights=float(mw),
            residual=float(mr),
            angle_rate=la,
            angle_rate_se=la_se,
            lambda_g_input=lg,
            lambda_g_input_se=lg_se,
            distance=distance(la, lg, L, max_factor, max_angle_rate),
        )
        points.append(p)
        if progress is not None:
            progress(int(inits))
        return p

    lw = np.linspace(math.log(weights_range[0]), math.log(weights_range[1]), grid)
    lr = np.linspace(math.log(residual_range[0]), math.log(residual_range[1]), grid)
    evaluate(1.0, 1.0)  # the model as it is: its own fix when it already meets the criteria
    for a in lw:
        for b in lr:
            evaluate(math.exp(a), math.exp(b))
    best = _pick(points, margin)
    sw, sr = (lw[1] - lw[0]), (lr[1] - lr[0])
    fw = np.linspace(math.log(best["weights"]) - sw / 2, math.log(best["weights"]) + sw / 2, fine)
    fr = np.linspace(math.log(best["residual"]) - sr / 2, math.log(best["residual"]) + sr / 2, fine)
    for a in fw:
        for b in fr:
            evaluate(math.exp(a), math.exp(b))
    best = _pick(points, margin)
    return dict(best=best, points=points, inits=int(inits), margin=float(margin))


def preset_numbers(spec) -> dict:
    """The standard preset's (sigma, alpha_attn, alpha_mlp) as declared (defaults filled)."""
    from ..layers.presets import GPT2_SIGMA

    name, kw = spec
    alpha = float(kw.get("alpha", 1.0))
    return dict(
        sigma=float(kw.get("sigma", GPT2_SIGMA)),
        alpha_attn=float(kw.get("alpha_attn", alpha)),
        alpha_mlp=float(kw.get("alpha_mlp", alpha)),
    )


def theory_beside(spec, m_w, m_res, L, n_tokens, start, eps, max_factor, max_angle_rate) -> dict | None:
    """``recommend --block``'s answer for a standard preset beside the measured fix (module
    docstring), or None for a block it does not cover."""
    from ..layers import recommend as rb
    from ..layers import spec as lspec
    from . import theory

    name, kw = spec
    if name not in rb.BLOCKS:
        return None
    now = preset_numbers(spec)
    fixed_numbers = dict(
        sigma=now["sigma"] * m_w, alpha_attn=now["alpha_attn"] * m_res, alpha_mlp=now["alpha_mlp"] * m_res
    )
    others = {k: v for k, v in kw.items() if k not in ("sigma", "alpha", "alpha_attn", "alpha_mlp")}
    rec = rb.recommend(
        name, depth=int(L), n_tokens=int(n_tokens), max_factor=max_factor, max_angle_rate=max_angle_rate, fixed=others
    )
    best = rec["points"][0]
    block = lspec.build(name, {**others, **fixed_numbers})
    # the measured start; where the block's map is undefined there (post-LN's first attention
    # reads unnormalized tokens: the exact map needs q = 1), the normalized start (1, rho0)
    for st in ((float(start[0]), float(start[1])), (1.0, float(start[1]))):
        th = theory.curves(block, int(n_tokens), int(L), st[0], st[1], eps)
        la = float(np.log(th["gap"][-1] / th["gap"][0]) / L)
        lg = float(th["log_grad"][0] / L)
        if math.isfinite(la) and math.isfinite(lg):
            break
    rec_point = {k: best[k] for k in ("sigma", "alpha_attn", "alpha_mlp")}
    return dict(
        block=name,
        before=now,
        measured_fix=fixed_numbers,
        recommend=dict(
            rec_point,
            lambda_g_input=best["lambda_g_input"],
            angle_rate=best["angle_rate"],
            distance=best["distance"],
            found=rec["found"],
        ),
        log_ratio={k: float(math.log(fixed_numbers[k] / rec_point[k])) for k in rec_point if rec_point[k] > 0},
        theory_at_measured_fix=dict(
            angle_rate=la, lambda_g_input=lg, distance=distance(la, lg, L, max_factor, max_angle_rate)
        ),
    )


def fix(
    model,
    before,
    inits: int = 2,
    verify_inits: int = 16,
    seed: int = 0,
    eps: float = 1e-3,
    chunk: int = 1,
    max_factor: float = MAX_FACTOR,
    max_angle_rate: float = MAX_ANGLE_RATE,
    weights=None,
    residual=None,
    skip=None,
    margin: float = MARGIN,
    progress=None,
    measure=None,
) -> dict:
    """Search, verify and describe the fix of ``model`` (a :class:`phasefield.probing.Model`)
    whose probe as it is is ``before`` (a ProbeResult). The ``fix`` dict of the JSON.
    ``measure``: the probe that re-measures the fixed model (:func:`phasefield.probing.probe`,
    which passes itself). ``progress(n)``: called with the initializations just measured, by
    the search and the check (a :class:`.measure.Steps` where the probe calls it)."""
    from .model import Model

    if measure is None:
        raise ValueError("fix needs measure=: the probe that re-measures the fixed model")
    probe = measure

    t0 = time.perf_counter()
    key0 = jax.random.PRNGKey(int(seed))
    sel = check_selection(jax.eval_shape(model.init_fn, key0), weights, residual, skip)
    run = (
        model.runner
        if model.runner is not None
        else capture.runner(model.apply_fn, model.inputs, blocks=model.blocks, stack=model.stack)
    )
    L = before.depth
    found = search(
        model.init_fn,
        run,
        L,
        sel,
        eps,
        inits=inits,
        seed=seed,
        max_factor=max_factor,
        max_angle_rate=max_angle_rate,
        margin=margin,
        progress=progress,
    )
    best = found["best"]
    m_w, m_res = best["weights"], best["residual"]
    init_fn = model.init_fn
    fixed = Model(
        lambda k: scale(init_fn(k), m_w, m_res, sel),
        model.apply_fn,
        model.inputs,
        blocks=model.blocks,
        stack=model.stack,
        block=None,
        name=model.name + " (fixed)",
        runner=model.runner,
    )
    verify_seed = int(seed) + 1_000_003  # fresh initializations: none shared with the search or the probe
    after = probe(
        fixed,
        inits=verify_inits,
        seed=verify_seed,
        eps=eps,
        chunk=chunk,
        max_factor=max_factor,
        max_angle_rate=max_angle_rate,
        progress=progress,
    )
    la, la_se = after.angle_rate
    lg, lg_se = after.lambda_g_input
    b_la, b_la_se = before.angle_rate
    b_lg, b_lg_se = before.lambda_g_input
    d_after = distance(la, lg, L, max_factor, max_angle_rate)
    out = dict(
        multipliers=dict(weights=m_w, residual=m_res),
        criteria=dict(max_gradient_factor=float(max_factor), max_angle_rate=float(max_angle_rate)),
        patterns=dict(weights=weights, residual=residual or RESIDUAL, skip=skip or SKIP),
        init_std=init_std(model.init_fn, key0, sel, m_w, m_res),
        before=dict(
            angle_rate=b_la,
            angle_rate_se=b_la_se,
            lambda_g_input=b_lg,
            lambda_g_input_se=b_lg_se,
            gradient_factor=_factor(b_lg, L),
            distance=distance(b_la, b_lg, L, max_factor, max_angle_rate),
            phase=list(before.phase),
            first_failing_block=before.first_failing_block,
        ),
        after=dict(
            angle_rate=la,
            angle_rate_se=la_se,
            lambda_g_input=lg,
            lambda_g_input_se=lg_se,
            gradient_factor=_factor(lg, L),
            gradient_factor_se=_factor(lg, L) * L * lg_se if math.isfinite(lg) else float("nan"),
            distance=d_after,
            phase=list(after.phase),
            first_failing_block=after.first_failing_block,
            inits=after.inits,
            seed=verify_seed,
        ),
        meets=bool(d_after <= 1.0),
        search=dict(
            points=len(found["points"]),
            inits=found["inits"],
            margin=found["margin"],
            weights_range=list(WEIGHTS_RANGE),
            residual_range=list(RESIDUAL_RANGE),
            best=best,
        ),
    )
    if model.spec is not None:
        n_tokens = int(np.shape(jax.eval_shape(lambda: run(model.init_fn(key0))[0]))[-2])
        out["theory"] = theory_beside(
            model.spec, m_w, m_res, L, n_tokens, before.start, eps, max_factor, max_angle_rate
        )
    out["seconds"] = time.perf_counter() - t0
    return out


def _factor(lg, L):
    x = lg * L
    return float(math.exp(x)) if math.isfinite(x) and abs(x) < 700 else float("nan")
