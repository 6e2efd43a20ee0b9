"""Named blocks: compositions of the layers, config as code.

``paper``       the seed paper's block (docs/theory.md §1) from an :class:`phasefield.HParams`
``pre-ln``      GPT-2 / ViT / timm: LayerNorm before each branch, multi-head attention with
                an output projection, GELU MLP with 4x expansion, identity residual
``post-ln``     BERT / ``nn.Transformer``: each sublayer ``x -> LN(x + alpha f(x))``
``rms-swiglu``  LLaMA: RMSNorm before each branch, multi-head attention with an output
                projection, SwiGLU MLP with 8/3 expansion, identity residual
``deepscalelm`` DeepScaleLM (seed 002): pre-LN with ReLU FFN (4x), scaled residuals
                ``lambda x + beta f(x)``, ``beta^2 = k / N``, ``lambda^2 = 1 - beta^2`` over
                N = 2 depth sublayers, and its FFN/value init (unit branch variance)
``dyt``         DyT (Zhu et al. 2025, "Transformers without Normalization"): pre-LN with
                every LayerNorm replaced by ``gamma tanh(a x) + beta`` (:mod:`.dyt`), the
                attention and GELU MLP of ``pre-ln``, identity residual

The standard blocks are written with one init scale ``sigma`` = (weight std) x sqrt(d) for
every weight that reads the d-dimensional stream or writes it (GPT-2's std 0.02 at d = 768
is sigma = 0.554): every d x d weight and the MLP's input layer have std ``sigma /
sqrt(d)``, and so has its output layer whatever its fan-in (its fan-in scale is then
``sigma sqrt(mult)``). The branch scale ``alpha`` multiplies each branch (GPT-2's
1/sqrt(2L) projection scaling is ``alpha = 1/sqrt(2L)``); ``alpha_attn`` and ``alpha_mlp``
set the attention and the MLP branch's own scale (each defaults to ``alpha``: the paper's
alpha_A and alpha_M). The query/key std ``sigma`` gives
logits of standard deviation ``sigma^2 q`` (``sigma_A = sigma^2``).

Approximations (static, part of the pytree's structure): ``attention`` "exact" (the
exact-softmax map, the default of the standard blocks: valid here at every sigma because
their attention reads normalized tokens, q = 1; within 2.5 se of the networks at every
validated point, docs/blocks.md; block sweeps read it from per-logit-scale mesh values, as
fast as Eq. 10) or "paper" (Eq. 10, the paper's Assumption 3.2: within 2.5 se for sigma <= 1,
off by up to 44 se at sigma = 2; the ``paper`` preset keeps it, it is the paper's block);
``softmax_correction`` (the softmax-derivative path in the
backward map; on by default for the standard blocks, where it is measured to matter:
docs/blocks.md); ``qk_norm`` (RMS-normalized queries and keys per head, gain 1:
:mod:`.qknorm`). Every number is a leaf: ``jax.vmap`` over ``sigma``, ``alpha`` etc. after
``block.replace`` or by building the block inside the vmapped function.

Every preset takes ``causal`` (``NAME:causal=true``: each attention masked,
:data:`.registry.BLOCK_OPTIONS`), but ``dyt``: its maps hold only between tokens of equal
norm, which the mask makes differ (its per-position results would be NaN).

Each preset is registered as a :class:`.registry.Preset`: its numbers and their ranges, its
options, its validation and its capabilities (the ``paper`` preset's numbers are one
:class:`phasefield.HParams`, and it has the closed-form engine :mod:`phasefield.layers.paper`).
"""

from __future__ import annotations

import math
from typing import Any

from ..grid import SIGMA_MAX
from . import registry
from .attention import Attention
from .base import Serial
from .dyt import ANY_NORM_ACTIVATIONS, AnyNormMLP, DyT
from .glu import GLU
from .mlp import MLP
from .norm import Norm
from .qknorm import QKNormAttention
from .registry import Preset
from .residual import Residual

GPT2_SIGMA = 0.02 * math.sqrt(768)


def paper(hp, mult: float = 1.0) -> Serial:
    """The paper's block from its numbers ``hp`` (an :class:`phasefield.HParams`): the builder
    of the ``paper`` preset, which its own package (:mod:`phasefield.layers.paper`) registers
    with its closed-form engine."""
    return registry.lookup("paper").builder(hp, mult=mult)


def _attention(sigma, heads, attention, softmax_correction, sigma_v=None, sigma_o=None, qk_norm=False, any_norm=False):
    return (QKNormAttention if qk_norm else Attention)(
        sigma_a=sigma * sigma,
        sigma_v=sigma if sigma_v is None else sigma_v,
        sigma_o=sigma if sigma_o is None else sigma_o,
        heads=heads,
        map=attention,
        softmax_correction=softmax_correction,
        any_norm=any_norm,
    )


def _branch_scales(alpha, alpha_attn, alpha_mlp):
    """(attention, MLP) branch scales: each its own number when given, else ``alpha``."""
    return (alpha if alpha_attn is None else alpha_attn), (alpha if alpha_mlp is None else alpha_mlp)


