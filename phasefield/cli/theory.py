"""``phasefield exponents``, ``phasefield trajectory`` and ``phasefield sweep`` (the theory; the sweep
command itself is :mod:`phasefield.cli.sweep`)."""

from __future__ import annotations

import click

from .common import (
    MLP_LAYERS_MAX,
    PAPER_OPTIONS,
    UsageError,
    check,
    echo_json,
    option,
    paper_option,
    point_hparams,
    point_options,
)

Q0_MAX = 1e6  # input squared norm per component (trajectory)
# the default input of the point commands: a decoder preset's embeddings at init
# (phasefield.layers.presets.GPT2_INPUT, LLAMA_INPUT; tests/test_decoders.py holds them to it),
# else q0 = 1 and the flag's own rho0
GEOMETRY_HELP = "gpt2: 8e-4 and 0, llama: 4e-4 and 0 (their embeddings at init); else"


def _point_options(f):
    for o in reversed(_static_options()):
        f = o(f)
    return point_options()(f)


def _static_options():
    return [
        paper_option(k, help=f"[1, {MLP_LAYERS_MAX}]") if k == "mlp_layers" else paper_option(k) for k in PAPER_OPTIONS
    ]


def _hp(mlp_layers, **kw):
    option("--mlp-layers", mlp_layers, hi=MLP_LAYERS_MAX, integer=True)  # its lower end: HParams.validate
    return point_hparams(mlp_layers=int(mlp_layers), **kw)


def _sign_word(x, pos, neg, zero="edge"):
    return pos if x > 0 else neg if x < 0 else zero


def exponents_result(hp, kw=None) -> dict:
    """The ``phasefield exponents`` record of one point (plain Python numbers).

    ``phase`` is "<angle>/<gradient>": angle chaotic (lambda_a > 0), ordered (< 0) or, where
    lambda_a = 0 exactly, decided by :func:`phasefield.layers.paper.angle_growth` (identity
    residual: the power law of 1 - rho; alpha = 0: the block is the identity, "edge");
    gradient exploding (lambda_g_collapse > 0), vanishing (< 0) or edge (= 0).
    ``attractors``: every stable cosine, ascending (1 = the collapsed point);
    ``bistable``: more than one; ``rho_star``: the one reached from ``rho_0``.
    ``lambda_g_collapse``: lambda_g(L) from the collapsed fixed point."""
    import numpy as np

    from ..layers import registry
    from ..theory import mlp

    paper = registry.lookup("paper").engine.namespace  # the paper block's closed-form engine

    kern = mlp.kernel(hp)
    out = paper.exponents(hp, kern)
    res = {
        k: float(out[k])
        for k in (
            "lambda_a",
            "lambda_g_collapse",
            "lambda_g_inf",
            "q_star",
            "q_z_star",
            "rho_star",
            "rho_star_min",
            "rho_star_max",
        )
    }
    stable = np.asarray(paper.attractors(hp, kern), float)
    res["attractors"] = sorted(float(r) for r in stable[np.isfinite(stable)])
    res["n_stable"] = int(out["n_stable"])
    res["bistable"] = res["n_stable"] > 1
    res["rho_0"] = float(paper.fixed_points.RHO0)
    growth = float(paper.angle_growth(hp, kern))
    res["angle_growth"] = growth
    kw = kw or {}
    res.update(
        {k: kw[k] for k in ("sigma_w", "sigma_a", "n_tokens", "depth") if k in kw},
        alpha_a=float(hp.alpha_a),
        alpha_m=float(hp.alpha_m),
        residual=hp.residual,
    )
    la = res["lambda_a"]
    if la == 0 and (float(hp.alpha_a) > 0 or float(hp.alpha_m) > 0):
        angle = _sign_word(growth, "chaotic", "ordered")
    else:
        angle = _sign_word(la, "chaotic", "ordered")
    res["phase"] = angle + "/" + _sign_word(res["lambda_g_collapse"], "exploding", "vanishing")
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


def _geometry(hp_n, q0, rho0, name=None, fixed=None):
    """(q0, rho0) of the finite-depth rates, checked: each the flag's where given, else the
    preset's input geometry (gpt2, llama: :meth:`phasefield.layers.registry.Preset.geometry`),
    else 1 and 0.5."""
    from ..layers import point

    option("--q0", q0, 0.0, Q0_MAX, lo_open=True)
    q0, rho0 = point.geometry(name, fixed or {}, q0, rho0)
    option("--rho0", rho0, -1.0 / (hp_n - 1), 1.0)
    return q0, rho0


