"""Elementwise nonlinearities phi and their derivatives, by name.

Shared by the theory (Gaussian integrals of phi and phi') and by the networks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import erf as _erf

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x):  # exact (erf) GELU
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _dgelu(x):
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * jnp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _silu(x):  # x sigmoid(x) (swish), the gate of SwiGLU
    return x * jax.nn.sigmoid(x)


def _dsilu(x):
    s = jax.nn.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


_PHI = {
    "tanh": jnp.tanh,
    "erf": _erf,
    "relu": jax.nn.relu,
    "gelu": _gelu,
    "linear": lambda x: x,
    "silu": _silu,
}

_DPHI = {
    "tanh": lambda x: 1.0 - jnp.tanh(x) ** 2,
    "erf": lambda x: (2.0 / math.sqrt(math.pi)) * jnp.exp(-x * x),
    "relu": lambda x: (x > 0).astype(x.dtype),
    "gelu": _dgelu,
    "linear": lambda x: jnp.ones_like(x),
    "silu": _dsilu,
}


def get(name: str):
    """phi by name."""
    try:
        return _PHI[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(_PHI)}") from None


def derivative(name: str):
    """phi' by name."""
    get(name)
    return _DPHI[name]


def names() -> tuple[str, ...]:
    return tuple(_PHI)