def _mlp(sigma, activation, mult, sigma_out=None):
    return MLP(
        sigma_w=sigma,
        activation=activation,
        layers=1,
        mult=mult,
        sigma_out=sigma * mult**0.5 if sigma_out is None else sigma_out,
    )


def pre_ln(
    sigma: Any = GPT2_SIGMA,
    alpha: Any = 1.0,
    heads: int = 12,
    activation: str = "gelu",
    mult: float = 4.0,
    attention: str = "exact",
    softmax_correction: bool = True,
    qk_norm: bool = False,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
) -> Serial:
    """x -> x + alpha_attn Attn(LN x);  x -> x + alpha_mlp MLP(LN x) (both default to alpha)."""
    a_att, a_mlp = _branch_scales(alpha, alpha_attn, alpha_mlp)
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm)
    return Serial(
        (
            Residual(Serial((Norm("layernorm"), att)), alpha=a_att, kind="identity"),
            Residual(Serial((Norm("layernorm"), _mlp(sigma, activation, mult))), alpha=a_mlp, kind="identity"),
        )
    )


def post_ln(
    sigma: Any = GPT2_SIGMA,
    alpha: Any = 1.0,
    heads: int = 12,
    activation: str = "gelu",
    mult: float = 4.0,
    attention: str = "exact",
    softmax_correction: bool = True,
    qk_norm: bool = False,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
) -> Serial:
    """x -> LN(x + alpha_attn Attn(x));  x -> LN(x + alpha_mlp MLP(x)) (both default to alpha).
    Its input must be normalized (BERT normalizes the embeddings): the branches read the
    previous LayerNorm's output."""
    a_att, a_mlp = _branch_scales(alpha, alpha_attn, alpha_mlp)
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm)
    return Serial(
        (
            Residual(att, alpha=a_att, kind="identity"),
            Norm("layernorm"),
            Residual(_mlp(sigma, activation, mult), alpha=a_mlp, kind="identity"),
            Norm("layernorm"),
        )
    )


def rms_swiglu(
    sigma: Any = GPT2_SIGMA,
    alpha: Any = 1.0,
    heads: int = 12,
    mult: float = 8.0 / 3.0,
    activation: str = "silu",
    attention: str = "exact",
    softmax_correction: bool = True,
    qk_norm: bool = False,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
) -> Serial:
    """x -> x + alpha_attn Attn(RMSNorm x);  x -> x + alpha_mlp SwiGLU(RMSNorm x) (both
    default to alpha)."""
    a_att, a_mlp = _branch_scales(alpha, alpha_attn, alpha_mlp)
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm)
    glu = GLU(sigma_g=sigma, sigma_v=sigma, sigma_out=sigma * mult**0.5, activation=activation, mult=mult)
    return Serial(
        (
            Residual(Serial((Norm("rmsnorm"), att)), alpha=a_att, kind="identity"),
            Residual(Serial((Norm("rmsnorm"), glu)), alpha=a_mlp, kind="identity"),
        )
    )


def deepscalelm(
    depth: int = 16,
    k: Any = 2.0,
    heads: int = 12,
    mult: float = 4.0,
    attention: str = "exact",
    softmax_correction: bool = True,
    sigma_a: Any = 1.0,
) -> Serial:
    """DeepScaleLM's pre-LN block for a ``depth``-block model (N = 2 depth sublayers):
    ``x -> lambda x + beta Attn(LN x)``, ``x -> lambda x + beta FFN(LN x)``, beta^2 = k / N;
    FFN and value/output weights of variance (1/d) sqrt(2 / mult) per d fan-in (the 'simple'
    DSLM init, :func:`phasefield.seeds.deepscalelm.moments.dslm_init`), query/key 1/d."""
    n_sub = 2 * int(depth)
    beta2 = k / n_sub
    s2 = math.sqrt(2.0 / mult)  # sigma^2 of every W_V, W_O, W_1
    s = s2**0.5
    att = _attention(1.0, heads, attention, softmax_correction, sigma_v=s, sigma_o=s)
    att = att.replace(sigma_a=sigma_a)
    ffn = MLP(sigma_w=s, activation="relu", layers=1, mult=mult, sigma_out=(s2 * mult) ** 0.5)
    res = dict(alpha=beta2**0.5, beta=(1.0 - beta2) ** 0.5, kind="explicit")
    return Serial(
        (
            Residual(Serial((Norm("layernorm"), att)), **res),
            Residual(Serial((Norm("layernorm"), ffn)), **res),
        )
    )


