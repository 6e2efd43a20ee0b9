"""A fix for the model as it is: multipliers on its initialization, found by measuring,
with the named recipes measured beside it.

    res = phasefield.probe(model, inits=16, fix=True)
    res.fix["multipliers"]    # {"weights": m_w, "residual": m_res, "attention": 1, "mlp": 1}
    res.fix["after"]          # the model re-probed at the fixed init, fresh seeds, +- se
    res.fix["meets"]          # whether the criteria hold there
    res.fix["recipes"]        # DeepNorm, T-Fixup, GPT-2, depth-muP, ... measured the same way

Every transformer has two scales that move its rates: the init scale of its weight matrices
and the scale of its residual branches' output projections. The fix multiplies

* **every weight matrix** (a float parameter with two or more axes, not a ``bias``, whose
  path does not match ``skip``, by default the embeddings: ``embed``, ``wte``, ``wpe``, ``position``) by
  ``m_w``; with ``weights=REGEX`` only the matching ones;
* **the residual branches' output projections** (paths matching ``residual``: by default
  GPT-2's ``c_proj``, BERT's and ViT's ``output/dense``, LLaMA's ``o_proj``/``down_proj``
  (and ``wo``/``w2``), ``out_proj``/``fc2``/``linear2``/``attn/proj``, Flax's example
  ``MlpBlock``'s ``Dense_1``, phasefield's MLP ``dense_1`` and GLU ``out``, and, found by
  its neighbours, the ``out`` of any attention holding ``query`` and ``key`` projections:
  ``nnx.MultiHeadAttention``, ``linen.MultiHeadDotProductAttention``, phasefield's own) by
  ``m_res`` on top;
* an attention's other matrices (``attention``) or the MLP's (``mlp``) by their own
  multiplier on top, where that alone is the nearer fix,

found by the continuous search of :mod:`.search` (the same initialization keys at every
point) on the angle rate of nearby tokens ``angle_rate`` and the whole stack's gradient rate
``lambda_g_input``, with the criteria of ``phasefield recommend --block`` (:mod:`.blocks`):
distance ``d = max(|L lambda_g_input| / log F, |angle_rate| / r)``, the fix the point
nearest the model as it is (least ``sum |log m|``) with ``d <= margin`` (0.8: room for the
search's few inits), else the one with the smallest d. It is then verified: the model at the
fixed initialization is measured again with fresh seeds and ``verify_inits``
initializations, and so is every recipe of :mod:`.recipes` (``recipes``: their names, by
default all) and, for a preset, ``recommend --block``'s answer: the same program, the same
keys.

For a phasefield preset (``--block`` or declared with ``--as``), the measured fix is also
written in the preset's numbers (sigma x m_w, alpha_attn and alpha_mlp x m_res) beside
``recommend --block``'s theory answer for the same depth and criteria, with the theory's
rates at the measured fix.

A causal model (``before.causal``) is searched, checked and compared on the last token's
rates (``angle_rate_last``, ``lambda_g_last``: ``fix["rates"]`` names them; the
whole-sequence rates are reported beside them): the recipes likewise. ``recommend --block``
searches the (q, p) theory, which has no causal answer: for a causal preset ``fix.theory``
holds the causal theory's rates (:func:`phasefield.layers.causal_rates`) as it is and at the
measured fix, without ``recommend``'s answer.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import capture, measure, result
from . import recipes as rc
from . import search as sr
from .blocks import MAX_ANGLE_RATE, MAX_FACTOR
from .paths import RESIDUAL, SKIP, groups, param_path, select  # noqa: F401  (the fix's names)
from .search import MARGIN, RESIDUAL_RANGE, WEIGHTS_RANGE, distance


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
            f"{residual or 'the default names (c_proj, o_proj, out_proj, down_proj, fc2, output/dense, an attention out, ...)'} "
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


def init_std(params, sel, mult: dict) -> dict:
    """The std of each parameter group (:func:`groups`; :func:`.recipes.group_std`) in
    ``params`` (one initialization), as the model draws it and after the multipliers
    ``{path: m}`` (one per group)."""
    names = groups(list(sel))
    std = rc.group_std(params, sel)
    out = {}
    for p in sel:
        m = mult.get(p, 1.0)
        out.setdefault(names[p], dict(before=std[p], after=std[p] * m, multiplier=m, residual_projection=sel[p][1]))
    return out


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


def fix_in_numbers(spec, knobs) -> tuple[dict, dict, bool, dict]:
    """(the preset's numbers now, the measured fix in them, whether they express it: a fix
    with its own attention or MLP multiplier has no preset numbers, the preset's other
    keywords)."""
    _, kw = spec
    now = preset_numbers(spec)
    m_w, m_res = knobs.get("weights", 1.0), knobs.get("residual", 1.0)
    fixed_numbers = dict(
        sigma=now["sigma"] * m_w, alpha_attn=now["alpha_attn"] * m_res, alpha_mlp=now["alpha_mlp"] * m_res
    )
    expressible = all(knobs.get(k, 1.0) == 1.0 for k in ("attention", "mlp"))
    others = {k: v for k, v in kw.items() if k not in ("sigma", "alpha", "alpha_attn", "alpha_mlp")}
    return now, fixed_numbers, expressible, others


def theory_beside(spec, knobs, L, n_tokens, start, eps, max_factor, max_angle_rate, causal=False) -> dict | None:
    """``recommend --block``'s answer for a standard preset beside the measured fix (module
    docstring; ``knobs``: its multipliers), or None for a block it does not cover. A fix
    with its own attention or MLP multiplier has no preset numbers (one sigma sets every
    matrix): ``measured_fix`` None. ``causal``: :func:`causal_beside`."""
    from ..layers import recommend as rb
    from ..layers import spec as lspec
    from . import theory

    name, kw = spec
    if name not in rb.BLOCKS:
        return None
    if causal:
        return causal_beside(spec, knobs, L, n_tokens, start, max_factor, max_angle_rate)
    now, fixed_numbers, expressible, others = fix_in_numbers(spec, knobs)
    rec = rb.recommend(
        name, depth=int(L), n_tokens=int(n_tokens), max_factor=max_factor, max_angle_rate=max_angle_rate, fixed=others
    )
    best = rec["points"][0]
    la = lg = float("nan")
    if expressible:
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
        measured_fix=fixed_numbers if expressible else None,
        recommend=dict(
            rec_point,
            lambda_g_input=best["lambda_g_input"],
            angle_rate=best["angle_rate"],
            distance=best["distance"],
            found=rec["found"],
        ),
        log_ratio={k: float(math.log(fixed_numbers[k] / rec_point[k])) for k in rec_point if rec_point[k] > 0}
        if expressible
        else {},
        theory_at_measured_fix=dict(
            angle_rate=la, lambda_g_input=lg, distance=distance(la, lg, L, max_factor, max_angle_rate)
        )
        if expressible
        else None,
    )


def causal_beside(spec, knobs, L, n_tokens, start, max_factor, max_angle_rate) -> dict:
    """A causal standard preset's theory beside the measured fix: the last token's rates of
    :func:`phasefield.layers.causal_rates` (every attention masked, from the measured start)
    as it is and at the measured fix in the preset's numbers (None where the fix scales the
    attention or the MLP alone); ``recommend`` None (module docstring)."""
    from ..layers import spec as lspec
    from ..layers.causal import masked
    from . import theory

    name, kw = spec
    now, fixed_numbers, expressible, others = fix_in_numbers(spec, knobs)

    def rates(numbers):
        block = masked(lspec.build(name, {**others, **numbers}), True)
        th = theory.causal(block, int(n_tokens), int(L), float(start[0]), float(start[1]))
        la, lg = float(th["angle_rate_last"]), float(th["lambda_g_last"])
        return dict(angle_rate_last=la, lambda_g_last=lg, distance=distance(la, lg, L, max_factor, max_angle_rate))

    return dict(
        block=name,
        causal=True,
        before=now,
        theory_as_is=rates(now),
        measured_fix=fixed_numbers if expressible else None,
        recommend=None,
        log_ratio={},
        theory_at_measured_fix=rates(fixed_numbers) if expressible else None,
    )


def search_size(max_points: int = sr.MAX_POINTS) -> int:
    """The most points the search measures (:mod:`.search`)."""
    return int(max_points)


def check_size(recipes=None, spec=None, causal=False) -> int:
    """The measurements of the check, in models: the fix, the recipes, and recommend's
    answer for a preset ``spec`` it covers (not for a causal model)."""
    from ..layers import recommend as rb

    return 1 + len(_recipe_names(recipes)) + int(spec is not None and spec[0] in rb.BLOCKS and not causal)


def _recipe_names(recipes):
    if recipes is None:
        return list(rc.NAMES)
    names = [recipes] if isinstance(recipes, str) else list(recipes)
    bad = [n for n in names if n not in rc.NAMES]
    if bad:
        raise ValueError(f"recipes: unknown recipe {bad[0]!r}; choose from {', '.join(rc.NAMES)}")
    return list(dict.fromkeys(names))


def check_fn(init_fn, run, idx, eps, chunk, with_deltas, causal=False):
    """``f(vec, keys) -> raw``: the probe's measurements (:func:`.measure.one`) of the model
    with its weight matrices times ``vec`` (:func:`.search.scale_vector`), one compiled
    program for the fix, every recipe and recommend's answer."""

    def one(vec, key):
        init = lambda k: sr.scale_vector(init_fn(k), vec, idx)
        return measure.one(init, run, key, eps, None, True, with_deltas, causal)

    return jax.jit(lambda vec, keys: jax.lax.map(lambda k: one(vec, k), keys, batch_size=max(1, int(chunk))))


