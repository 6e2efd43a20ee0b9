"""Probe any JAX model at initialization: measured angle and gradient exponents per block.

    import phasefield
    res = phasefield.probe(init_fn, apply_fn, inputs, blocks="FlaxGPT2Block", inits=16)
    res.ds            # xarray: per-block q, rho (data / symmetric start), angle, gradient, +- se
    res.lambda_a, res.lambda_g, res.phase, res.verdict()

``init_fn(key) -> params`` draws one initialization (any pytree; for a Flax module
``lambda k: module.init(k, x)``); ``apply_fn(params, inputs)`` runs the model (its output is
not used). The blocks are named by ``blocks=`` (Flax modules: class, name, path regex or a
``capture_intermediates``-style filter) or ``stack=`` (a callable returning per-block
tokens): :mod:`.capture`. What is measured: :mod:`.measure`; the rates, phase and verdict:
:mod:`.result`; the theory beside it for phasefield's own blocks: :mod:`.theory`
(``block=`` a :mod:`phasefield.layers` block); ready-made models: :mod:`.models` (phasefield
presets) and :mod:`.hf` (Hugging Face Flax GPT-2, ViT, BERT at random init).

The module itself is callable: ``phasefield.probe(...)`` is :func:`probe`.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import capture, geometry, measure, result  # noqa: F401
from .result import ProbeResult

EPS = 1e-3


@dataclasses.dataclass
class Model:
    """What a ``--model module:factory`` returns: the arguments of :func:`probe`
    (``block``: a phasefield block for the theory curves, when the model is one)."""

    init_fn: Callable
    apply_fn: Callable
    inputs: Any
    blocks: Any = None
    stack: Callable | None = None
    block: Any = None
    name: str = "model"


def probe(
    init_fn,
    apply_fn=None,
    inputs=None,
    blocks=None,
    stack=None,
    inits: int = 16,
    seed: int = 0,
    eps: float = EPS,
    start=None,
    gradient: bool = True,
    chunk: int = 1,
    block=None,
    name: str = "model",
) -> ProbeResult:
    """Measure a model's blocks over ``inits`` independent initializations (module
    docstring). ``init_fn`` may also be a :class:`Model`. ``start=(q0, rho0)``: the
    permutation-symmetric start (default: the geometry of the tokens entering the first
    block, per init); ``eps``: 1 - rho of the nearby tokens; ``chunk``: inits vmapped at
    once; ``block``: a phasefield block whose theory curves are drawn beside (from the
    measured start). ValueError (one line) for bad input: no matching block, outputs not
    finite, fewer than 2 inits."""
    if isinstance(init_fn, Model):
        m = init_fn
        init_fn, apply_fn, inputs, blocks, stack = m.init_fn, m.apply_fn, m.inputs, m.blocks, m.stack
        block = m.block if block is None else block
        name = m.name if name == "model" else name
    if not callable(init_fn) or not callable(apply_fn):
        raise ValueError("probe needs an init function and an apply function")
    if int(inits) < 2:
        raise ValueError(f"inits must be at least 2 (standard errors), got {inits}")
    if not 0.0 < float(eps) < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    run = capture.runner(apply_fn, inputs, blocks=blocks, stack=stack)
    keys = jax.random.split(jax.random.PRNGKey(int(seed)), int(inits))
    st = None if start is None else tuple(float(s) for s in start)
    raw = jax.device_get(
        measure.many(init_fn, run, keys, float(eps), st, gradient, max(1, int(chunk)), with_deltas=stack is None)
    )
    L = np.asarray(raw["q_data"]).shape[1] - 1
    bad = int(np.min(raw["finite"]))
    if bad < L:
        raise ValueError(f"the model's tokens are not finite (NaN or inf) after block {bad + 1} of {L}")
    if "grad_finite" in raw and not np.all(raw["grad_finite"]):
        raise ValueError("the gradient at the first block's input is not finite (NaN or inf)")
    ds = result.dataset(raw)
    data0 = (float(ds["q_data"][0]), float(ds["rho_data"][0]))
    q0, rho0 = data0 if st is None else st
    rho0 = min(max(rho0, 0.0), 1.0)
    th = None
    if block is not None:
        from . import theory

        n_tokens = int(np.shape(jax.eval_shape(lambda: run(init_fn(keys[0]))[0]))[-2])
        th = theory.curves(block, n_tokens, L, q0, rho0, float(eps), grad_start=data0)
    return ProbeResult(name=name, ds=ds, start=(q0, rho0), eps=float(eps), theory=th)


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return probe(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
