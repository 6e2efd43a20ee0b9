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
``gpt2``        GPT-2's decoder block at its own init (:func:`gpt2`): ``pre-ln`` causal,
                every weight std 0.02 (``sigma = 0.02 sqrt(width)``) and the output
                projections std ``0.02 / sqrt(2 depth)`` (``alpha = 1 / sqrt(2 depth)``)
``llama``       Llama's decoder block at Hugging Face's init (:func:`llama`):
                ``rms-swiglu`` causal, every weight std 0.02, no depth scaling

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
norm, which the mask makes differ (its per-position results would be NaN). The decoders'
presets ``gpt2`` and ``llama`` are causal unless spelled ``NAME:causal=false``, and say what
their stack's input is at init (:attr:`.registry.Preset.input_geometry`, the point
commands' default q0 and rho0: :data:`GPT2_INPUT`, :data:`LLAMA_INPUT`).

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
from .base import Serial, masked
from .dyt import ANY_NORM_ACTIVATIONS, AnyNormMLP, DyT
from .glu import GLU
from .mlp import MLP
from .norm import Norm
from .qknorm import QKNormAttention
from .registry import Preset
from .residual import Residual

INITIALIZER_RANGE = 0.02  # GPT-2's and Hugging Face Llama's weight and embedding std
GPT2_SIGMA = INITIALIZER_RANGE * math.sqrt(768)
# the stacks' inputs at init, (q0, rho0): GPT-2 adds a token and a position embedding, each
# of std 0.02 per component; Llama's token embedding alone (RoPE acts on queries and keys,
# not on the stream); distinct tokens at distinct positions have independent embeddings
GPT2_INPUT = (2 * INITIALIZER_RANGE**2, 0.0)
LLAMA_INPUT = (INITIALIZER_RANGE**2, 0.0)


def paper(hp, mult: float = 1.0) -> Serial:
    """The paper's block from its numbers ``hp`` (an :class:`phasefield.HParams`): the builder
    of the ``paper`` preset, which its own package (:mod:`phasefield.layers.paper`) registers
    with its closed-form engine."""
    return registry.lookup("paper").builder(hp, mult=mult)


def _attention(
    sigma,
    heads,
    attention,
    softmax_correction,
    sigma_v=None,
    sigma_o=None,
    qk_norm=False,
    any_norm=False,
    unit_input=False,
):
    return (QKNormAttention if qk_norm else Attention)(
        sigma_a=sigma * sigma,
        sigma_v=sigma if sigma_v is None else sigma_v,
        sigma_o=sigma if sigma_o is None else sigma_o,
        heads=heads,
        map=attention,
        softmax_correction=softmax_correction,
        any_norm=any_norm,
        unit_input=unit_input,
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
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm, unit_input=True)
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
    att = _attention(sigma, heads, attention, softmax_correction, qk_norm=qk_norm, unit_input=True)
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
    att = _attention(1.0, heads, attention, softmax_correction, sigma_v=s, sigma_o=s, unit_input=True)
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


def gpt2_numbers(width: int = 768, depth: int = 12) -> dict:
    """GPT-2's init in this module's parameterization: ``sigma = 0.02 sqrt(width)`` (every
    weight std 0.02) and ``alpha = 1 / sqrt(2 depth)`` (the output projections' std
    ``0.02 / sqrt(2 depth)``)."""
    return dict(sigma=INITIALIZER_RANGE * math.sqrt(width), alpha=1.0 / math.sqrt(2 * depth))


def gpt2(
    sigma: Any = None,
    alpha: Any = None,
    width: int = 768,
    depth: int = 12,
    heads: int = 12,
    attention: str = "exact",
    softmax_correction: bool = True,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
    mult: float = 4.0,
) -> Serial:
    """GPT-2's block at its init (Radford et al. 2019; Hugging Face ``GPT2Model``): ``pre-ln``
    with GELU (4x MLP), every weight std ``initializer_range`` = 0.02 and each residual
    branch's output projection (the attention's ``c_proj``, the MLP's ``c_proj``, a 4d -> d
    weight) std ``0.02 / sqrt(2 depth)`` for a ``depth``-block stack.

    In this module's parameterization (module docstring): ``sigma = 0.02 sqrt(width)`` (GPT-2
    small: 0.554) and ``alpha = 1 / sqrt(2 depth)`` (GPT-2 small: 0.204); both defaults
    follow ``width`` and ``depth`` and either can be given instead (a sweep ranges over
    them). Scaling the output projection scales the branch: the branch is linear in it, and
    its bias is zero. The MLP's output layer has std ``sigma / sqrt(width)`` whatever its
    fan-in (module docstring), GPT-2's 0.02 on its 4d -> d ``c_proj`` before the depth
    scaling. The preset is causal (``gpt2:causal=false``: the same weights unmasked); its
    stack's input is the token plus position embedding (:data:`GPT2_INPUT`).

    Not modelled: the biases (zero at init, nothing lost), dropout (off: the init's
    network), GPT-2's tanh-approximated GELU (``gelu_new``, within 4.7e-4 of the exact GELU
    used here at every input), the LayerNorm epsilon (1e-5 in GPT-2: 1.2 % of the first
    block's input variance 8e-4; the mean field has none), and what lies outside the stack
    (the final LayerNorm, the unembedding). Hugging Face's Flax GPT-2 draws the output
    projections with std 0.02 (no depth scaling): ``gpt2:alpha=1``."""
    own = gpt2_numbers(width, depth)
    sigma = own["sigma"] if sigma is None else sigma
    alpha = own["alpha"] if alpha is None else alpha
    return pre_ln(
        sigma=sigma,
        alpha=alpha,
        heads=heads,
        activation="gelu",
        mult=mult,
        attention=attention,
        softmax_correction=softmax_correction,
        alpha_attn=alpha_attn,
        alpha_mlp=alpha_mlp,
    )


