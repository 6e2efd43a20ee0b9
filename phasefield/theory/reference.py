"""A slow, independent route to the exponents (NumPy + SciPy, one point at a time).

No tables, no Chebyshev series, no JAX: every MLP expectation is a dense trapezoid
integral (:func:`quadrature.reference_2d`, finer than the tables), the simplex fixed
point is found by ``scipy.optimize.brentq`` and the finite-depth gradient exponent by an
explicit loop. Tests and ``scripts/bench_theory.py`` hold the fast engine to it.
Supports ``mlp_layers = 1`` and the paper attention map.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq

from .. import activations
from . import quadrature


class ReferencePoint:
    def __init__(
        self,
        sigma_w,
        sigma_a,
        alpha_a,
        alpha_m,
        n_tokens=32,
        depth=16,
        sigma_v=1.0,
        activation="tanh",
        residual="unit-norm",
    ):
        self.sw, self.sa, self.sv = float(sigma_w), float(sigma_a), float(sigma_v)
        self.n, self.depth = float(n_tokens), int(depth)
        self.aa2, self.am2 = float(alpha_a) ** 2, float(alpha_m) ** 2
        if residual == "identity":
            self.ba2 = self.bm2 = 1.0
        else:
            self.ba2, self.bm2 = 1.0 - self.aa2, 1.0 - self.am2
        np_phi = {"tanh": np.tanh, "linear": lambda x: x, "relu": lambda x: np.maximum(x, 0.0)}
        np_dphi = {
            "tanh": lambda x: 1.0 - np.tanh(x) ** 2,
            "linear": np.ones_like,
            "relu": lambda x: (x > 0).astype(float),
        }
        if activation in np_phi:
            self.phi, self.dphi = np_phi[activation], np_dphi[activation]
        else:  # any other name: the package's jax function, evaluated on numpy arrays
            f, g = activations.get(activation), activations.derivative(activation)
            self.phi = lambda x: np.asarray(f(x))
            self.dphi = lambda x: np.asarray(g(x))
        s = self.sw
        self.q_m = s * s * quadrature.reference_1d(lambda x: self.phi(x) ** 2, s)
        self.d_one = s**4 * quadrature.reference_1d(lambda x: self.dphi(x) ** 2, s)

    # -- maps -------------------------------------------------------------------------
    def p_m(self, rho):
        return self.sw**2 * quadrature.reference_2d(self.phi, self.phi, self.sw, rho)

    def d_m(self, rho):
        return self.sw**4 * quadrature.reference_2d(self.dphi, self.dphi, self.sw, rho)

    def attention(self, rho):
        s2, n, sv2 = self.sa**2, self.n, self.sv**2
        e1 = (n - 1) * math.exp(s2 * (rho - 1))  # paper Eq. 10, as written
        er = (n - 1) * math.exp(s2 * rho * (rho - 1))
        return sv2 * (1 + rho * e1) / (1 + e1), sv2 * (1 + rho * er) / (1 + er)

    def block(self, q, p):
        q_a, p_a = self.attention(p / q)
        q_z, p_z = self.ba2 * q + self.aa2 * q_a, self.ba2 * p + self.aa2 * p_a
        return (self.bm2 * q_z + self.am2 * self.q_m, self.bm2 * p_z + self.am2 * self.p_m(p_z / q_z), q_z, p_z)

    # -- fixed points and exponents -------------------------------------------------
    def q_star(self):
        return (self.bm2 * self.aa2 * self.sv**2 + self.am2 * self.q_m) / (1 - self.ba2 * self.bm2)

    def lambda_a(self):
        qz = self.ba2 * self.q_star() + self.aa2 * self.sv**2
        return math.log(self.ba2 * (self.bm2 + self.am2 * self.d_one / qz))

    def mean_mode(self):
        q = self.q_star()
        qz = self.ba2 * q + self.aa2 * self.sv**2
        return (self.ba2 + self.aa2 * self.sv**2 / q) * (self.bm2 + self.am2 * self.d_one / qz)

    def _norm_at(self, rho):
        q_a, _ = self.attention(rho)
        return (self.bm2 * self.aa2 * q_a + self.am2 * self.q_m) / (1 - self.ba2 * self.bm2)

    def rho_star(self):
        if self.lambda_a() <= 0:
            return 1.0
        g = lambda r: self.block(self._norm_at(r), r * self._norm_at(r))[1] / self._norm_at(r) - r
        lo = -1.0 / (self.n - 1)
        hi = 1.0 - 1e-9
        while g(hi) > 0 and hi > lo:  # lambda_a tiny: root very close to 1
            hi = 1.0 - 10 * (1.0 - hi)
        return brentq(g, lo, hi, xtol=1e-15, rtol=1e-15)

    def backward(self, q, rho, q_z, rho_z, a, b):
        c_d = self.bm2 + self.am2 * self.d_one / q_z
        c_o = self.bm2 + self.am2 * self.d_m(rho_z) / q_z
        diag, off = c_d * (a + b), c_o * b
        a, b = diag - off, off
        n, s2 = self.n, self.sa**2
        w1 = 1 / (1 + math.exp(-(s2 * (rho - 1) + math.log(n - 1))))
        wr = 1 / (1 + math.exp(-(s2 * rho * (rho - 1) + math.log(n - 1))))
        sc = self.sv**2 / q
        da = sc * (a * (1 - w1) + b * ((1 - w1) + (n - 1) * (1 - wr)))
        oa = sc * (a * w1 / (n - 1) + b * (w1 / (n - 1) + wr))
        diag = self.ba2 * (a + b) + self.aa2 * da
        off = self.ba2 * b + self.aa2 * oa
        return diag - off, off

    def lambda_g(self, q0=None, p0=None, depth=None):
        """Finite depth, by explicit forward and backward loops."""
        depth = self.depth if depth is None else int(depth)
        q, p = (self.q_star(), self.q_star()) if q0 is None else (q0, p0)
        states = []
        for _ in range(depth):
            q1, p1, q_z, p_z = self.block(q, p)
            states.append((q, p / q, q_z, p_z / q_z))
            q, p = q1, p1
        a, b, log_total = 1.0, 0.0, 0.0
        for st in reversed(states):
            a, b = self.backward(*st, a, b)
            s = a + b
            a, b, log_total = a / s, b / s, log_total + math.log(s)
        return log_total / depth

    def lambda_g_inf(self):
        rho = self.rho_star()
        if rho >= 1.0:
            q = self.q_star()
            q_z, rho_z = self.ba2 * q + self.aa2 * self.sv**2, 1.0
        else:
            q = self._norm_at(rho)
            _, _, q_z, p_z = self.block(q, rho * q)
            rho_z = p_z / q_z
        m = np.array([self.backward(q, rho, q_z, rho_z, 1.0, 0.0), self.backward(q, rho, q_z, rho_z, 0.0, 1.0)]).T
        return float(np.log(np.max(np.real(np.linalg.eigvals(m)))))

    def exponents(self) -> dict:
        return dict(
            lambda_a=self.lambda_a(),
            lambda_g_collapse=self.lambda_g(),
            lambda_g_inf=self.lambda_g_inf(),
            q_star=self.q_star(),
            rho_star=self.rho_star(),
        )


# ---- closed forms at the collapsed point (an independent check of the simulator) ------------

_Z = np.linspace(-12.0, 12.0, 200001)  # dense standard-normal trapezoid rule
_W = np.exp(-0.5 * _Z**2)
_W /= _W.sum()


def closed_form_exponents(hp, depth: int = 16):
    """(q*, lambda_a, lambda_g(depth)) at the collapsed point for tanh, one hidden layer
    (docs/theory.md §6-7), from concrete ``hp`` fields:
    e^{lambda_a} = beta_A^2 m, mean mode (beta_A^2 + alpha_A^2 sigma_V^2/q*) m, with
    m = beta_M^2 + alpha_M^2 sigma_w^2 chi_1 / q_z*; G = I seeds the mean mode with 1/n."""
    sw, aa, am, sv = (float(getattr(hp, k)) for k in ("sigma_w", "alpha_a", "alpha_m", "sigma_v"))
    qm = sw**2 * np.sum(_W * np.tanh(sw * _Z) ** 2)
    chi1 = sw**2 * np.sum(_W * (1 - np.tanh(sw * _Z) ** 2) ** 2)
    ba2, bm2 = 1 - aa**2, 1 - am**2
    q_star = (bm2 * aa**2 * sv**2 + am**2 * qm) / (1 - ba2 * bm2)
    q_z = ba2 * q_star + aa**2 * sv**2
    m = bm2 + am**2 * sw**2 * chi1 / q_z
    e_a, e_mean = ba2 * m, (ba2 + aa**2 * sv**2 / q_star) * m
    n = int(hp.n_tokens)
    lam_g = np.log((n - 1) / n * e_a**depth + e_mean**depth / n) / depth
    return q_star, float(np.log(e_a)), float(lam_g)
