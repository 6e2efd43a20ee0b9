"""Named initialization recipes as code: each one a set of multipliers on a model's weight
matrices, by the role each matrix plays in its block, found as the fix finds them
(:func:`.fix.select`; the roles: :func:`roles`).

    new, info = recipes.apply("deepnorm", params, depth=12, post_ln=True)
    info["applicable"], info["reason"], info["multipliers"]   # {role: multiplier}

N (= L) is the number of blocks (each one attention and one MLP sublayer). Every recipe
multiplies the model's own draw (it stands in for the paper's base init, e.g. Xavier):

* ``deepnorm`` (Wang et al. 2022, DeepNet, encoder-only and decoder-only alike): post-LN
  sublayers ``x <- LN(alpha x + F(x))``, ``alpha = (2N)^(1/4)``, and the value and output
  projections and the MLP's weights times ``beta = (8N)^(-1/4)``. The skip's ``alpha`` is
  written as ``1/alpha`` on the branches' output projections: ``LN(alpha x + F) = LN(x +
  F / alpha)`` (a LayerNorm is invariant to a positive scale of its input, up to its
  epsilon), so it applies where the blocks end in a normalization (post-LN: each block's
  output tokens of equal norm); on a pre-LN stack it is not applicable.
* ``t-fixup`` (Huang et al. 2020): the value and output projections and the MLP's weights
  times ``0.67 N^(-1/4)`` (its encoder rule; ``decoder=True``: ``(9N)^(-1/4)``). Chosen over
  Admin (Liu et al. 2020), whose skip scales ``omega_i = sqrt(sum_{j<i} Var f_j)`` need the
  variance of every sublayer's branch output from a profiling pass (the probe sees whole
  blocks, not their sublayers). T-Fixup also removes the normalizations; a model's are kept.
* ``gpt2`` (Radford et al. 2019): every weight matrix std 0.02, the residual output
  projections ``0.02 / sqrt(2L)`` (multipliers: the target over the group's std as drawn).
* ``depth-mup`` (Yang et al. 2023, depth-muP): the residual branches times ``1/sqrt(L)``
  (on their output projections); ``completep`` (Dey et al. 2025, CompleteP): ``1/L``.
* ``rezero`` (Bachlechner et al. 2020; SkipInit, De & Smith 2020): the branches times 0
  (every block the identity, or its normalization alone, at init).
* ``small-std``: every weight matrix times ``m`` (default 1/2): the "scale everything down"
  baseline.

A recipe that cannot apply (no residual projection found, a post-LN recipe on a pre-LN
stack, no value projection of its own) says so: ``applicable`` False and the ``reason``,
and :func:`apply` returns the parameters unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from .paths import FUSED, KEY, QUERY, VALUE, attention_parents, groups, param_path, select, split_path

GPT2_STD = 0.02
SMALL_STD = 0.5
TFIXUP_ENCODER = 0.67
NAMES = ("deepnorm", "t-fixup", "gpt2", "depth-mup", "completep", "rezero", "small-std")

# a weight matrix's role in its block
ATTENTION_IN = ("query", "key", "value", "qkv", "attention")
ROLES = ATTENTION_IN + ("attn_out", "mlp", "mlp_out")
# the fix's parameter groups: what its search scales together
OUT = ("attn_out", "mlp_out")
# the knobs of the fix's search: the roles each multiplies (``weights``: every one)
KNOBS = {"weights": ROLES, "residual": OUT, "attention": ATTENTION_IN, "mlp": ("mlp",)}


def deepnorm_constants(n_layers: int) -> tuple[float, float]:
    """DeepNet's (alpha, beta) for an N-layer encoder-only or decoder-only stack:
    ``((2N)^(1/4), (8N)^(-1/4))``."""
    n = _layers(n_layers)
    return (2.0 * n) ** 0.25, (8.0 * n) ** -0.25


def tfixup_scale(n_layers: int, decoder: bool = False) -> float:
    """T-Fixup's multiplier of the value and output projections and MLP weights:
    ``0.67 N^(-1/4)`` (encoder), ``(9N)^(-1/4)`` (decoder)."""
    n = _layers(n_layers)
    return (9.0 * n) ** -0.25 if decoder else TFIXUP_ENCODER * n**-0.25


def gpt2_std(n_layers: int) -> tuple[float, float]:
    """GPT-2's (weight std, residual output projection std): ``(0.02, 0.02 / sqrt(2L))``."""
    n = _layers(n_layers)
    return GPT2_STD, GPT2_STD / math.sqrt(2.0 * n)


