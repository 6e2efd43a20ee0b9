"""Exact-softmax attention map (THEORY.md §3, §8): no Assumption 3.2.

At d -> infinity the logits of normalized tokens with cosine matrix R are Gaussian with
``E[M_ij M_kl] = sigma_A^2 R_ik R_jl``. Under permutation symmetry
(``R = (1 - rho) I + rho 11^T``) two facts make the expectations cheap (docs/beyond.md §1):

* a per-row constant does not change a softmax row, and after removing it the logits of
  one query row are i.i.d. ``N(0, tau^2)``, ``tau^2 = sigma_A^2 (1 - rho)``; the logits
  of two different query rows i != k at the same key j have correlation ``rho``
  (independent across keys);
* with ``R`` of that form, ``sum_jl A_ij A_kl R_jl = rho + (1 - rho) sum_j A_ij A_kj``, so
  the forward and the values-path backward maps need only the two scalars

      S_1   = E sum_j A_ij^2          (= 1 - w_1   of the paper map)
      S_rho = E sum_j A_ij A_kj       (= 1 - w_rho of the paper map),  k != i.

The n-token denominators are handled *exactly* (no law of large numbers) with a Laplace
transform, ``1 / X^p = int_0^inf t^{p-1} e^{-t X} dt / Gamma(p)``: the n - 1
undistinguished tokens factor into the power ``phi(t)^{n-1}`` (``phi`` a 1-D Gaussian
integral), the distinguished token(s) into one more Gaussian integral. In log-coordinates
``t = e^a`` every Gaussian integral is of the bounded function
``g_p(v) = exp(p v - e^v)``::

    E[A_1^p]              = (1/Gamma(p)) int da  h_p(a) phi(a)^{n-1},   h_p(a) = E g_p(a + s)
    E[A_1^p B_1^r]        = (1/Gamma(p)Gamma(r)) int da db  H_pr(a, b) f(a, b)^{n-1}
                            H_pr(a, b) = E g_p(a + x) g_r(b + y),  f = H_00

with ``s, x ~ N(0, tau^2)``, ``y = rho x + tau sqrt(1 - rho^2) w``. The Gaussian
integrals and the a/b integrals are trapezoid rules on fixed grids (static sizes, traced
ranges), so everything is deterministic, ``jit``/``vmap``-able and differentiable
(``tau`` enters through a sqrt made safe at ``rho = 1``). ``n`` may be traced and may be
large (4096): it only enters as an exponent. The same machinery gives the higher moments
(``E[A^3]``, ``E[A^2 B]``, ...) used by :mod:`.softmax`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Z_MAX = 8.0            # standard-normal range of the Gaussian trapezoid rules
A_LOW_PAD = 32.0       # a < -(log n + Z_MAX tau + A_LOW_PAD): integrand < n^-p e^-32
A_HIGH_PAD = 12.0      # a > Z_MAX tau + A_HIGH_PAD: g_p(a + s) = 0 in float64
V_CLIP = 60.0          # g_p(v) = 0 beyond (exp(-e^60)); clip keeps derivatives finite
H_A = 0.3              # target a-spacing (trapezoid error ~ exp(-pi^2 / h): 5e-15; 0.4 gave
                       # up to 7e-11 in S at sizes sized to a concrete sigma_A, n, issue 13)
H_X = 0.45             # target logit spacing tau * dz
DEFAULT_SIGMA_MAX = 4.5
DEFAULT_N_MAX = 4096
GAMMA_VALUES = 1 << 16  # integrand values of a Gamma table built at once (memory per point)
MAX_VALUES = 1.2e8      # n_a x n_z^2 integrand values per evaluation allowed (sigma_A <~ 10):
                        # beyond, one evaluation takes seconds and a point tens of minutes


# ---- grid sizes (static) -------------------------------------------------------------

def _concrete(x):
    try:
        return float(np.max(np.asarray(x)))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
        return None


def sizes(hp=None, sigma_max: float | None = None, n_max: float | None = None) -> tuple[int, int]:
    """(a-nodes, z-nodes) resolving logit scale ``sigma_max`` and ``n_max`` tokens.

    From concrete ``hp.sigma_a`` / ``hp.n_tokens`` when possible, else the defaults
    (sigma_A <= 4.5, n <= 4096). Raises ValueError when the grid would exceed
    :data:`MAX_VALUES` integrand values (checked before any work: the CLI exits 2)."""
    if hp is not None:
        sigma_max = sigma_max or _concrete(hp.sigma_a)
        n_max = n_max or _concrete(hp.n_tokens)
    s = max(float(sigma_max or DEFAULT_SIGMA_MAX), 0.25) * 1.05   # tau <= sigma_A sqrt(1 + 1/(n-1))
    n = max(float(n_max or DEFAULT_N_MAX), 2.0)
    n_z = int(math.ceil(2 * Z_MAX * s / H_X)) + 1
    n_z = max(49, n_z + (1 - n_z % 2))
    span = math.log(n) + 2 * Z_MAX * s + A_LOW_PAD + A_HIGH_PAD
    n_a = max(96, int(math.ceil(span / H_A)) + 1)
    if n_a * n_z * n_z > MAX_VALUES:
        raise ValueError(f"the exact attention map at sigma_A = {s / 1.05:g}, n = {n:g} needs a logit grid "
                         f"of {n_a} x {n_z}^2 = {n_a * n_z * n_z:.1e} values per evaluation (limit "
                         f"{MAX_VALUES:.1e}, about sigma_A <= 10); use --attention paper or a smaller sigma_A")
    return n_a, n_z


# ---- building blocks -----------------------------------------------------------------

def _safe_sqrt(x):
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def _safe_log(x):
    pos = x > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)), -1e300)


def _g(p, v):
    """g_p(v) = exp(p v - e^v) (bounded by (p/e)^p)."""
    v = jnp.minimum(v, V_CLIP)
    return jnp.exp(p * v - jnp.exp(v))


def _znodes(n_z, dtype):
    z = jnp.linspace(-Z_MAX, Z_MAX, n_z, dtype=dtype)
    w = jnp.exp(-0.5 * z * z)
    return z, w / jnp.sum(w)


def _pow(base_log, n):
    """exp(n * log base) with the log already taken (safe for base = 0)."""
    return jnp.exp(jnp.maximum(n * base_log, -745.0))


class _Grid:
    """a-grid and Gaussian nodes for one (sigma_A, rho, n)."""

    def __init__(self, hp, rho, n_a, n_z):
        dt = jnp.result_type(float)
        rho = jnp.clip(jnp.asarray(rho, dt), -1.0, 1.0)
        self.n = jnp.asarray(hp.n_tokens, dt)
        self.rho = rho
        self.tau = _safe_sqrt(jnp.square(hp.sigma_a) * (1.0 - rho))
        self.tau_perp = self.tau * _safe_sqrt(1.0 - rho * rho)
        lo = -(jnp.log(self.n) + Z_MAX * self.tau + A_LOW_PAD)
        hi = Z_MAX * self.tau + A_HIGH_PAD
        j = jnp.arange(n_a, dtype=dt) / (n_a - 1)
        self.a = lo + (hi - lo) * j
        self.h = (hi - lo) / (n_a - 1)
        self.z, self.wz = _znodes(n_z, dt)
        # trapezoid end weights (the integrand vanishes at both ends anyway)
        self.wa = jnp.ones((n_a,), dt).at[0].set(0.5).at[-1].set(0.5) * self.h


def _h1(grid, p):
    """h_p(a) = E g_p(a + tau z) on the a-grid."""
    return _g(p, grid.a[:, None] + grid.tau * grid.z[None, :]) @ grid.wz


def _gamma_tables(grid, rs):
    """Gamma_r[b, m] = E_w g_r(b + rho x_m + tau_perp w), x_m = tau z_m, for each r in ``rs``
    (non-negative integers) from one pass over the n_a x n_z x n_z integrand.

    ``g_r(v) = exp(r v - E)`` with ``E = e^v`` (v clipped at V_CLIP) computed once for every
    r: 1 + len(rs) ``exp`` per integrand value instead of 2 len(rs) (issue 13), the same
    operations as :func:`_g` (``E^r exp(-E)`` would save more but differs from it by
    E ulp, 1e-13 relative where g ~ 1e-250). The integrand is built :func:`_gamma_rows`
    a-rows at a time (``jax.lax.map``), so a vmapped chunk of points holds a bounded number
    of values at once (16.7 GB for 36 points before blocking, issue 13).
    """
    shift = grid.rho * grid.tau * grid.z
    noise = grid.tau_perp * grid.z

    def rows(a):
        v = (a[:, None] + shift[None, :])[:, :, None] + noise[None, None, :]
        v = jnp.minimum(v, V_CLIP)
        e = jnp.exp(v)
        return tuple(jnp.exp(float(r) * v - e) @ grid.wz for r in rs)

    n_a, n_z = grid.a.shape[0], grid.z.shape[0]
    batch = _gamma_rows(n_a, n_z)
    if batch >= n_a:
        return rows(grid.a)
    return jax.lax.map(lambda a: tuple(t[0] for t in rows(a[None])), grid.a, batch_size=batch)


def _gamma_rows(n_a, n_z):
    """a-rows of the Gamma integrand built at once: about GAMMA_VALUES values per point."""
    return max(1, min(n_a, GAMMA_VALUES // (n_z * n_z)))


def _h2(grid, p, gamma_r):
    """H_pr(a, b) = E g_p(a + x) g_r(b + y)."""
    left = _g(p, grid.a[:, None] + grid.tau * grid.z[None, :]) * grid.wz[None, :]
    return left @ gamma_r.T


# ---- moments -------------------------------------------------------------------------

def row_moments(hp, rho, n_a=None, n_z=None):
    """One softmax row of n i.i.d. N(0, tau^2) logits: dict of E[A_1], E[A_1^2], E[A_1^3],
    E[A_1^4], E[A_1^2 A_2^2] (exact up to quadrature)."""
    if n_a is None or n_z is None:
        n_a, n_z = sizes(hp)
    gr = _Grid(hp, rho, n_a, n_z)
    phi_log = _safe_log(_h1(gr, 0.0))
    w_n1 = _pow(phi_log, gr.n - 1.0) * gr.wa
    w_n2 = _pow(phi_log, gr.n - 2.0) * gr.wa
    h = {p: _h1(gr, float(p)) for p in (1, 2, 3, 4)}
    return {
        "a1": jnp.sum(h[1] * w_n1),
        "a2": jnp.sum(h[2] * w_n1),
        "a3": jnp.sum(h[3] * w_n1) / 2.0,
        "a4": jnp.sum(h[4] * w_n1) / 6.0,
        "a2a2": jnp.sum(h[2] * h[2] * w_n2) / 6.0,
    }


def pair_moments(hp, rho, n_a=None, n_z=None, higher: bool = False):
    """Two query rows A, B (logit correlation rho at each key) of the same n tokens:
    dict of E[A_1 B_1] and, with ``higher``, E[A_1^2 B_1], E[A_1^2 B_1^2], E[A_1 B_1 A_2 B_2],
    E[A_1^2 B_2^2] (keys ``ab``, ``a2b``, ``a2b2``, ``abab``, ``a2_b2``)."""
    if n_a is None or n_z is None:
        n_a, n_z = sizes(hp)
    gr = _Grid(hp, rho, n_a, n_z)
    if higher:
        gam0, gam1, gam2 = _gamma_tables(gr, (0, 1, 2))
    else:
        gam0, gam1 = _gamma_tables(gr, (0, 1))
    f_log = _safe_log(_h2(gr, 0.0, gam0))
    w2 = gr.wa[:, None] * gr.wa[None, :]
    w_n1 = _pow(f_log, gr.n - 1.0) * w2
    h11 = _h2(gr, 1.0, gam1)
    out = {"ab": jnp.sum(h11 * w_n1)}
    if higher:
        out["a2b"] = jnp.sum(_h2(gr, 2.0, gam1) * w_n1)
        out["a2b2"] = jnp.sum(_h2(gr, 2.0, gam2) * w_n1)
        w_n2 = _pow(f_log, gr.n - 2.0) * w2
        out["abab"] = jnp.sum(h11 * h11 * w_n2)
        out["a2_b2"] = jnp.sum(_h2(gr, 2.0, gam0) * _h2(gr, 0.0, gam2) * w_n2)
    return out


def s_values(hp, rho, n_a=None, n_z=None):
    """(S_1, S_rho) = (E sum_j A_ij^2, E sum_j A_ij A_kj) at token cosine rho."""
    n = jnp.asarray(hp.n_tokens, jnp.result_type(float))
    s1 = n * row_moments(hp, rho, n_a, n_z)["a2"]
    sr = n * pair_moments(hp, rho, n_a, n_z)["ab"]
    return s1, sr


def grid_sizes(hp, att=None) -> tuple[int, int]:
    """Static (n_a, n_z): those of ``att`` (an :class:`.exact_table.ExactKernel`, sized to
    a concrete sigma_A and n outside the trace), else :func:`sizes` (defaults when traced)."""
    return (att.n_a, att.n_z) if att is not None else sizes(hp)


def forward_from_s(hp, rho, s1, sr):
    """(q_A, p_A) from (S_1, S_rho) at cosine rho (THEORY.md §3)."""
    sv2 = jnp.square(hp.sigma_v)
    return sv2 * (rho + (1.0 - rho) * s1), sv2 * (rho + (1.0 - rho) * sr)


# ---- the maps (signatures of .paper, plus the grid sizes ``att``) ---------------------------

def forward(hp, rho, att=None):
    """(q_A, p_A) of the attention output for normalized input tokens with cosine rho."""
    return forward_from_s(hp, rho, *s_values(hp, rho, *grid_sizes(hp, att)))


def backward(hp, q, rho, a, b, att=None):
    """Values-path backward map with exact E[A A] (see :func:`.paper.backward`)."""
    n = jnp.asarray(hp.n_tokens, jnp.result_type(float))
    s1, sr = s_values(hp, rho, *grid_sizes(hp, att))
    d1, o1 = s1, (1.0 - s1) / (n - 1.0)         # sum_i E[A_im A_im'],  m = m' / m != m'
    dr, orr = (n - 1.0) * sr, 1.0 - sr          # sum_{i != k} E[A_im A_km']
    scale = jnp.square(hp.sigma_v) / q
    diag = scale * (a * d1 + b * (d1 + dr))
    off = scale * (a * o1 + b * (o1 + orr))
    return diag, off


# ---- brute-force reference (tests) -------------------------------------------------------

def monte_carlo_s(sigma_a, rho, n, samples=200_000, seed=0, batch=20_000):
    """Brute-force S_1, S_rho (and standard errors) from the full n x n logit field
    M = sigma_A L Z L^T, R = L L^T (NumPy; for tests at small n)."""
    rng = np.random.default_rng(seed)
    r = (1 - rho) * np.eye(n) + rho * np.ones((n, n))
    lam, u = np.linalg.eigh(r)
    l_mat = u * np.sqrt(np.clip(lam, 0, None))
    s1, sr = [], []
    for start in range(0, samples, batch):
        m = min(batch, samples - start)
        z = rng.standard_normal((m, n, n))
        logits = sigma_a * np.einsum("ij,sjk,lk->sil", l_mat, z, l_mat)
        logits -= logits.max(-1, keepdims=True)
        a = np.exp(logits)
        a /= a.sum(-1, keepdims=True)
        s1.append(np.sum(a[:, 0] ** 2, -1))
        sr.append(np.sum(a[:, 0] * a[:, 1], -1))
    s1, sr = np.concatenate(s1), np.concatenate(sr)
    return (s1.mean(), s1.std(ddof=1) / math.sqrt(s1.size),
            sr.mean(), sr.std(ddof=1) / math.sqrt(sr.size))
