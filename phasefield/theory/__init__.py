"""Mean-field theory of signal propagation in the transformer of THEORY.md (float64).

Every function is a pure function of one :class:`phasefield.HParams` pytree (plus, for
speed, an optional precomputed :class:`MLPKernel`), so ``jax.jit``/``jax.vmap``/``grad``
apply to every numeric field.

    attention      the attention branch map, forward and backward (§3, §7)
    mlp            the MLP branch map: Gaussian-integral kernels of phi (§4)
    block          the block map (q, p) -> (q', p') and its iteration (§5)
    fixed_points   collapsed and stable fixed points (§6)
    exponents      lambda_a and lambda_g (§6–7)
    quadrature     dense trapezoid Gaussian integrals and the dense reference
"""
from .attention import forward as attention_map  # noqa: F401
from .block import attention_step, block_map, trajectory  # noqa: F401
from .exponents import (angle_exponent, backward_block, exponents, gradient_exponent,  # noqa: F401
                        gradient_exponent_collapsed, gradient_exponent_inf, gradient_matrix,
                        mean_mode)
from .fixed_points import collapsed_fixed_point, simplex_fixed_point, stable_fixed_point  # noqa: F401
from .mlp import MLPKernel, d_m, kernel, p_m  # noqa: F401
