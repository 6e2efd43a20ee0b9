"""QK-norm attention (Dehghani et al. 2023, ViT-22B; OLMo 2, Gemma 3): each head's queries
and keys are RMS-normalized before the logits, ``Q_h -> g Q_h / rms(Q_h)``,
``K_h -> g K_h / rms(K_h)``, so the logits no longer grow with the token norm or the
query/key init.

Network: :class:`Attention`'s, with the normalization applied to every head's queries and
keys (``gain`` g fixed at its init value; the dense trainer does not train it).

Mean field: a head's query ``Q_h = x W_Q`` has ``d_head`` components of variance
``sigma_A q`` (``q``: the input's squared norm per component), so ``rms(Q_h)^2 -> sigma_A q``
as ``d_head -> inf`` and the normalized logits are the unnormalized ones times
``g^2 / (sigma_A q)``: the logits of normalized tokens with logit scale ``g^2`` (``g^2 /
sqrt(d_head)`` with the 1/d_head scaling), whatever q and sigma_A. Backward, the
normalization's Jacobian ``(sqrt(d_head)/|Q_h|)(I - Q_h Q_h^T/|Q_h|^2)`` removes one
direction of d_head: the logit derivative is the unnormalized one times the same factor up
to O(1/d_head). So every map of :class:`Attention` applies with the logit scale ``g^2``
in place of ``sigma_A q`` (:meth:`QKNormAttention.logit_std`), and the exact-softmax map
(``map="exact"``, tables built for the logit scale) holds at every token norm.

Full Gram (:mod:`.gram`): the logits read the cosines, ``E[M_ij M_kl] = g^4 R_ik R_jl`` at any
token norms, the values the Gram ``C`` (:meth:`QKNormAttention.gram_logits`). The softmax
path's queries and keys read ``R`` while its values read ``C``: with equal token norms
``C = q R`` its value factor q cancels the normalization's 1/q and the path is
:func:`phasefield.theory.attention.softmax.gram_softmax_term` at ``R``; with unequal norms it
is NaN (a mixed term that module does not compute).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from ..theory import attention as att_maps
from . import gram
from .attention import Attention, AttentionModule
from .state import as_float

EPS = 1e-6


@struct.dataclass
class QKNormAttention(Attention):
    gain: Any = 1.0

    def logit_scale(self):
        s = jnp.square(as_float(self.gain))
        if self.scale == "inv":
            s = s / jnp.sqrt(jnp.asarray(self.width // self.heads, s.dtype))
        return s

    def logit_std(self, q):
        return self.logit_scale() + 0.0 * q

    def _at_norm(self, q, sigma_a, ctx, fn, backward=False):
        """The exact map's tables are built for the logit scale g^2, which no token norm
        changes: valid at every q (plain attention's are valid at q = 1 only)."""
        return fn(self.att)

    def gram_logits(self, c):
        return self.logit_scale(), gram.cosines(c)

    def gram_softmax_path(self, c, g, mask, a=None):
        scale, r = self.gram_logits(c)
        term = att_maps.softmax.gram_softmax_term(scale, as_float(self.sigma_v), r, g, mask, a=a)
        return jnp.where(jnp.all(gram.equal_norms(c)), term, jnp.nan)

    def module(self, weights="dense", causal=False, name=None):
        return QKNormModule(self, causal=causal or self.causal, weights=weights, name=name)


class QKNormModule(AttentionModule):
    def queries_keys(self, q, k):
        g = jnp.asarray(self.layer.gain, q.dtype)
        rms = lambda t: t * (g * jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(t), -1, keepdims=True) + EPS)))
        return rms(q), rms(k)
