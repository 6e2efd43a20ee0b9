"""``phasefield probe``: measure a model's blocks at initialization (angle and gradient
growth per block, phase, verdict), with the theory beside it for phasefield's presets.

    phasefield probe --block pre-ln:sigma=0.55,alpha=0.2 --width 256 --depth 8
    phasefield probe --preset pre-ln --set sigma=0.55 --set alpha=0.2 --width 256 --depth 8   (the same)
    phasefield probe --model phasefield.probing.hf:gpt2 --set std=0.02 --set scaled=true
    phasefield probe --model mypkg.models:make_model --json --figure probe.png
    phasefield probe --model my_models.py:make --as pre-ln:sigma=0.55,heads=12 --fix

``--as NAME[:k=v,...]`` declares a ``--model`` to be one of phasefield's presets (its theory
curves drawn beside; the fix's theory answer). A causal model (Hugging Face GPT-2, a preset
spelled ``NAME:causal=true``, ``gpt2``, ``llama``; ``--causal``/``--no-causal`` say it of any
model) is measured per position too and compared with the causal theory position by
position; its phase, bands and fix read the last token's rates. ``--fix`` searches init multipliers (all
weight matrices; the residual branches' output projections, found by name or by
``--fix-residual REGEX``; an attention's or the MLP's matrices alone) until the measured
rates meet the criteria (``--max-gradient-factor``, ``--max-angle-rate``, as ``recommend
--block``), then re-measures the fixed model with fresh seeds, and the init recipes of
``--recipes`` (DeepNorm, T-Fixup, GPT-2, depth-muP, CompleteP, ReZero, a smaller std)
beside it (:mod:`phasefield.probing.fix`, :mod:`phasefield.probing.recipes`).

``--model module:factory`` (or ``path/to/file.py:factory``) names a function returning a
:class:`phasefield.probing.Model`; ``--set key=value`` (repeated) are its keyword arguments
(numbers, true/false or text), and ``--depth/--width/--n-tokens`` are passed to it when
given. ``--block NAME:k=v,...`` (the spelling of every command; ``--preset NAME --set k=v``
is its alias) is the factory :func:`phasefield.probing.models.preset` for that
phasefield block (its keywords: the preset's numbers, e.g. sigma, alpha, heads; for
``paper`` the HParams fields).
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import click

from .. import io
from .blockopt import PRESET_LIST
from .common import UsageError, atomic_path, check, echo_json, option, options, output

INITS_MAX = 10_000
SIZE_MAX = {"--depth": 1000, "--width": 65536, "--n-tokens": 4096}


def _value(text):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return io.loads_json(text, "the value")
    except ValueError:
        return text


def _settings(items):
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise UsageError(f"--set takes key=value (got {item!r})")
        out[key] = _value(val)
    return out


def _factory(spec):
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise UsageError(f"--model takes module:factory (got {spec!r})")
    try:
        if mod_name.endswith(".py"):
            if not os.path.isfile(mod_name):
                raise UsageError(f"--model: no file {mod_name}")
            loader_spec = importlib.util.spec_from_file_location("_phasefield_probe_model", mod_name)
            mod = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: one line
        raise UsageError(f"--model: cannot import {mod_name} ({type(exc).__name__}: {exc})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise UsageError(f"--model: {mod_name} has no factory {attr!r}")
    return fn


def _regex(text, flag):
    import re

    if text is None:
        return None
    if not text.strip():
        raise UsageError(f"{flag}: an empty regular expression")
    try:
        re.compile(text)
    except re.error as exc:
        raise UsageError(f"{flag}: {text!r} is not a regular expression ({exc})") from None
    return text


def _declared(as_spec):
    """(block, (name, numbers)) of ``--as NAME[:k=v,...]``."""
    from ..layers import spec

    name, numbers = check(spec.parse, as_spec)
    block = check(spec.build, name, dict(numbers))
    return block, (name, numbers)


def _model(model, preset, kw):
    from ..probing import Model

    if (model is None) == (preset is None):
        raise UsageError("give --model module:factory or --preset NAME (one of them)")
    if preset is not None:
        from ..layers import registry

        if preset not in registry.names():
            raise UsageError(f"--preset: unknown block {preset!r}; choose one of {', '.join(registry.names())}")
        from ..probing import models

        fn = models.preset
        p = registry.lookup(preset)
        if p.numbers_class is not None:  # its numbers are one object (the paper's HParams)
            hp_keys = [
                k
                for k in list(kw)
                if k not in ("depth", "width", "n_tokens", "batch", "weights", "q0", "rho0", "seed", "causal")
            ]
            try:
                # the network has the softmax-derivative path: so has the theory, unless told
                kw["hp"] = p.numbers_class(**{**p.network_defaults, **{k: kw.pop(k) for k in hp_keys}})
            except TypeError as exc:
                raise UsageError(f"--set: {exc}") from None
        kw = dict(kw, name=preset)
    else:
        fn = _factory(model)
    try:
        m = fn(**kw)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"the model factory refused its arguments: {' '.join(str(exc).split())}") from None
    if not isinstance(m, Model):
        raise UsageError(f"the factory must return a phasefield.probing.Model, not {type(m).__name__}")
    return m


def _recipes(text):
    """The recipe names of ``--recipes`` (``all``, ``none`` or a comma list)."""
    from ..probing.recipes import NAMES

    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return list(NAMES)
    if words == ["none"]:
        return []
    bad = [w for w in words if w not in NAMES]
    if bad or not words:
        raise UsageError(
            f"--recipes: unknown recipe {bad[0] if bad else text!r}; give all, none or names from {', '.join(NAMES)}"
        )
    return words


def _pair(a, names):
    """``angle = v +- se, gradient = v +- se`` of the two rates ``names`` in ``a``."""
    return ", ".join(f"{k} = {a[k]:+.4f} +- {a[k + '_se']:.4f}" for k in names)


def _rate(a, names=("angle_rate", "lambda_g_input")):
    if not a.get("finite", True):
        return a["reason"]
    return f"{_pair(a, names)}, distance {a['distance']:.3g}"


def _recipes_text(fx):
    lines = [f"  recipes, measured as the fix ({fx['after']['inits']} fresh inits, the same keys):"]
    for r in fx["recipes"]:
        if not r["applicable"]:
            lines.append(f"    {r['name']}: not applicable ({r['reason']})")
            continue
        verdict = "meets" if r["meets"] else "does not meet"
        lines.append(f"    {r['name']}: {verdict} the criteria; {_rate(r['after'], fx['rates'])}  [{r['text']}]")
    return lines


def _fix_text(fx, depth):
    m = fx["multipliers"]
    a, b = fx["after"], fx["before"]
    more = "".join(f", {k} matrices x {m[k]:.4g} more" for k in ("attention", "mlp") if m.get(k, 1.0) != 1.0)
    lines = [
        f"fix: weight matrices x {m['weights']:.4g}, residual output projections x {m['residual']:.4g} more{more} "
        f"(criteria: gradient factor within {fx['criteria']['max_gradient_factor']:g} over {depth} blocks, "
        f"|{fx['rates'][0]}| <= {fx['criteria']['max_angle_rate']:g}; {fx['search']['points']} points searched)",
        "  init std per parameter group (before -> after):",
    ]
    for g, v in fx["init_std"].items():
        lines.append(
            f"    {g}: {v['before']:.4g} -> {v['after']:.4g}"
            + (" (residual projection)" if v["residual_projection"] else "")
        )
    names = fx["rates"]
    lines.append(
        f"  as it is:  {_pair(b, names)} (gradient factor {b['gradient_factor']:.3g}, distance {b['distance']:.3g})"
    )
    lines.append(
        f"  fixed ({a['inits']} fresh inits, seed {a['seed']}): {_pair(a, names)} (gradient factor "
        f"{a['gradient_factor']:.3g} +- {a['gradient_factor_se']:.2g}, distance {a['distance']:.3g})"
    )
    lines.append(
        "  the criteria hold at the fixed init" if fx["meets"] else "  the criteria do NOT hold at the fixed init"
    )
    th = fx.get("theory")
    if th and th["recommend"] is None:  # a causal preset: no recommend --block answer
        now, at = th["theory_as_is"], th["theory_at_measured_fix"]
        lines.append(
            f"  causal theory ({th['block']}, last token): as it is angle_rate_last {now['angle_rate_last']:+.4f}, "
            f"lambda_g_last {now['lambda_g_last']:+.4f}"
            + (
                f"; at the measured fix (sigma {th['measured_fix']['sigma']:.4g}): {at['angle_rate_last']:+.4f}, "
                f"{at['lambda_g_last']:+.4f}, distance {at['distance']:.3g}"
                if at
                else ""
            )
            + " (recommend --block searches the acausal theory: no answer for a causal block)"
        )
    elif th and th["measured_fix"] is None:
        rc = th["recommend"]
        lines.append(
            f"  recommend --block (theory): sigma {rc['sigma']:.4g}, alpha_attn {rc['alpha_attn']:.4g}, alpha_mlp "
            f"{rc['alpha_mlp']:.4g}; the measured fix scales a group of its own (no {th['block']} numbers say it)"
        )
    elif th:
        mf, rc = th["measured_fix"], th["recommend"]
        lines.append(
            f"  as {th['block']} numbers: measured fix sigma {mf['sigma']:.4g}, alpha_attn {mf['alpha_attn']:.4g}, "
            f"alpha_mlp {mf['alpha_mlp']:.4g}; recommend --block (theory): sigma {rc['sigma']:.4g}, alpha_attn "
            f"{rc['alpha_attn']:.4g}, alpha_mlp {rc['alpha_mlp']:.4g} (log ratios "
            + ", ".join(f"{k} {v:+.2f}" for k, v in th["log_ratio"].items())
            + f"); the theory's distance at the measured fix: {th['theory_at_measured_fix']['distance']:.3g}"
        )
    if fx.get("recipes"):
        lines += _recipes_text(fx)
    return "\n".join(lines)


def _table(res):
    ds = res.ds
    diag = res.diagnosis()
    first = diag["first_failing_block"]
    gr = diag["grad_rate"]
    a_key, g_key = ("angle_last", "grad_last") if res.causal else ("angle", "grad")
    head = "angle(last)  |g_last|^2" if res.causal else "      angle    |J^T u|^2"
    lines = [f"block        q   rho(data)    rho(sym) {head}  log grad factor"]
    for b in ds["block"].values:
        ang = ds[a_key].values[b]
        g = ds[g_key].values[b] if g_key in ds else float("nan")
        r = gr[b] if gr is not None else float("nan")
        mark = "  <- first out of band" if first is not None and b == first["block"] else ""
        lines.append(
            f"{b:5d} {ds['q_data'].values[b]:10.4g} {ds['rho_data'].values[b]:10.4f} "
            f"{ds['rho_sym'].values[b]:10.4f} {ang:+11.4f} {g:12.4g} {r:+16.4f}{mark}"
        )
    lines.append(
        f"bands per block: |angle| <= {diag['angle_band']:g}, |log grad factor| <= {diag['gradient_band']:.4g} "
        f"(log {diag['max_gradient_factor']:g} / {res.depth})" + (" (the last token's)" if res.causal else "")
    )
    return "\n".join(lines)


def _positions_text(res):
    """A causal model's per-position table after the last block and the last token's rates,
    with the causal theory and z when there is one."""
    import numpy as np

    p = res.positions()
    th = res.causal_theory
    z = res.position_agreement() if th is not None else None
    lines = [
        "position  q_L_pos (+- se)        rho_L_pos (+- se)     (from the symmetric start)"
        + ("   theory q, rho   z q, rho" if th is not None else "")
    ]
    for i in range(len(p["q_L_pos"])):
        line = f"{i:>8}  {p['q_L_pos'][i]:10.4g} ({p['q_L_pos_se'][i]:.2g})   {p['rho_L_pos'][i]:+.4f} ({p['rho_L_pos_se'][i]:.2g})"
        if th is not None:
            zr = z["rho_L_pos"][i]
            line += f"   {th['q_L_pos'][i]:.4g}, {th['rho_L_pos'][i]:+.4f}   {z['q_L_pos'][i]:+.1f}, " + (
                f"{zr:+.1f}" if np.isfinite(zr) else "-"
            )
        lines.append(line)
    for k in ("angle_rate_last", "lambda_g_last"):
        line = f"{k:<16} = {p[k]:+.4f} +- {p[k + '_se']:.4f}"
        if th is not None:
            line += f"   theory {float(th[k]):+.4f}  z = {z[k]:+.1f}"
        lines.append(line)
    if z is not None:
        m = z["max_abs_z"]
        where = "" if m["position"] is None else f" at position {m['position']}"
        lines.append(f"largest |z| against the causal theory: {abs(m['value']):.2f} ({m['quantity']}{where})")
    return "\n".join(lines)


PROBE_OPTIONS = (
    click.option("--model", default=None, help="module:factory (or file.py:factory) returning a probe.Model"),
    click.option(
        "--block",
        "block_spec",
        default=None,
        help=f"a phasefield block and its numbers: NAME[:k=v,...] (a preset: {PRESET_LIST}) or a JSON "
        "file (as on every command; --preset NAME --set k=v is the same)",
    ),
    click.option("--preset", default=None, help=f"a phasefield block: {PRESET_LIST}"),
    click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="a keyword of the factory (repeat)"),
    click.option("--depth", type=int, default=None, help="blocks (passed to the factory)"),
    click.option("--width", type=int, default=None, help="d (passed to the factory)"),
    click.option("--n-tokens", type=int, default=None, help="tokens per sequence (passed to the factory)"),
    click.option("--inits", type=int, default=16, show_default=True, help="independent initializations"),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--eps", type=float, default=1e-3, show_default=True, help="1 - rho of the nearby tokens"),
    click.option("--chunk", type=int, default=1, show_default=True, help="initializations vmapped at once"),
    click.option("--no-gradient", is_flag=True, help="skip the vector-Jacobian products"),
    click.option(
        "--causal/--no-causal",
        default=None,
        help="the model is causal (per-position measurements, the last token's rates; default: as the model "
        "says: Hugging Face GPT-2, NAME:causal=true, gpt2, llama)",
    ),
    click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout"),
    click.option("--figure", default=None, help="per-block figure (PNG or PDF)"),
    click.option(
        "--as",
        "as_spec",
        default=None,
        metavar="NAME[:k=v,...]",
        help=f"declare a --model to be a phasefield preset ({PRESET_LIST}): theory curves, the fix's theory answer",
    ),
    click.option("--fix", "do_fix", is_flag=True, help="search and verify init multipliers that meet the criteria"),
    click.option("--max-gradient-factor", type=float, default=10.0, show_default=True, help="F of the criteria"),
    click.option("--max-angle-rate", type=float, default=0.05, show_default=True, help="r of the criteria"),
    click.option(
        "--fix-residual", default=None, metavar="REGEX", help="the residual output projections' parameter paths"
    ),
    click.option(
        "--fix-weights", default=None, metavar="REGEX", help="only these weight matrices (default: all but embeddings)"
    ),
    click.option("--fix-inits", type=int, default=2, show_default=True, help="initializations per searched point"),
    click.option("--verify-inits", type=int, default=16, show_default=True, help="fresh initializations of the check"),
    click.option(
        "--recipes",
        default="all",
        show_default=True,
        metavar="NAMES",
        help="init recipes measured beside the fix: all, none or a comma list of deepnorm, t-fixup, gpt2, "
        "depth-mup, completep, rezero, small-std",
    ),
    click.option(
        "--progress/--quiet",
        default=True,
        show_default=True,
        help="progress bar on stderr, in initializations measured",
    ),
)


def _check_run(o) -> dict:
    """The measurement's options checked (``o``: the command's parameters); the keywords of
    :func:`phasefield.probing.probe` they set, the model aside."""
    option("--inits", o["inits"], 2, INITS_MAX, integer=True)
    option("--seed", o["seed"], 0, 2**31 - 1, integer=True)
    option("--eps", o["eps"], 0.0, 0.5, lo_open=True, hi_open=True)
    option("--chunk", o["chunk"], 1, 1024, integer=True)
    option("--max-gradient-factor", o["max_gradient_factor"], 1.0, 1e300, lo_open=True)
    option("--max-angle-rate", o["max_angle_rate"], 0.0, 100.0, lo_open=True)
    option("--fix-inits", o["fix_inits"], 2, INITS_MAX, integer=True)
    option("--verify-inits", o["verify_inits"], 2, INITS_MAX, integer=True)
    fix_residual = _regex(o["fix_residual"], "--fix-residual")
    fix_weights = _regex(o["fix_weights"], "--fix-weights")
    from .blockopt import given

    recipes = _recipes(o["recipes"])
    unused = [
        n for n in given("fix_residual", "fix_weights", "fix_inits", "verify_inits", "recipes") if not o["do_fix"]
    ]
    if unused:
        raise UsageError(f"--{unused[0].replace('_', '-')} is an option of --fix (give --fix)")
    if o["no_gradient"] and o["do_fix"]:
        raise UsageError("--fix measures the gradient: drop --no-gradient")
    return dict(
        causal=o["causal"],
        inits=o["inits"],
        seed=o["seed"],
        eps=o["eps"],
        chunk=o["chunk"],
        gradient=not o["no_gradient"],
        max_factor=o["max_gradient_factor"],
        max_angle_rate=o["max_angle_rate"],
        fix=o["do_fix"],
        fix_options=dict(
            inits=o["fix_inits"],
            verify_inits=o["verify_inits"],
            residual=fix_residual,
            weights=fix_weights,
            recipes=recipes,
        ),
    )


def _factory_kw(model, block_spec, preset, settings, sizes, as_spec, causal=None):
    """(preset, the factory's keywords, the ``--as`` declaration or None) of the model options;
    ``causal`` (``--causal/--no-causal``) builds a ``--block``/``--preset`` masked or not."""
    declared = None
    if as_spec is not None:
        if model is None:
            raise UsageError("--as declares a --model to be a preset (a --block or --preset model is one already)")
        declared = _declared(as_spec)
    kw = _settings(settings)
    if block_spec is not None:
        if preset is not None or model is not None:
            raise UsageError("give one of --block, --preset or --model")
        from ..layers import spec

        preset, numbers = check(spec.parse, block_spec)
        both = sorted(set(numbers) & set(kw))
        if both:
            raise UsageError(f"{both[0]} given twice: in --block and by --set")
        import re

        if (
            causal is not None
            and re.search(r"(^|[:,{\s\"])causal\b", block_spec)
            and bool(numbers.get("causal")) != causal
        ):
            raise UsageError(f"--{'' if causal else 'no-'}causal contradicts --block {block_spec}")
        kw.update(numbers)
    if causal is not None and (preset is not None):
        if "causal" in kw and block_spec is None and bool(kw["causal"]) != causal:
            raise UsageError(f"--{'' if causal else 'no-'}causal contradicts --set causal={kw['causal']}")
        kw["causal"] = causal
    for flag, v in sizes.items():
        if v is not None:
            option(flag, v, 1 if flag == "--depth" else 2, SIZE_MAX[flag], integer=True)
            kw[flag[2:].replace("-", "_")] = int(v)
    return preset, kw, declared


def _measure(m, run_kw, progress):
    """:func:`phasefield.probing.probe` of the model ``m``, with a progress bar on stderr; the
    user's model failing is one line."""
    from .. import probing

    bar = None
    if progress:
        from tqdm import tqdm

        desc = "probe and fix" if run_kw["fix"] else "probe"
        bar = tqdm(total=None, desc=desc, unit="init", file=click.get_text_stream("stderr"), leave=False)

    def tick(done, total):
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        return probing.probe(m, progress=tick, **run_kw)
    except (ValueError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's model failed: one line
        if "RESOURCE_EXHAUSTED" in str(exc):
            raise
        raise UsageError(
            f"probing the model failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None
    finally:
        if bar is not None:
            bar.close()


def _print(res) -> None:
    click.echo(_table(res))
    if res.causal:
        click.echo(_positions_text(res))
    elif res.theory is not None:
        t = res.theory_rates()
        click.echo(f"theory: angle_rate = {t['angle_rate']:+.4f}, lambda_g_input = {t['lambda_g_input']:+.4f}")
    click.echo(res.verdict())
    if res.fix is not None:
        click.echo(_fix_text(res.fix, res.depth))


@click.command("probe")
@options(*PROBE_OPTIONS)
def probe_cmd(model, block_spec, preset, settings, depth, width, n_tokens, as_json, figure, as_spec, progress, **o):
    """Measure a model's blocks at initialization over independent inits: per-block q,
    rho, angle growth of nearby tokens and gradient growth, the phase and a verdict
    (docs/probe.md)."""
    run_kw = _check_run(o)
    sizes = {"--depth": depth, "--width": width, "--n-tokens": n_tokens}
    preset, kw, declared = _factory_kw(model, block_spec, preset, settings, sizes, as_spec, run_kw["causal"])
    if figure is not None:
        output(figure, "--figure", need_bytes=16 << 20)
    m = _model(model, preset, kw)
    if declared is not None:
        m.block, m.spec = declared
    res = _measure(m, run_kw, progress)
    if figure is not None:
        from ..figures.probe import probe_figure

        with atomic_path(figure) as tmp:
            probe_figure(res, tmp)
    if as_json:
        echo_json(res.to_dict())
    else:
        _print(res)


def register(cli):
    cli.add_command(probe_cmd)
