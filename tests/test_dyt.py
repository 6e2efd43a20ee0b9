"""DyT (phasefield/layers/dyt.py) and the ``dyt`` preset: its Gaussian integrals against a
dense reference, its backward map against autodiff of its forward map (Price's theorem),
the MLP at any input norm against the unit-norm MLP tables, the preset's spec and
compilation, and the block's theory against its own finite-width network."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import layers
from phasefield.layers import Context, Kernel, dyt, spec
from phasefield.layers.sweep import leaf_layers
from phasefield.simulate import compare, measure
from phasefield.theory import quadrature

pytestmark = pytest.mark.usefixtures("float64")

SCALES = (0.05, 0.5, 1.0, 3.0, 10.0)
RHOS = (-1.0, -0.999, -0.5, 0.0, 0.3, 0.9, 0.999, 0.999999, 1.0)


def _sech2(x):
    return 1.0 / np.cosh(np.minimum(np.abs(x), 300.0)) ** 2


def test_tanh_integrals_against_a_dense_reference():
    """E[tanh tanh] and E[tanh' tanh'] within 1e-14 of a dense NumPy trapezoid (spacing half
    the library reference's) from s = 0.05 to 10, rho = -1 .. 1, evaluated with the scale
    traced (one vmapped program over every point)."""
    s, r = (np.array(v, float).ravel() for v in np.meshgrid(SCALES, RHOS, indexing="ij"))
    k, j = jax.jit(jax.vmap(dyt.tanh_pair))(jnp.asarray(s), jnp.asarray(r))
    for i in range(s.size):
        ref_k = quadrature.reference_2d(np.tanh, np.tanh, s[i], r[i], c=0.1)
        ref_j = quadrature.reference_2d(_sech2, _sech2, s[i], r[i], c=0.1)
        assert abs(float(k[i]) - ref_k) <= 1e-14, (s[i], r[i], float(k[i]), ref_k)
        assert abs(float(j[i]) - ref_j) <= 1e-14, (s[i], r[i], float(j[i]), ref_j)


@jax.jit
def _price(s, rho):
    """(dK/ds, dK/drho) by the custom JVP, J, and K at rho +- h and s +- h (h = 1e-5): one
    program for every (s, rho)."""
    f = lambda s_, r_: dyt.tanh_pair(s_, r_)[0]
    h = 1e-5
    return (*jax.jacfwd(f, argnums=(0, 1))(s, rho), dyt.tanh_pair(s, rho)[1]), (
        f(s, rho + h) - f(s, rho - h),
        f(s + h, rho) - f(s - h, rho),
    )


@pytest.mark.parametrize("s,rho", [(0.7, -0.3), (1.0, 0.5), (3.0, 0.9), (10.0, 0.99)])
def test_price_theorem_and_scale_derivative(s, rho):
    """The custom JVP: dK/drho = s^2 J (Price) and dK/ds through the rule, both against
    central differences."""
    (ds, dr, j), (diff_r, diff_s) = _price(jnp.asarray(s), jnp.asarray(rho))
    h = 1e-5
    assert float(dr) == pytest.approx(s * s * float(j), rel=1e-13)
    assert float(dr) == pytest.approx(float(diff_r) / (2 * h), rel=1e-7)
    assert float(ds) == pytest.approx(float(diff_s) / (2 * h), rel=1e-7)


@jax.jit
def _backward_and_slopes(lay, q, ctx):
    """Per rho in (0.4, -0.2, 1): the backward map's diagonal factor (Grad(1, 0)) and
    off-diagonal one (Grad(-1, 1)) at (q, rho q), autodiff of the forward map's p' in p there,
    and p' at p = q and q - 1e-6 q (one program per layer structure, every q)."""
    fwd_p = lambda p: lay.forward(Kernel(q, p), ctx).p
    out = []
    for rho in (0.4, -0.2, 1.0):
        k = Kernel(q, rho * q)
        g = lay.backward(k, layers.Grad(1.0, 0.0), ctx)  # diag 1, off 0
        g_off = lay.backward(k, layers.Grad(-1.0, 1.0), ctx)  # diag 0, off 1
        out.append((g.diag, g_off.b, jax.grad(fwd_p)(rho * q)))
    return out, (fwd_p(q), fwd_p(q - 1e-6 * q))


@pytest.mark.parametrize(
    "lay",
    [
        dyt.DyT(a=0.5),
        dyt.DyT(a=2.0, gamma=1.3),
        dyt.AnyNormMLP(sigma_w=1.1, sigma_out=2.2, activation="gelu"),
        dyt.AnyNormMLP(sigma_w=0.9, activation="tanh"),
    ],
    ids=["dyt", "dyt-a2-gamma", "mlp-gelu", "mlp-tanh"],
)
@pytest.mark.parametrize("q", [0.3, 1.0, 4.0])
def test_backward_is_the_derivative_of_the_forward_map(lay, q):
    """An elementwise map under gradient independence: the off-diagonal factor of the
    backward map is d p'/d p at p = rho q, the diagonal one its value at p = q (autodiff of
    the forward map; at p = q through the custom JVP / the slope-1 clip), and the collapsed
    point's derivative equals the one-sided difference."""
    per_rho, (at_q, below_q) = _backward_and_slopes(lay, jnp.asarray(q), Context(8.0))
    for rho, (diag, off, slope) in zip((0.4, -0.2, 1.0), per_rho):
        slope = float(slope)
        assert float(off) == pytest.approx(slope, rel=1e-12), rho
        if rho == 1.0:
            assert float(diag) == pytest.approx(slope, rel=1e-12)
            assert slope == pytest.approx(float(at_q - below_q) / (1e-6 * q), rel=1e-4)


@pytest.mark.parametrize("act", ["gelu", "tanh"])
def test_any_norm_mlp_equals_the_mlp_tables_at_unit_norm(act):
    """At q = 1 the MLP at any norm gives the unit-norm MLP layer's numbers: gelu's closed
    form to rounding; tanh's Chebyshev tables to their accuracy (their local rule's spacing
    is 1.5x this one's: ~1e-10 on E[tanh'^2] near s = 1)."""
    ctx = Context(8.0)
    ref = layers.MLP(sigma_w=1.3, activation=act, sigma_out=2.0, mult=4.0).prepare(ctx)
    new = dyt.AnyNormMLP(sigma_w=1.3, sigma_out=2.0, activation=act)

    def both(rho):  # (the unit-norm layer's, the any-norm layer's) (q, p, a, b) at (1, rho)
        k, g = Kernel(1.0, rho), layers.Grad(0.7, 0.3)
        outs = [(lay.forward(k, ctx), lay.backward(k, g, ctx)) for lay in (ref, new)]
        return [jnp.stack([f.q, f.p, b.a, b.b]) for f, b in outs]

    # every cosine in one compiled program (not op by op)
    want, got = jax.jit(jax.vmap(both))(jnp.array([-0.3, 0.2, 0.8, 1.0]))
    assert want.shape == (4, 4) and np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=1e-12 if act == "gelu" else 1e-9)


