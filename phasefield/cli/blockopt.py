"""One spelling of a block on every command: ``--block SPEC`` (a preset, ``NAME:key=value,...``
or a JSON file, parsed by :func:`phasefield.layers.spec.parse`), the paper flags
(``--sigma-w``, ``--alpha``, ``--alpha-a`` ...) as spellings of the paper block's numbers, and
grid axes ``--axis NAME=start:stop:count`` (or ``NAME=a,b,c``) over the block's numbers.

    @block_option(axes=True)          # adds --block (default paper) and --axis
    def cmd(block_spec, axis_texts, **kw):
        name, fixed, axes = resolve(block_spec, axis_texts, paper_flags(kw))

A paper flag given with another block, a number given twice (in ``--block`` and by its flag
or an ``--axis``), an axis the block has no number for, or a causal block
(``NAME:causal=true``, whose results are per position) given to a command other than the point
commands, ``sweep`` and ``figures --block``: one line (:class:`UsageError`).
"""

from __future__ import annotations

import click

from ..grid import untie
from .common import PAPER_NUMBERS, PAPER_OPTIONS, UsageError, check, parse_range

# The registry's presets (phasefield.layers.registry.names(), in its order) and the standard
# blocks `recommend --block` searches (phasefield.layers.recommend.BLOCKS), written out because
# --help answers without importing JAX, which filling the registry does;
# tests/test_cli_start.py checks both against the library.
PRESETS = ("paper", "pre-ln", "post-ln", "rms-swiglu", "deepscalelm", "dyt", "gpt2", "llama")
RECOMMEND_BLOCKS = ("pre-ln", "post-ln", "rms-swiglu", "dyt")
PRESET_LIST = ", ".join(PRESETS)

BLOCK_HELP = (
    f"the block: a preset ({PRESET_LIST}), NAME:key=value,... "
    '(e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file {"block": NAME, ...}'
)
# the point commands take every preset's option causal=true (per-position results)
POINT_BLOCK_HELP = (
    BLOCK_HELP + "; NAME:causal=true masks its attention (results per position; gpt2 and llama are causal "
    "unless given causal=false)"
)
CAUSAL_COMMANDS = "`phasefield exponents`, `trajectory`, `sweep`, `figures --block` and `simulate exponents`"
AXIS_HELP = "NAME=start:stop:count or NAME=a,b,c: an axis over a number of the block (repeat it)"

# the paper flags (click parameter names) -> the paper block's numbers they set (``alpha``:
# both branch weights), from the one list of them (:data:`.common.PAPER_NUMBERS`, ``PAPER_OPTIONS``)
PAPER_FLAGS = {k: tuple(untie({k: None})) for k in (*PAPER_NUMBERS, *PAPER_OPTIONS)}


def block_option(default: str | None = "paper", axes: bool = False, help: str = BLOCK_HELP):
    """Decorator: ``--block`` (parameter ``block_spec``) and, with ``axes``, ``--axis``
    (parameter ``axis_texts``, repeatable)."""
    opts = [click.option("--block", "block_spec", default=default, show_default=default is not None, help=help)]
    if axes:
        opts.append(click.option("--axis", "axis_texts", multiple=True, metavar="NAME=RANGE", help=AXIS_HELP))

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


def given(*names) -> list:
    """Those of the current command's parameters ``names`` set on the command line (not left
    at their defaults). Outside a click command: none."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    src = click.core.ParameterSource
    return [n for n in names if ctx.get_parameter_source(n) not in (None, src.DEFAULT, src.DEFAULT_MAP)]


def paper_flags(kw: dict) -> dict:
    """The paper flags of a command's parameters ``kw`` that were given on the command line."""
    return {k: kw[k] for k in given(*[k for k in PAPER_FLAGS if k in kw])}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_axes(texts, allowed=None) -> dict:
    """``{name: values}`` from ``NAME=range`` texts (``-`` in a name reads as ``_``)."""
    out = {}
    for text in texts or ():
        key, eq, rng = str(text).partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise UsageError(f"--axis expects NAME=start:stop:count or NAME=a,b,c, got {text!r}")
        if key in out:
            raise UsageError(f"--axis {key} given twice")
        if allowed is not None and key not in allowed:
            raise UsageError(f"--axis {key}: not a number of the block; it has {', '.join(allowed)}")
        out[key] = parse_range(rng, f"axis {key}")
    return out


def refuse_causal(name: str, kw: dict) -> None:
    """UsageError for a causal block (``NAME:causal=true``): a command that computes the
    (q, p) numbers or simulates without per-position measurements cannot take it (the point
    commands, ``sweep`` and ``figures --block`` answer it per position)."""
    if kw.get("causal"):
        from ..layers import registry

        own = f" ({name} is causal unless spelled {name}:causal=false)" if registry.lookup(name).causal_default else ""
        raise UsageError(
            f"block {name}: causal=true gives per-position results, which {CAUSAL_COMMANDS} compute; "
            f"this command takes no causal block{own}"
        )


def resolve(
    spec_text: str, axis_texts=(), flags: dict | None = None, extra_axes=(), grid: bool = False, causal: bool = False
) -> tuple[str, dict, dict]:
    """``(name, fixed, axes)`` of a command's block: ``fixed`` the block's checked keywords
    (the paper flags in ``flags`` folded in as the paper block's numbers, unchecked: the
    command checks them with its flags' messages), ``axes`` name ->
    values (numbers of the block, or one of ``extra_axes`` such as ``depth``); ``grid``: the
    command takes ``--axis`` (its messages say so); ``causal``: the command takes a causal
    block (:func:`refuse_causal` otherwise)."""
    from ..layers import registry, spec

    name, kw = check(spec.parse, spec_text)
    if not causal:
        refuse_causal(name, kw)
    flags = dict(flags or {})
    if flags and registry.lookup(name).numbers_class is None:  # the flags set a numbers_class's fields
        f = next(iter(flags))
        numbers = ", ".join(spec.NUMBERS[name])
        raise UsageError(
            f"block {name} has no number for {flag(f)} (a number of the paper block); it takes "
            f"{numbers}: give them as --block {name}:KEY=VALUE" + (" or --axis KEY=RANGE" if grid else "")
        )
    if "alpha" in flags and ("alpha_a" in flags or "alpha_m" in flags):
        raise UsageError("give --alpha (ties alpha_a = alpha_m) or --alpha-a/--alpha-m, not both")
    for f, v in flags.items():
        for number in PAPER_FLAGS[f]:
            if number in kw:
                raise UsageError(f"{number} given twice: in --block and as {flag(f)}")
            kw[number] = v
    # the flags' values are checked by the command (its messages name the flag), not here
    allowed = list(spec.NUMBERS[name]) + list(extra_axes)
    axes = parse_axes(axis_texts, allowed)
    both = sorted(set(axes) & set(kw))
    if both:
        raise UsageError(f"{', '.join(both)}: both in --block (or a flag) and an --axis")
    for key, values in axes.items():
        if key in spec.NUMBERS[name]:
            for v in (values.min(), values.max()):
                check(spec.check, name, dict(kw, **{key: float(v)}))
    return name, kw, axes
