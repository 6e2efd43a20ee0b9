"""DeepScaleLM moment propagation (Kedia et al. 2024; seed 002; docs/seeds.md §2).

* :mod:`.moments` — the moment rules: components (Table 1), attention and FFN blocks
  (Table 2), residual stacks (App. E), the DeepScaleLM init and scaling (§3.5).
* :mod:`.simulate` — finite-width Monte Carlo: one attention head, whole stacks, and the
  validation grid (percentiles of relative errors).

Everything is re-exported here (``phasefield.seeds.deepscalelm.<name>``).
"""

from .moments import (  # noqa: F401
    ARCHS,
    INITS,
    Bwd,
    Fwd,
    attention_block,
    attention_block_bwd,
    dropout,
    dropout_bwd,
    dslm_init,
    dslm_scaling,
    ffn_block,
    ffn_block_bwd,
    kappa_attention,
    kappa_dropout,
    kappa_ffn,
    kappa_linear,
    kappa_relu,
    kappa_residual,
    layernorm,
    layernorm_bwd,
    linear,
    linear_bwd,
    logit_variance,
    norm_cv2_block,
    norm_cv2_residual,
    relu,
    relu_bwd,
    relu_corr,
    residual,
    residual_bwd,
    resolve_init,
    sha,
    sha_bwd,
    softmax,
    softmax_bwd,
    softmax_row_moments,
    stack,
    xavier_init,
)
from .simulate import PATHS, simulate_sha, simulate_stack, validate  # noqa: F401