def _record_keys(fixed):
    """A block's keywords in a point command's record: its own ``depth`` (the stack it is
    built for: gpt2's, deepscalelm's) as ``block_depth``, beside the record's ``depth``."""
    return {("block_" + k if k in ("depth", "n_tokens") else k): v for k, v in fixed.items()}


def block_exponents_result(name, fixed, n_tokens, depth, q0=1.0, rho0=0.5) -> dict:
    """The ``phasefield exponents --block NAME`` record of a standard block (plain numbers):
    the finite-depth rates from (q0, rho0) and, where the block has a finite collapsed fixed
    point, the exponents. ``lambda_g_input``: lambda_g(L) from (q0, rho0);
    ``lambda_g_collapse``: from collapsed tokens of norm q0; ``angle_rate``: the angle rate
    of nearby tokens; ``lambda_a``: the angle exponent at the fixed point (NaN without one)."""
    import numpy as np

    from .. import layers
    from ..layers import spec

    r = layers.rates(spec.build(name, fixed), q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
    res = dict(
        block=name,
        **_record_keys(fixed),
        n_tokens=n_tokens,
        depth=depth,
        q0=q0,
        rho0=rho0,
        lambda_g_input=float(r["lambda_g_input"]),
        lambda_g_collapse=float(r["lambda_g_collapse"]),
        **{
            k: float(r[k])
            for k in ("angle_rate", "lambda_a", "lambda_g_inf", "q_star", "rho_star", "rho_star_min", "rho_star_max")
        },
        n_stable=int(r["n_stable"]),
        rho_L=float(r["rho"][-1]),
        q_L=float(r["q"][-1]),
        q=[float(v) for v in np.asarray(r["q"])],
        rho=[float(v) for v in np.asarray(r["rho"])],
    )
    fixed_pt = res["has_fixed_point"] = bool(r["has_fixed_point"])
    res["phase"] = (
        _sign_word(res["lambda_a"] if fixed_pt else res["angle_rate"], "chaotic", "ordered")
        + "/"
        + _sign_word(res["lambda_g_input"], "exploding", "vanishing")
    )
    return res


def _print_block(res):
    L, name = res["depth"], res["block"]
    kw = {k: v for k, v in res.items() if k not in _BLOCK_KEYS}
    click.echo(f"block             = {name} {', '.join(f'{k}={v}' for k, v in kw.items())}")
    click.echo(f"angle_rate        = {res['angle_rate']:+.6f}   ((1/L) log[(1-rho_L)/(1-rho_0)], rho_0 -> 1, L = {L})")
    click.echo(
        f"lambda_g_input    = {res['lambda_g_input']:+.6f}   (L = {L}, from q0 = {res['q0']:g}, rho0 = {res['rho0']:g})"
    )
    click.echo(
        f"lambda_g_collapse = {res['lambda_g_collapse']:+.6f}   (L = {L}, from collapsed tokens, q0 = {res['q0']:g})"
    )
    click.echo(f"rho_L, q_L        = {res['rho_L']:.6g}, {res['q_L']:.6g}")
    if res["has_fixed_point"]:
        click.echo(
            f"lambda_a          = {res['lambda_a']:+.6f}   (exponent at the collapsed fixed point, "
            f"q* = {res['q_star']:.6g})"
        )
        click.echo(f"lambda_g_inf      = {res['lambda_g_inf']:+.6f}   (at rho_star = {res['rho_star']:.6g})")
        if res["n_stable"] > 1:
            click.echo(
                f"attractors        = {res['n_stable']} stable cosines in [{res['rho_star_min']:.6g}, "
                f"{res['rho_star_max']:.6g}] (multistable: the start geometry picks one)"
            )
    else:
        click.echo(
            "no finite fixed point (the norm grows with depth): the rates above are finite-depth rates, not exponents"
        )
    click.echo(f"phase             = {res['phase']}")


_BLOCK_KEYS = {
    "block",
    "n_tokens",
    "depth",
    "q0",
    "rho0",
    "lambda_g_input",
    "lambda_g_collapse",
    "angle_rate",
    "lambda_a",
    "lambda_g_inf",
    "q_star",
    "rho_star",
    "rho_star_min",
    "rho_star_max",
    "n_stable",
    "rho_L",
    "q_L",
    "q",
    "rho",
    "has_fixed_point",
    "phase",
}


def _paper_kw(fixed, kw):
    """The point options ``kw`` with the paper block's numbers of ``--block paper:...`` folded in."""
    kw = dict(kw)
    for k, v in fixed.items():
        if k in ("alpha_a", "alpha_m"):
            kw["alpha"] = None
        kw[k] = v
    return kw


def _block_point(block_spec, kw):
    """(name, fixed, preset) of a point command's block; the paper flags fold into the paper
    block."""
    from ..layers import registry
    from .blockopt import paper_flags, resolve

    name, fixed, _ = resolve(block_spec, (), paper_flags(kw), causal=True)
    return name, fixed, registry.lookup(name)


def _point_size(name, fixed, preset, kw):
    """``(fixed, n, L, hp)`` of a point command's block: the paper block's numbers checked
    into ``hp`` (its flags folded in) and ``n``, ``L`` from them, else from --n-tokens and
    --depth (``hp`` None). A causal paper block takes the layers' road: ``hp`` None and its
    numbers spelled out in ``fixed``."""
    if not preset.fast_engine:
        n, L = _std_size(kw["n_tokens"], kw["depth"])
        return _stack_depth(name, fixed, L), n, L, None
    hp = _hp(**_paper_kw({k: v for k, v in fixed.items() if k != "causal"}, kw))
    if fixed.get("causal"):
        return dict(_hp_fixed(hp), causal=True), int(hp.n_tokens), int(hp.depth), None
    return fixed, int(hp.n_tokens), int(hp.depth), hp


def _stack_depth(name, fixed, depth):
    """``fixed`` with the block's stack-depth option (gpt2's, deepscalelm's ``depth``) set
    to --depth unless the block gives it."""
    from ..layers import point

    return check(point.with_stack_depth, name, fixed, depth)


def _std_size(n_tokens, depth):
    option("--n-tokens", n_tokens, 2, 1_000_000, integer=True)
    option("--depth", depth, 1, 10_000, integer=True)
    return int(n_tokens), int(depth)


def causal_exponents_result(name, fixed, n_tokens, depth, q0=1.0, rho0=0.5) -> dict:
    """The ``phasefield exponents --block NAME:causal=true`` record (plain numbers): the
    per-position results of :func:`phasefield.layers.causal_rates` from (q0, rho0), lists
    over the positions; ``phase`` from the last token's rates."""
    import numpy as np

    from .. import layers
    from ..layers import spec

    r = layers.rates(spec.build(name, fixed), q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
    res = dict(block=name, **_record_keys(fixed), n_tokens=n_tokens, depth=depth, q0=q0, rho0=rho0)
    res.update({k: float(r[k]) for k in ("angle_rate_last", "lambda_g_last")})
    res.update({k: [float(v) for v in np.asarray(r[k])] for k in ("q_L_pos", "rho_L_pos")})
    res["phase"] = (
        _sign_word(res["angle_rate_last"], "chaotic", "ordered")
        + "/"
        + _sign_word(res["lambda_g_last"], "exploding", "vanishing")
    )
    return res


def _print_causal(res):
    L, name = res["depth"], res["block"]
    kw = {k: v for k, v in res.items() if k not in _BLOCK_KEYS | _CAUSAL_KEYS}
    click.echo(f"block           = {name} {', '.join(f'{k}={v}' for k, v in kw.items())}")
    click.echo(f"angle_rate_last = {res['angle_rate_last']:+.6f}   (the last token's angle rate, L = {L})")
    click.echo(
        f"lambda_g_last   = {res['lambda_g_last']:+.6f}   (the last token, L = {L}, from q0 = {res['q0']:g}, "
        f"rho0 = {res['rho0']:g})"
    )
    click.echo(f"phase           = {res['phase']}   (the last token's rates)")
    click.echo(f"{'position':>8} {'q_L_pos':>12} {'rho_L_pos':>10}   (rho: mean cosine with the earlier tokens)")
    for i, (q, rho) in enumerate(zip(res["q_L_pos"], res["rho_L_pos"])):
        click.echo(f"{i:8d} {q:12.6g} {rho:10.6f}")


_CAUSAL_KEYS = {"q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last"}


def run_exponents(block_spec, q0, rho0, as_json, kw):
    """``phasefield exponents`` and its alias ``phasefield block exponents`` (one code path)."""
    name, fixed, preset = _block_point(block_spec, kw)
    if fixed.get("causal"):  # per position, on the layers' road (the paper block too)
        fixed, n, L, _ = _point_size(name, fixed, preset, kw)
        q0, rho0 = _geometry(n, q0, rho0, name, fixed)
        res = causal_exponents_result(name, fixed, n, L, q0, rho0)
        echo_json(res) if as_json else _print_causal(res)
        return
    if not preset.fast_engine:
        fixed, n, L, _ = _point_size(name, fixed, preset, kw)
        q0, rho0 = _geometry(n, q0, rho0, name, fixed)
        res = block_exponents_result(name, fixed, n, L, q0, rho0)
        if as_json:
            echo_json(res)
        else:
            _print_block(res)
        return
    kw = _paper_kw(fixed, kw)
    hp = _hp(**kw)
    res = exponents_result(hp, kw)
    if q0 is not None or rho0 is not None:  # the paper block's finite-depth rates from (q0, rho0)
        q0, rho0 = _geometry(int(hp.n_tokens), q0, rho0)
        fd = block_exponents_result(name, _hp_fixed(hp), int(hp.n_tokens), int(hp.depth), q0, rho0)
        res.update({k: fd[k] for k in ("q0", "rho0", "lambda_g_input", "angle_rate", "rho_L", "q_L")})
    if as_json:
        echo_json({k: _json_number(v) for k, v in res.items()})
        return
    angle = res["phase"].split("/")[0]
    click.echo(f"lambda_a          = {res['lambda_a']:+.6f}   ({angle}{_note(res)})")
    click.echo(f"lambda_g_collapse = {res['lambda_g_collapse']:+.6f}   (L = {hp.depth}, from the collapsed point)")
    if "lambda_g_input" in res:
        click.echo(
            f"lambda_g_input    = {res['lambda_g_input']:+.6f}   (L = {hp.depth}, from q0 = {res['q0']:g}, "
            f"rho0 = {res['rho0']:g})"
        )
        click.echo(f"angle_rate        = {res['angle_rate']:+.6f}   (nearby tokens, from q0)")
        click.echo(f"rho_L, q_L        = {res['rho_L']:.6g}, {res['q_L']:.6g}")
    click.echo(f"lambda_g_inf      = {res['lambda_g_inf']:+.6f}   (at rho_star)")
    click.echo(f"q_star            = {res['q_star']:.6g}")
    click.echo(f"rho_star          = {res['rho_star']:.6g}   (the attractor reached from rho_0 = {res['rho_0']:g})")
    att = ", ".join(f"{r:.6g}" for r in res["attractors"]) or "none found"
    n = res["n_stable"]
    click.echo(
        f"attractors        = {att}   ({n} stable fixed point{'' if n == 1 else 's'}"
        f"{': BISTABLE, rho_star depends on the input geometry' if res['bistable'] else ''})"
    )


def _hp_fixed(hp):
    return dict(
        sigma_w=float(hp.sigma_w),
        sigma_a=float(hp.sigma_a),
        sigma_v=float(hp.sigma_v),
        alpha_a=float(hp.alpha_a),
        alpha_m=float(hp.alpha_m),
        activation=hp.activation,
        mlp_layers=int(hp.mlp_layers),
        residual=hp.residual,
        attention=hp.attention,
        softmax_correction=bool(hp.softmax_correction),
    )


def exponents_options(f):
    """The options of ``phasefield exponents`` (shared by its alias ``block exponents``)."""
    from .blockopt import POINT_BLOCK_HELP, block_option

    f = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help='print one JSON object (RFC 8259: ±inf as the strings "inf"/"-inf", NaN as null)',
    )(f)
    f = click.option(
        "--rho0",
        type=float,
        default=None,
        help=f"input token cosine of the finite-depth rates [{GEOMETRY_HELP} 0.5] (the paper block: adds them)",
    )(f)
    f = click.option("--q0", type=float, default=None, help=f"input squared norm per component [{GEOMETRY_HELP} 1]")(f)
    f = _point_options(f)
    return block_option(help=POINT_BLOCK_HELP)(f)


EXPONENTS_HELP = """λ_a, λ_g and the attractors of a block at one point.

    The paper block (default; --sigma-w, --alpha ... are its numbers): λ_a, λ_g(L) from the
    collapsed fixed point (lambda_g_collapse), λ_g^∞, q*, ρ* and every stable
    fixed point (more than one: bistable); --q0/--rho0 add its finite-depth rates. Another block
    (--block pre-ln:sigma=0.55,alpha=0.2): lambda_g_input (from q0, rho0), lambda_g_collapse
    (from collapsed tokens), angle_rate, rho_L, q_L and, where it has a finite fixed point,
    lambda_a and λ_g^∞. A causal block (--block pre-ln:causal=true; every preset takes
    causal=true but dyt; gpt2 and llama are causal unless given causal=false): per position,
    q_L_pos and rho_L_pos (each token's mean cosine with the earlier ones) and the last
    token's angle_rate_last and lambda_g_last. Without --q0/--rho0 the input is the block's
    own (gpt2, llama: their embeddings at init), else q0 = 1, rho0 = 0.5; a block built for a
    stack's depth (gpt2, deepscalelm) takes --depth unless given its own."""


def register(cli):
    @cli.command("exponents", help=EXPONENTS_HELP)
    @exponents_options
    def exponents_cmd(block_spec, q0, rho0, as_json, **kw):
        run_exponents(block_spec, q0, rho0, as_json, kw)

    @cli.command("trajectory")
    @block_option_lazy()
    @_point_options
    @click.option("--q0", type=float, default=None, help=f"input squared norm per component [{GEOMETRY_HELP} 1]")
    @click.option("--rho0", type=float, default=None, help=f"input cosine (or give --p0) [{GEOMETRY_HELP} 0.3]")
    @click.option("--p0", type=float, default=None, help="input dot product per component")
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    def trajectory_cmd(block_spec, q0, rho0, p0, as_json, **kw):
        """q and p per layer of the mean-field map of a block (default: the paper's) from input
        (q0, p0 = rho0 q0). A causal block (--block NAME:causal=true; gpt2 and llama unless
        given causal=false): q_pos and rho_pos per layer and position (rho: mean cosine with
        the earlier tokens). Without --q0/--rho0 the input is the block's own (gpt2, llama:
        their embeddings at init), else q0 = 1, rho0 = 0.3."""
        from ..layers import point

        name, fixed, preset = _block_point(block_spec, kw)
        fixed, n, L, hp = _point_size(name, fixed, preset, kw)
        option("--q0", q0, 0.0, Q0_MAX, lo_open=True)
        option("--rho0", rho0, -1.0, 1.0)
        option("--p0", p0, -Q0_MAX, Q0_MAX)
        if rho0 is not None and p0 is not None:
            raise UsageError("give either --rho0 or --p0, not both")
        own = preset.geometry(fixed)
        q0 = (own[0] if own is not None else point.Q0) if q0 is None else q0
        if p0 is None:
            rho0 = (own[1] if own is not None else 0.3) if rho0 is None else rho0
            p0 = rho0 * q0
        if not (-q0 / (n - 1) - 1e-12 <= p0 <= q0):
            raise UsageError(f"input cosine must lie in [-1/(n-1), 1] (got {p0 / q0:g})")
        if fixed.get("causal"):
            return _causal_trajectory(name, fixed, q0, p0 / q0, n, L, as_json)
        import numpy as np

        if hp is not None:
            q, p = (np.asarray(v, float) for v in preset.engine.trajectory(hp, q0, p0, L))
        else:
            from .. import layers
            from ..layers import spec

            q, p = (
                np.asarray(v, float)
                for v in layers.trajectory(spec.build(name, fixed), q0=q0, rho0=p0 / q0, n_tokens=n, depth=L)
            )
        res = dict(q0=q0, rho0=p0 / q0, layer=list(range(len(q))), q=q.tolist(), p=p.tolist(), rho=(p / q).tolist())
        if not preset.fast_engine:
            res = dict(block=name, **fixed, **res)
        if as_json:
            echo_json(res)
            return
        click.echo(f"{'layer':>5} {'q':>12} {'p':>12} {'rho':>9}")
        for i, (a, b) in enumerate(zip(q, p)):
            click.echo(f"{i:5d} {a:12.6g} {b:12.6g} {b / a:9.5f}")

    from .sweep import sweep_command

    cli.add_command(sweep_command, "sweep")  # every block (phasefield.cli.sweep)


def block_option_lazy():
    from .blockopt import POINT_BLOCK_HELP, block_option

    return block_option(help=POINT_BLOCK_HELP)


def _causal_trajectory(name, fixed, q0, rho0, n, depth, as_json):
    """The trajectory of a causal block: per layer and position (:func:`phasefield.layers.trajectory`)."""
    import numpy as np

    from .. import layers
    from ..layers import spec

    r = layers.trajectory(spec.build(name, fixed), q0=q0, rho0=rho0, n_tokens=n, depth=depth)
    q, rho = np.asarray(r["q_pos"], float), np.asarray(r["rho_pos"], float)
    res = dict(block=name, **fixed, q0=q0, rho0=rho0, layer=list(range(len(q))), q_pos=q.tolist(), rho_pos=rho.tolist())
    if as_json:
        echo_json(res)
        return
    click.echo(
        f"{'layer':>5} {'position':>8} {'q_pos':>12} {'rho_pos':>10}   (rho: mean cosine with the earlier tokens)"
    )
    for i in range(len(q)):
        for j in range(q.shape[1]):
            click.echo(f"{i:5d} {j:8d} {q[i, j]:12.6g} {rho[i, j]:10.6f}")
