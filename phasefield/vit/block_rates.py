"""The collapsed-point rates a block model reads (``lambda_a``, ``angle_rate``,
``lambda_g_collapse``), fast: the route of ``predict --block``.

:func:`phasefield.vit.features.block_theory` (the reference) integrates the exact-softmax map
(and its softmax-derivative term) by quadrature at every layer of every trajectory, on the
logit grid sized for the study box's largest scale: ~2.5 CPU s a point (pre-LN, depth 16),
~9 s where the block has a fixed point (post-LN: the whole attractor search of
``layers.fixed_point_exponents``, for lambda_a alone). Both rates live at the **collapsed point**: every
trajectory starts from (q0, rho0) = (1, 1) and rho = 1 is invariant, so the attention only
ever sees n identical tokens (at unit norm: its branches read normalized tokens). There the
logits of a row are equal and the softmax is uniform whatever the logit scale, so

    S_1 = S_rho = 1/n,     T_1 = T_rho = 1/n - 1/n^2

(the exact map's E sum_j A_ij^2, E sum_j A_ij A_kj and the softmax term's moments,
:mod:`phasefield.theory.attention.exact`); the maps read S and T only through
``(1 - rho) S'`` beside them, so their slopes in rho never enter (the transverse multiplier
is ``sigma_V^2 (1 - S(1))`` up to the block's other layers). This route hands the attention
those values as its mesh tables (constant interpolants, ``ExactKernel.interp``) instead of
integrating: no quadrature, no per-scale tables, one compiled program per (block structure,
depth, padded point count) with the numbers traced (points mapped one by one):

* ``lambda_g_collapse`` = lambda_g(L) from (1, 1) (:func:`phasefield.layers.depth.gradient_exponent`);
* ``lambda_a`` = ``log m(q*)`` (:func:`phasefield.layers.depth.fixed_point_exponents`' formula, without
  its attractor search) where the norm has a finite fixed point, NaN where it has none;
* ``angle_rate`` = the finite-depth angle rate from collapsed tokens
  (:func:`phasefield.layers.depth.finite_depth`'s), at every point.

The program also returns how far the collapsed trajectory strays from rho = 1 (rounding
in the other layers' maps can leave it at 1 - 1e-16): a stray e changes the attention's
values by (1 - rho)(S(rho) - S(1)) = O(e^2). Beyond :data:`RHO_TOL`, for a trajectory that
is not finite, or for a block this does not cover (another attention class, the paper
block, deepscalelm) :func:`rates` returns None and the caller takes the reference route.
The two agree to ~1e-14 (tests/test_block_predict.py).
"""

from __future__ import annotations

import functools

import numpy as np

OUT = ("lambda_a", "angle_rate", "lambda_g_collapse")
RHO_TOL = 1e-12  # the largest |1 - rho| along the collapsed trajectory this route accepts


def uniform_tables(n: float, m: int | None = None):
    """(S, T) [2, m + 1] each: the exact map's and the softmax term's values for n identical
    tokens (uniform attention), at every node of the mesh (a constant interpolant)."""
    from ..theory.attention import exact_table

    m = exact_table.MESH if m is None else m
    s = np.full((2, m + 1), 1.0 / n)
    t = np.full((2, m + 1), 1.0 / n - 1.0 / n**2)
    return s, t


def _attention_leaves(block):
    from ..layers.attention import Attention
    from ..layers.sweep import leaf_layers

    return [x for x in leaf_layers(block) if isinstance(x, Attention)]


