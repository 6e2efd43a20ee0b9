"""Exact-softmax attention map (docs/theory.md §3, §8): no Assumption 3.2.

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

with ``s, x ~ N(0, tau^2)``, ``y = rho x + tau sqrt(1 - rho^2) w``. ``H_pr`` is computed
from a shared/own split of (x, y) (:func:`_pair_tables`: one-dimensional tables and a
matrix product instead of a two-dimensional rule at every (a, b)). The Gaussian
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

Z_MAX = 8.0  # standard-normal range of the Gaussian trapezoid rules
A_LOW_PAD = 32.0  # a < -(log n + Z_MAX tau + A_LOW_PAD): integrand < n^-p e^-32
A_HIGH_PAD = 12.0  # a > Z_MAX tau + A_HIGH_PAD: g_p(a + s) = 0 in float64
H_A = 0.3  # target a-spacing (trapezoid error ~ exp(-pi^2 / h): 5e-15; 0.4 gave
# up to 7e-11 in S at grids sized to a concrete sigma_A, n)
H_X = 0.45  # target logit spacing tau * dz
DEFAULT_SIGMA_MAX = 4.5
DEFAULT_N_MAX = 4096
N_GH = 16  # Gauss-Hermite nodes of the shared logit part c when it is narrow ...
SIGMA_C_LATTICE = 0.2  # ... below this std; from it on, the lattice rule with spacing
LATTICE_REFINE = 8  # nodes on multiples of h / 8, spacing <= sigma_c / C_SPACING and
C_SPACING = 1.4  # <= SPACING_MAX (trapezoid error ~ exp(-2 pi^2 C_SPACING^2) and
SPACING_MAX = 0.2  # A exp(-pi^2 / spacing + pi^2 / (8 sigma_c^2)), A ~ e^{e^v} <~ 1e4 the
# growth of g_p off the real axis: ~1e-14; 0.26 left 3e-11 in H_22)
MAX_VALUES = 1.2e8  # cost bound on n_a x n_z^2 (the direct pair rule's work; the pair
# tables now cost less, but the mesh grows with it): sigma_A <~ 10


# ---- grid sizes (static) -------------------------------------------------------------


def concrete_max(x):
    try:
        return float(np.max(np.asarray(x)))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
        return None


def sizes(sigma_a=None, n_tokens=None, sigma_max: float | None = None, n_max: float | None = None) -> tuple[int, int]:
    """(a-nodes, z-nodes) resolving logit scale ``sigma_max`` and ``n_max`` tokens.

    Where those are not given: from the logit scale ``sigma_a`` and the number of tokens
    ``n_tokens`` when they are concrete, else the defaults (sigma_A <= 4.5, n <= 4096).
    Raises ValueError when the grid would exceed the cost bound :data:`MAX_VALUES` (checked
    before any work: the CLI exits 2)."""
    if sigma_a is not None:
        sigma_max = sigma_max or concrete_max(sigma_a)
    if n_tokens is not None:
        n_max = n_max or concrete_max(n_tokens)
    n = max(float(n_max or DEFAULT_N_MAX), 2.0)
    sa = max(float(sigma_max or DEFAULT_SIGMA_MAX), 0.25)
    # tau <= sigma_A sqrt(1 + 1/(n-1)); the shared part sigma_c = tau sqrt|rho| of two rows'
    # logits, <= s / 2 (lattice_nodes): sigma_A / 2 for rho >= -0.2, and up to
    # sigma_A sqrt(n) / (n - 1) at rho = -1/(n-1) (n < 6)
    s = max(sa * 1.05, 2 * sa * math.sqrt(n) / (n - 1) if n < 6 else 0.0)
    n_z = int(math.ceil(2 * Z_MAX * s / H_X)) + 1
    n_z = max(49, n_z + (1 - n_z % 2))
    span = math.log(n) + 2 * Z_MAX * s + A_LOW_PAD + A_HIGH_PAD
    n_a = max(96, int(math.ceil(span / H_A)) + 1)
    if n_a * n_z * n_z > MAX_VALUES:
        raise ValueError(
            f"the exact attention map at sigma_A = {s / 1.05:g}, n = {n:g} needs a logit grid "
            f"of {n_a} x {n_z} points, over its cost limit (n_a n_z^2 = {n_a * n_z * n_z:.1e} > "
            f"{MAX_VALUES:.1e}, about sigma_A <= 10); use --attention paper or a smaller sigma_A"
        )
    return n_a, n_z


def reach(n_a: int, n_z: int, n_tokens):
    """The largest logit scale the grid sizes ``(n_a, n_z)`` resolve at ``n_tokens`` tokens
    (may be traced): :func:`sizes` read backwards, so ``reach(*sizes(s, n), n) >= s``. A map
    integrated on these sizes at a larger scale (attention reading tokens of norm q > 1 at
    ``sigma_A q``) is not resolved: the layers turn it into NaN."""
    dt = jnp.result_type(float)
    n = jnp.maximum(jnp.asarray(n_tokens, dt), 2.0)
    s_z = (n_z - 1) * H_X / (2 * Z_MAX)
    s_a = ((n_a - 1) * H_A - jnp.log(n) - A_LOW_PAD - A_HIGH_PAD) / (2 * Z_MAX)
    few = jnp.where(n < 6, 2 * jnp.sqrt(n) / (n - 1), 0.0)
    return jnp.minimum(s_z, s_a) / jnp.maximum(1.05, few)


# ---- building blocks -----------------------------------------------------------------


def safe_sqrt(x):
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def safe_log(x):
    pos = x > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)), -1e300)


def z_nodes(n_z, dtype):
    z = jnp.linspace(-Z_MAX, Z_MAX, n_z, dtype=dtype)
    w = jnp.exp(-0.5 * z * z)
    return z, w / jnp.sum(w)


def log_power(base_log, n):
    """exp(n * log base) with the log already taken (safe for base = 0)."""
    return jnp.exp(jnp.maximum(n * base_log, -745.0))


class Grid:
    """a-grid and Gaussian nodes for one (sigma_A, rho, n)."""

    def __init__(self, sigma_a, n_tokens, rho, n_a, n_z):
        dt = jnp.result_type(float)
        rho = jnp.clip(jnp.asarray(rho, dt), -1.0, 1.0)
        self.n = jnp.asarray(n_tokens, dt)
        self.rho = rho
        self.tau = safe_sqrt(jnp.square(sigma_a) * (1.0 - rho))
        self.sigma_c = self.tau * safe_sqrt(jnp.abs(rho))  # shared part of two rows' logits
        self.sigma_d = self.tau * safe_sqrt(1.0 - jnp.abs(rho))  # own part
        lo = -(jnp.log(self.n) + Z_MAX * self.tau + A_LOW_PAD)
        hi = Z_MAX * self.tau + A_HIGH_PAD
        j = jnp.arange(n_a, dtype=dt) / (n_a - 1)
        self.a = lo + (hi - lo) * j
        self.h = (hi - lo) / (n_a - 1)
        self.z, self.wz = z_nodes(n_z, dt)
        # trapezoid end weights (the integrand vanishes at both ends anyway)
        self.wa = jnp.ones((n_a,), dt).at[0].set(0.5).at[-1].set(0.5) * self.h


def gh_nodes(m, dtype):
    t, w = np.polynomial.hermite_e.hermegauss(m)
    return jnp.asarray(t, dtype), jnp.asarray(w / w.sum(), dtype)


def u_tables(v, sd, grid, ps):
    """u_p(v) = E_d g_p(v + d), d ~ N(0, sd^2), for every p in ``ps`` at the points ``v``
    (any shape), with one ``exp`` per integrand value for all orders:
    g_p(v + d) = e^{pv} e^{pd} exp(-e^v e^d)."""
    d = sd * grid.z
    m = jnp.exp(-(jnp.exp(v)[..., None] * jnp.exp(d)))
    return [jnp.exp(p * v) * (m @ (grid.wz * jnp.exp(p * d))) for p in ps]


def lattice_nodes(n_a: int, n_z: int) -> tuple[int, int]:
    """Static (N, k_max) of the shared-logit lattice rule of :func:`_pair_tables`: 2N + 1
    nodes c_k = k m delta (m the traced integer multiple of the fine step delta), and the
    half-width k_max >= N m of the fine-lattice range they can reach. sigma_c <= s / 2 with
    s = (n_z - 1) H_X / (2 Z_MAX) the logit scale the z-grid resolves (:func:`sizes`); the
    finest a-grid n_a can have is that of tau = 0, n = 2."""
    s = (n_z - 1) * H_X / (2 * Z_MAX)
    step_max = H_A / LATTICE_REFINE
    step_min = (math.log(2.0) + A_LOW_PAD + A_HIGH_PAD) / (n_a - 1) / LATTICE_REFINE
    need = max(SIGMA_C_LATTICE / (SIGMA_C_LATTICE / C_SPACING - step_max), (s / 2) / (SPACING_MAX - step_max))
    n = int(math.ceil(Z_MAX * need)) + 1
    return n, n * max(1, int(SPACING_MAX / step_min))


def _pair_tables(grid, pairs):
    """H_pr[a, b] = E g_p(a + x) g_r(b + y) on the a-grid for each (p, r) in ``pairs``.

    (x, y) are N(0, tau^2) with correlation rho: x = c + d_1, y = +-c + d_2 (sign of rho),
    c ~ N(0, |rho| tau^2) shared, d_i ~ N(0, (1 - |rho|) tau^2) independent, so
    H_pr(a, b) = E_c u_p(a + c) u_r(b +- c) with the 1-D u_p(v) = E_d g_p(v + d)
    (:func:`u_tables`), and H is a matrix product over nodes of c:

    * wide c (sigma_c >= SIGMA_C_LATTICE): a trapezoid rule whose nodes are multiples of the
      fine step h / LATTICE_REFINE, spacing min(sigma_c / C_SPACING, SPACING_MAX) rounded
      down to a multiple (error ~ exp(-pi^2 / spacing + pi^2 / (8 sigma_c^2)), the integrand
      being analytic in a strip of half-width pi/2), so a + c falls on the refined a-grid
      and each u_p is one table of ~ n_a LATTICE_REFINE x n_z values;
    * narrow c: N_GH Gauss-Hermite nodes, u_p evaluated at a + c directly.

    ``lax.cond`` picks the rule valid at sigma_c (under vmap both are evaluated); NaN where the static lattice cannot reach Z_MAX sigma_c (sizes too small for sigma_A,
    n). Cost ~ n_a n_z (LATTICE_REFINE + N_GH) exp and 2 n_a^2 (2N + 1 + N_GH) multiply-adds
    per pair, instead of the n_a n_z^2 exp of a direct two-dimensional Gaussian rule."""
    dt = grid.a.dtype
    n_a, n_z = grid.a.shape[0], grid.z.shape[0]
    ps = sorted({p for pr in pairs for p in pr})
    flip = grid.rho < 0

    def contract(u, w):
        out = {}
        for p, r in pairs:
            ur = jnp.where(flip, u[r][:, ::-1], u[r])
            out[(p, r)] = (u[p] * w) @ ur.T
        return out

    def narrow(grid):
        t, wt = gh_nodes(N_GH, dt)
        return contract(dict(zip(ps, u_tables(grid.a[:, None] + grid.sigma_c * t, grid.sigma_d, grid, ps))), wt)

    def wide(grid):
        n_c, k_max = lattice_nodes(n_a, n_z)
        step = grid.h / LATTICE_REFINE
        mult = jnp.floor(jnp.minimum(grid.sigma_c / C_SPACING, SPACING_MAX) / step)
        mult = jnp.clip(mult, 1, k_max // n_c).astype(jnp.int32)
        fine = grid.a[0] + jnp.arange(-k_max, (n_a - 1) * LATTICE_REFINE + k_max + 1, dtype=dt) * step
        tables = u_tables(fine, grid.sigma_d, grid, ps)
        k = jnp.arange(-n_c, n_c + 1) * mult
        idx = (jnp.arange(n_a) * LATTICE_REFINE)[:, None] + k[None, :] + k_max
        sc = jnp.where(grid.sigma_c > 0, grid.sigma_c, 1.0)
        wc = jnp.exp(-0.5 * jnp.square(k * step / sc))
        out = contract({p: tab[idx] for p, tab in zip(ps, tables)}, wc / jnp.sum(wc))
        covered = Z_MAX * grid.sigma_c <= n_c * mult * step  # else sizes too small for sigma_A, n
        return {pr: jnp.where(covered, v, jnp.nan) for pr, v in out.items()}

    # a real branch for one rho (lax.map over the mesh: exact_table.values); under vmap
    # both are evaluated and one selected
    return jax.lax.cond(grid.sigma_c >= SIGMA_C_LATTICE, lambda: wide(grid), lambda: narrow(grid))


# ---- moments -------------------------------------------------------------------------


def row_moments(sigma_a, n_tokens, rho, n_a=None, n_z=None):
    """One softmax row of n i.i.d. N(0, tau^2) logits (tau^2 = sigma_A^2 (1 - rho)): dict of
    E[A_1], E[A_1^2], E[A_1^3], E[A_1^4], E[A_1^2 A_2^2] (exact up to quadrature)."""
    if n_a is None or n_z is None:
        n_a, n_z = sizes(sigma_a, n_tokens)
    gr = Grid(sigma_a, n_tokens, rho, n_a, n_z)
    h = dict(zip(range(5), u_tables(gr.a, gr.tau, gr, range(5))))  # h_p(a) = E g_p(a + tau z)
    phi_log = safe_log(h[0])
    w_n1 = log_power(phi_log, gr.n - 1.0) * gr.wa
    w_n2 = log_power(phi_log, gr.n - 2.0) * gr.wa
    return {
        "a1": jnp.sum(h[1] * w_n1),
        "a2": jnp.sum(h[2] * w_n1),
        "a3": jnp.sum(h[3] * w_n1) / 2.0,
        "a4": jnp.sum(h[4] * w_n1) / 6.0,
        "a2a2": jnp.sum(h[2] * h[2] * w_n2) / 6.0,
    }


def pair_moments(sigma_a, n_tokens, rho, n_a=None, n_z=None, higher: bool = False):
    """Two query rows A, B (logit correlation rho at each key) of the same n tokens:
    dict of E[A_1 B_1] and, with ``higher``, E[A_1^2 B_1], E[A_1^2 B_1^2], E[A_1 B_1 A_2 B_2],
    E[A_1^2 B_2^2] (keys ``ab``, ``a2b``, ``a2b2``, ``abab``, ``a2_b2``)."""
    if n_a is None or n_z is None:
        n_a, n_z = sizes(sigma_a, n_tokens)
    gr = Grid(sigma_a, n_tokens, rho, n_a, n_z)
    pairs = [(0, 0), (1, 1)] + ([(2, 1), (2, 2), (2, 0), (0, 2)] if higher else [])
    h = _pair_tables(gr, pairs)
    f_log = safe_log(h[0, 0])
    w2 = gr.wa[:, None] * gr.wa[None, :]
    w_n1 = log_power(f_log, gr.n - 1.0) * w2
    out = {"ab": jnp.sum(h[1, 1] * w_n1)}
    if higher:
        out["a2b"] = jnp.sum(h[2, 1] * w_n1)
        out["a2b2"] = jnp.sum(h[2, 2] * w_n1)
        w_n2 = log_power(f_log, gr.n - 2.0) * w2
        out["abab"] = jnp.sum(h[1, 1] * h[1, 1] * w_n2)
        out["a2_b2"] = jnp.sum(h[2, 0] * h[0, 2] * w_n2)
    return out


def s_values(sigma_a, n_tokens, rho, n_a=None, n_z=None):
    """(S_1, S_rho) = (E sum_j A_ij^2, E sum_j A_ij A_kj) at token cosine rho (logit scale
    sigma_A, n tokens)."""
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    s1 = n * row_moments(sigma_a, n_tokens, rho, n_a, n_z)["a2"]
    sr = n * pair_moments(sigma_a, n_tokens, rho, n_a, n_z)["ab"]
    return s1, sr


def t_values(sigma_a, n_tokens, rho, n_a=None, n_z=None):
    """(T_1, T_rho) of the softmax-derivative term (:mod:`.softmax`) at token cosine rho::

    T_1   = E[ sum_l A_l^2 (1 - 2 A_l) + (sum_l A_l^2)^2 ]       (one row A)
    T_rho = E[ sum_l A_l B_l (1 - A_l - B_l) + (A . B)^2 ]      (rows A, B, i != k)
    """
    rm = row_moments(sigma_a, n_tokens, rho, n_a, n_z)
    pm = pair_moments(sigma_a, n_tokens, rho, n_a, n_z, higher=True)
    return t_from_moments(n_tokens, rm, pm)


def t_from_moments(n_tokens, rm, pm):
    """(T_1, T_rho) from :func:`row_moments` and :func:`pair_moments` (``higher=True``)."""
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    t1 = n * rm["a2"] - 2.0 * n * rm["a3"] + n * rm["a4"] + n * (n - 1.0) * rm["a2a2"]
    tr = n * pm["ab"] - 2.0 * n * pm["a2b"] + n * pm["a2b2"] + n * (n - 1.0) * pm["abab"]
    return t1, tr


def st_values(sigma_a, n_tokens, rho, n_a=None, n_z=None):
    """((S_1, S_rho), (T_1, T_rho)) at token cosine rho from one evaluation of the row and
    pair moments (:func:`s_values` and :func:`t_values` each integrate their own: the
    same sums, S_rho here read from the higher pair tables)."""
    rm = row_moments(sigma_a, n_tokens, rho, n_a, n_z)
    pm = pair_moments(sigma_a, n_tokens, rho, n_a, n_z, higher=True)
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    return (n * rm["a2"], n * pm["ab"]), t_from_moments(n_tokens, rm, pm)


def grid_sizes(sigma_a, n_tokens, att=None) -> tuple[int, int]:
    """Static (n_a, n_z): those of ``att`` (an :class:`.exact_table.ExactKernel`, sized to
    a concrete sigma_A and n outside the trace), else :func:`sizes` (defaults when traced)."""
    return (att.n_a, att.n_z) if att is not None else sizes(sigma_a, n_tokens)


def forward_from_s(sigma_v, rho, s1, sr):
    """(q_A, p_A) from (S_1, S_rho) at cosine rho (docs/theory.md §3)."""
    sv2 = jnp.square(sigma_v)
    return sv2 * (rho + (1.0 - rho) * s1), sv2 * (rho + (1.0 - rho) * sr)


# ---- the maps (signatures of .paper, plus the grid sizes ``att``) ---------------------------


def _s_at(sigma_a, n_tokens, rho, att):
    """(S_1, S_rho) at rho: from the Chebyshev interpolant of ``att``'s mesh values where it
    is the exact map to rounding (``att.interp``, :mod:`.exact_table`), else by quadrature."""
    if att is not None and att.interp:
        return att.s_at(n_tokens, rho)
    return s_values(sigma_a, n_tokens, rho, *grid_sizes(sigma_a, n_tokens, att))


def forward(sigma_a, n_tokens, sigma_v, rho, att=None):
    """(q_A, p_A) of the attention output for normalized input tokens with cosine rho
    (logit scale sigma_A, n tokens, value scale sigma_V)."""
    return forward_from_s(sigma_v, rho, *_s_at(sigma_a, n_tokens, rho, att))


def backward(sigma_a, n_tokens, sigma_v, q, rho, a, b, att=None):
    """Values-path backward map with exact E[A A] (see :func:`.paper.backward`)."""
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    s1, sr = _s_at(sigma_a, n_tokens, rho, att)
    d1, o1 = s1, (1.0 - s1) / (n - 1.0)  # sum_i E[A_im A_im'],  m = m' / m != m'
    dr, orr = (n - 1.0) * sr, 1.0 - sr  # sum_{i != k} E[A_im A_km']
    scale = jnp.square(sigma_v) / q
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
    return (s1.mean(), s1.std(ddof=1) / math.sqrt(s1.size), sr.mean(), sr.std(ddof=1) / math.sqrt(sr.size))