def llama(
    sigma: Any = None,
    alpha: Any = 1.0,
    width: int = 4096,
    heads: int = 32,
    attention: str = "exact",
    softmax_correction: bool = True,
    alpha_attn: Any = None,
    alpha_mlp: Any = None,
    mult: float = 8.0 / 3.0,
) -> Serial:
    """Llama's block at Hugging Face's init (``LlamaPreTrainedModel``: every ``nn.Linear``
    and the embedding std ``initializer_range`` = 0.02, no depth scaling): ``rms-swiglu``
    (RMSNorm, SwiGLU with 8/3 expansion), ``sigma = 0.02 sqrt(width)``, ``alpha = 1``. The
    default ``width`` is Llama-7B's 4096 (sigma 1.28, 32 heads). Its ``down_proj`` (fan-in
    11008 in Llama-7B, 2.6875 d rather than 8/3 d) has std 0.02 = ``sigma / sqrt(width)``
    whatever its fan-in, which is this module's convention, so the expansion does not enter
    the mean field. The preset is causal (``llama:causal=false``: unmasked); its stack's
    input is the token embedding (:data:`LLAMA_INPUT`).

    Not modelled: RoPE (it rotates queries and keys by their positions; the mean field
    treats the logits as position-free: its size at init is measured in docs/theory.md,
    "Causal stacks"), the RMSNorm epsilon (1e-6 in Hugging Face's config: 0.25 % of the
    first block's input variance 4e-4), and the final RMSNorm and unembedding."""
    sigma = INITIALIZER_RANGE * math.sqrt(width) if sigma is None else sigma
    return rms_swiglu(
        sigma=sigma,
        alpha=alpha,
        heads=heads,
        mult=mult,
        activation="silu",
        attention=attention,
        softmax_correction=softmax_correction,
        alpha_attn=alpha_attn,
        alpha_mlp=alpha_mlp,
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


def _check_width(name):
    def check(kw: dict) -> None:
        if "width" in kw and not 1 <= kw["width"] <= WIDTH_MAX:
            raise ValueError(f"block {name}: width must lie in [1, {WIDTH_MAX}] (got {kw['width']})")

    return check


WIDTH_MAX = 1_000_000
_DECODER_OPTIONS = dict(heads=int, attention=str, softmax_correction=bool)


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
    Preset(
        "gpt2",
        gpt2,
        _STD,
        dict(width=int, depth=int, **_DECODER_OPTIONS),
        run_numbers=_STD_RUN,
        check=_check_width("gpt2"),
        stack_depth="depth",
        causal_default=True,
        input_geometry=lambda kw: GPT2_INPUT,
        number_defaults=lambda kw: gpt2_numbers(kw["width"], kw["depth"]),
    ),
    Preset(
        "llama",
        llama,
        _STD,
        dict(width=int, **_DECODER_OPTIONS),
        default_heads=32,
        run_numbers=_STD_RUN,
        check=_check_width("llama"),
        causal_default=True,
        input_geometry=lambda kw: LLAMA_INPUT,
        number_defaults=lambda kw: dict(sigma=INITIALIZER_RANGE * math.sqrt(kw["width"])),
    ),
):
    registry.register(_preset)
NAMES = registry.names()


def get(name: str, hp=None, **kw) -> Serial:
    """The preset ``name`` built from its numbers: for a preset whose numbers are one object
    (``paper``: an :class:`phasefield.HParams`) ``hp``, else one made from ``kw``; for the
    others the keyword numbers ``kw``."""
    preset = registry.lookup(name)
    if preset.numbers_class is not None and hp is not None:
        causal = kw.pop("causal", False)
        return masked(preset.builder(hp)) if causal else preset.builder(hp)
    return preset.build(kw)