def _layers(n):
    if int(n) != n or n < 1:
        raise ValueError(f"the number of layers must be an integer >= 1, got {n}")
    return int(n)


def roles(sel: dict) -> dict:
    """``{path: role}`` of the fix's weight matrices (``sel`` of :func:`.fix.select`):
    ``query``, ``key``, ``value``, ``qkv`` (fused), ``attention`` (another matrix of an
    attention), ``attn_out`` and ``mlp_out`` (the residual output projections: of an
    attention, by its module or an ``attn``/``attention`` in the path, or else of the MLP),
    ``mlp`` (every other weight matrix)."""
    att = attention_parents(sel)
    out = {}
    for p, (_, residual) in sel.items():
        parent, name = split_path(p)
        in_att = parent in att
        if residual:
            words = p.lower().split("/")
            out[p] = "attn_out" if in_att or any("attn" in w or "attention" in w for w in words) else "mlp_out"
        elif in_att:
            out[p] = (
                "query"
                if name in QUERY
                else "key"
                if name in KEY
                else "value"
                if name in VALUE
                else "qkv"
                if name in FUSED
                else "attention"
            )
        else:
            out[p] = "mlp"
    return out


@dataclasses.dataclass(frozen=True)
class Structure:
    """What a recipe reads of a model: its depth L, the role of every weight matrix,
    whether its blocks end in a normalization (``post_ln``: True, False, or None unknown),
    the std of each matrix's group as drawn (``std``, for recipes that set a std)."""

    depth: int
    roles: dict
    post_ln: bool | None = None
    std: dict | None = None


def _present(st, *needed):
    have = set(st.roles.values())
    return [r for r in needed if r not in have]


def plan(name: str, st: Structure, m: float = SMALL_STD, decoder: bool = False) -> dict:
    """``{"name", "text", "applicable", "reason", "multipliers"}``: the recipe ``name`` on a
    model of structure ``st``; ``multipliers`` ``{role: m}`` (roles not named keep 1), or,
    for ``gpt2``, ``{path: m}`` from the groups' std. ``reason``: None where it applies."""
    if name not in NAMES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(NAMES)}")
    L = _layers(st.depth)
    has_res = any(r in ("attn_out", "mlp_out") for r in st.roles.values())
    no_res = "no residual output projection was found"
    out = dict(name=name, applicable=True, reason=None, multipliers={})
    if name in ("deepnorm", "t-fixup"):
        if name == "deepnorm":
            a, b = deepnorm_constants(L)
            out["text"] = (
                f"post-LN skip x alpha = (2N)^(1/4) = {a:.4g} (as 1/alpha on the branches' output projections), "
                f"value, output projections and MLP x beta = (8N)^(-1/4) = {b:.4g}"
            )
            out_m = b / a
        else:
            b = tfixup_scale(L, decoder)
            rule = "(9N)^(-1/4)" if decoder else "0.67 N^(-1/4)"
            out["text"] = f"value, output projections and MLP x {rule} = {b:.4g} (normalizations kept)"
            out_m = b
        missing = _present(st, "value", "attn_out")
        if missing or not has_res:
            out["reason"] = (
                "no value projection of its own (fused or not found)"
                if "value" in missing
                else "no attention output projection was found"
            )
        elif name == "deepnorm" and st.post_ln is not True:
            out["reason"] = (
                "a post-LN recipe: the blocks do not end in a normalization (pre-LN), so the skip cannot be scaled"
                if st.post_ln is False
                else "a post-LN recipe: whether the blocks end in a normalization is not known"
            )
        out["multipliers"] = dict(value=b, attn_out=out_m, mlp=b, mlp_out=out_m)
    elif name == "gpt2":
        w, r = gpt2_std(L)
        out["text"] = f"every weight matrix std {w:g}, residual output projections std 0.02/sqrt(2L) = {r:.4g}"
        if not has_res:
            out["reason"] = no_res
        elif not st.std:
            out["reason"] = "the weight matrices' std as drawn is not known"
        else:
            mult = {}
            for p, role in st.roles.items():
                s = st.std.get(p, 0.0)
                target = r if role in ("attn_out", "mlp_out") else w
                mult[p] = target / s if s > 0 else float("nan")
            if not all(math.isfinite(v) for v in mult.values()):
                out["reason"] = "a weight matrix is drawn with std 0 (it cannot be rescaled to a std)"
            out["multipliers"] = mult
    elif name in ("depth-mup", "completep", "rezero"):
        f = {"depth-mup": 1.0 / math.sqrt(L), "completep": 1.0 / L, "rezero": 0.0}[name]
        out["text"] = {
            "depth-mup": f"residual branches x 1/sqrt(L) = {f:.4g} (on their output projections)",
            "completep": f"residual branches x 1/L = {f:.4g} (on their output projections)",
            "rezero": "residual branches x 0 (ReZero / SkipInit: every block its skip at init)",
        }[name]
        if not has_res:
            out["reason"] = no_res
        out["multipliers"] = dict(attn_out=f, mlp_out=f)
    else:  # small-std
        if not (m >= 0 and math.isfinite(m)):
            raise ValueError(f"small-std: the multiplier must be a finite number >= 0, got {m}")
        out["text"] = f"every weight matrix x {m:g}"
        out["multipliers"] = {r: float(m) for r in ROLES}
    out["applicable"] = out["reason"] is None
    return out