def measured(raw, L, name, eps, max_factor, max_angle_rate, seed, causal=False) -> dict:
    """The rates, phase and first failing block of a check's measurements (the probe's
    :class:`.result.ProbeResult`), or ``{"finite": False, "reason": ...}``; ``causal``: the
    last token's rates too, which the distance, the gradient factor and the phase read."""
    bad = int(np.min(raw["finite"]))
    if bad < L or not np.all(raw["grad_finite"]):
        where = f"after block {bad + 1} of {L}" if bad < L else "in the gradient at the first block's input"
        return dict(finite=False, reason=f"not finite (NaN or inf) {where}")
    res = result.ProbeResult(
        name=name,
        ds=result.dataset(raw),
        start=(float(np.mean(raw["q_data"][:, 0])), float(np.mean(raw["rho_data"][:, 0]))),
        eps=float(eps),
        max_factor=float(max_factor),
        max_angle_rate=float(max_angle_rate),
        causal=causal,
    )
    return dict(finite=True, **_rates(res, L, max_factor, max_angle_rate), inits=res.inits, seed=int(seed))


def _rates(res, L, max_factor, max_angle_rate) -> dict:
    """The rates of a ProbeResult (the whole sequence's; a causal model's last token's too),
    the gradient factor, distance and phase from the rates its criteria read."""
    la, la_se = res.angle_rate
    lg, lg_se = res.lambda_g_input
    out = dict(angle_rate=la, angle_rate_se=la_se, lambda_g_input=lg, lambda_g_input_se=lg_se)
    if res.causal:
        (a, a_se), (g, g_se) = res.rates
        out.update(angle_rate_last=a, angle_rate_last_se=a_se, lambda_g_last=g, lambda_g_last_se=g_se)
        la, lg, lg_se = a, g, g_se
    f = _factor(lg, L)
    return dict(
        out,
        gradient_factor=f,
        gradient_factor_se=f * L * lg_se if math.isfinite(lg) else float("nan"),
        distance=distance(la, lg, L, max_factor, max_angle_rate),
        phase=list(res.phase),
        first_failing_block=res.first_failing_block,
    )


