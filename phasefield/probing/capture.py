"""Where the blocks are: the tokens entering the first block and leaving every block of a
user's model, and the first block's input replaced by tokens of our choosing.

Two ways to name the blocks:

* **Flax modules** (``blocks=``): a class (``isinstance``), a string (a module's class name,
  or a regular expression matched in full against the module's name or its path
  ``"h/0"``), or a filter ``f(module, method_name) -> bool`` with the signature of Flax's
  ``capture_intermediates``. Every call of a matching module's ``__call__`` is one block,
  in call order (a match inside a matched block is not another block). The calls are found
  with ``flax.linen.intercept_methods``, so any Flax model works without changing it; the
  block's first positional argument is its input tokens, its output (or the first element
  of a tuple output, as Hugging Face blocks return) the next tokens. Blocks inside
  ``nn.scan`` are traced once, inside the scan: :func:`runner` cannot return their tokens
  (use a stack callable), :func:`first_input` reads the first block's input at run time.
* **A plain callable** (``stack=``): ``stack(params, x) -> sequence of per-block tokens``
  (L arrays shaped like ``x``, or one array ``[L, *x.shape]``), where ``x`` is the tokens
  entering the first block (``inputs`` are then token embeddings).

:func:`runner` turns either into ``run(params, inject) -> (x0, outs)``: ``x0`` the tokens
entering the first block (``inject`` when given), ``outs`` ``[L, *x0.shape]``. Pure and
traceable: ``jit``/``vmap``/``vjp`` apply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn


def stacked_outputs(x0, outs):
    """``(x0, outs stacked [L, ...])``: the first block's input and every block's output;
    ValueError where an output is not shaped like the input (a block must map tokens to
    tokens)."""
    bad = [o.shape for o in outs if o.shape != x0.shape]
    if bad:
        raise ValueError(f"a block's output {bad[0]} is not shaped like its input {x0.shape}")
    return x0, jnp.stack(outs)


def parse_blocks(blocks) -> tuple[str, Any]:
    """What ``blocks`` names: ``("class", a class or tuple of classes)``, ``("name", its
    compiled regular expression)`` (a class name or a path regex) or ``("filter", the
    function)``; ValueError (one line) for anything else."""
    if isinstance(blocks, type) or (isinstance(blocks, tuple) and blocks and all(isinstance(b, type) for b in blocks)):
        return "class", blocks
    if isinstance(blocks, str):
        if not blocks.strip():
            raise ValueError("blocks: an empty module name")
        try:
            return "name", re.compile(blocks)
        except re.error as exc:
            raise ValueError(f"blocks: {blocks!r} is not a class name or regular expression ({exc})") from None
    if callable(blocks):
        return "filter", blocks
    raise ValueError(f"blocks: expected a module class, a name or a filter function, not {type(blocks).__name__}")


def module_filter(blocks) -> Callable[[Any, str], bool]:
    """``f(module, method_name) -> bool`` from a class, a string or a filter."""
    kind, v = parse_blocks(blocks)
    if kind == "class":
        return lambda mod, method: method == "__call__" and isinstance(mod, v)
    if kind == "name":

        def by_name(mod, method):
            if method != "__call__":
                return False
            if type(mod).__name__ == blocks:
                return True
            name = mod.name or ""
            return bool(v.fullmatch(name) or v.fullmatch("/".join(map(str, mod.path))))

        return by_name
    return v


def block_call(state, fun, args, kwargs, inject=None, deltas=None, shift=None):
    """One matching block's call inside a capture (Linen's interceptor, NNX's patched
    ``__call__``): the first block's input replaced by ``inject`` and moved by ``shift``
    and kept as ``state["x0"]``; the block's output moved by ``deltas[i]`` (the i-th
    block) and appended to ``state["outs"]``; blocks nested in it are not matched."""
    if state["x0"] is None:
        if inject is not None:
            if jnp.shape(inject) != jnp.shape(args[0]):
                raise ValueError(f"the first block's input is {jnp.shape(args[0])}, not {jnp.shape(inject)}")
            args = (inject.astype(args[0].dtype),) + tuple(args[1:])
        if shift is not None:
            args = (args[0] + shift.astype(args[0].dtype),) + tuple(args[1:])
        state["x0"] = args[0]
    state["inside"] += 1
    try:
        out = fun(*args, **kwargs)
    finally:
        state["inside"] -= 1
    y = _first(out)
    if deltas is not None:
        i = len(state["outs"])
        if i >= deltas.shape[0]:
            raise ValueError(f"the model has more matching blocks than {deltas.shape[0]}")
        y = y + deltas[i].astype(y.dtype)
        out = _replace_first(out, y)
    state["outs"].append(y)
    return out


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def searched(seen, limit: int = 12) -> str:
    """``"searched N modules: classes A, B; paths a, a/b, ..."`` from ``(class name, path)``
    pairs: what a block name was matched against, for the message when none matched."""
    classes = list(dict.fromkeys(c for c, _ in seen))
    paths = list(dict.fromkeys(p for _, p in seen if p))

    def head(xs):
        return ", ".join(xs[:limit]) + (f", ... ({len(xs) - limit} more)" if len(xs) > limit else "")

    if not seen:
        return "the model called no Flax module (is it a Flax model? otherwise pass stack=)"
    return f"searched {len(seen)} module calls: classes {head(classes)}; paths {head(paths) or '(none)'}"


def _seen_entry(context):
    mod = context.module
    return type(mod).__name__, "/".join(map(str, getattr(mod, "path", ()) or ()))


def first_input(apply_fn, params, inputs, blocks):
    """The tokens entering the first matching block, as a concrete array, also where the
    blocks run inside ``nn.scan`` (read with an ordered ``jax.debug.callback``, so the value
    of the first call at run time is kept). Measurement only (no gradient, no vmap)."""
    import numpy as np

    match = module_filter(blocks)
    got, seen = [], []

    def keep(v):
        if not got:
            got.append(np.asarray(v))

    def interceptor(next_fun, args, kwargs, context):
        if args and match(context.module, context.method_name):
            jax.debug.callback(keep, args[0], ordered=True)
        elif context.method_name == "__call__":
            seen.append(_seen_entry(context))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        out = apply_fn(params, inputs)
    jax.block_until_ready(out)
    jax.effects_barrier()
    if not got:
        raise ValueError(f"the model has no block matching {blocks!r} ({searched(seen)})")
    return got[0]


def _replace_first(out, x):
    if isinstance(out, tuple):
        return (x,) + tuple(out[1:])
    if isinstance(out, list):
        return [x] + list(out[1:])
    return x


def runner(apply_fn, inputs, blocks=None, stack=None):
    """``run(params, inject=None, deltas=None, shift=None) -> (x0, outs)`` (module
    docstring); ``deltas`` ``[L, *x0.shape]`` are added to the blocks' outputs (Flax blocks
    only: the gradient at every block's output in one vector-Jacobian product); ``shift``
    (shaped like ``x0``) is added to the first block's input (the gradient at the input from
    the same pass that reads it)."""
    if (blocks is None) == (stack is None):
        raise ValueError("name the blocks with exactly one of blocks= (Flax modules) or stack= (a callable)")
    if stack is not None:

        def run_stack(params, inject=None, deltas=None, shift=None):
            if deltas is not None:
                raise ValueError("deltas need Flax blocks (blocks=), not a stack callable")
            x0 = inputs if inject is None else inject
            if shift is not None:
                x0 = x0 + shift.astype(jnp.result_type(x0))
            outs = stack(params, x0)
            outs = jnp.stack(list(outs)) if isinstance(outs, (list, tuple)) else jnp.asarray(outs)
            if outs.ndim != jnp.ndim(x0) + 1 or outs.shape[1:] != jnp.shape(x0):
                raise ValueError(
                    f"stack() must return per-block tokens shaped like its input {jnp.shape(x0)}, got {outs.shape}"
                )
            return x0, outs

        return run_stack

    match = module_filter(blocks)

    def run(params, inject=None, deltas=None, shift=None):
        state = dict(x0=None, outs=[], inside=0)
        seen = []

        def interceptor(next_fun, args, kwargs, context):
            if state["inside"] or not match(context.module, context.method_name):
                if not state["inside"] and context.method_name == "__call__":
                    seen.append(_seen_entry(context))
                return next_fun(*args, **kwargs)
            if not args:
                raise ValueError(
                    f"block {context.module.name!r} takes its tokens as a keyword; "
                    "name a module whose first positional argument is the tokens"
                )
            return block_call(state, next_fun, args, kwargs, inject, deltas, shift)

        with nn.intercept_methods(interceptor):
            apply_fn(params, inputs)
        if state["x0"] is None:
            raise ValueError(f"the model has no block matching {blocks!r} ({searched(seen)})")
        return stacked_outputs(state["x0"], state["outs"])

    return run
