"""``phasefield exponents``, ``phasefield trajectory`` and ``phasefield sweep`` (the theory; the sweep
command itself is :mod:`phasefield.cli.sweep`)."""
from __future__ import annotations

import click

from .common import UsageError, echo_json, option, point_hparams, point_options

Q0_MAX = 1e6  # input squared norm per component (trajectory)

ACTIVATION_HELP = "tanh, erf, relu, gelu or linear"


def _point_options(f):
    for o in reversed(_static_options()):
        f = o(f)
    return point_options()(f)


def _static_options():
    return [
        click.option("--activation", default="tanh", show_default=True, help=ACTIVATION_HELP),
        click.option("--mlp-layers", type=int, default=1, show_default=True, help="[1, 16]"),
        click.option("--residual", default="unit-norm", show_default=True, help="unit-norm or identity"),
        click.option("--attention", default="paper", show_default=True, help="paper or exact"),
        click.option("--softmax-correction", is_flag=True,
                     help="add the softmax-derivative path to the backward map (λ_g^∞)"),
    ]


def _hp(mlp_layers, **kw):
    option("--mlp-layers", mlp_layers, 1, 16, integer=True)
    return point_hparams(mlp_layers=int(mlp_layers), **kw)


def _sign_word(x, pos, neg, zero="edge"):
    return pos if x > 0 else neg if x < 0 else zero


def exponents_result(hp, kw=None) -> dict:
    """The ``phasefield exponents`` record of one point (plain Python numbers).

    ``phase`` is "<angle>/<gradient>": angle chaotic (lambda_a > 0), ordered (< 0) or, where
    lambda_a = 0 exactly, decided by :func:`phasefield.layers.paper.angle_growth` (identity
    residual: the power law of 1 - rho; alpha = 0: the block is the identity, "edge");
    gradient exploding (lambda_g > 0), vanishing (< 0) or edge (= 0).
    ``attractors``: every stable cosine, ascending (1 = the collapsed point);
    ``bistable``: more than one; ``rho_star``: the one reached from ``rho_0``.
    ``lambda_g_collapse``: lambda_g(L) from the collapsed fixed point; ``lambda_g`` is the
    same number under its earlier name (kept for the records and scripts that read it; not
    the ``lambda_g_input`` of ``phasefield block exponents``, which starts from (q0, rho0))."""
    import numpy as np

    from ..layers import paper
    from ..layers.paper import fixed_points
    from ..theory import mlp

    kern = mlp.kernel(hp)
    out = paper.exponents(hp, kern)
    res = {k: float(out[k]) for k in ("lambda_a", "lambda_g", "lambda_g_inf", "q_star", "q_z_star",
                                       "rho_star", "rho_star_min", "rho_star_max")}
    stable = np.asarray(paper.attractors(hp, kern), float)
    res["attractors"] = sorted(float(r) for r in stable[np.isfinite(stable)])
    res["n_stable"] = int(out["n_stable"])
    res["bistable"] = res["n_stable"] > 1
    res["rho_0"] = float(fixed_points.RHO0)
    growth = float(paper.angle_growth(hp, kern))
    res["angle_growth"] = growth
    kw = kw or {}
    res.update({k: kw[k] for k in ("sigma_w", "sigma_a", "n_tokens", "depth") if k in kw},
               alpha_a=float(hp.alpha_a), alpha_m=float(hp.alpha_m), residual=hp.residual)
    la = res["lambda_a"]
    if la == 0 and (float(hp.alpha_a) > 0 or float(hp.alpha_m) > 0):
        angle = _sign_word(growth, "chaotic", "ordered")
    else:
        angle = _sign_word(la, "chaotic", "ordered")
    res["phase"] = angle + "/" + _sign_word(res["lambda_g"], "exploding", "vanishing")
    res["lambda_g_collapse"] = res["lambda_g"]
    return res


