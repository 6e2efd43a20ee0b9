"""The paper block's numbers: one hyperparameter pytree, :class:`HParams`, read by its
closed-form engine, its network (the ``paper`` preset), the simulator and the ViT trainer
(``from phasefield import HParams``).

Numeric fields are pytree leaves, so ``jax.vmap``/``jit``/``grad`` apply to each of them;
structural fields (activation, MLP depth, residual convention, attention map) are static.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ... import activations
from ...grid import check_values

ACTIVATIONS = activations.names()
RESIDUALS = ("unit-norm", "identity")
ATTENTIONS = ("paper", "exact")


@struct.dataclass
class HParams:
    """Hyperparameters of the random transformer of docs/theory.md §1.

    sigma_w   MLP weight scale, W ~ N(0, sigma_w^2 / fan_in)
    sigma_a   attention logit scale, W_Q, W_K ~ N(0, sigma_a / d) (logit variance sigma_a^2)
    alpha_a   attention branch weight (residual beta_a = sqrt(1 - alpha_a^2) by default)
    alpha_m   MLP branch weight
    sigma_v   value weight scale, W_V ~ N(0, sigma_v^2 / d)
    n_tokens  number of tokens n
    depth     number of blocks L
    activation, mlp_layers, residual ('unit-norm' or 'identity'), attention ('paper' or
    'exact': the attention map of the theory) and softmax_correction (the theory's
    backward maps add the softmax-derivative path) are static (not traced).
    """

    sigma_w: Any = 1.0
    sigma_a: Any = 1.0
    alpha_a: Any = 0.5
    alpha_m: Any = 0.5
    sigma_v: Any = 1.0
    n_tokens: Any = 32
    depth: Any = 16
    activation: str = struct.field(pytree_node=False, default="tanh")
    mlp_layers: int = struct.field(pytree_node=False, default=1)
    residual: str = struct.field(pytree_node=False, default="unit-norm")
    attention: str = struct.field(pytree_node=False, default="paper")
    softmax_correction: bool = struct.field(pytree_node=False, default=False)

    # ---- derived quantities (traceable) -------------------------------------------
    @property
    def beta_a(self):
        return _beta(self.alpha_a, self.residual)

    @property
    def beta_m(self):
        return _beta(self.alpha_m, self.residual)

    def astype(self, dtype) -> HParams:
        """Cast every numeric field to ``dtype`` (float64 for theory)."""
        return self.replace(**{k: jnp.asarray(getattr(self, k), dtype) for k in NUMERIC_FIELDS})

    def validate(self) -> HParams:
        """Raise ``ValueError`` with a one-line message if a concrete field is out of range
        (the ranges are :func:`phasefield.grid.check_values`; traced fields are skipped)."""
        _check_static(self)
        try:
            vals = {k: np.asarray(getattr(self, k), float) for k in NUMERIC_FIELDS}
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
            return self
        check_values(vals)
        return self


NUMERIC_FIELDS = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "sigma_v", "n_tokens", "depth")
STATIC_FIELDS = ("activation", "mlp_layers", "residual", "attention", "softmax_correction")


def _beta(alpha, residual):
    if residual == "identity":
        return jnp.ones_like(jnp.asarray(alpha, dtype=jnp.result_type(float)))
    return jnp.sqrt(jnp.clip(1.0 - jnp.square(alpha), 0.0, 1.0))


def _check_static(hp: HParams) -> None:
    if hp.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {hp.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if hp.residual not in RESIDUALS:
        raise ValueError(f"unknown residual {hp.residual!r}; choose one of {', '.join(RESIDUALS)}")
    if hp.attention not in ATTENTIONS:
        raise ValueError(f"unknown attention map {hp.attention!r}; choose one of {', '.join(ATTENTIONS)}")
    if not isinstance(hp.softmax_correction, bool):
        raise ValueError(f"softmax-correction must be True or False (got {hp.softmax_correction!r})")
    if not (isinstance(hp.mlp_layers, int) and hp.mlp_layers >= 1):
        raise ValueError(f"mlp-layers must be an integer >= 1 (got {hp.mlp_layers!r})")
