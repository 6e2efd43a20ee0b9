"""The attention branch map: its modes side by side, chosen in one place.

``attention`` picks the mode from :data:`MODES`, ``softmax_correction`` adds the
softmax-derivative (query/key) path to the backward maps. The maps take the numbers they
read: the logit scale ``sigma_a`` (sigma_A), the number of tokens ``n_tokens`` and the value
scale ``sigma_v`` (sigma_V). Each mode gives four maps:

    forward(sigma_a, n_tokens, sigma_v, rho)            -> (q_A, p_A)  symmetric, theory.md §3
    backward(sigma_a, n_tokens, sigma_v, q, rho, a, b)  -> (diag, off) values path, §7
    (both take ``att``: the exact map's grid sizes and tables, :mod:`.exact_table`)
    gram_forward(sigma_a, sigma_v, r, mask)             -> C^A         full Gram, §8
    gram_backward(sigma_a, r, g, mask)                  -> sum_ik E[A_im A_km'] G_ik

Modules (imports point down): :mod:`.paper` (Assumption 3.2, paper Eq. 10), :mod:`.exact`
(exact softmax expectations), :mod:`.exact_table` (its grid sizes and its values on the
stable-point mesh, built outside the trace), :mod:`.full_gram` (both modes on a full
Gram), :mod:`.softmax` (the softmax-derivative terms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from . import exact, exact_table, full_gram, paper, softmax  # noqa: F401


class Mode(NamedTuple):
    forward: Callable
    backward: Callable
    gram_forward: Callable
    gram_backward: Callable


MODES = {
    "paper": Mode(paper.forward, paper.backward, full_gram.paper_forward, full_gram.paper_backward),
    "exact": Mode(exact.forward, exact.backward, full_gram.exact_forward, full_gram.exact_backward),
}


def mode(attention: str) -> Mode:
    """The maps of the mode ``attention`` ('paper' or 'exact')."""
    try:
        return MODES[attention]
    except KeyError:
        raise ValueError(f"unknown attention map {attention!r}; choose one of {', '.join(MODES)}") from None


def _att_kw(attention, att):
    return {"att": att} if attention == "exact" else {}


def forward(sigma_a, n_tokens, sigma_v, rho, attention: str = "paper", att=None):
    """(q_A, p_A) of the attention output for normalized input tokens with cosine rho
    (``att``: the exact map's :class:`.exact_table.ExactKernel`, or None)."""
    return mode(attention).forward(sigma_a, n_tokens, sigma_v, rho, **_att_kw(attention, att))


def backward(
    sigma_a, n_tokens, sigma_v, q, rho, a, b, attention: str = "paper", softmax_correction: bool = False, att=None
):
    """Attention branch's backward map (without its residual): the gradient Gram
    ``a I + b 11^T`` at its output -> (diag, off) at its input (norm q, cosine rho), values
    path plus, with ``softmax_correction``, the softmax path."""
    d, o = mode(attention).backward(sigma_a, n_tokens, sigma_v, q, rho, a, b, **_att_kw(attention, att))
    if softmax_correction:
        d_sm, o_sm = softmax.softmax_term(sigma_a, n_tokens, sigma_v, q, rho, a, b, att)
        d, o = d + d_sm, o + o_sm
    return d, o


def gram_forward(sigma_a, sigma_v, r, mask, attention: str = "paper"):
    """C^A = sigma_V^2 E[A R A^T] for cosine matrix r (no residual)."""
    return mode(attention).gram_forward(sigma_a, sigma_v, r, mask)


def gram_backward(sigma_a, sigma_v, r, g, mask, attention: str = "paper", softmax_correction: bool = False):
    """sigma_V^2 sum_ik E[A_im A_km'] G_ik (+ the softmax path with
    ``softmax_correction``), before the LN factor 1 / sqrt(q q')."""
    # the exact map and the softmax path average the same attention samples: drawn once
    a = full_gram.mc_attention(sigma_a, r, mask) if attention == "exact" and softmax_correction else None
    kw = {} if a is None else {"a": a}
    ga = jnp.square(sigma_v) * mode(attention).gram_backward(sigma_a, r, g, mask, **kw)
    if softmax_correction:
        ga = ga + softmax.gram_softmax_term(sigma_a, sigma_v, r, g, mask, a=a)
    return ga
