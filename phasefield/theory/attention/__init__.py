"""The attention branch map: its modes side by side, chosen in one place.

``hp.attention`` picks the mode from :data:`MODES`, ``hp.softmax_correction`` adds the
softmax-derivative (query/key) path to the backward maps. Each mode gives four maps:

    forward(hp, rho)                 -> (q_A, p_A)   permutation-symmetric, docs/theory.md §3
    backward(hp, q, rho, a, b)       -> (diag, off)  values path, §7
    (both take ``att``: the exact map's grid sizes and tables, :mod:`.exact_table`)
    gram_forward(hp, r, mask)        -> C^A          full Gram, §8
    gram_backward(hp, r, g, mask)    -> sum_ik E[A_im A_km'] G_ik

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


def mode(hp) -> Mode:
    """The maps of ``hp.attention``."""
    try:
        return MODES[hp.attention]
    except KeyError:
        raise ValueError(f"unknown attention map {hp.attention!r}; choose one of {', '.join(MODES)}") from None


def _att_kw(hp, att):
    return {"att": att} if hp.attention == "exact" else {}


def forward(hp, rho, att=None):
    """(q_A, p_A) of the attention output for normalized input tokens with cosine rho
    (``att``: the exact map's :class:`.exact_table.ExactKernel`, or None)."""
    return mode(hp).forward(hp, rho, **_att_kw(hp, att))


def backward(hp, q, rho, a, b, att=None):
    """Attention branch's backward map (without its residual): the gradient Gram
    ``a I + b 11^T`` at its output -> (diag, off) at its input (norm q, cosine rho), values
    path plus, with ``hp.softmax_correction``, the softmax path."""
    d, o = mode(hp).backward(hp, q, rho, a, b, **_att_kw(hp, att))
    if hp.softmax_correction:
        d_sm, o_sm = softmax.softmax_term(hp, q, rho, a, b, att)
        d, o = d + d_sm, o + o_sm
    return d, o


def gram_forward(hp, r, mask):
    """C^A = sigma_V^2 E[A R A^T] for cosine matrix r (no residual)."""
    return mode(hp).gram_forward(hp, r, mask)


def gram_backward(hp, r, g, mask):
    """sigma_V^2 sum_ik E[A_im A_km'] G_ik (+ the softmax path with
    ``hp.softmax_correction``), before the LN factor 1 / sqrt(q q')."""
    ga = jnp.square(hp.sigma_v) * mode(hp).gram_backward(hp, r, g, mask)
    if hp.softmax_correction:
        ga = ga + softmax.gram_softmax_term(hp, r, g, mask)
    return ga