def _role_summary(mult: dict, roles: dict) -> dict:
    """``{role: m}`` of ``{path: m}`` (a role's matrices sharing one multiplier, else the
    range ``[min, max]``), the roles left at 1 omitted."""
    by = {}
    for p, m in mult.items():
        by.setdefault(roles[p], []).append(float(m))
    return {r: (v[0] if max(v) == min(v) else [min(v), max(v)]) for r, v in by.items() if v != [1.0] * len(v)}


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
    recipes=None,
    small_std: float = rc.SMALL_STD,
    progress=None,
) -> dict:
    """Search, verify and describe the fix of ``model`` (a :class:`phasefield.probing.Model`)
    whose probe as it is is ``before`` (a ProbeResult), and measure the recipes beside it
    (``recipes``: names of :data:`.recipes.NAMES`, default all; ``small_std``: the
    ``small-std`` recipe's multiplier). The ``fix`` dict of the JSON. ``progress(n)``: called
    with the initializations just measured, by the search and the check."""
    t0 = time.perf_counter()
    names = _recipe_names(recipes)
    key0 = jax.random.PRNGKey(int(seed))
    sel = check_selection(jax.eval_shape(model.init_fn, key0), weights, residual, skip)
    roles = rc.roles(sel)
    idx = sr.index(sel)
    run = (
        model.runner
        if model.runner is not None
        else capture.runner(model.apply_fn, model.inputs, blocks=model.blocks, stack=model.stack)
    )
    L = before.depth
    causal = bool(before.causal)
    keys = jax.random.split(jax.random.PRNGKey(int(seed) + 7919), int(inits))
    f = sr.point_fn(model.init_fn, run, idx, float(eps), keys, causal)
    found = sr.Search(
        f,
        roles,
        idx,
        L,
        max_factor,
        max_angle_rate,
        margin,
        inits,
        progress,
        sr.MAX_POINTS,
        sr.BISECT,
        names=before.rate_names,
    ).run()
    best = found["best"]
    knobs = {k: best["knobs"].get(k, 1.0) for k in rc.KNOBS}
    mult = sr.knob_multipliers(best["knobs"], roles)
    params0 = jax.device_get(jax.jit(model.init_fn)(key0))
    post_ln = found["spread"] is not None and found["spread"] < sr.NORMALIZED
    n_tokens = int(np.shape(jax.eval_shape(lambda: run(model.init_fn(key0))[0]))[-2])
    width = int(np.shape(jax.eval_shape(lambda: run(model.init_fn(key0))[0]))[-1])

    verify_seed = int(seed) + 1_000_003  # fresh initializations: none shared with the search or the probe
    vkeys = jax.random.split(jax.random.PRNGKey(verify_seed), int(verify_inits))
    with_deltas = model.stack is None and getattr(run, "deltas", True)
    check = check_fn(model.init_fn, run, idx, float(eps), chunk, with_deltas, causal)

    def measure_at(m, name):
        raw = jax.device_get(check(jnp.asarray(sr.vector(m, idx)), vkeys))
        if progress is not None:
            progress(int(verify_inits))
        return measured(raw, L, name, eps, max_factor, max_angle_rate, verify_seed, causal)

    after = measure_at(mult, model.name + " (fixed)")
    if not after["finite"]:
        raise ValueError(f"the fixed model's tokens are {after['reason'][4:]}")
    out = dict(
        multipliers=knobs,
        rates=list(before.rate_names),
        criteria=dict(max_gradient_factor=float(max_factor), max_angle_rate=float(max_angle_rate)),
        patterns=dict(weights=weights, residual=residual or RESIDUAL, skip=skip or SKIP),
        roles={g: roles[p] for p, g in groups(list(sel)).items()},
        init_std=init_std(params0, sel, mult),
        before=_rates(before, L, max_factor, max_angle_rate),
        after=after,
        meets=bool(after["distance"] <= 1.0),
        search=dict(
            points=len(found["points"]),
            max_points=sr.MAX_POINTS,
            inits=int(inits),
            margin=float(margin),
            weights_range=list(WEIGHTS_RANGE),
            residual_range=list(RESIDUAL_RANGE),
            best=best,
            axes=found["axes"],
            normalized_spread=found["spread"],
        ),
    )
    theory = None
    if model.spec is not None:
        theory = theory_beside(
            model.spec, knobs, L, n_tokens, before.start, eps, max_factor, max_angle_rate, causal=causal
        )
        out["theory"] = theory
    st = rc.Structure(L, roles, post_ln, rc.group_std(params0, sel) if "gpt2" in names else None)
    arms = []
    for name in names:
        p = rc.plan(name, st, m=small_std)
        arm = dict(name=name, text=p["text"], applicable=p["applicable"], reason=p["reason"])
        pp = rc.per_path(p, st)
        arm["multipliers"] = _role_summary(pp, roles) if p["applicable"] else {}
        if theory is not None:
            arm["preset_numbers"] = rc.as_preset_numbers(name, theory["before"], L, width, m=small_std)
        if p["applicable"]:
            arm["after"] = measure_at(pp, name)
            arm["meets"] = bool(arm["after"].get("distance", float("inf")) <= 1.0)
        else:
            arm["after"], arm["meets"] = None, None
            if progress is not None:
                progress(int(verify_inits))  # counted in the total: the bar ends full
        arms.append(arm)
    if theory is not None and theory["recommend"] is not None:
        arms.append(_recommend_arm(theory, roles, measure_at, progress, verify_inits))
    out["recipes"] = arms
    out["seconds"] = time.perf_counter() - t0
    return out


