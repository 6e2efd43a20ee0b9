"""Probe any JAX model at initialization: measured angle and gradient exponents per block.

    import phasefield
    res = phasefield.probe(init_fn, apply_fn, inputs, blocks="FlaxGPT2Block", inits=16)
    res.ds            # xarray: per-block q, rho (data / symmetric start), angle, gradient, +- se
    res.angle_rate, res.lambda_g_input, res.phase, res.verdict()

``init_fn(key) -> params`` draws one initialization (any pytree; for a Flax module
``lambda k: module.init(k, x)``); ``apply_fn(params, inputs)`` runs the model (its output is
not used). The blocks are named by ``blocks=`` (Flax modules: class, name, path regex or a
``capture_intermediates``-style filter) or ``stack=`` (a callable returning per-block
tokens): :mod:`.capture`. What is measured: :mod:`.measure`; the rates, phase and verdict:
:mod:`.result`; the theory beside it for phasefield's own blocks: :mod:`.theory`
(``block=`` a :mod:`phasefield.layers` block); ready-made models: :mod:`.models` (phasefield
presets) and :mod:`.hf` (Hugging Face Flax GPT-2, ViT, BERT at random init); Flax NNX
models: :mod:`.nnx` (``probe(make, inputs, blocks=...)`` with ``make(rngs) -> nnx.Module``).
Where it fails, per block: :mod:`.blocks` (``res.first_failing_block``); a fix of the
model's init, measured and verified: :mod:`.fix` (``probe(..., fix=True)``).

``phasefield.probe(...)`` is :func:`probe` of this package.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from . import capture, geometry, measure, result  # noqa: F401
from .model import Model
from .result import ProbeResult

EPS = 1e-3


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
    max_factor: float = 10.0,
    max_angle_rate: float = 0.05,
    fix: bool = False,
    fix_options: dict | None = None,
    progress=None,
) -> ProbeResult:
    """Measure a model's blocks over ``inits`` independent initializations (module
    docstring). ``init_fn`` may also be a :class:`Model`, or a Flax NNX model: a function
    ``rngs -> nnx.Module`` (or a :class:`flax.nnx.Module`, refused with a message: one
    instance is one initialization) with ``inputs`` as the second argument (:mod:`.nnx`).
    ``start=(q0, rho0)``: the permutation-symmetric start (default: the geometry of the
    tokens entering the first block, per init); ``eps``: 1 - rho of the nearby tokens;
    ``chunk``: inits vmapped at once; ``block``: a phasefield block whose theory curves are
    drawn beside (from the measured start). ``max_factor``, ``max_angle_rate``: the criteria
    of the per-block bands (:mod:`.blocks`) and of the fix. ``fix=True`` searches and verifies
    a fix of the init (:mod:`.fix`; ``fix_options``: the keywords of :func:`.fix.fix`, e.g.
    ``residual``, ``weights``, ``inits``, ``verify_inits``, ``recipes``), put in ``result.fix``
    with the named init recipes measured beside it (:mod:`.recipes`);
    ``progress(done, total)`` follows the work in initializations measured: the probe's,
    and with ``fix`` the search's (``inits`` per point) and the check's. ValueError (one line) for bad input: no
    matching block, outputs not finite, fewer than 2 inits."""
    from . import nnx as _nnx

    if _nnx.is_nnx(init_fn):
        init_fn = _nnx.model(init_fn, apply_fn if inputs is None else inputs, blocks=blocks, stack=stack, name=name)
    run = None
    spec = None
    if isinstance(init_fn, Model):
        m = init_fn
        init_fn, apply_fn, inputs, blocks, stack = m.init_fn, m.apply_fn, m.inputs, m.blocks, m.stack
        block = m.block if block is None else block
        name = m.name if name == "model" else name
        run, spec = m.runner, m.spec
    if not callable(init_fn) or not callable(apply_fn):
        raise ValueError("probe needs an init function and an apply function")
    if not (float(max_factor) > 1.0 and math.isfinite(float(max_factor))):
        raise ValueError(f"max_factor must be a finite number > 1, got {max_factor}")
    if not (float(max_angle_rate) > 0.0 and math.isfinite(float(max_angle_rate))):
        raise ValueError(f"max_angle_rate must be a finite number > 0, got {max_angle_rate}")
    if int(inits) < 2:
        raise ValueError(f"inits must be at least 2 (standard errors), got {inits}")
    if not 0.0 < float(eps) < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    if fix:
        import inspect

        from . import fix as _fix

        allowed = set(inspect.signature(_fix.fix).parameters) - {"model", "before", "seed", "eps", "chunk", "progress"}
        allowed -= {"max_factor", "max_angle_rate"}
        bad = sorted(set(fix_options or {}) - allowed)
        if bad:
            raise ValueError(f"fix_options: unknown option {bad[0]!r}; it takes {', '.join(sorted(allowed))}")
        if not gradient:
            raise ValueError("the fix measures the gradient: gradient=False and fix=True do not go together")
        o = fix_options or {}
        _fix.check_size(o.get("recipes"))  # unknown recipe names: before any work
        _fix.check_selection(
            jax.eval_shape(init_fn, jax.random.PRNGKey(0)), o.get("weights"), o.get("residual"), o.get("skip")
        )
    if run is None:
        run = capture.runner(apply_fn, inputs, blocks=blocks, stack=stack)
    with_deltas = stack is None and getattr(run, "deltas", True)
    keys = jax.random.split(jax.random.PRNGKey(int(seed)), int(inits))
    st = None if start is None else tuple(float(s) for s in start)
    if progress is not None and not isinstance(progress, measure.Steps):
        extra = 0
        if fix:
            from . import fix as _fix

            o = fix_options or {}
            checks = _fix.check_size(o.get("recipes"), spec)
            extra = _fix.search_size() * int(o.get("inits", 2)) + int(o.get("verify_inits", 16)) * checks
        progress = measure.Steps(progress, int(inits) + extra)
    raw = jax.device_get(
        measure.many(
            init_fn, run, keys, float(eps), st, gradient, max(1, int(chunk)), with_deltas=with_deltas, advance=progress
        )
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
    res = ProbeResult(
        name=name,
        ds=ds,
        start=(q0, rho0),
        eps=float(eps),
        theory=th,
        max_factor=float(max_factor),
        max_angle_rate=float(max_angle_rate),
    )
    if fix:
        from . import fix as _fix

        m = Model(init_fn, apply_fn, inputs, blocks=blocks, stack=stack, name=name, spec=spec, runner=run)
        opts = dict(fix_options or {})
        res.fix = _fix.fix(  # the same progress: the search and the check advance it
            m,
            res,
            seed=seed,
            eps=float(eps),
            chunk=chunk,
            max_factor=float(max_factor),
            max_angle_rate=float(max_angle_rate),
            progress=progress,
            **opts,
        )
    return res
