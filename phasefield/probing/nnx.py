"""Flax NNX models in the probe: ``phasefield.probe(make, inputs, blocks="Block")``.

``make`` is a function ``rngs -> nnx.Module`` (its first parameter named ``rngs``), the NNX
way of drawing independent initializations: each init builds the model from
``nnx.Rngs(key)``. A module instance (``phasefield.probe(model, inputs, ...)``) is one
initialization; the probe draws others from the initializers its layers keep
(``kernel_init``, ``bias_init``, ``scale_init``, ``embedding_init`` of ``nnx.Linear``,
``nnx.LayerNorm``, ``nnx.Embed`` ...) and refuses, naming them, parameters whose layer keeps
none (``nnx.LinearGeneral`` inside ``nnx.MultiHeadAttention``, a bare ``nnx.Param``): pass
the function then.

The parameters are the module's ``nnx.split`` state (a pytree: ``init_fn(key) -> state``);
``apply_fn(state, x)`` merges it back and calls the module. The blocks are found as for
Linen (:mod:`.capture`): a class, a class name or a regular expression matched in full
against a submodule's attribute name or its path (``"blocks/0"``), or a filter
``f(module, "__call__")``. Every call of a matching submodule is one block, in call order
(found by wrapping its class's ``__call__`` while the model runs, so the model is not
changed); its first positional argument is its tokens, its output (or the first element of
a tuple) the next tokens.
"""

from __future__ import annotations

import inspect

import jax

from .capture import block_call, parse_blocks, stacked_outputs


def _nnx():
    from flax import nnx

    return nnx


def is_nnx(obj) -> bool:
    """An ``nnx.Module`` or a function whose first parameter is named ``rngs``."""
    try:
        nnx = _nnx()
    except ImportError:  # pragma: no cover - flax without nnx
        return False
    if isinstance(obj, nnx.Module):
        return True
    if callable(obj) and not isinstance(obj, type):
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return False
        return bool(params) and params[0] == "rngs"
    return False


def _path(p) -> str:
    return "/".join(str(k) for k in p)


def _matcher(blocks):
    kind, v = parse_blocks(blocks)
    if kind == "class":
        return lambda mod, path: isinstance(mod, v)
    if kind == "name":

        def by_name(mod, path):
            if type(mod).__name__ == blocks:
                return True
            last = str(path[-1]) if path else ""
            return bool(v.fullmatch(last) or v.fullmatch(_path(path)))

        return by_name
    return lambda mod, path: v(mod, "__call__")


def _modules(module):
    nnx = _nnx()
    return [(p, m) for p, m in nnx.iter_graph(module) if isinstance(m, nnx.Module)]


def block_paths(module, blocks) -> list:
    """The paths of the submodules matching ``blocks`` (outermost matches only), or a
    ValueError naming what was searched."""
    match = _matcher(blocks)
    mods = _modules(module)
    found = [p for p, m in mods if p and match(m, p)]
    found = [p for p in found if not any(q != p and p[: len(q)] == q for q in found)]
    if not found:
        classes = list(dict.fromkeys(type(m).__name__ for _, m in mods))
        paths = [_path(p) for p, _ in mods if p]
        head = lambda xs: ", ".join(xs[:12]) + (f", ... ({len(xs) - 12} more)" if len(xs) > 12 else "")
        raise ValueError(
            f"the model has no block matching {blocks!r} (searched {len(mods)} NNX modules: classes "
            f"{head(classes)}; paths {head(paths) or '(none)'})"
        )
    return found


def _get(module, path):
    for k in path:
        module = module[k] if isinstance(k, int) or not hasattr(module, str(k)) else getattr(module, str(k))
    return module


