"""The MLP branch map of docs/theory.md §4 (Poole et al. 2016, behind the normalization).

The MLP sees normalized tokens, so its first pre-activations have variance ``sigma_w**2``
whatever the block input: for one grid point every MLP quantity is a function of the
input cosine ``rho`` alone. :class:`MLPKernel` holds that function for one ``sigma_w``:

* the hidden-layer variances ``q_l`` (``q_1 = sigma_w**2``),
* per hidden layer, Chebyshev series in ``rho`` of ``E[phi(h) phi(h')]`` and
  ``E[phi'(h) phi'(h')]`` (built once from a dense trapezoid rule on the Chebyshev–Lobatto
  nodes ``rho_j = cos(pi j / (K - 1))``), or nothing when a closed form exists
  (erf: arcsine kernel, relu: arc-cosine kernel, linear, gelu: :func:`.smoothed.gelu_pair`).

From it::

    p_M(rho)   = sigma_w^2 E[phi(h_k) phi(h_k')]       (composition over k hidden layers)
    q_M        = p_M(1)                                (1-D integrals, exact to the grid)
    D(rho)     = d p_M / d rho                          (Price's theorem, also a table)

``p_M`` carries a custom JVP whose rho-derivative is ``D``, so ``jax.jacfwd`` of the block
map is smooth and exact at the collapsed point ``rho = 1``.

Build a kernel with :func:`kernel` from ``sigma_w``, the activation and the number of hidden
layers (``sigma_w`` may be traced; sizes are static and chosen from a concrete ``sigma_w``
when available). Sweeps build one kernel per unique ``sigma_w`` and reuse it across every
other axis.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import activations
from . import quadrature, smoothed
from .precision import float64

CLOSED_FORMS = ("erf", "relu", "linear", "gelu")
ODD = ("tanh", "erf", "linear")
DEFAULT_SIGMA_MAX = 10.0  # table resolution used when sigma_w is traced
# tanh tables take the plain 2-D rule up to this grid size (s <~ 4), the erf split above it:
# the split's fixed 129-node local rules cost 5-12x the plain rule's at s <= 2,
# both agree with a dense reference to the same digits (tests/test_cost.py)
PLAIN_GRID_MAX = 256
# concrete kernels are sized for the first of these pre-activation scales at or above their
# own (:func:`size_class`), and their Chebyshev series padded to PAD_CHEB terms (:func:`pad`):
# every sigma_w up to 13 gives the same array shapes, so a new sigma_w compiles nothing
SIZE_CLASSES = (3.0, 6.0, 13.0)
PAD_CHEB = 257


@struct.dataclass
class MLPKernel:
    sigma_w: Any  # scalar
    q_layers: Any  # [k] pre-activation variances of the hidden layers
    e_phi2: Any  # [k] E[phi(h_l)^2]
    e_dphi2: Any  # [k] E[phi'(h_l)^2]
    c_pp: Any  # [k, K] Chebyshev coefficients of E[phi phi](rho) (K=0: closed form)
    c_dd: Any  # [k, K] Chebyshev coefficients of E[phi' phi'](rho)
    activation: str = struct.field(pytree_node=False, default="tanh")
    # the attention branch's tables riding along (exact mode: an
    # attention.exact_table.ExactKernel, its grid sizes static; None: sized from sigma_A, n)
    att: Any = None

    @property
    def layers(self) -> int:
        return self.q_layers.shape[-1]

    @property
    def q_m(self):
        """q_M = sigma_w^2 E[phi(h_k)^2]."""
        return self.sigma_w**2 * self.e_phi2[..., -1]

    @property
    def d_one(self):
        """D(1) = d p_M / d rho at rho = 1 (= sigma_w^4 E[phi'^2] for one hidden layer)."""
        return _chain(self.sigma_w, self.q_layers, self.e_dphi2)


# ---- sizes ------------------------------------------------------------------------------


def table_sizes(s_max: float) -> tuple[int, int]:
    """(trapezoid nodes per direction, Chebyshev nodes) that resolve pre-activation scale s_max."""
    n_grid = quadrature.grid_size(s_max)
    n_cheb = 65 if s_max <= 3.0 else 129 if s_max <= 6.0 else 257 if s_max <= 13.0 else 513
    return n_grid, n_cheb


def _concrete_max(x) -> float | None:
    try:
        return float(np.max(np.asarray(x)))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
        return None


def layer_scales(sigma_w, activation: str, layers: int):
    """Hidden-layer variances q_l and E[phi^2], E[phi'^2] at each (1-D integrals)."""
    phi, dphi = activations.get(activation), activations.derivative(activation)
    q = jnp.asarray(sigma_w, jnp.result_type(float)) ** 2
    qs, e2, d2 = [], [], []
    for _ in range(layers):
        s = jnp.sqrt(q)
        ep, ed = _e_sq(activation, s, phi, dphi)
        qs.append(q)
        e2.append(ep)
        d2.append(ed)
        q = sigma_w**2 * ep
    return jnp.stack(qs, -1), jnp.stack(e2, -1), jnp.stack(d2, -1)


def _e_sq(activation, s, phi, dphi):
    if activation == "gelu":
        return smoothed.gelu_pair(s * s, 1.0)
    if activation == "erf":
        return (2 / math.pi) * jnp.arcsin(2 * s * s / (1 + 2 * s * s)), (4 / math.pi) / jnp.sqrt(1 + 4 * s * s)
    if activation == "relu":
        return 0.5 * s * s, jnp.full_like(s, 0.5)
    if activation == "linear":
        return s * s, jnp.ones_like(s)
    if activation in smoothed.SPLIT:  # tanh = erf(K h) + rest(h): fixed-size rules at any s
        rest, erf_k = smoothed.tanh_rest, lambda x: smoothed.erf_given(x, 0.0)
        e_pp = (
            smoothed.erf_pair(s * s, 1.0)
            + quadrature.expect_1d_local(lambda x: rest(x) ** 2, s)
            + 2.0 * quadrature.expect_1d_local(lambda x: rest(x) * erf_k(x), s)
        )
        return e_pp, quadrature.expect_1d_local(lambda x: dphi(x) ** 2, s)
    return (quadrature.expect_1d(lambda x: phi(x) ** 2, s), quadrature.expect_1d(lambda x: dphi(x) ** 2, s))


# ---- construction -------------------------------------------------------------------------


@float64
def kernel(
    sigma_w,
    activation: str | None = None,
    layers: int = 1,
    *,
    n_grid: int | None = None,
    n_cheb: int | None = None,
    sigma_max: float | None = None,
) -> MLPKernel:
    """The kernel of an MLP of ``layers`` hidden layers of ``activation`` with weight scale
    ``sigma_w`` (any shape: a batch of kernels). ``kernel(hp)``, no activation given, reads
    the sigma_w, activation and mlp_layers of an :class:`phasefield.HParams`.

    Table sizes (static) follow the concrete sigma_w (``n_grid``, ``n_cheb``: fixed
    sizes); with a concrete sigma_w the construction runs as cached compiled programs (the
    layer scales, then one table program per hidden layer, shared by every ``layers``).
    When sigma_w is traced the tables resolve pre-activation scales up to ``sigma_max``
    (default :data:`DEFAULT_SIGMA_MAX`), and every number of the kernel is NaN where a scale
    exceeds it (never a silently under-resolved answer); pass a larger ``sigma_max`` for
    larger traced sigma_w.
    """
    sigma_w, act, k = _mlp_fields(sigma_w, activation, layers)
    activations.get(act)
    sigma_w = jnp.asarray(sigma_w, jnp.result_type(float))
    concrete = _concrete_max(sigma_w) is not None
    if act in CLOSED_FORMS:
        return _closed_jit(act, k)(sigma_w) if concrete else _build(sigma_w, act, k, 0, 0)
    guard = None
    if concrete:
        scales = _layer_scales_jit(act, k)(sigma_w)
    padded = False
    if n_grid is None or n_cheb is None:
        if concrete:
            s_max = size_class(float(np.max(np.sqrt(np.asarray(scales[0])))))
            padded = True
        else:
            s_max = guard = float(DEFAULT_SIGMA_MAX if sigma_max is None else sigma_max)
        g, c = table_sizes(s_max)
        n_grid, n_cheb = n_grid or g, n_cheb or c
    if concrete:
        kern = _build_concrete(sigma_w, act, k, int(n_grid), int(n_cheb), scales)
        return pad(kern, PAD_CHEB) if padded and kern.c_pp.shape[-1] <= PAD_CHEB else kern
    kern = _build(sigma_w, act, k, n_grid, n_cheb)
    if guard is not None:
        kern = _poison(kern, jnp.all(kern.q_layers <= guard * guard, axis=-1))
    return kern


def _mlp_fields(sigma_w, activation, layers):
    """(sigma_w, activation, layers as an int); an HParams-like ``sigma_w`` with no
    ``activation`` gives its own sigma_w, activation and mlp_layers."""
    if activation is None:
        if not hasattr(sigma_w, "mlp_layers"):
            raise TypeError("kernel(sigma_w, activation, layers): the activation is missing")
        sigma_w, activation, layers = sigma_w.sigma_w, sigma_w.activation, sigma_w.mlp_layers
    return sigma_w, activation, int(layers)


def size_class(s_max: float) -> float:
    """The pre-activation scale a concrete kernel's tables are sized for: the smallest of
    :data:`SIZE_CLASSES` at or above ``s_max`` (``s_max`` itself beyond them). Tables are
    built by one compiled program per class, not per value."""
    return next((c for c in SIZE_CLASSES if s_max <= c), s_max)


def pad(kern: MLPKernel, size: int) -> MLPKernel:
    """``kern`` with its Chebyshev series padded by zero coefficients to ``size`` terms: the
    same function bit for bit (Clenshaw's recurrence carries the leading zeros as exact
    zeros), and one array shape for every scale, so the programs that read the kernel are
    compiled once per block structure."""
    extra = size - kern.c_pp.shape[-1]
    if extra <= 0 or kern.c_pp.shape[-1] == 0:
        return kern
    widths = [(0, 0)] * (kern.c_pp.ndim - 1) + [(0, extra)]
    return kern.replace(c_pp=jnp.pad(kern.c_pp, widths), c_dd=jnp.pad(kern.c_dd, widths))


def _poison(kern: MLPKernel, ok) -> MLPKernel:
    """``kern`` with every number NaN where ``ok`` is False (ok: the kernel's batch shape)."""

    def f(x):
        okb = jnp.reshape(ok, jnp.shape(ok) + (1,) * (jnp.ndim(x) - jnp.ndim(ok)))
        return jnp.where(okb, x, jnp.nan)

    return kern.replace(**{name: f(getattr(kern, name)) for name in ("q_layers", "e_phi2", "e_dphi2", "c_pp", "c_dd")})


def bind(kern: MLPKernel, sigma_w, activation: str, layers: int = 1) -> MLPKernel:
    """``kern`` checked against the MLP it is used for (``sigma_w``, ``activation``,
    ``layers``): a kernel built for another sigma_w (a stale kernel) raises ``ValueError``
    when both are concrete, and turns every number NaN when traced."""
    if kern.activation != activation or kern.layers != int(layers):
        raise ValueError(
            f"the MLP kernel is for activation {kern.activation!r} with {kern.layers} "
            f"layer(s), not {activation!r} with {layers}; build it with "
            f"theory.kernel(sigma_w, activation, layers)"
        )
    ks, hs = _concrete_array(kern.sigma_w), _concrete_array(sigma_w)
    if ks is not None and hs is not None:
        if not np.array_equal(*np.broadcast_arrays(ks, hs)):
            raise ValueError(
                f"the MLP kernel was built for sigma_w = {np.ravel(ks)[:3].tolist()} but "
                f"sigma_w = {np.ravel(hs)[:3].tolist()}; build it with theory.kernel(sigma_w, activation, layers)"
            )
        return kern
    return _poison(kern, kern.sigma_w == jnp.asarray(sigma_w, jnp.result_type(float)))


def _concrete_array(x):
    try:
        return np.asarray(x, float)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
        return None


@functools.cache
def _layer_scales_jit(act, k):
    return jax.jit(lambda s: layer_scales(s, act, k))


@functools.cache
def _closed_jit(act, k):
    """:func:`_build` of a closed-form activation as one compiled program (not ~20 eager
    operations, each its own program)."""
    return jax.jit(lambda s: _build(s, act, k, 0, 0))


@functools.cache
def _tables_jit(act, n_grid, n_cheb):
    def tables(q, e_one, d_one, layer):  # hidden layer ``layer`` (traced) of the layer scales
        q, e_one, d_one = (jnp.take(x, layer, axis=-1) for x in (q, e_one, d_one))
        pp, dd = _tables(act, jnp.sqrt(q), n_grid, n_cheb, e_one, d_one)
        return pp[..., None, :], dd[..., None, :]  # each [..., 1, n_cheb]: that layer's slot

    return jax.jit(tables)


def _build_concrete(sigma_w, act, k, n_grid, n_cheb, scales):
    """:func:`_build` for a concrete sigma_w from its :func:`layer_scales` (the same numbers
    bitwise, tests/test_theory.py, from fewer compiled programs): the Chebyshev tables
    take one program per (activation, sizes) called once per hidden layer, shared by every
    ``mlp_layers`` (one program per ``k`` before); the tanh split rule's program does not
    depend on ``n_grid`` (only on ``n_grid > PLAIN_GRID_MAX``), so those sizes share one key."""
    q_l, e2, d2 = scales
    if act in smoothed.SPLIT and n_grid > PLAIN_GRID_MAX:
        n_grid = PLAIN_GRID_MAX + 1
    tab = _tables_jit(act, n_grid, n_cheb)
    c_pp, c_dd = zip(*(tab(q_l, e2, d2, np.int32(layer)) for layer in range(k)))
    # one layer (the common case) is the program's output itself: no wait for the device
    c_pp, c_dd = (c[0] if k == 1 else jnp.concatenate(c, -2) for c in (c_pp, c_dd))
    return MLPKernel(sigma_w, q_l, e2, d2, c_pp, c_dd, activation=act)


def _build(sigma_w, act, k, n_grid, n_cheb):
    q_l, e2, d2 = layer_scales(sigma_w, act, k)
    if act in CLOSED_FORMS:
        empty = jnp.zeros(q_l.shape + (0,), q_l.dtype)
        return MLPKernel(sigma_w, q_l, e2, d2, empty, empty, activation=act)
    c_pp, c_dd = [], []
    for layer in range(k):
        pp, dd = _tables(act, jnp.sqrt(q_l[..., layer]), n_grid, n_cheb, e2[..., layer], d2[..., layer])
        c_pp.append(pp)
        c_dd.append(dd)
    return MLPKernel(sigma_w, q_l, e2, d2, jnp.stack(c_pp, -2), jnp.stack(c_dd, -2), activation=act)


def _tables(act, s, n_grid, n_cheb, e_one, d_one, groups: int = 4, split: bool | None = None):
    """Chebyshev coefficients of E[phi phi] and E[phi' phi'] at scale s (vmapped over s).

    tanh, where the plain rule's grid exceeds :data:`PLAIN_GRID_MAX`, splits into a
    closed-form erf part and a localized remainder whose integrals take a fixed number of
    nodes at any scale (:mod:`.smoothed`, ``quadrature.N_LOCAL``; the plain 2-D rule's nodes
    grow like s^2, and are the cheaper rule below that size). ``split=True``/``False``
    forces one rule (tests).

    The nodes are split into ``groups`` contiguous theta ranges; each gets its own static
    v-grid size, proportional to the largest b = sin(theta/2) in it (the v spacing only
    has to resolve the scale s b). The rho = 1 node takes the 1-D values ``e_one`` and
    ``d_one`` so that p_M(1) = q_M holds to rounding (rho = 1 stays exactly invariant).
    """
    phi, dphi = activations.get(act), activations.derivative(act)
    odd = act in ODD
    m = (n_cheb + 1) // 2 if odd else n_cheb
    theta_all = np.pi * np.arange(m) / (n_cheb - 1)
    if split is None:
        split = act in smoothed.SPLIT and n_grid > PLAIN_GRID_MAX
    if split:
        rest = smoothed.tanh_rest
        theta_nodes = jnp.asarray(theta_all)
        n_loc = quadrature.N_LOCAL

        def node(s_, t):
            rr, dd_ = quadrature.expect_2d(((rest, rest), (dphi, dphi)), s_, t, n_loc, n_loc, parity=True, local=True)
            r = jnp.cos(t)
            (cross,) = quadrature.expect_2d_conditional(((rest, smoothed.erf_given),), s_, r, n_loc, local=True)
            return smoothed.erf_pair(s_ * s_, r) + 2.0 * cross + rr, dd_

        plan = None
    else:
        bounds = np.linspace(0, m, groups + 1).astype(int)
        n_min = quadrature.grid_size(0.0)
        plan = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if hi > lo:
                b_max = math.sin(0.5 * theta_all[hi - 1])
                n_v = min(n_grid, max(n_min, int(math.ceil(b_max * n_grid)) + 1))
                plan.append((jnp.asarray(theta_all[lo:hi]), n_v))

    def one(s_, e_one_, d_one_):
        if plan is None:
            pp, dd = jax.vmap(lambda t: node(s_, t))(theta_nodes)
        else:
            pp, dd = [], []
            for theta, n_v in plan:
                node2 = lambda t, n_v=n_v: quadrature.expect_2d(
                    ((phi, phi), (dphi, dphi)), s_, t, n_grid, n_v, parity=odd
                )
                a, b = jax.lax.map(node2, theta)
                pp.append(a)
                dd.append(b)
            pp, dd = jnp.concatenate(pp), jnp.concatenate(dd)
        pp, dd = pp.at[0].set(e_one_), dd.at[0].set(d_one_)
        if odd:  # E[phi phi](-rho) = -E[phi phi](rho); phi' is even
            pp = jnp.concatenate([pp, -pp[-2::-1]])
            dd = jnp.concatenate([dd, dd[-2::-1]])
        return _dct1(pp), _dct1(dd)

    s = jnp.asarray(s)
    if s.ndim == 0:
        return one(s, e_one, d_one)
    return jax.lax.map(lambda args: one(*args), (s, e_one, d_one))


def _dct1(values):
    """Chebyshev coefficients from values at rho_j = cos(pi j / (K-1)), j = 0..K-1."""
    k = values.shape[-1]
    n = k - 1
    j = np.arange(k)
    mat = np.cos(np.pi * np.outer(j, j) / n) * (2.0 / n)
    mat[:, 0] *= 0.5
    mat[:, -1] *= 0.5
    mat[0] *= 0.5
    mat[-1] *= 0.5
    return values @ jnp.asarray(mat.T, values.dtype)


def clenshaw(coef, x, unroll=8):
    """sum_k coef[k] T_k(x) (Clenshaw recurrence; coef along the last axis). A scan traced
    once and unrolled ``unroll`` steps per iteration: a Python loop traced 4 K operations per
    call, the largest tracing cost of a sweep under vmap (same operations, same result)."""

    def step(carry, c):
        b1, b2 = carry
        return (2.0 * x * b1 - b2 + c, b1), None

    coef = jnp.moveaxis(coef, -1, 0)
    (b1, b2), _ = jax.lax.scan(step, (jnp.zeros_like(x), jnp.zeros_like(x)), coef[1:][::-1], unroll=unroll)
    return x * b1 - b2 + coef[0]


# ---- per-layer pair expectations ----------------------------------------------------------


def _pair(kern: MLPKernel, layer: int, rho):
    """(E[phi phi], E[phi' phi']) at hidden layer ``layer`` and correlation rho."""
    act = kern.activation
    s2 = kern.q_layers[..., layer]
    rho = jnp.clip(rho, -1.0, 1.0)
    if act == "gelu":
        return smoothed.gelu_pair(s2, rho)
    if act == "erf":
        den = 1.0 + 2.0 * s2
        return (
            (2 / math.pi) * jnp.arcsin(2 * s2 * rho / den),
            (4 / math.pi) / jnp.sqrt(den * den - 4 * s2 * s2 * rho * rho),
        )
    if act == "relu":
        theta = jnp.arccos(rho)
        return s2 / 2 * arccos_j1(rho), (math.pi - theta) / (2 * math.pi)
    if act == "linear":
        return s2 * rho, jnp.ones_like(rho)
    return clenshaw(kern.c_pp[..., layer, :], rho), clenshaw(kern.c_dd[..., layer, :], rho)


@jax.custom_jvp
def arccos_j1(rho):
    """(sin theta + (pi - theta) rho) / pi, theta = arccos rho (the degree-1 arc-cosine kernel
    of relu). Its derivative is (pi - theta) / pi, finite on [-1, 1]; written out because the
    chain through arccos is inf * 0 = NaN at rho = 1 (relu, mlp_layers >= 2 under autodiff)."""
    theta = jnp.arccos(rho)
    return (jnp.sqrt(jnp.maximum(1.0 - rho * rho, 0.0)) + (math.pi - theta) * rho) / math.pi


@arccos_j1.defjvp
def arccos_j1_jvp(primals, tangents):
    (rho,), (drho,) = primals, tangents
    return arccos_j1(rho), (math.pi - jnp.arccos(rho)) / math.pi * drho


def _chain(sigma_w, q_layers, e_dd):
    """d p_M / d rho = prod_l sigma_w^2 q_l E[phi'phi']_l / prod_{l>=2} q_l."""
    k = q_layers.shape[-1]
    out = sigma_w**2 * q_layers[..., 0] * e_dd[..., 0]
    for layer in range(1, k):
        out = out * sigma_w**2 * e_dd[..., layer]
    return out


def _forward_layers(kern: MLPKernel, rho):
    """Correlations rho_l entering each hidden layer, the output p_M, and the E' values."""
    k = kern.layers
    sw2 = kern.sigma_w**2
    e_dd = []
    for layer in range(k):
        e_pp, e_d = _pair(kern, layer, rho)
        e_dd.append(e_d)
        p = sw2 * e_pp
        if layer + 1 < k:
            rho = p / kern.q_layers[..., layer + 1]
    return p, jnp.stack(e_dd, -1)


def d_m(kern: MLPKernel, rho):
    """D(rho) = d p_M / d rho (for one hidden layer sigma_w^4 E[phi'(h) phi'(h')])."""
    _, e_dd = _forward_layers(kern, rho)
    return _chain(kern.sigma_w, kern.q_layers, e_dd)


@jax.custom_jvp
def p_m(kern: MLPKernel, rho):
    """p_M(rho) = sigma_w^2 E[phi(h_k) phi(h_k')]; its rho-derivative is :func:`d_m`."""
    return _forward_layers(kern, rho)[0]


@p_m.defjvp
def _p_m_jvp(primals, tangents):
    kern, rho = primals
    dkern, drho = tangents
    out, d_kern = jax.jvp(lambda k_: _forward_layers(k_, rho)[0], (kern,), (dkern,))
    return out, d_kern + d_m(kern, rho) * drho