def _note(res):
    if res["residual"] == "identity":
        return ", identity residual: 1 - rho changes as a power of depth, not exponentially"
    if res["alpha_a"] == 0 and res["alpha_m"] == 0:
        return ", alpha = 0: every block is the identity"
    if res["lambda_a"] == float("-inf"):
        return ", alpha_A = 1: 1 - rho shrinks faster than exponentially"
    return ""


def _json_number(v):
    """±inf -> "inf"/"-inf" (a true value JSON numbers cannot hold); NaN stays (-> null)."""
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v


def register(cli):
    @cli.command("exponents")
    @_point_options
    @click.option("--json", "as_json", is_flag=True,
                  help="print one JSON object (RFC 8259: ±inf as the strings \"inf\"/\"-inf\", NaN as null)")
    def exponents(as_json, **kw):
        """λ_a, λ_g (depth L, input at the collapsed fixed point), λ_g^∞, q*, ρ* at one point,
        and every stable fixed point (more than one: bistable)."""
        hp = _hp(**kw)
        res = exponents_result(hp, kw)
        if as_json:
            echo_json({k: _json_number(v) for k, v in res.items()})
            return
        angle = res["phase"].split("/")[0]
        click.echo(f"lambda_a     = {res['lambda_a']:+.6f}   ({angle}{_note(res)})")
        click.echo(f"lambda_g     = {res['lambda_g']:+.6f}   (L = {hp.depth}, from the collapsed point)")
        click.echo(f"lambda_g_inf = {res['lambda_g_inf']:+.6f}   (at rho_star)")
        click.echo(f"q_star       = {res['q_star']:.6g}")
        click.echo(f"rho_star     = {res['rho_star']:.6g}   (the attractor reached from rho_0 = {res['rho_0']:g})")
        att = ", ".join(f"{r:.6g}" for r in res["attractors"]) or "none found"
        n = res["n_stable"]
        click.echo(f"attractors   = {att}   ({n} stable fixed point{'' if n == 1 else 's'}"
                   f"{': BISTABLE, rho_star depends on the input geometry' if res['bistable'] else ''})")

    @cli.command("trajectory")
    @_point_options
    @click.option("--q0", type=float, default=1.0, show_default=True, help="input squared norm per component")
    @click.option("--rho0", type=float, default=None, help="input cosine (or give --p0)")
    @click.option("--p0", type=float, default=None, help="input dot product per component")
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    def trajectory(q0, rho0, p0, as_json, **kw):
        """q and p per layer of the mean-field map from input (q0, p0 = rho0 q0)."""
        hp = _hp(**kw)
        option("--q0", q0, 0.0, Q0_MAX, lo_open=True)
        option("--rho0", rho0, -1.0, 1.0)
        option("--p0", p0, -Q0_MAX, Q0_MAX)
        if rho0 is not None and p0 is not None:
            raise UsageError("give either --rho0 or --p0, not both")
        if p0 is None:
            rho0 = 0.3 if rho0 is None else rho0
            p0 = rho0 * q0
        n = hp.n_tokens
        if not (-q0 / (n - 1) - 1e-12 <= p0 <= q0):
            raise UsageError(f"input cosine must lie in [-1/(n-1), 1] (got {p0 / q0:g})")
        import numpy as np

        from ..layers import paper

        q, p = (np.asarray(v, float) for v in paper.trajectory(hp, q0, p0, int(hp.depth)))
        res = dict(layer=list(range(len(q))), q=q.tolist(), p=p.tolist(), rho=(p / q).tolist())
        if as_json:
            echo_json(res)
            return
        click.echo(f"{'layer':>5} {'q':>12} {'p':>12} {'rho':>9}")
        for i, (a, b) in enumerate(zip(q, p)):
            click.echo(f"{i:5d} {a:12.6g} {b:12.6g} {b / a:9.5f}")

    from .sweep import sweep_command
    cli.add_command(sweep_command, "sweep")   # every block (phasefield.cli.sweep)