def _redraw_plan(module):
    """``{param path string: (initializer, shape, dtype)}`` for every ``nnx.Param`` of an
    instance, or a ValueError naming those whose layer keeps no initializer."""
    from .fix import param_path

    nnx = _nnx()
    owners = {p: m for p, m in nnx.iter_graph(module)}
    plan, missing = {}, []
    for p, node in nnx.iter_graph(module):
        if not isinstance(node, nnx.Param) or not p:
            continue
        owner = owners.get(p[:-1])
        init = getattr(owner, f"{p[-1]}_init", None)
        val = node.get_value() if hasattr(node, "get_value") else node.value
        key = param_path([jax.tree_util.DictKey(k) for k in p])
        if not callable(init):
            missing.append(key)
        else:
            plan[key] = (init, tuple(val.shape), val.dtype)
    if missing:
        shown = ", ".join(missing[:6]) + (f", ... ({len(missing) - 6} more)" if len(missing) > 6 else "")
        raise ValueError(
            f"an nnx.Module instance is one initialization, and the probe cannot draw others: no initializer "
            f"is kept for {shown}; pass a function instead, e.g. lambda rngs: MyModel(..., rngs=rngs)"
        )
    return plan


def model(make, inputs, blocks=None, stack=None, name: str = "model"):
    """A :class:`phasefield.probing.Model` of an NNX model (module docstring)."""
    from .fix import param_path
    from .model import Model

    nnx = _nnx()
    if inputs is None:
        raise ValueError("an NNX model needs its inputs: probe(make, inputs, blocks=...)")
    if (blocks is None) == (stack is None):
        raise ValueError("name the blocks with exactly one of blocks= (NNX modules) or stack= (a callable)")
    if isinstance(make, nnx.Module):
        abstract = make
        graphdef, state0 = nnx.split(make)
        plan = _redraw_plan(make)

        def init_fn(key):
            leaves = {}

            def draw(path, leaf):
                p = param_path(path)
                if p not in plan:
                    return leaf
                if p not in leaves:
                    i = len(leaves)
                    init, shape, dtype = plan[p]
                    leaves[p] = init(jax.random.fold_in(key, i), shape, dtype)
                return leaves[p]

            return jax.tree_util.tree_map_with_path(draw, state0)
    else:
        try:
            abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        except Exception as exc:  # noqa: BLE001 - the user's constructor: one line
            raise ValueError(f"building the NNX model failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(abstract, nnx.Module):
            raise ValueError(f"the NNX factory must return an nnx.Module, not {type(abstract).__name__}")
        graphdef = nnx.split(abstract)[0]

        def init_fn(key):
            return nnx.split(make(nnx.Rngs(key)))[1]

    def apply_fn(state, x):
        return nnx.merge(graphdef, state)(x)

    if stack is not None:
        from .capture import runner

        return Model(
            init_fn,
            apply_fn,
            inputs,
            stack=lambda st, x: stack(nnx.merge(graphdef, st), x),
            name=name,
            runner=runner(apply_fn, inputs, stack=lambda st, x: stack(nnx.merge(graphdef, st), x)),
        )
    paths = block_paths(abstract, blocks)
    _ = param_path  # the same path spelling as the fix

    def run(state, inject=None, deltas=None, shift=None):
        mod = nnx.merge(graphdef, state)
        targets = {id(_get(mod, p)) for p in paths}
        classes = {type(_get(mod, p)) for p in paths}
        st = dict(x0=None, outs=[], inside=0)
        originals = {}

        def wrap(orig):
            def call(self, *args, **kwargs):
                if st["inside"] or id(self) not in targets:
                    return orig(self, *args, **kwargs)
                if not args:
                    raise ValueError(
                        "a block takes its tokens as a keyword; name a module whose first argument is them"
                    )
                return block_call(st, lambda *a, **k: orig(self, *a, **k), args, kwargs, inject, deltas, shift)

            return call

        try:
            for cls in classes:
                originals[cls] = cls.__dict__.get("__call__")
                cls.__call__ = wrap(cls.__call__)
            mod(inputs)
        finally:
            for cls, orig in originals.items():
                if orig is None:
                    del cls.__call__
                else:
                    cls.__call__ = orig
        if st["x0"] is None:
            raise ValueError(f"the model's blocks matching {blocks!r} were not called")
        return stacked_outputs(st["x0"], st["outs"])

    return Model(init_fn, apply_fn, inputs, blocks=blocks, name=name, runner=run)