def per_path(p: dict, st: Structure) -> dict:
    """``{path: multiplier}`` of a :func:`plan` (1 where it names no role; all 1 where it
    does not apply)."""
    if not p["applicable"]:
        return {path: 1.0 for path in st.roles}
    m = p["multipliers"]
    return {path: float(m.get(path, m.get(role, 1.0))) for path, role in st.roles.items()}


def group_std(params, sel: dict) -> dict:
    """``{path: std}``: the std of each weight matrix's group (:func:`.fix.groups`: the same
    matrix in every block, pooled; each matrix about its own mean) in ``params``."""
    names = groups(list(sel))
    acc = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        p = param_path(path)
        if p in sel:
            a = np.asarray(leaf, np.float64)
            s = acc.setdefault(names[p], [0.0, 0])
            s[0] += float(np.square(a - a.mean()).sum())
            s[1] += a.size
    std = {g: math.sqrt(sq / n) if n else 0.0 for g, (sq, n) in acc.items()}
    return {p: std[names[p]] for p in sel}


def apply(
    name: str,
    params,
    depth: int,
    post_ln: bool | None = None,
    m: float = SMALL_STD,
    decoder: bool = False,
    weights=None,
    residual=None,
    skip=None,
):
    """``(params with the recipe applied, its plan)`` (module docstring): the weight
    matrices found as the fix finds them (``weights``, ``residual``, ``skip``: its patterns),
    ``depth`` the number of blocks, ``post_ln`` whether they end in a normalization. Where
    the recipe does not apply, the parameters come back unchanged with the reason."""
    sel = select(params, weights, residual, skip)
    st = Structure(int(depth), roles(sel), post_ln, group_std(params, sel) if name == "gpt2" else None)
    p = plan(name, st, m=m, decoder=decoder)
    if not p["applicable"]:
        return params, p
    mult = per_path(p, st)

    def f(path, leaf):
        k = param_path(path)
        return leaf if k not in mult else leaf * jnp.asarray(mult[k], jnp.result_type(leaf))

    return jax.tree_util.tree_map_with_path(f, params), p


def as_preset_numbers(name: str, numbers: dict, depth: int, width: int, m: float = SMALL_STD) -> dict | None:
    """The recipe in a standard preset's numbers (``numbers``: its sigma, alpha_attn,
    alpha_mlp), or None where one sigma cannot say it (DeepNorm, T-Fixup: the query and key
    keep their std while the value and the MLP's input change)."""
    s, aa, am = numbers["sigma"], numbers["alpha_attn"], numbers["alpha_mlp"]
    L = _layers(depth)
    if name == "gpt2":
        return dict(sigma=GPT2_STD * math.sqrt(width), alpha_attn=1 / math.sqrt(2 * L), alpha_mlp=1 / math.sqrt(2 * L))
    if name in ("depth-mup", "completep", "rezero"):
        f = {"depth-mup": 1.0 / math.sqrt(L), "completep": 1.0 / L, "rezero": 0.0}[name]
        return dict(sigma=s, alpha_attn=aa * f, alpha_mlp=am * f)
    if name == "small-std":
        return dict(sigma=s * m, alpha_attn=aa, alpha_mlp=am)
    return None
