"""Full-Gram mean field (docs/theory.md §8): propagate the whole n x n token Gram ``C`` forward
and the gradient Gram ``G`` backward, with an optional causal mask and any initial Gram.

The maps are the paper preset's layers' own Gram maps (``gram_forward``, ``gram_backward``)
stacked by :mod:`phasefield.layers.gram`, the engine of every block; this module gives them
the paper's numbers (an :class:`.numbers.HParams`) and adds the figures' helpers.

Forward, one block (``R`` = cosine matrix of ``C``, ``q_i = C_ii``)::

    C^A_ik = sigma_V^2 sum_jl E[A_ij A_kl] R_jl          attention on normalized tokens
    C^z    = beta_A^2 C + alpha_A^2 C^A
    C'_ik  = beta_M^2 C^z_ik + alpha_M^2 p_M(R^z_ik)      (q_M on the diagonal)

Backward (values path, gradient Gram at a block output -> input)::

    G <- c .* G,  c_ik = beta_M^2 + alpha_M^2 D(R^z_ik) / sqrt(q^z_i q^z_k)   (D(1) on the diagonal)
    G_in_mm' = beta_A^2 G_mm' + alpha_A^2 sigma_V^2 sum_ik E[A_im A_km'] G_ik / sqrt(q_m q_m')

``E[A_ij A_kl]`` comes from :mod:`phasefield.theory.attention` (``hp.attention``: the paper's
Assumption 3.2, or exact by fixed-seed Monte-Carlo; ``hp.softmax_correction`` adds the
softmax path to the backward map). Under a permutation-symmetric start without mask the
paper mode *is* the (q, p) engine (tested to 1e-10). ``n`` is the (static) size of ``C``.

Public helpers for the figures: :func:`two_group_trajectory` (paper Fig. 3, Eq. 12),
:func:`causal_exponents` and :func:`causal_geometry` (paper Fig. 6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...theory import mlp
from ...theory.precision import float64
from .. import gram as layer_gram
from ..base import Serial
from ..causal import masked
from ..state import Context
from . import fixed_points
from .block import _sublayers


def _kern(hp, kern):
    return mlp.kernel(hp.sigma_w, hp.activation, hp.mlp_layers) if kern is None else kern


def _at_collapse(hp):
    """hp for maps evaluated at the collapsed point R = 11^T, where attention is the
    deterministic (masked) uniform average in both modes and the softmax path vanishes:
    the paper mode gives the same numbers without Monte-Carlo (and without differentiating
    an eigendecomposition at its degenerate point)."""
    return hp.replace(attention="paper", softmax_correction=False)


# ---- Gram helpers ----------------------------------------------------------------------

cosines = float64(layer_gram.cosines)
causal_mask = layer_gram.causal_mask
symmetric_gram = float64(layer_gram.symmetric_gram)


@float64
def two_group_gram(n: int, q, rho_intra, rho_inter):
    """Paper Eq. 12: two groups (first n//2 tokens, the rest), cosine rho_intra inside a
    group and rho_inter across, squared norm q."""
    dt = jnp.result_type(float)
    g = np.arange(n) >= n // 2
    same = jnp.asarray(g[:, None] == g[None, :])
    r = jnp.where(same, jnp.asarray(rho_intra, dt), jnp.asarray(rho_inter, dt))
    r = jnp.where(jnp.eye(n, dtype=bool), 1.0, r)
    return jnp.asarray(q, dt) * r


# ---- block maps: the paper preset's layers on the full Gram (phasefield.layers.gram) --------


def _block(hp, kern=None, causal: bool = False):
    """The paper preset's block with the MLP kernel ``kern`` attached (its two residual
    sublayers, as :mod:`.block`), its attention causal where ``causal``."""
    return _mask(Serial(_sublayers(hp, kern)), causal)


def _mask(layer, causal: bool):
    return masked(layer) if causal else layer


def _ctx(hp):
    return Context(hp.n_tokens)


def _causal(mask) -> bool:
    """Whether ``mask`` (one of :func:`causal_mask`'s) is the causal one."""
    mask = np.asarray(mask, bool)
    if mask.all():
        return False
    if np.array_equal(mask, causal_mask(mask.shape[-1], True)):
        return True
    raise ValueError("the Gram maps take the causal mask or none")


def attention_step(hp, c, mask):
    """C^z: the Gram between the two branches."""
    return _mask(_sublayers(hp)[0], _causal(mask)).gram_forward(c, _ctx(hp))


def mlp_step(hp, cz, kern):
    return _sublayers(hp, kern)[1].gram_forward(cz, _ctx(hp))


@float64
def block_map(hp, c, causal: bool = False, kern=None):
    """One block of the Gram map: C -> C'."""
    return _block(hp, _kern(hp, kern), causal).gram_forward(c, _ctx(hp))


@float64
def trajectory_from_gram(
    hp, c0, num_layers: int | None = None, causal: bool = False, kern=None, return_z: bool = False
):
    """Grams [L + 1, n, n] (index 0 = input); with ``return_z`` also C^z [L, n, n]."""
    num_layers = int(hp.depth) if num_layers is None else int(num_layers)
    block, ctx = _block(hp, _kern(hp, kern), causal), _ctx(hp)
    cs = layer_gram.forward_grams(block, ctx, c0, num_layers)
    if not return_z:
        return cs
    czs = jax.lax.map(lambda c: block.layers[0].gram_forward(c, ctx), cs[:-1])
    return cs, czs


def backward_block(hp, kern, c, cz, g, mask):
    """Gradient Gram G at a block's output -> at its input (forward states C, C^z)."""
    attn, mlp = _sublayers(hp, kern)
    ctx = _ctx(hp)
    return _mask(attn, _causal(mask)).gram_backward(c, mlp.gram_backward(cz, g, ctx), ctx)


@float64
def gradient_exponent_from_gram(
    hp, c0, num_layers: int | None = None, causal: bool = False, kern=None, return_grams: bool = False
):
    """lambda_g(L) = (1/L) log(tr G_0 / n) with G_L = I, from input Gram c0 (docs/theory.md §7)."""
    num_layers = int(hp.depth) if num_layers is None else int(num_layers)
    block, ctx = _block(hp, _kern(hp, kern), causal), _ctx(hp)
    lam, gs = layer_gram.backward_grams(block, ctx, layer_gram.forward_grams(block, ctx, c0, num_layers))
    return (lam, gs) if return_grams else lam


# ---- figures: two groups (Fig. 3) and causal attention (Fig. 6) ----------------------------


@float64
def group_cosines(c):
    """Mean intra-group and inter-group cosine of a Gram [..., n, n] (groups as in
    :func:`two_group_gram` and ``phasefield.simulate.measure.group_stats``)."""
    n = c.shape[-1]
    r = cosines(c)
    g = np.arange(n) >= n // 2
    same = (g[:, None] == g[None, :]) & ~np.eye(n, dtype=bool)
    diff = g[:, None] != g[None, :]
    intra = jnp.sum(jnp.where(same, r, 0.0), (-2, -1)) / same.sum()
    inter = jnp.sum(jnp.where(diff, r, 0.0), (-2, -1)) / diff.sum()
    return intra, inter


@float64
def two_group_trajectory(hp, q0, rho_intra, rho_inter, num_layers: int | None = None, causal: bool = False, kern=None):
    """Symmetry restoration from the two-group input of paper Eq. 12 (Fig. 3).

    Returns ``(intra, inter)``: per-layer mean intra-group and inter-group cosines, arrays
    of length ``num_layers + 1`` (index 0 = input); their ratio ``inter / intra`` -> 1 when
    permutation symmetry is restored. ``hp.n_tokens`` must be concrete."""
    n = int(np.asarray(hp.n_tokens))
    c0 = two_group_gram(n, q0, rho_intra, rho_inter)
    cs = trajectory_from_gram(hp, c0, num_layers, causal, kern)
    return group_cosines(cs)


@float64
def causal_geometry(hp, q0, rho0, num_layers: int | None = None, causal: bool = True, kern=None) -> dict:
    """Per-position token norms ``norms [L+1, n]`` (``C_ii``, squared norm / d) and cosines
    ``cosines [L+1, n, n]`` from a permutation-symmetric input (q0, rho0)."""
    n = int(np.asarray(hp.n_tokens))
    cs = trajectory_from_gram(hp, symmetric_gram(n, q0, rho0 * q0), num_layers, causal, kern)
    return {"norms": jnp.diagonal(cs, axis1=-2, axis2=-1), "cosines": cosines(cs)}


def _u_over_q(c):
    n = c.shape[-1]
    tr = jnp.trace(c)
    u = (tr - jnp.sum(c) / n) / (n - 1)
    return u / (tr / n)


@float64
def angle_exponent_from_gram(hp, causal: bool = True, kern=None):
    """lambda_a by the simulator's protocol (docs/theory.md §6): tokens at q*, cosine 1 - eps,
    one block, ``log[(u'/q') / (u/q)]`` in the limit eps -> 0 (u = mean squared distance
    to the token mean, as in ``simulate.measure.token_stats``). At the collapsed point, so
    in the paper mode (:func:`_at_collapse`)."""
    hp, kern = _at_collapse(hp), _kern(hp, kern)
    n = int(np.asarray(hp.n_tokens))
    q_star, _ = fixed_points.collapsed_fixed_point(hp, kern)
    ones = jnp.ones((n, n))
    eye = jnp.eye(n)

    def ratio(eps):
        c0 = q_star * ((1.0 - eps) * ones + eps * eye)
        return _u_over_q(block_map(hp, c0, causal, kern))

    _, slope = jax.jvp(ratio, (jnp.zeros(()),), (jnp.ones(()),))
    return jnp.log(slope)


@float64
def angle_exponent_spectral(hp, causal: bool = True, kern=None):
    """log spectral radius of the linearized cosine map dR' / dR at the collapsed point
    (all n(n-1)/2 transverse modes; equals lambda_a without a mask; paper mode, see
    :func:`_at_collapse`)."""
    hp, kern = _at_collapse(hp), _kern(hp, kern)
    n = int(np.asarray(hp.n_tokens))
    q_star, _ = fixed_points.collapsed_fixed_point(hp, kern)
    iu = np.triu_indices(n, 1)

    def f(delta):
        s = jnp.zeros((n, n)).at[iu].set(delta)
        c = q_star * (jnp.ones((n, n)) + s + s.T)
        return cosines(block_map(hp, c, causal, kern))[iu]

    jac = jax.jacfwd(f)(jnp.zeros(len(iu[0])))
    return jnp.log(jnp.max(jnp.abs(jnp.linalg.eigvals(jac))))


@float64
def causal_exponents(hp, kern=None, causal: bool = True) -> dict:
    """Causal-attention exponents (paper Fig. 6) at one point:

    lambda_a           simulator protocol (one block from cosine 1 - eps at q*)
    lambda_a_spectral  log spectral radius of the transverse linearization
    lambda_g_collapse  finite depth hp.depth, input at the collapsed point (as simulated)

    At the collapsed point the attention matrix is the deterministic causal average
    (uniform over j <= i) in both modes, so the exponents do not depend on
    ``hp.attention``: they are computed in the paper mode (:func:`_at_collapse`).
    ``hp.n_tokens`` and ``hp.depth`` must be concrete."""
    hp, kern = _at_collapse(hp), _kern(hp, kern)
    n = int(np.asarray(hp.n_tokens))
    q_star, _ = fixed_points.collapsed_fixed_point(hp, kern)
    c0 = q_star * jnp.ones((n, n))
    out = {
        "lambda_a": angle_exponent_from_gram(hp, causal, kern),
        "lambda_a_spectral": angle_exponent_spectral(hp, causal, kern),
        "lambda_g_collapse": gradient_exponent_from_gram(hp, c0, int(np.asarray(hp.depth)), causal, kern),
        "q_star": q_star,
    }
    return out


# ---- the reports of ``phasefield gram`` --------------------------------------------------


def geometry_report(hp, q0, rho0, rho_inter=None, num_layers: int | None = None, causal: bool = False) -> dict:
    """Per-layer geometry from a permutation-symmetric input (q0, rho0): ``norms`` [L+1, n],
    ``cosines`` [L+1, n, n], their means and each position's mean cosine with the earlier
    positions; with ``rho_inter``, from the two-group input of paper Eq. 12 instead (cosine
    ``rho0`` inside a group, ``rho_inter`` across): ``intra``, ``inter`` and their ``ratio``
    per layer. NumPy arrays; ``hp.n_tokens`` concrete."""
    num_layers = int(np.asarray(hp.depth)) if num_layers is None else int(num_layers)
    layer = list(range(num_layers + 1))
    if rho_inter is not None:
        intra, inter = (np.asarray(v) for v in two_group_trajectory(hp, q0, rho0, rho_inter, num_layers, causal))
        return dict(layer=layer, intra=intra, inter=inter, ratio=inter / intra)
    n = int(np.asarray(hp.n_tokens))
    geo = causal_geometry(hp, q0, rho0, num_layers, causal=causal)
    norms, cos = np.asarray(geo["norms"]), np.asarray(geo["cosines"])
    iu = np.triu_indices(n, 1)
    earlier = np.array([[c[i, :i].mean() if i else np.nan for i in range(n)] for c in cos])
    return dict(
        layer=layer,
        causal=causal,
        norms=norms,
        cosines=cos,
        mean_cosine=cos[:, iu[0], iu[1]].mean(-1),
        mean_cosine_with_earlier=earlier,
    )


def exponents_report(hp, q0, rho0, causal: bool = False, softmax_correction: bool = False) -> dict:
    """:func:`causal_exponents` and ``lambda_g_input``, lambda_g(L) from the symmetric input
    (q0, rho0) (with ``softmax_correction`` also ``lambda_g_input_corrected``, the backward
    map with the softmax path), as plain floats."""
    n, depth = int(np.asarray(hp.n_tokens)), int(np.asarray(hp.depth))
    res = {k: float(v) for k, v in causal_exponents(hp, causal=causal).items()}
    c0 = symmetric_gram(n, q0, rho0 * q0)
    res["lambda_g_input"] = float(gradient_exponent_from_gram(hp, c0, depth, causal))
    if softmax_correction:
        res["lambda_g_input_corrected"] = float(
            gradient_exponent_from_gram(hp.replace(softmax_correction=True), c0, depth, causal)
        )
    return res
