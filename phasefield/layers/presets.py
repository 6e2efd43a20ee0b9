"""Named blocks: compositions of the layers, config as code.

``paper``   the seed paper's block (THEORY.md §1) from an :class:`phasefield.HParams`
``pre-ln``  GPT-2 / ViT / timm: LayerNorm before each branch, multi-head attention with an
            output projection, GELU MLP with 4x expansion, identity residual, branch scale
``post-ln`` BERT / ``nn.Transformer``: each sublayer ``x -> LN(x + alpha f(x))``

The standard blocks are written with one init scale ``sigma`` = (weight std) x sqrt(fan-in)
of a d -> d map (GPT-2's std 0.02 at d = 768 is sigma = 0.55), so every d x d weight has
std ``sigma / sqrt(d)`` and the MLP's 4d -> d output layer std ``sigma / sqrt(d)`` too
(its fan-in scale is then ``2 sigma``). The branch scale ``alpha`` multiplies each branch
(GPT-2's 1/sqrt(2L) projection scaling is ``alpha = 1/sqrt(2L)``).
"""
from __future__ import annotations

from typing import Any

from ..config import HParams
from .attention import Attention
from .base import Serial
from .mlp import MLP
from .norm import Norm
from .residual import Residual

NAMES = ("paper", "pre-ln", "post-ln")


def paper(hp: HParams) -> Serial:
    """The paper's block: unit-norm (or identity) residuals around an RMS-normalized single
    head and a bias-free MLP of width d."""
    att = Attention(sigma_a=hp.sigma_a, sigma_v=hp.sigma_v, map=hp.attention,
                    softmax_correction=hp.softmax_correction)
    mlp = MLP(sigma_w=hp.sigma_w, activation=hp.activation, layers=hp.mlp_layers)
    return Serial((
        Residual(Serial((Norm("rms"), att)), alpha=hp.alpha_a, kind=hp.residual),
        Residual(Serial((Norm("rms"), mlp)), alpha=hp.alpha_m, kind=hp.residual),
    ))


def _standard_branches(sigma, heads, activation, mult, norm):
    att = Attention(sigma_a=sigma * sigma, sigma_v=sigma, sigma_o=sigma, heads=heads)
    mlp = MLP(sigma_w=sigma, activation=activation, layers=1, mult=mult, sigma_out=sigma * mult ** 0.5)
    return att, mlp


def pre_ln(sigma: Any = 0.55, alpha: Any = 1.0, heads: int = 12, activation: str = "gelu",
           mult: float = 4.0) -> Serial:
    """x -> x + alpha Attn(LN x);  x -> x + alpha MLP(LN x)."""
    att, mlp = _standard_branches(sigma, heads, activation, mult, "layernorm")
    return Serial((
        Residual(Serial((Norm("layernorm"), att)), alpha=alpha, kind="identity"),
        Residual(Serial((Norm("layernorm"), mlp)), alpha=alpha, kind="identity"),
    ))


def post_ln(sigma: Any = 0.55, alpha: Any = 1.0, heads: int = 12, activation: str = "gelu",
            mult: float = 4.0) -> Serial:
    """x -> LN(x + alpha Attn(x));  x -> LN(x + alpha MLP(x)). Its input must be normalized
    (BERT normalizes the embeddings): the branches read the previous LayerNorm's output."""
    att, mlp = _standard_branches(sigma, heads, activation, mult, "layernorm")
    return Serial((
        Residual(att, alpha=alpha, kind="identity"), Norm("layernorm"),
        Residual(mlp, alpha=alpha, kind="identity"), Norm("layernorm"),
    ))


def get(name: str, hp: HParams | None = None, **kw) -> Serial:
    """The preset ``name`` (``paper`` from ``hp``; the others from keyword numbers)."""
    if name == "paper":
        return paper(hp if hp is not None else HParams())
    if name == "pre-ln":
        return pre_ln(**kw)
    if name == "post-ln":
        return post_ln(**kw)
    raise ValueError(f"unknown block {name!r}; choose one of {', '.join(NAMES)}")