def _point(name, fixed, run_numbers, n_tokens, depth, scales):
    """The traced point function: (the run's numbers, S, T) -> {lambda_a, angle_rate, lambda_g_collapse}."""
    import jax.numpy as jnp

    from ..layers import depth as D
    from ..layers import spec
    from ..layers.attention import Attention
    from ..layers.state import Context, Kernel
    from ..layers.sweep import map_leaves, prepare_traced

    def f(values, s, t):
        kw = dict(fixed, **{number: values[run] for run, number in run_numbers})
        block = prepare_traced(spec.build(name, kw), Context(n_tokens), *scales)

        def attach(x):
            if isinstance(x, Attention) and x.att is not None:
                return x.replace(att=x.att.replace(s=s, t=t, interp=True, interp_t=True))
            return x

        block = map_leaves(block, attach)
        dt = jnp.float64
        ctx = Context(jnp.asarray(n_tokens, dt))
        one = jnp.asarray(1.0, dt)
        k1 = Kernel(one, one)
        # the finite-depth rates of layers.depth.finite_depth from collapsed tokens (1, 1)
        qc, pc = D.trajectory(block, ctx, k1, depth)
        angle_rate, _ = D.collapsed_angle_rate(block, ctx, qc, depth)
        stray = jnp.max(jnp.abs(1.0 - pc / qc))
        lambda_g = D.backward_rate(block, ctx, qc, pc, depth)  # along the trajectory above
        # lambda_a of layers.depth.fixed_point_exponents where the norm has a finite fixed point (NaN without one)
        _, fin, _, la = D.collapsed_point(block, ctx)
        lambda_a = jnp.where(fin, la, jnp.nan)
        return dict(lambda_a=lambda_a, angle_rate=angle_rate, lambda_g_collapse=lambda_g, stray=stray)

    return f


@functools.lru_cache(maxsize=32)
def _compiled(name, fixed_items, run_numbers, n_tokens, depth, scales):
    import jax

    f = _point(name, dict(fixed_items), run_numbers, n_tokens, depth, scales)
    # lax.map, not vmap: the point is traced once, unbatched (half the tracing a fresh
    # process pays before it finds the program in the persistent cache)
    return jax.jit(lambda values, s, t: jax.lax.map(lambda v: f(v, s, t), values))


def rates(cfg, configs: list[dict], attention: str | None = None) -> dict | None:
    """{lambda_a, angle_rate, lambda_g_collapse} (arrays over ``configs``) of
    :func:`phasefield.vit.features.block_theory` by the uniform-attention route (module
    docstring), or None where that route does not serve."""
    import jax
    import jax.numpy as jnp

    from ..layers.attention import Attention
    from .features import block_specs, table_scales_of
    from .train import RUN_NUMBERS

    name, kw = cfg.block_spec()
    run_numbers = tuple(sorted(RUN_NUMBERS.get(name, {}).items()))
    if not configs or {r for r, _ in run_numbers} != {"sigma_w", "alpha_a", "alpha_m"} or "depth" in kw:
        return None  # the paper block, deepscalelm (its depth sets a scale)
    over = {} if attention is None else dict(attention=attention)
    blocks = block_specs(cfg, configs, **over)
    if any(type(a) is not Attention for b in blocks for a in _attention_leaves(b)):
        return None  # another attention (QK-norm): not covered here
    scales = table_scales_of(cfg, blocks, **over)
    s, t = uniform_tables(float(cfg.n_tokens))
    vals = {run: np.array([float(c[run]) for c in configs]) for run, _ in run_numbers}
    depths = np.array([int(c["depth"]) for c in configs])
    out = {k: np.full(len(configs), np.nan) for k in OUT}
    fixed = tuple(sorted(dict(kw, **over).items()))
    with jax.enable_x64(True):
        for L in sorted(set(depths.tolist())):
            idx = np.flatnonzero(depths == L)
            # padded to a power of two (repeating the last point): few compiled sizes
            sel = np.pad(idx, (0, (1 << max(0, (len(idx) - 1).bit_length())) - len(idx)), mode="edge")
            f = _compiled(name, fixed, run_numbers, int(cfg.n_tokens), int(L), scales)
            res = jax.device_get(
                f({k: jnp.asarray(v[sel], jnp.float64) for k, v in vals.items()}, jnp.asarray(s), jnp.asarray(t))
            )
            if not np.all(np.asarray(res["stray"])[: len(idx)] <= RHO_TOL):
                return None  # the trajectory left rho = 1 (or is not finite): integrate
            for k in OUT:
                out[k][idx] = np.asarray(res[k], np.float64)[: len(idx)]
    return out
