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

A causal model (a decoder: ``Model.causal``, a phasefield block masked, or ``causal=True``)
is measured per position as well (:mod:`.positions`: ``res.positions()``, the last token's
``res.angle_rate_last``, ``res.lambda_g_last``, which its phase, bands and fix read) and
compared with :func:`phasefield.layers.causal_rates` position by position
(``res.position_agreement()``).

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
    causal: bool | None = None,
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
    and with ``fix`` the search's (``inits`` per point) and the check's. ``causal``: the
    model is causal (per-position measurements, the last token's rates, the causal theory
    of ``block``); None: as the model says (:attr:`Model.causal`, else whether ``block``
    is masked, else not). ValueError (one line) for bad input: no matching block, outputs
    not finite, fewer than 2 inits, ``causal=True`` for a model that says it is not."""
    from . import nnx as _nnx

    if _nnx.is_nnx(init_fn):
        init_fn = _nnx.model(init_fn, apply_fn if inputs is None else inputs, blocks=blocks, stack=stack, name=name)
    run = None
    spec = None
    model_causal = None
    if isinstance(init_fn, Model):
        m = init_fn
        model_causal = m.causal
        init_fn, apply_fn, inputs, blocks, stack = m.init_fn, m.apply_fn, m.inputs, m.blocks, m.stack
        block = m.block if block is None else block
        name = m.name if name == "model" else name
        run, spec = m.runner, m.spec
    causal = _causal(causal, model_causal, block)
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
    n_tokens = None
    if causal or block is not None:
        n_tokens = int(np.shape(jax.eval_shape(lambda: run(init_fn(jax.random.PRNGKey(0)))[0]))[-2])
    if causal and n_tokens < 2:
        raise ValueError(f"a causal model's per-position results need at least 2 tokens, got {n_tokens}")
    keys = jax.random.split(jax.random.PRNGKey(int(seed)), int(inits))
    st = None if start is None else tuple(float(s) for s in start)
    if progress is not None and not isinstance(progress, measure.Steps):
        extra = 0
        if fix:
            from . import fix as _fix

            o = fix_options or {}
            checks = _fix.check_size(o.get("recipes"), spec, causal)
            extra = _fix.search_size() * int(o.get("inits", 2)) + int(o.get("verify_inits", 16)) * checks
        progress = measure.Steps(progress, int(inits) + extra)
    raw = jax.device_get(
        measure.many(
            init_fn,
            run,
            keys,
            float(eps),
            st,
            gradient,
            max(1, int(chunk)),
            with_deltas=with_deltas,
            advance=progress,
            causal=causal,
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
    th = cth = None
    if block is not None:
        from ..layers.causal import masked
        from . import theory

        blk = masked(block, causal)  # the model's mask: the theory's
        if causal:
            cth = theory.causal(blk, n_tokens, L, q0, rho0, grad_start=data0)
        else:
            th = theory.curves(blk, n_tokens, L, q0, rho0, float(eps), grad_start=data0)
    res = ProbeResult(
        name=name,
        ds=ds,
        start=(q0, rho0),
        eps=float(eps),
        theory=th,
        max_factor=float(max_factor),
        max_angle_rate=float(max_angle_rate),
        causal=causal,
        causal_theory=cth,
    )
    if fix:
        from . import fix as _fix

        m = Model(
            init_fn, apply_fn, inputs, blocks=blocks, stack=stack, name=name, spec=spec, runner=run, causal=causal
        )
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


def _causal(causal, model_causal, block) -> bool:
    """Whether the probe treats the model as causal (:func:`probe`'s ``causal``)."""
    if causal is not None and not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True, False or None, got {causal!r}")
    if model_causal is None and block is not None:
        from .. import layers

        model_causal = layers.is_causal(block)
    if causal is None:
        return bool(model_causal)
    if causal and model_causal is False:
        raise ValueError(
            "causal=True, but the model says its attention is not causal (Model.causal=False): "
            "the probe measures a model as it is and cannot mask it"
        )
    return bool(causal)
