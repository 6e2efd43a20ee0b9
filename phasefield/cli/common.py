"""Shared CLI helpers: hyperparameter options, bad input as :class:`UsageError`, JSON output.

The logic lives in the library: axes, the branch-weight rule and the range checks in
:mod:`phasefield.grid`, atomic files in :mod:`phasefield.io` (``atomic_path`` is re-exported
here for the commands that write files).
"""

from __future__ import annotations

import click
import numpy as np

from .. import grid, io
from ..io import atomic_path, json_default  # noqa: F401  (re-exported for the commands)


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""


def parse_range(text: str, name: str = "value") -> np.ndarray:
    """:func:`phasefield.grid.parse_axis`, bad input as :class:`UsageError`."""
    try:
        return grid.parse_axis(text, name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check(fn, *args, **kw):
    """Call a library check (``grid.check_option``, ``io.check_output`` ...), its
    ``ValueError`` as :class:`UsageError`."""
    try:
        return fn(*args, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def option(name, value, lo=None, hi=None, **kw) -> None:
    """:func:`phasefield.grid.check_option` (``name`` is the flag, e.g. ``--width``)."""
    if value is not None:
        check(grid.check_option, name, value, lo, hi, **kw)


def output(path, flag="--out", kind="file", need_bytes=0) -> None:
    """:func:`phasefield.io.check_output`: the output can be written (before any work)."""
    check(io.check_output, path, flag, kind, need_bytes)


def check_hparams_values(values: dict) -> None:
    """:func:`phasefield.grid.check_values`, bad input as :class:`UsageError`."""
    try:
        grid.check_values(values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# The paper block's flags, written once: the fields of its numbers class (``HParams``, the
# ``numbers_class`` of the registry's ``paper`` preset) with their defaults -- its numbers (and
# ``alpha``, which ties alpha_A = alpha_M), the context (n_tokens, depth) and its static options.
# Written out because ``--help`` imports no JAX (HParams' module does); tests/test_cli_start.py
# holds them to HParams and to the preset's NUMBERS/OPTIONS.
PAPER_NUMBERS = dict(sigma_w=1.0, sigma_a=1.0, alpha=None, alpha_a=0.5, alpha_m=0.5, sigma_v=1.0)
PAPER_CONTEXT = dict(n_tokens=32, depth=16)
PAPER_OPTIONS = dict(activation="tanh", mlp_layers=1, residual="unit-norm", attention="paper", softmax_correction=False)
PAPER_HELP = dict(
    sigma_w="MLP weight scale σ_w",
    sigma_a="attention logit scale σ_A",
    alpha="sets α_A = α_M",
    alpha_a=f"attention branch weight α_A [{PAPER_NUMBERS['alpha_a']}]",
    alpha_m=f"MLP branch weight α_M [{PAPER_NUMBERS['alpha_m']}]",
    sigma_v="value weight scale σ_V",
    activation="tanh, erf, relu, gelu or linear",
    residual="unit-norm or identity",
    attention="paper or exact",
    softmax_correction="add the softmax-derivative path to the backward map (λ_g^∞)",
)
MLP_LAYERS_MAX = 16  # --mlp-layers (the numbers class takes any count >= 1)


def paper_option(name, **kw):
    """The click option of the paper block's field ``name`` (``--sigma-w`` ...): its default
    and help unless ``kw`` gives them."""
    if name == "softmax_correction":
        kw.setdefault("is_flag", True)
    else:
        default = {**PAPER_NUMBERS, **PAPER_CONTEXT, **PAPER_OPTIONS}[name]
        kw.setdefault("default", default)
        kw.setdefault("show_default", default is not None)
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            kw.setdefault("type", type(default))
    if name in PAPER_HELP:
        kw.setdefault("help", PAPER_HELP[name])
    return click.option("--" + grid.flag(name), **kw)


def point_options(n_tokens: int = PAPER_CONTEXT["n_tokens"], depth: int = PAPER_CONTEXT["depth"]):
    """Decorator: the hyperparameters of one point (``alpha`` ties alpha_A = alpha_M);
    :func:`point_hparams` turns them into ``HParams``."""
    # alpha_a, alpha_m: None unless given (grid.branch_weights: alpha or the pair)
    opts = [paper_option(k, type=float, default=None if k.startswith("alpha") else v) for k, v in PAPER_NUMBERS.items()]
    opts += [paper_option("n_tokens", default=n_tokens), paper_option("depth", default=depth)]
    return options(*opts)


def point_hparams(n_tokens, depth, alpha=None, alpha_a=None, alpha_m=None, **fields):
    """``HParams`` of the :func:`point_options` (and static fields), validated once (by
    ``HParams.validate``)."""
    from .. import HParams

    w = grid.untie(grid.branch_weights(alpha, alpha_a, alpha_m))
    numbers = {k: float(fields.pop(k)) for k in PAPER_NUMBERS if k in fields}
    return HParams(
        n_tokens=int(n_tokens), depth=int(depth), **{k: float(v) for k, v in w.items()}, **numbers, **fields
    ).validate()


def grid_options(f):
    """The hyperparameter axes of a grid command (each a range, a list or a number)."""
    opts = []
    for k, v in {**PAPER_NUMBERS, **PAPER_CONTEXT}.items():
        text = None if v is None else str(v)
        help = "start:stop:count, a,b,c or x" if k == "sigma_w" else None
        if k == "alpha":
            help = "sets alpha_a = alpha_m (one axis)"
        elif k in ("alpha_a", "alpha_m"):
            text, help = None, f"(default {v})"
        opts.append(paper_option(k, default=text, type=str, help=help))
    return options(*opts)(f)


def grid_values(**raw) -> dict:
    """Parse the :func:`grid_options` into arrays (``alpha`` or the pair; their values are
    checked where they are used)."""
    weights = check(
        grid.branch_weights, raw.pop("alpha"), raw.pop("alpha_a"), raw.pop("alpha_m"), str(grid.DEFAULT_BRANCH_WEIGHT)
    )
    return {k: parse_range(v, k) for k, v in dict(raw, **weights).items()}


def echo_json(obj) -> None:
    """One JSON object on stdout, RFC 8259: NaN and ±inf are printed as null."""
    click.echo(io.dumps(obj))


def options(*opts):
    """Decorator: the click options ``opts`` (decorators) in the order listed, as if written
    one above the other (the first listed first in ``--help``)."""

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco
