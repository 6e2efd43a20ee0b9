"""The ``paper`` preset: the seed paper's block (docs/theory.md §1) as a composition of
layers, its numbers (one :class:`.numbers.HParams`) and its closed-form engine, registered
with :mod:`phasefield.layers.registry` by this package (:func:`register`)."""

from __future__ import annotations

from ...grid import SIGMA_MAX
from .. import registry
from ..attention import Attention
from ..base import Serial
from ..mlp import MLP
from ..norm import Norm
from ..residual import Residual
from .numbers import NUMERIC_FIELDS, STATIC_FIELDS, HParams


def paper(hp: HParams, mult: float = 1.0) -> Serial:
    """The paper's block: unit-norm (or identity) residuals around an RMS-normalized single
    head and a bias-free MLP of width ``mult`` d. Its network is :class:`phasefield.block.Block`
    (modules named "attention" and "mlp", as the ViT's parameters always were)."""
    att = Attention(
        sigma_a=hp.sigma_a,
        sigma_v=hp.sigma_v,
        map=hp.attention,
        softmax_correction=hp.softmax_correction,
        name="attention",
    )
    mlp = MLP(sigma_w=hp.sigma_w, activation=hp.activation, layers=hp.mlp_layers, mult=mult, name="mlp")
    return Serial(
        (
            Residual(Serial((Norm("rms"), att)), alpha=hp.alpha_a, kind=hp.residual),
            Residual(Serial((Norm("rms"), mlp)), alpha=hp.alpha_m, kind=hp.residual),
        )
    )


# the block's numbers and options, from its numbers class: every numeric field but the
# context (n_tokens, depth) is a number of the block, with the range grid.check_values gives it
NUMBERS = {
    k: ((0.0, 1.0, False) if k.startswith("alpha") else (0.0, SIGMA_MAX, True))
    for k in sorted(NUMERIC_FIELDS, key=lambda k: k.startswith("alpha"))  # the scales, then the branch weights
    if k not in ("n_tokens", "depth")
}
OPTIONS = {k: type(HParams.__dataclass_fields__[k].default) for k in STATIC_FIELDS}


def register(engine: registry.Engine) -> registry.Preset:
    """Register the ``paper`` preset with its closed-form ``engine``."""
    return registry.register(
        registry.Preset(
            "paper",
            paper,
            numbers=NUMBERS,
            options=OPTIONS,
            engine=engine,
            default_heads=1,
            run_numbers=dict(sigma_w="sigma_w", sigma_a="sigma_a", alpha_a="alpha_a", alpha_m="alpha_m"),
            network_defaults=dict(softmax_correction=True),  # the network has the softmax path
        )
    )
