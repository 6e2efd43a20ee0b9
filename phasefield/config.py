"""The one hyperparameter pytree shared by the theory, the simulator and the ViT trainer.

Numeric fields are pytree leaves, so ``jax.vmap``/``jit``/``grad`` apply to each of them;
structural fields (activation, MLP depth, residual convention, attention map) are static.
"""
from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from flax import struct

ACTIVATIONS = ("tanh", "erf", "relu", "gelu", "linear")
RESIDUALS = ("unit-norm", "identity")
ATTENTIONS = ("paper", "exact")


@struct.dataclass
class HParams:
    """Hyperparameters of the random transformer of THEORY.md §1.

    sigma_w   MLP weight scale, W ~ N(0, sigma_w^2 / fan_in)
    sigma_a   attention logit scale, W_Q, W_K ~ N(0, sigma_a / d) (logit variance sigma_a^2)
    alpha_a   attention branch weight (residual beta_a = sqrt(1 - alpha_a^2) by default)
    alpha_m   MLP branch weight
    sigma_v   value weight scale, W_V ~ N(0, sigma_v^2 / d)
    n_tokens  number of tokens n
    depth     number of blocks L
    activation, mlp_layers, residual ('unit-norm' or 'identity'), attention ('paper' or
    'exact') are static (not traced).
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

    # ---- derived quantities (traceable) -------------------------------------------
    @property
    def beta_a(self):
        return _beta(self.alpha_a, self.residual)

    @property
    def beta_m(self):
        return _beta(self.alpha_m, self.residual)

    def astype(self, dtype) -> "HParams":
        """Cast every numeric field to ``dtype`` (float64 for theory)."""
        return self.replace(
            **{k: jnp.asarray(getattr(self, k), dtype) for k in NUMERIC_FIELDS}
        )

    def validate(self) -> "HParams":
        """Raise ``ValueError`` with a one-line message if a concrete field is out of range."""
        _check_static(self)
        vals = {k: getattr(self, k) for k in NUMERIC_FIELDS}
        try:
            vals = {k: float(jnp.min(jnp.asarray(v))) for k, v in vals.items()}
            maxes = {k: float(jnp.max(jnp.asarray(v))) for k, v in self.__dict__.items() if k in NUMERIC_FIELDS}
        except Exception:  # traced values cannot be validated
            return self
        for k in ("sigma_w", "sigma_a", "sigma_v"):
            if not vals[k] > 0 or not math.isfinite(maxes[k]):
                raise ValueError(f"{k.replace('_', '-')} must be a finite number > 0 (got {vals[k]:g})")
        for k in ("alpha_a", "alpha_m"):
            if not (0.0 <= vals[k] and maxes[k] <= 1.0):
                raise ValueError(f"{k.replace('_', '-')} must lie in [0, 1] (got {vals[k] if vals[k] < 0 else maxes[k]:g})")
        if vals["n_tokens"] < 2:
            raise ValueError(f"n-tokens must be >= 2 (got {vals['n_tokens']:g})")
        if vals["depth"] < 1:
            raise ValueError(f"depth must be >= 1 (got {vals['depth']:g})")
        return self


NUMERIC_FIELDS = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "sigma_v", "n_tokens", "depth")
STATIC_FIELDS = ("activation", "mlp_layers", "residual", "attention")


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
    if not (isinstance(hp.mlp_layers, int) and hp.mlp_layers >= 1):
        raise ValueError(f"mlp-layers must be an integer >= 1 (got {hp.mlp_layers!r})")