def dyt(
    sigma: Any = GPT2_SIGMA,
    alpha: Any = 1.0,
    a: Any = 0.5,
    heads: int = 12,
    activation: str = "gelu",
    mult: float = 4.0,
    attention: str = "paper",
    softmax_correction: bool = True,
    qk_norm: bool = False,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
) -> Serial:
    """x -> x + alpha_attn Attn(DyT x);  x -> x + alpha_mlp MLP(DyT x) (both default to
    alpha): ``pre-ln`` with each LayerNorm replaced by DyT, ``gamma tanh(a x) + beta`` at
    its init (``a`` = alpha0, default 0.5; gamma 1, beta 0).

    DyT does not normalize: the branches read tokens of squared norm ``E[tanh(a h)^2] < 1``
    that changes from layer to layer, so the attention's logit scale is ``sigma^2 q``
    (:class:`.attention.Attention` with ``any_norm``: a point reads its exact map and
    softmax-derivative term at that scale from the interpolants in the scale up to sigma^2,
    :mod:`phasefield.theory.attention.scale_table`; a block sweep integrates them on grids
    sized for its largest sigma^2, which bounds sigma^2 q as q < gamma^2 = 1). The
    softmax-derivative path is on by default (``softmax_correction``): without it lambda_g
    from the input falls 4 to 11 standard errors below the network extrapolated to infinite
    width at sigma 1.3 to 1.5; with it within 1.4 se, and 8 se off at the larger logit scale
    sigma 1.2, a = 2 (docs/blocks.md). The attention map is Eq. 10 by default
    (``attention="paper"``; ``"exact"`` integrates the exact softmax at sigma^2 q). With
    ``qk_norm=True`` the logit scale no longer depends on q and the tables of the logit
    scale serve every norm. The MLP's maps are taken at the scale ``sigma sqrt(q)``
    (:class:`.dyt.AnyNormMLP`: closed forms, no tables; gelu, tanh, erf, relu, linear)."""
    a_att, a_mlp = _branch_scales(alpha, alpha_attn, alpha_mlp)
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm, any_norm=not qk_norm)
    mlp = AnyNormMLP(sigma_w=sigma, sigma_out=sigma * mult**0.5, activation=activation, mult=mult)
    return Serial(
        (
            Residual(Serial((DyT(a=a), att)), alpha=a_att, kind="identity"),
            Residual(Serial((DyT(a=a), mlp)), alpha=a_mlp, kind="identity"),
        )
    )


# number -> (low, high, low open): the sweepable leaves of the standard presets
_STD = dict(
    sigma=(0.0, SIGMA_MAX, True),
    alpha=(0.0, 100.0, False),
    alpha_attn=(0.0, 100.0, False),
    alpha_mlp=(0.0, 100.0, False),
)
_STD_OPTIONS = dict(heads=int, activation=str, mult=float, attention=str, softmax_correction=bool, qk_norm=bool)
# a ViT run's numbers -> the standard presets' numbers they set
_STD_RUN = dict(sigma_w="sigma", alpha_a="alpha_attn", alpha_m="alpha_mlp")


def _check_dyt(kw: dict) -> None:
    if kw.get("causal"):
        raise ValueError(
            "block dyt: causal=true has no full-Gram map: under the mask the tokens' norms differ, "
            "and DyT's and its MLP's maps hold only between tokens of equal norm (NaN)"
        )
    if "activation" in kw and kw["activation"] not in ANY_NORM_ACTIVATIONS:
        raise ValueError(
            f"block dyt: activation {kw['activation']!r} has no MLP map at every input "
            f"norm; choose one of {', '.join(ANY_NORM_ACTIVATIONS)}"
        )


def _check_deepscalelm(kw: dict) -> None:
    beta2 = kw.get("k", 2.0) / (2 * kw.get("depth", 16))
    if not 0 < beta2 <= 1:
        raise ValueError(f"block deepscalelm: beta^2 = k / (2 depth) = {beta2:g} must lie in (0, 1]")


for _preset in (
    Preset("pre-ln", pre_ln, _STD, _STD_OPTIONS, run_numbers=_STD_RUN),
    Preset("post-ln", post_ln, _STD, _STD_OPTIONS, run_numbers=_STD_RUN),
    Preset("rms-swiglu", rms_swiglu, _STD, _STD_OPTIONS, run_numbers=_STD_RUN),
    Preset(
        "deepscalelm",
        deepscalelm,
        dict(k=(0.0, 1e6, True), sigma_a=(0.0, SIGMA_MAX, True)),
        dict(depth=int, heads=int, mult=float, attention=str, softmax_correction=bool),
        run_numbers=dict(sigma_a="sigma_a"),
        check=_check_deepscalelm,
        stack_depth="depth",
    ),
    Preset("dyt", dyt, dict(_STD, a=(0.0, 100.0, True)), _STD_OPTIONS, run_numbers=_STD_RUN, check=_check_dyt),
):
    registry.register(_preset)
NAMES = registry.names()


def get(name: str, hp=None, **kw) -> Serial:
    """The preset ``name`` built from its numbers: for a preset whose numbers are one object
    (``paper``: an :class:`phasefield.HParams`) ``hp``, else one made from ``kw``; for the
    others the keyword numbers ``kw``."""
    preset = registry.lookup(name)
    if preset.numbers_class is not None:
        return preset.builder(hp if hp is not None else preset.numbers_class(**kw))
    return preset.builder(**kw)