def _recommend_arm(theory, roles, measure_at, progress, verify_inits) -> dict:
    """``recommend --block``'s answer as multipliers of the model as it is: sigma's ratio on
    every matrix, the branch scales' ratios on top on the output projections."""
    now, rec = theory["before"], theory["recommend"]
    arm = dict(
        name="recommend",
        text="recommend --block's theory answer: sigma {sigma:.4g}, alpha_attn {alpha_attn:.4g}, "
        "alpha_mlp {alpha_mlp:.4g}".format(**rec),
        preset_numbers={k: rec[k] for k in ("sigma", "alpha_attn", "alpha_mlp")},
    )
    zero = [k for k in ("sigma", "alpha_attn", "alpha_mlp") if not now[k] > 0]
    if zero:
        arm.update(applicable=False, reason=f"the model's {zero[0]} is 0: no multiplier reaches it", multipliers={})
        arm["after"], arm["meets"] = None, None
        if progress is not None:
            progress(int(verify_inits))
        return arm
    w = rec["sigma"] / now["sigma"]
    ratio = dict(attn_out=w * rec["alpha_attn"] / now["alpha_attn"], mlp_out=w * rec["alpha_mlp"] / now["alpha_mlp"])
    pp = {p: ratio.get(role, w) for p, role in roles.items()}
    arm.update(applicable=True, reason=None, multipliers=_role_summary(pp, roles))
    arm["after"] = measure_at(pp, "recommend")
    arm["meets"] = bool(arm["after"].get("distance", float("inf")) <= 1.0)
    return arm


def _factor(lg, L):
    x = lg * L
    return float(math.exp(x)) if math.isfinite(x) and abs(x) < 700 else float("nan")
