"""phasefield: mean-field signal propagation in deep transformers (JAX/Flax)."""
from __future__ import annotations

import jax as _jax

_jax.config.update("jax_enable_x64", True)  # theory runs in float64; networks pick their own dtype

from .config import HParams  # noqa: E402

__all__ = ["HParams"]
__version__ = "0.1.0"
