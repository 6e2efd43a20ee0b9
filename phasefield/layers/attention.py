"""Softmax attention as a layer: multi-head, 1/sqrt(d_head) or 1/d_head logit scaling,
value and output projections, paper or exact-softmax mean-field map.

Network (``heads`` H, ``d_head = d / H``)::

    Q, K, V = x W_Q, x W_K, x W_V        W_Q, W_K ~ N(0, sigma_A / d), W_V ~ N(0, sigma_V^2 / d)
    A_h     = softmax(Q_h K_h^T / sqrt(d_head))        (scale="inv": / d_head)
    out     = concat_h(A_h V_h) [W_O]                  W_O ~ N(0, sigma_O^2 / d) if sigma_O

Every head's logits have variance ``sigma_A^2 q_i q_j`` whatever H (d_head components,
each of variance ``(sigma_A q)^2 / d_head`` after the 1/sqrt(d_head)), and the heads see
independent weights, so the output Gram is the average of H identically distributed head
Grams: **the multi-head mean-field map equals the single-head one**; more heads only shrink
the finite-width spread (by averaging H independent softmax draws). With ``scale="inv"`` the
logit scale is ``sigma_A q / sqrt(d_head)`` (``width`` must be given; at infinite width
attention becomes uniform).

Mean field on input ``(q, rho)``: the logits are those of normalized tokens with
``sigma_A -> sigma_A q``, the values carry ``sigma_V^2 q``; so the maps of
:mod:`phasefield.theory.attention` (paper Eq. 10 or the exact softmax) apply with
``sigma_A q`` and ``sigma_V sqrt(q)``, and the backward map is theirs with the input norm
q (whose ``1/q`` is the chain rule of ``x = sqrt(q) x_hat``).

The exact map and the softmax-derivative term read tables of the logit scale sigma_A
(:meth:`Attention.prepare`, a block sweep's :meth:`Attention.with_logit_tables`): those
serve q = 1. At another norm a point's map integrates at its own logit scale ``sigma_A q``
on the tables' grid (``lax.cond``: the branch runs only where q != 1), NaN beyond the
scale that grid resolves (:func:`phasefield.theory.attention.exact.reach`); a sweep's tables
(attached only from q0 = 1) give NaN there. ``unit_input``: the attention reads a normalization's output
(pre-LN, RMSNorm blocks), whose norm is 1 exactly: its programs hold no branch for another
norm (the same numbers; smaller programs, faster to compile). ``any_norm``: the attention reads tokens whose
norm is not 1 (behind DyT): no tables of sigma_A; a point reads the values of every scale
up to sigma_A from their interpolants in the scale
(:mod:`phasefield.theory.attention.scale_table`) at ``sigma_A q``, and integrates there
where no piece holds that scale; a sweep attaches none and integrates
(:meth:`Attention.logit_tables`).

Full Gram (:mod:`.gram`), any token norms, with or without a causal mask (the static field
``causal``: each query attends to the keys j <= i, in the Gram maps and in the network;
:func:`phasefield.layers.causal.masked` sets it on every attention of a block):
the logits have covariance ``E[M_ij M_kl] = sigma_A^2 C_ik C_jl`` (the Gram itself, not its
cosines: the (q, p) map's ``sigma_A q``), the values carry ``sigma_V^2 C``, so::

    forward    C' = sigma_O^2 sigma_V^2 E[A C A^T]
    backward   G  = sigma_O^2 (sigma_V^2 E[A^T G A] + softmax path)

with ``E[A_ij A_kl]`` of :mod:`phasefield.theory.attention.full_gram` (``map="paper"``:
Assumption 3.2 over the allowed keys; ``"exact"``: its fixed Monte-Carlo logit fields) and,
with ``softmax_correction``, :func:`phasefield.theory.attention.softmax.gram_softmax_term` at
the Gram ``C``. The multi-head map is the single-head one, as for (q, p).

``rope`` (the network only): rotary position embeddings on every head's queries and keys
(:func:`rotary`, base 10000, Llama's convention), which the mean-field maps do not model:
they refuse a layer with it. Its size at init is measured against the maps' position-free
logits in docs/theory.md, "Causal stacks" (``scripts/rope_gap.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from ..theory import attention as att_maps
from ..theory.attention import exact_table, scale_table
from . import gram
from .base import Layer
from .state import Grad, Kernel, as_float
from .weights import check_weights, linear

MAPS = ("paper", "exact")
SCALES = ("sqrt", "inv")


@struct.dataclass
class Attention(Layer):
    sigma_a: Any = 1.0
    sigma_v: Any = 1.0
    sigma_o: Any = None  # None: no output projection (the paper's block)
    heads: int = struct.field(pytree_node=False, default=1)
    scale: str = struct.field(pytree_node=False, default="sqrt")
    width: int | None = struct.field(pytree_node=False, default=None)
    map: str = struct.field(pytree_node=False, default="paper")
    softmax_correction: bool = struct.field(pytree_node=False, default=False)
    any_norm: bool = struct.field(pytree_node=False, default=False)  # reads tokens of norm != 1
    causal: bool = struct.field(pytree_node=False, default=False)  # mask: query i reads keys j <= i
    rope: bool = struct.field(pytree_node=False, default=False)  # rotary queries and keys (network only)
    unit_input: bool = struct.field(pytree_node=False, default=False)  # reads a normalization's output (q = 1)
    att: Any = None  # the exact map's tables (prepare)
    name: str | None = struct.field(pytree_node=False, default=None)  # its Flax module's (None: automatic)

    def __post_init__(self):
        if self.map not in MAPS:
            raise ValueError(f"unknown attention map {self.map!r}; choose one of {', '.join(MAPS)}")
        if self.scale not in SCALES:
            raise ValueError(f"unknown attention scale {self.scale!r}; choose one of {', '.join(SCALES)}")
        if not (isinstance(self.heads, int) and self.heads >= 1):
            raise ValueError(f"heads must be an integer >= 1 (got {self.heads!r})")
        if self.scale == "inv" and self.width is None:
            raise ValueError("attention scale 'inv' (1/d_head) needs the width")

    # ---- mean field ---------------------------------------------------------------------
    def logit_scale(self):
        s = as_float(self.sigma_a)
        if self.scale == "inv":
            s = s / jnp.sqrt(jnp.asarray(self.width // self.heads, s.dtype))
        return s

    def logit_std(self, q):
        """The logits' scale on tokens of squared norm per component ``q`` (the maps'
        sigma_A): ``sigma_A q`` here; a variant that normalizes queries and keys overrides it."""
        return self.logit_scale() * q

    def _scales(self, q):
        """(logit scale, value scale) the maps of :mod:`phasefield.theory.attention` take on
        input norm ``q``: ``sigma_A q`` (:meth:`logit_std`) and ``sigma_V sqrt(q)``."""
        return self.logit_std(q), as_float(self.sigma_v) * jnp.sqrt(q)

    def _out_scale(self):
        return 1.0 if self.sigma_o is None else jnp.square(as_float(self.sigma_o))

    def prepare(self, ctx, sigma_max=None):
        """Attach the exact-softmax grid sizes (``att``) for the exact map and for the
        softmax-derivative correction: for a concrete logit scale and n, the sizes of its
        cap (:func:`phasefield.theory.attention.exact_table.point_cap`) and, for the exact
        map, the mesh values of S and T; with ``sigma_max`` (the largest logit scale a sweep
        will trace) its sizes; else the traced defaults (sigma_A <= 4.5, n <= 4096). With
        ``any_norm``, the sizes alone (no values: the maps integrate at ``sigma_A q``)."""
        if (self.map != "exact" and not self.softmax_correction) or self.att is not None:
            return self
        sigma_a = self.logit_scale()
        if sigma_max is not None:
            n_a, n_z = att_maps.exact.sizes(sigma_a, ctx.n_tokens, sigma_max=float(sigma_max))
            return self.replace(att=exact_table.ExactKernel(None, n_a=n_a, n_z=n_z))
        logits = exact_table.concrete_logits(sigma_a, ctx.n_tokens)
        if logits is None:
            return self.replace(att=exact_table.kernel(sigma_a, ctx.n_tokens))
        # sizes and mesh values keyed by the scale's cap, not its value: one compiled program
        # serves every new scale
        if not self.any_norm:
            return self.replace(att=exact_table.point_kernel(*logits, values=self.map == "exact"))
        # tokens of norm q < 1 behind DyT: the values of every scale up to sigma_A, read at
        # sigma_A q (integrated where the table holds no piece, or beyond sigma_A)
        att = exact_table.point_kernel(*logits, values=False)
        return self.replace(att=att.replace(scales=scale_table.for_point(*logits)))

    # ---- block sweeps (:mod:`.sweep`) -------------------------------------------------
    def logit_grid(self):
        return self.map == "exact" or self.softmax_correction

    def logit_tables(self):
        return self.logit_grid() and not self.any_norm

    def with_logit_tables(self, s, t, interp, interp_t):
        """``att`` (sized by :meth:`prepare_for`) with the mesh values ``s`` (S_1, S_rho) and
        ``t`` (T_1, T_rho) of its logit scale (unit input norm: NaN at another)."""
        if self.att is None:
            return self
        return self.replace(att=self.att.replace(s=s, t=t, interp=interp, interp_t=interp_t, unit_norm=True))

    def prepare_for(self, ctx, logit_max, kernel_max):
        return self.prepare(ctx, sigma_max=max(logit_max, 1e-3))

    def _reads_tables(self, backward=False):
        """Whether its maps read ``att``'s values of the logit scale sigma_A (forward: the
        exact map's S; backward: S and the softmax term's T)."""
        att = self.att
        if att is None:
            return False
        return (self.map == "exact" and att.interp) or (backward and self.softmax_correction and att.interp_t)

    def _in_reach(self, sigma_a, ctx, out):
        """``out`` (a map integrated at the logit scale ``sigma_a``), NaN beyond the scale
        its grid resolves."""
        n_a, n_z = att_maps.exact.grid_sizes(sigma_a, ctx.n_tokens, self.att)
        ok = sigma_a <= att_maps.exact.reach(n_a, n_z, ctx.n_tokens) * (1.0 + 1e-12)
        return tuple(jnp.where(ok, x, jnp.nan) for x in out)

    def _at_norm(self, q, sigma_a, ctx, fn, backward=False):
        """``fn(att)`` (a map given the tables) at input norm ``q``, logit scale ``sigma_a``
        (= sigma_A q): the tables of sigma_A at q = 1; elsewhere the map integrated at
        ``sigma_a`` (a point's tables: ``lax.cond``, one branch runs) or NaN (a sweep's
        unit-norm tables); a map that integrates anyway, NaN beyond its grid's reach."""
        grid = self.map == "exact" or (backward and self.softmax_correction)
        if not grid:
            return fn(self.att)
        if self.att is not None and self.att.scales is not None:  # a point's values of every scale (any norm)
            table = self.att.scales
            bare = self.att.replace(scales=None)

            def read():
                s, t = table.at(sigma_a)
                return fn(bare.replace(s=s, t=t, interp=table.interp, interp_t=table.interp_t))

            return jax.lax.cond(table.holds(sigma_a), read, lambda: self._in_reach(sigma_a, ctx, fn(bare)))
        if not self._reads_tables(backward):
            return self._in_reach(sigma_a, ctx, fn(self.att))
        if self.att.unit_norm:
            return tuple(jnp.where(q == 1.0, x, jnp.nan) for x in fn(self.att))
        if self.unit_input:  # q = 1 exactly: no branch for another norm in the program
            return fn(self.att)
        own = self.att.replace(s=None, t=None, interp=False, interp_t=False)
        return jax.lax.cond(q == 1.0, lambda: fn(self.att), lambda: self._in_reach(sigma_a, ctx, fn(own)))

    def _no_rope(self):
        """ValueError for an attention with RoPE: its maps treat the logits as independent of
        the positions, which RoPE is not (its network alone takes it)."""
        if self.rope:
            raise ValueError(
                "attention with rope=True has no mean-field map (RoPE's position-dependent logits are "
                "not modelled): only its network takes it"
            )

    def _unmasked(self):
        """ValueError for a causal attention: its (q, p) maps assume permutation-symmetric
        tokens, which the mask breaks (its results are per position: :mod:`.causal`)."""
        if self.causal:
            raise ValueError(
                "causal attention has no (q, p) map (the mask makes every position differ): "
                "its results are per position (phasefield.layers.causal_rates)"
            )

    def forward(self, k, ctx):
        self._no_rope()
        self._unmasked()
        sigma_a, sigma_v = self._scales(k.q)
        fn = lambda att: att_maps.forward(sigma_a, ctx.n_tokens, sigma_v, k.rho, self.map, att)
        q_a, p_a = self._at_norm(k.q, sigma_a, ctx, fn)
        c = self._out_scale()
        return Kernel(c * q_a, c * p_a)

    def backward(self, k, g, ctx):
        self._no_rope()
        self._unmasked()
        sigma_a, sigma_v = self._scales(k.q)

        def fn(att):
            return att_maps.backward(
                sigma_a, ctx.n_tokens, sigma_v, k.q, k.rho, g.a, g.b, self.map, self.softmax_correction, att
            )

        diag, off = self._at_norm(k.q, sigma_a, ctx, fn, backward=True)
        c = self._out_scale()
        return Grad.from_diag_off(c * diag, c * off)

    # ---- network ------------------------------------------------------------------------
    def module(self, weights="dense", causal=False, name=None):
        """Its network, masked where ``causal`` (the caller's) or its own field says so."""
        return AttentionModule(self, causal=causal or self.causal, weights=weights, name=name)

    # ---- full Gram (:mod:`.gram`) ------------------------------------------------------
    def gram_logits(self, c):
        """``(scale, m)``: the logits' covariance on input Gram ``c`` is ``scale^2 m_ik m_jl``:
        (:meth:`logit_scale`, ``c``) here; a variant that normalizes queries and keys
        overrides it."""
        return self.logit_scale(), c

    def _samples(self, c):
        """The exact map's attention samples [S, n, n] on input Gram ``c``
        (:func:`phasefield.theory.attention.full_gram.mc_attention`), masked where ``causal``."""
        scale, m = self.gram_logits(c)
        return att_maps.full_gram.mc_attention(scale, m, gram.causal_mask(c.shape[-1], self.causal))

    def _paper_weights(self, c):
        scale, m = self.gram_logits(c)
        return att_maps.full_gram.paper_weights(scale, m, gram.causal_mask(c.shape[-1], self.causal))

    def gram_forward(self, c, ctx):
        """``sigma_O^2 sigma_V^2 E[A C A^T]`` over the attention matrices of input Gram ``c`` in
        the layer's map (:mod:`phasefield.theory.attention.full_gram`), masked where ``causal``."""
        self._no_rope()
        fg = att_maps.full_gram
        if self.map == "exact":
            ac = fg.pair_mean(self._samples(c), c)
        else:
            ac = jnp.einsum("ikjl,jl->ik", self._paper_weights(c), c)
        return self._out_scale() * (jnp.square(as_float(self.sigma_v)) * ac)

    def gram_backward(self, c, g, ctx):
        """``sigma_O^2 (sigma_V^2 E[A^T G A] + softmax path)`` (``(E[A^T G A])_mm' = sum_ik
        E[A_im A_km'] G_ik``); the exact map's values path and the softmax path average the
        same samples, drawn once."""
        self._no_rope()
        mask = gram.causal_mask(c.shape[-1], self.causal)
        a = None
        if self.map == "exact":
            a = self._samples(c)
            ga = att_maps.full_gram.pair_mean_t(a, g)
        else:
            ga = jnp.einsum("ikml,ik->ml", self._paper_weights(c), g)
        ga = jnp.square(as_float(self.sigma_v)) * ga
        if self.softmax_correction:
            ga = ga + self.gram_softmax_path(c, g, mask, a)
        return self._out_scale() * ga

    def gram_step(self, c, x, ctx):
        """The exact map's forward Gram and its backward map's adjoint at ``x`` from one draw of
        the fields (:func:`phasefield.theory.attention.softmax.exact_step`); the paper map's
        by the default (:meth:`.base.Layer.gram_step`)."""
        if self.map != "exact":
            return super().gram_step(c, x, ctx)
        self._no_rope()
        scale, m = self.gram_logits(c)
        mask = gram.causal_mask(c.shape[-1], self.causal)
        fwd, values, soft = att_maps.softmax.exact_step(scale, m, c, x, mask, softmax=self.softmax_correction)
        s2 = self._out_scale() * jnp.square(as_float(self.sigma_v))
        return s2 * fwd, s2 * (values + soft)

    def gram_softmax_path(self, c, g, mask, a=None):
        """The softmax-derivative path's gradient Gram at input Gram ``c`` (queries, keys and
        values all read ``c``; ``a``: the exact map's samples of ``c``, when drawn)."""
        scale, m = self.gram_logits(c)
        return att_maps.softmax.gram_softmax_term(scale, as_float(self.sigma_v), m, g, mask, a=a)


