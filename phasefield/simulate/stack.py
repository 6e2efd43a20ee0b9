"""Random stacks of any block (docs/theory.md §1): the block's own Flax network
(``block.module(weights, causal)``, :mod:`phasefield.layers`), and the token inputs the
measurements start from.

A block is named as everywhere else (:func:`resolve`): a spec string ``NAME:key=value,...``
(or a JSON file's path), a ``(name, keywords)`` pair, or a block itself (a
:mod:`phasefield.layers` composition, e.g. ``layers.presets.paper(hp)``: the paper's block,
:class:`phasefield.block.Block`).

A stack is L blocks with independent Gaussian weights, drawn one of two ways (``weights=``):

``"lazy"`` (default)  every linear map is sampled lazily on the tokens it sees
    (:func:`phasefield.layers.weights.random_linear`, exact in distribution with one VJP per
    draw), O(n^2 d) per block; the block's randomness is the ``"lazy"`` rng stream seeded by
    the layer key.
``"dense"`` (reference)  the parameters of block ``l`` are drawn from ``keys[l]`` by the
    module's ``init`` (the same initialisation the ViT trainer uses): ``init_with_output``
    returns the block's output together with its freshly drawn parameters, so one layer's
    parameters live in memory at a time. O(n d^2) per block, d^2 numbers per matrix.

Layers run inside a ``lax.scan``. Autodiff with respect to the tokens passes straight
through (the weights depend only on the key), which is what the vector-Jacobian protocol
of §7 needs (lazy weights: one VJP per draw; full Jacobians need dense weights).

All functions are pure in ``(block, key, tokens)``, so they ``jit`` and ``vmap`` over draws
(keys) and over points (the block's numbers are pytree leaves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..layers import spec as block_spec
from ..layers.base import check_layer
from ..layers.measure import symmetric_tokens, tokens  # noqa: F401 (the block protocol's inputs)
from ..layers.weights import LAZY_RNG, WEIGHTS, check_weights  # noqa: F401 (WEIGHTS re-exported)

DEFAULT_WEIGHTS = "lazy"


def resolve(block):
    """``(label, block)`` from a spec string (``NAME:key=value,...`` or a JSON file's path),
    a ``(name, keywords)`` pair or a block (a layer); ValueError (one line) otherwise."""
    if isinstance(block, str):
        name, kw = block_spec.parse(block)
        return name, block_spec.build(name, kw)
    if isinstance(block, tuple) and len(block) == 2 and isinstance(block[0], str):
        name, kw = block[0], block_spec.check(block[0], dict(block[1]))
        return name, block_spec.build(name, kw)
    try:
        check_layer(block)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return type(block).__name__, block


def block_of(block):
    """The block (a layer) of anything :func:`resolve` takes."""
    return resolve(block)[1]


def cast(block, dtype):
    """The block with every number (pytree leaf) an array of ``dtype``."""
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), block)


def block_forward(block, key, x, *, causal: bool = False, weights: str = DEFAULT_WEIGHTS):
    """One random block applied to tokens ``x`` (``[n, d]``) with weights drawn from ``key``
    (``weights``: ``"lazy"`` or ``"dense"``, see the module docstring)."""
    check_weights(weights)
    mod = block.module(weights, causal)
    if weights == "lazy":
        return mod.apply({}, x, rngs={LAZY_RNG: key})
    out, _ = mod.init_with_output({"params": key}, x)
    return out


def block_params(block, key, n: int, d: int, *, causal: bool = False, dtype=jnp.float32):
    """The parameters :func:`block_forward` draws from ``key`` with dense weights (for
    inspection and tests)."""
    x = jnp.zeros((n, d), dtype)
    return block.module("dense", causal).init({"params": key}, x)


def layer_keys(key, depth: int):
    """The per-block keys of a depth-``depth`` stack drawn from ``key``."""
    return jax.random.split(key, depth)


def stack_forward(
    block,
    key,
    x,
    depth: int,
    *,
    causal: bool = False,
    return_all: bool = False,
    reduce=None,
    remat: bool = False,
    weights: str = DEFAULT_WEIGHTS,
):
    """Apply ``depth`` independent random blocks to ``x`` (``[n, d]``), weights ``"lazy"``
    (default) or ``"dense"``.

    ``return_all``: also return every layer's tokens, shape ``[depth + 1, n, d]``.
    ``reduce``: a function of the tokens applied at every layer (including the input);
    its per-layer outputs are stacked and returned instead of the tokens (cheap
    per-layer statistics without storing ``[depth+1, n, d]``).
    """
    keys = layer_keys(key, depth)

    fwd = lambda h, k: block_forward(block, k, h, causal=causal, weights=weights)
    if remat:
        fwd = jax.checkpoint(fwd)

    def body(h, k):
        h2 = fwd(h, k)
        if reduce is not None:
            return h2, reduce(h2)
        return h2, (h2 if return_all else None)

    out, ys = jax.lax.scan(body, x, keys)
    if reduce is not None:
        first = reduce(x)
        ys = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b], 0), first, ys)
        return out, ys
    if return_all:
        return out, jnp.concatenate([x[None], ys], 0)
    return out


def _orthonormal_rows(key, m: int, d: int, dtype):
    """m random orthogonal rows of squared norm d (needs m <= d)."""
    a = jax.random.normal(key, (d, m), dtype)
    qm, r = jnp.linalg.qr(a)
    qm = qm * jnp.sign(jnp.diagonal(r))  # Haar-distributed columns
    return jnp.sqrt(jnp.asarray(d, dtype)) * qm.T


def simplex_tokens(key, n: int, d: int, q, p, dtype=jnp.float32, exact: bool = False):
    """Tokens ``x_i = sqrt(p) g + sqrt(q - p) e_i`` (g, e_i ~ N(0, I_d)): in expectation
    squared norm ``q d`` and pairwise dot product ``p d`` (docs/theory.md §6, paper App. A).

    ``exact=True``: g and the e_i are random orthogonal vectors of squared norm exactly d,
    so the input Gram matrix is exactly ``d((q - p) I + p 11^T)`` (removes the input's
    O(1/sqrt(d)) fluctuations from per-layer measurements; needs n + 1 <= d)."""
    kg, ke = jax.random.split(key)
    if exact:
        rows = _orthonormal_rows(kg, n + 1, d, dtype)
        g, e = rows[:1], rows[1:]
    else:
        g = jax.random.normal(kg, (1, d), dtype)
        e = jax.random.normal(ke, (n, d), dtype)
    q = jnp.asarray(q, dtype)
    p = jnp.asarray(p, dtype)
    return jnp.sqrt(p) * g + jnp.sqrt(jnp.maximum(q - p, 0)) * e


def two_group_tokens(key, n: int, d: int, q, p_intra, p_inter, dtype=jnp.float32):
    """Symmetry-breaking input of the paper's Eq. 12 (Fig. 3): two groups of n/2 tokens,
    dot products ``p_intra d`` within a group and ``p_inter d`` (< p_intra) across groups,
    squared norms ``q d`` (all in expectation)."""
    kg, kh, ke = jax.random.split(key, 3)
    g = jax.random.normal(kg, (1, d), dtype)
    h = jax.random.normal(kh, (2, d), dtype)
    e = jax.random.normal(ke, (n, d), dtype)
    group = (jnp.arange(n) >= n // 2).astype(jnp.int32)
    q, pi, po = (jnp.asarray(v, dtype) for v in (q, p_intra, p_inter))
    return jnp.sqrt(po) * g + jnp.sqrt(jnp.maximum(pi - po, 0)) * h[group] + jnp.sqrt(jnp.maximum(q - pi, 0)) * e


def collapsed_tokens(key, n: int, d: int, q, dtype=jnp.float32):
    """n identical tokens of squared norm exactly ``q d`` (rho = 1), random direction."""
    g = jax.random.normal(key, (d,), dtype)
    g = g * jnp.sqrt(jnp.asarray(q, dtype) * d) / jnp.linalg.norm(g)
    return jnp.broadcast_to(g, (n, d))
