"""``phasefield train-lm``: the causal character-level language model (:mod:`phasefield.lm`)
trained over seeds, one JSON line per seed. Heavy imports happen inside the command."""

from __future__ import annotations

import click

from .blockopt import PRESET_LIST
from .common import UsageError, check, output


def _seeds(text: str) -> list:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds must be integers separated by commas (got {text!r})") from None
    if not seeds or any(not 0 <= s < 2**31 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds must be distinct integers in [0, 2^31) (got {text!r})")
    return seeds


def _knobs(text: str) -> dict:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, val = item.partition("=")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            raise UsageError(f"--multipliers: expected knob=number, got {item!r}") from None
        if not eq:
            raise UsageError(f"--multipliers: expected knob=number, got {item!r}")
    return out


def _init(cfg, recipe, knobs):
    """(multipliers by path, what the result records of them) of --recipe / --multipliers."""
    from ..lm import train as lm_train

    if recipe and knobs:
        raise UsageError("give --recipe or --multipliers, not both")
    if recipe:
        mult, plan = check(lm_train.recipe_multipliers, cfg, recipe)
        if not plan["applicable"]:
            click.echo(f"phasefield: note: recipe {recipe} does not apply ({plan['reason']}); init unchanged", err=True)
        return mult, dict(recipe=recipe, applicable=plan["applicable"], reason=plan["reason"], multipliers=mult)
    if knobs:
        mult = check(lm_train.knob_multipliers, cfg, knobs)
        return mult, dict(knobs=knobs, multipliers=mult)
    return {}, {}


@click.command("train-lm")
@click.option(
    "--block",
    default="pre-ln",
    show_default=True,
    help=f"the block: a preset ({PRESET_LIST}) or NAME:key=value,... (always masked causally)",
)
@click.option("--width", type=int, default=128, show_default=True)
@click.option("--depth", type=int, default=4, show_default=True)
@click.option("--heads", type=int, default=None, help="attention heads (default: the block's heads=, else 4)")
@click.option("--context", "n", type=int, default=64, show_default=True, help="window length n")
@click.option("--batch", type=int, default=32, show_default=True)
@click.option("--steps", type=int, default=300, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Adam's learning rate")
@click.option("--warmup", type=int, default=0, show_default=True, help="steps of linear warmup")
@click.option("--clip", type=float, default=1.0, show_default=True, help="gradient clipping (global norm)")
@click.option("--eval-batches", type=int, default=4, show_default=True, help="held-out batches evaluated")
@click.option("--recipe", default=None, help="multiply the init by a named recipe's multipliers (deepnorm, ...)")
@click.option("--multipliers", "knobs", default="", help="init multipliers per knob or role: weights=M,residual=M")
@click.option("--seeds", default="0", show_default=True, help="comma-separated seeds")
@click.option("--out", default="lm_results.jsonl", show_default=True, help="JSON lines, one per seed (resumed)")
@click.option("--progress/--quiet", default=True, help="progress bar on stderr, in steps")
def train_lm_cmd(recipe, knobs, seeds, out, progress, **kw):
    """Train the causal character-level language model on the Python standard library's
    sources (docs/lm.md): held-out bits per character per seed, written as JSON lines."""
    from ..lm import data, runs, train

    cfg = check(train.LMConfig(**kw).validate)
    check(runs.check_size, cfg)
    seeds = _seeds(seeds)
    output(out)
    corpus = check(data.load)
    mult, info = _init(cfg, recipe, _knobs(knobs))
    check(runs.done_seeds, out, runs.identity(cfg, corpus, info))  # another configuration's file: refused
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps * len(seeds), unit="step", file=click.get_text_stream("stderr"), leave=False)
    try:
        for rec in runs.train_seeds(cfg, corpus, seeds, out, mult, info, bar.update if bar else None):
            click.echo(f"seed {rec['seed']}: held-out {rec['held_bpc']:.3f} bpc, trains {rec['trains']}")
    finally:
        if bar is not None:
            bar.close()


def register(cli):
    cli.add_command(train_lm_cmd)