def test_module_parameters_and_lazy_map():
    """The trainable module has DyT's parameters (alpha scalar at a, weight at gamma, bias
    zero, per channel) and at init computes the map the simulator's lazy module does."""
    lay = dyt.DyT(a=0.7, gamma=1.5)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8), jnp.float32)
    y, params = lay.module("dense").init_with_output(jax.random.PRNGKey(1), x)
    p = params["params"]
    assert float(p["alpha"]) == pytest.approx(0.7) and p["alpha"].shape == ()
    np.testing.assert_array_equal(p["weight"], np.full(8, 1.5, np.float32))
    np.testing.assert_array_equal(p["bias"], np.zeros(8, np.float32))
    lazy = lay.module("lazy").apply({}, x)
    np.testing.assert_allclose(y, lazy, rtol=1e-6)
    np.testing.assert_allclose(y, 1.5 * np.tanh(0.7 * np.asarray(x)), rtol=1e-6)


@pytest.mark.parametrize(
    "text,msg",
    [
        ("dyt:a=0", "a = 0 is outside (0, 100]"),
        ("dyt:activation=silu", "no MLP map at every input norm"),
    ],
)
def test_spec_refuses_in_one_line(text, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        spec.parse(text)


@jax.jit  # one program per block structure (both points below), not one per point
def _block_forward(b, k, ctx):
    return b.forward(k, ctx)


@pytest.mark.parametrize("sigma,alpha", [(1.2956521739130435, 0.7108695652173913), (0.7, 0.3)])
def test_angle_multipliers_equal_finite_differences(sigma, alpha):
    """Each layer's transverse multiplier along the collapsed trajectory (autodiff through the
    pair rule's custom JVP and the clipped cosine, where rounding may put rho just above 1)
    against a one-sided difference of the block's forward map (gap 1e-6 q: error ~1e-6).
    At the sizes of the other DyT points here (8 tokens, depth 3, 4 heads): one compiled
    rates program."""
    block = spec.build("dyt", dict(sigma=sigma, alpha=alpha, heads=4))
    r = layers.rates(block, n_tokens=8, depth=3)
    b, ctx = layers.prepare(block, 8)
    for q, m in zip(np.asarray(r["q_collapsed"])[:-1], np.asarray(r["angle_multipliers"])):
        k = _block_forward(b, Kernel(q, q - 1e-6 * q), ctx)
        assert float(m) == pytest.approx(float(k.q - k.p) / (1e-6 * q), rel=1e-5), q


@pytest.mark.parametrize("act", ["gelu", "tanh", "erf", "relu"])
def test_the_cosine_clip_keeps_its_slope_just_above_one(act):
    """Rounding may put a block's cosine a few ulp above 1 at the collapsed geometry (the
    compiler decides): the MLP at any norm then gives rho = 1's value with rho = 1's slope,
    not a slope of 0 (which read one layer's angle multiplier as 1 at 9 of 576 points of a
    24 x 24 dyt sweep)."""
    lay = dyt.AnyNormMLP(sigma_w=1.4, sigma_out=2.8, activation=act)
    ctx = Context(16.0)
    f = lambda p: lay.forward(Kernel(1.0, p), ctx).p
    f, df = jax.jit(f), jax.jit(jax.grad(f))  # one program each, not one per operation
    above = float(np.nextafter(1.0, 2.0))
    assert float(f(above)) == float(f(1.0))
    assert float(df(above)) == pytest.approx(float(df(1.0)), rel=1e-12)
    assert float(df(1.0)) > 0


def test_spec_and_new_points_compile_nothing():
    """``dyt:...`` parses with DyT's number ``a``; the block's rates at new (sigma, alpha, a)
    run the first point's compiled program (zero compilations)."""
    name, kw = spec.parse("dyt:sigma=0.6,alpha=0.3,a=0.8,heads=4")
    assert name == "dyt" and kw == dict(sigma=0.6, alpha=0.3, a=0.8, heads=4)
    assert kw.keys() <= set(spec.NUMBERS["dyt"]) | set(spec.OPTIONS["dyt"])
    events = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    rng = np.random.default_rng(0)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        counts = []
        for _ in range(4):
            s, al, a = (float(v) for v in (rng.uniform(0.3, 1.5), rng.uniform(0.1, 1.0), rng.uniform(0.1, 2.0)))
            before = len(events)
            out = layers.rates(spec.build("dyt", dict(kw, sigma=s, alpha=al, a=a)), n_tokens=8, depth=3)
            counts.append(len(events) - before)
            assert np.isfinite(out["lambda_g_input"]) and np.isfinite(out["angle_rate"]) and not out["has_fixed_point"]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert counts[1:] == [0, 0, 0], counts


# two points: DyT's default alpha0 and a = 1 with the MLP branch at alpha = 1 (DyT's scale
# s = a sqrt(q) from 0.5 to 1.4 along the stack); width 1024, 32 draws: the O(1/d) bias of
# q_L and rho_L (~3/d at these points) is below one se
SIM = dict(n_tokens=8, depth=3, width=1024, draws=32, seed=0)
POINTS = ["dyt:sigma=1,alpha=0.5,heads=4", "dyt:sigma=0.8,alpha=1,a=1,heads=4"]


def _theory_and_network(text):
    """(theory, simulation) of a point at the sizes of SIM: the theory from ``layers.rates``
    (the compiled program of the tests above, the numbers of ``compare.theory``), the
    network's measurement given the theory's q* (inf: no collapsed fixed point)."""
    r = layers.rates(spec.build(*spec.parse(text)), n_tokens=SIM["n_tokens"], depth=SIM["depth"])
    th = {q: float(r[q]) for q in (*measure.QUANTITIES, "q_star")}
    return th, measure.rates(text, q_star=th["q_star"], **SIM)


@pytest.mark.parametrize("text", POINTS)
def test_theory_against_its_own_network(text):
    """q_L, rho_L, the angle rate and lambda_g (from the input and from collapsed tokens)
    of the block simulator within 3 standard errors of the theory."""
    th, sim = _theory_and_network(text)
    z = compare.z_scores(sim, th)
    print(
        text,
        {
            q: (round(th[q], 5), round(sim[q], 5), round(sim[q + "_se"], 5), round(z[q], 2))
            for q in measure.QUANTITIES
            if np.isfinite(th[q])
        },
    )
    assert np.isnan(th["lambda_a"]) and np.isnan(sim["lambda_a"])  # identity residual: no q*
    for q in ("q_L", "rho_L", "angle_rate", "lambda_g_input", "lambda_g_collapse"):
        assert sim[q + "_se"] > 0 and abs(z[q]) <= 3.0, (text, q, th[q], sim[q], sim[q + "_se"], z[q])


# the softmax-derivative path (on by default): two points at larger logits, where the path
# moves lambda_g from the input by several standard errors of this simulation (the network
# at the sizes of SIM, so both tests run one compiled network: its finite-width bias of
# lambda_g is below 0.1 se at d 1024 with 128 draws, docs/blocks.md)
POINTS_LOGITS = ["dyt:sigma=1.5,alpha=1,heads=4", "dyt:sigma=1.4,alpha=0.7,a=1,heads=4"]


@pytest.mark.slow
@pytest.mark.parametrize("text", POINTS_LOGITS)
def test_the_softmax_path_against_the_network_at_larger_logits(text):
    """With the path (the default, integrated at the point's logit scale sigma_A q) every
    quantity within 3 se of the block simulator; without it lambda_g from the input is
    outside that tolerance (the check can tell the two maps apart)."""
    block = spec.build(*spec.parse(text))
    att = [x for x in leaf_layers(block) if x.logit_scale() is not None]
    assert att and all(x.softmax_correction and x.any_norm for x in att)
    th, sim = _theory_and_network(text)
    z = compare.z_scores(sim, th)
    for q in ("q_L", "rho_L", "angle_rate", "lambda_g_input", "lambda_g_collapse"):
        assert sim[q + "_se"] > 0 and abs(z[q]) <= 3.0, (text, q, th[q], sim[q], sim[q + "_se"], z[q])
    off = layers.finite_depth(
        spec.build(*spec.parse(text + ",softmax_correction=false")), n_tokens=SIM["n_tokens"], depth=SIM["depth"]
    )
    assert abs(compare.z_scores(sim, {"lambda_g_input": float(off["lambda_g_input"])})["lambda_g_input"]) > 3.0