class AttentionModule(nn.Module):
    layer: Attention
    causal: bool = False
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        lay = self.layer
        *batch, n, d = x.shape
        h = lay.heads
        if d % h:
            raise ValueError(f"width {d} is not a multiple of heads {h}")
        dh = d // h
        qk_std = jnp.sqrt(jnp.asarray(lay.sigma_a) / d)
        v_std = jnp.asarray(lay.sigma_v) / jnp.sqrt(d)
        q, k, v = linear(self.weights, (d, d, d), (qk_std, qk_std, v_std), ("query", "key", "value"))(x)
        split = lambda t: t.reshape(*batch, n, h, dh)
        q, k, v = self.queries_keys(split(q), split(k)) + (split(v),)
        if lay.rope:
            q, k = rotary(q), rotary(k)
        div = dh if lay.scale == "inv" else jnp.sqrt(dh)
        spec = ("...ihd,...jhd->...hij", "...hij,...jhd->...ihd")
        if h == 1:  # one head: the same sums without a head axis (the paper block's rounding, bitwise)
            q, k, v = q[..., 0, :], k[..., 0, :], v[..., 0, :]
            spec = ("...id,...jd->...ij", "...ij,...jd->...id")
        logits = jnp.einsum(spec[0], q, k) / jnp.asarray(div, x.dtype)
        if self.causal:
            logits = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), logits, -jnp.inf)
        a = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum(spec[1], a, v).reshape(*batch, n, d)
        if lay.sigma_o is not None:
            (out,) = linear(self.weights, (d,), (jnp.asarray(lay.sigma_o) / jnp.sqrt(d),), ("out",))(out)
        return out

    def queries_keys(self, q, k):
        """Per-head queries and keys ``[..., n, heads, d_head]`` as the logits read them (a
        variant that normalizes them overrides this)."""
        return q, k


ROPE_BASE = 10000.0


def rotary(x, base: float = ROPE_BASE):
    """Rotary position embedding (Su et al. 2021; Llama's "rotate half" convention) of
    per-head vectors ``x`` ``[..., n, heads, d_head]``: the pair of components (i, i + d_head/2)
    of position t rotated by the angle ``t base^(-2i / d_head)``. Norms are kept; the dot
    product of a rotated query at t and key at s depends on t - s."""
    n, dh = x.shape[-3], x.shape[-1]
    if dh % 2:
        raise ValueError(f"rope needs an even head dimension (got {dh})")
    inv = base ** (-jnp.arange(0, dh, 2, dtype=x.dtype) / dh)
    ang = jnp.arange(n, dtype=x.dtype)[:, None] * inv[None, :]  # [n, dh/2]
    cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)[:, None, :]  # [n, 1, dh]
    sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)[:, None, :]
    half = dh // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin
