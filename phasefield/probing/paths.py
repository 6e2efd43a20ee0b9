"""Parameter paths: a pytree key path as text, which parameters are weight matrices and
residual output projections (:func:`select`, the names of :mod:`.fix`), where an attention's
projections are, and the parameter groups across blocks."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

RESIDUAL = (
    r"(^|/)(c_proj|o_proj|out_proj|down_proj|fc2|linear2|wo|w2)/(kernel|weight)$"
    r"|(^|/)output/dense/(kernel|weight)$"
    r"|(^|/)attn/proj/(kernel|weight)$"
    r"|(^|/)MlpBlock_\d+/Dense_1/kernel$"
    r"|(^|/)GLUModule_\d+/out/kernel$|(^|/)MLPModule_\d+/dense_1/kernel$"
)
ATTENTION_OUT = ("out",)  # an attention's output projection, found by its query/key neighbours
# not weight matrices: embeddings, and a normalization's ``scale`` (a vector, with 2 axes
# only where the blocks are scanned: ``nn.scan`` stacks every parameter on a depth axis)
SKIP = r"embed|(^|/)(wte|wpe)(/|$)|position|(^|/)scale$"


def _compile(text, what):
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"{what}: {text!r} is not a regular expression ({exc})") from None


def select(params, weights=None, residual=None, skip=None) -> dict:
    """``{path: (is_weight, is_residual)}`` of every weight matrix (module docstring). With
    the default names, an ``out`` matrix beside an attention's ``query`` and ``key`` is a
    residual projection too."""
    w_re = None if weights is None else _compile(weights, "the weights' pattern")
    r_re = _compile(RESIDUAL if residual is None else residual, "the residual projections' pattern")
    s_re = _compile(SKIP if skip is None else skip, "the skipped parameters' pattern")
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        shape, dtype = np.shape(leaf) if not hasattr(leaf, "shape") else leaf.shape, getattr(leaf, "dtype", None)
        if len(shape) < 2 or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            continue
        p = param_path(path)
        if p.rpartition("/")[2] == "bias" or s_re.search(p) or (w_re is not None and not w_re.search(p)):
            continue  # a bias of 2 axes (nnx.LinearGeneral's per head) is no weight matrix
        out[p] = (True, bool(r_re.search(p)))
    if residual is None:
        att = attention_parents(out)
        for p in out:
            parent, _, rest = p.rpartition("/")
            parent, _, name = parent.rpartition("/")
            if name in ATTENTION_OUT and parent in att and rest in ("kernel", "weight"):
                out[p] = (True, True)
    return out


QUERY = ("query", "q_proj", "q", "wq")
KEY = ("key", "k_proj", "k", "wk")
VALUE = ("value", "v_proj", "v", "wv")
FUSED = ("c_attn", "qkv", "in_proj", "query_key_value", "wqkv", "Wqkv")


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


def split_path(path):
    """``(parent module path, parameter's module name)`` of ``.../parent/name/kernel``."""
    parts = path.split("/")
    return "/".join(parts[:-2]), (parts[-2] if len(parts) >= 2 else "")


def attention_parents(paths) -> set:
    """The modules holding an attention's projections: a parent with a query and a key
    projection of its own, or a fused ``c_attn``/``qkv``/``in_proj``."""
    kids = {}
    for p in paths:
        parent, name = split_path(p)
        kids.setdefault(parent, set()).add(name)
    return {parent for parent, names in kids.items() if (names & set(QUERY) and names & set(KEY)) or names & set(FUSED)}
