"""``phasefield train-sweep``, ``fit``, ``predict`` and ``recommend`` (ViT trainability).

Each command parses its options, calls one library function (:mod:`phasefield.vit.plan`,
:mod:`phasefield.vit.fitting`, :mod:`phasefield.vit.predict`, :mod:`phasefield.vit.recommend`,
:mod:`phasefield.layers.recommend`), which checks its inputs before any work, and prints the
result. Heavy imports (jax, flax, optax, tensorflow-datasets, scipy, matplotlib) happen inside
the commands so that ``phasefield --help`` stays fast.
"""

from __future__ import annotations

import math
import os

import click
import numpy as np

from ..vit.design import MAX_DEPTH
from .blockopt import PRESET_LIST, RECOMMEND_BLOCKS, block_option, given, paper_flags, refuse_causal, resolve
from .common import UsageError, check, check_hparams_values, echo_json, option, options

TRAIN_SWEEP_OPTIONS = (
    click.option(
        "--dataset",
        default="digits",
        show_default=True,
        help="'digits' (bundled, offline), 'mnist1d' (generated offline; the optional "
        "mnist1d package; --image-size is its length 40) or a tensorflow-datasets name, "
        "e.g. food101",
    ),
    click.option(
        "--design",
        default="grid",
        show_default=True,
        help="'grid' (Cartesian product of the axes) or 'sobol:N' (N scrambled Sobol points in the box "
        "spanned by the axes' ranges, each given as lo:hi or a number)",
    ),
    click.option("--design-seed", type=int, default=0, show_default=True, help="scrambling seed of a Sobol design"),
    click.option(
        "--points",
        "points_file",
        default=None,
        help="CSV of configurations (columns sigma_w, sigma_a, alpha_a, alpha_m or alpha; optional depth, lr)",
    ),
    click.option(
        "--sigma-w",
        default="0.3:3:6",
        show_default=True,
        help="start:stop:count, a,b,c or x (the block's sigma_w, or its sigma: see --block)",
    ),
    click.option("--alpha", default=None, help="alpha_A = alpha_M (default 0.1:0.95:6)"),
    click.option(
        "--alpha-a", default=None, help="alpha_A axis, the attention branch's scale (then --alpha-m is its own axis)"
    ),
    click.option("--alpha-m", default=None, help="alpha_M axis, the MLP branch's scale (default 0.5 with --alpha-a)"),
    click.option("--sigma-a", default="1", show_default=True, help="sigma_A (the paper block, deepscalelm)"),
    click.option("--lr", default="1e-3", show_default=True, help="Adam learning rate(s)"),
    click.option("--seeds", type=int, default=1, show_default=True, help="seeds per grid point"),
    click.option("--epochs", type=int, default=15, show_default=True),
    click.option("--batch-size", type=int, default=None, help="(default 64 for digits and mnist1d, 256 otherwise)"),
    click.option(
        "--depth", default="16", show_default=True, help="number of blocks; a list (8,16,32) is a design axis"
    ),
    click.option("--width", type=int, default=64, show_default=True, help="embedding width d"),
    click.option("--image-size", type=int, default=None, help="(default 8 for digits, 40 for mnist1d, 64 otherwise)"),
    click.option("--patch-size", type=int, default=None, help="(default 2 for digits, 4 for mnist1d, 8 otherwise)"),
    click.option("--activation", default="tanh", show_default=True),
    click.option(
        "--block",
        "block_spec",
        default="paper",
        show_default=True,
        help=f"the ViT's block: a preset NAME[:k=v,...] ({PRESET_LIST}). "
        "The paper block's numbers are --sigma-w, --sigma-a, --alpha, --alpha-a, "
        "--alpha-m (or --axis sigma_w=... etc.); another block's are its own, by --axis NAME=RANGE "
        "(pre-ln, post-ln, rms-swiglu, dyt: sigma, alpha, alpha_attn, alpha_mlp; deepscalelm: sigma_a) or "
        "fixed in --block (pre-ln:heads=2,alpha=0.5). A paper flag with another block is refused. "
        "A --points file's columns set the block's numbers: sigma_w -> sigma, alpha_a -> alpha_attn, "
        "alpha_m -> alpha_mlp (deepscalelm: sigma_a). Each run's theory point is the block's",
    ),
    click.option(
        "--axis",
        "axis_texts",
        multiple=True,
        metavar="NAME=RANGE",
        help="NAME=start:stop:count or NAME=a,b,c: a grid axis (or Sobol bounds) over a number of the block",
    ),
    click.option(
        "--chunk", type=int, default=12, show_default=True, help="configs trained at once (one compiled program)"
    ),
    click.option("--data-dir", default=None, help="where prepared .npz arrays are cached"),
    click.option("--tfds-dir", default=None, help="tensorflow-datasets data_dir"),
    click.option("--download", is_flag=True, help="let tensorflow-datasets download and prepare the dataset"),
    click.option("--out", "-o", required=True, help="sweep directory (resumed when it exists)"),
    click.option("--quiet", is_flag=True, help="no progress bar"),
    click.option("--json", "as_json", is_flag=True, help="print a JSON summary"),
)


FIT_OPTIONS = (
    click.option(
        "--runs",
        required=True,
        multiple=True,
        help="sweep directory or results table (.jsonl/.json/.csv); repeat it to pool sweeps of one training config",
    ),
    click.option("--out", "-o", default=None, help="fit JSON to write (report + best exponent model)"),
    click.option("--folds", type=int, default=5, show_default=True, help="k of the k-fold CV over configurations"),
    click.option("--repeats", type=int, default=5, show_default=True, help="CV repeats with reshuffled folds"),
    click.option("--num-classes", type=int, default=None, help="(default from the sweep's sweep.json)"),
    click.option("--lr", "only_lr", type=float, default=None, help="fit only the runs of this learning rate"),
    click.option(
        "--per-lr", is_flag=True, help="fit each learning rate of a mixed table separately (OUT gets _lr<value>)"
    ),
    click.option("--json", "as_json", is_flag=True, help="print the fit document as JSON"),
    click.option(
        "--figure",
        default=None,
        help="PNG of the paper's Fig. 7: loss against the exponents, and the best exponent model's "
        "cross-validated predictions",
    ),
    click.option(
        "--block",
        "block_spec",
        default=None,
        help=f"the block the runs must have been trained with, a preset ({PRESET_LIST}) and its numbers "
        "(default: theirs, from sweep.json; the model records it)",
    ),
    click.option(
        "--nested/--no-nested",
        default=True,
        show_default=True,
        help="nested CV of the whole procedure (the honest estimate of the shipped model; about "
        "--folds times the cost of the rest)",
    ),
)


PREDICT_OPTIONS = (
    click.option(
        "--fit", "fit_path", default=None, help="fit JSON from 'phasefield fit' (default: the packaged model)"
    ),
    click.option("--sigma-w", type=float, default=None, help="the paper block's sigma_w"),
    click.option("--alpha", type=float, default=None, help="the paper block's alpha_A = alpha_M"),
    click.option("--alpha-a", type=float, default=None, help="the paper block's alpha_A"),
    click.option("--alpha-m", type=float, default=None, help="the paper block's alpha_M (default --alpha-a)"),
    click.option("--sigma-a", type=float, default=None, help="the paper block's sigma_A [1]"),
    click.option("--depth", type=int, default=16, show_default=True),
    click.option(
        "--block",
        "block_spec",
        default=None,
        help=f"the block, a preset ({PRESET_LIST}), and its numbers (default: the model's block), e.g. "
        "pre-ln:heads=2,sigma=0.8,alpha=0.5; it must be the block the model was fitted on (the packaged model: paper, "
        "whose numbers are --sigma-w, --alpha ...)",
    ),
    click.option("--json", "as_json", is_flag=True, help="print one JSON object"),
)


RECOMMEND_OPTIONS = (
    click.option("--n-tokens", type=int, default=17, show_default=True),
    click.option("--depth", type=int, default=16, show_default=True),
    click.option("--activation", default="tanh", show_default=True),
    click.option("--sigma-w", type=float, default=None, help="fix sigma_w (default: free in [0.3, 3])"),
    click.option("--sigma-a", type=float, default=None, help="fix sigma_A (default: free in [0.3, 4])"),
    click.option("--alpha", type=float, default=None, help="fix alpha_A = alpha_M"),
    click.option("--alpha-a", type=float, default=None, help="fix alpha_A (default: free in [0.05, 0.95])"),
    click.option("--alpha-m", type=float, default=None, help="fix alpha_M (default: free in [0.05, 0.95])"),
    click.option("--fit", "fit_path", default=None, help="loss model (default: the packaged one)"),
    click.option("--no-loss", is_flag=True, help="only the critical set (no loss model)"),
    click.option(
        "--max-fail-prob",
        type=float,
        default=None,
        help="propose no point whose predicted P(fails to train) exceeds this (default 0.1; "
        "needs the loss model's failure model)",
    ),
    block_option(
        axes=True,
        help="the block: paper (default; its critical set and the loss model) or "
        f"{', '.join(RECOMMEND_BLOCKS)}[:k=v,...] (the (sigma, alpha_attn, alpha_mlp) closest to "
        "critical at --depth and --n-tokens)",
    ),
    click.option(
        "--max-gradient-factor",
        type=float,
        default=10.0,
        show_default=True,
        help="(a standard block) the gradient may grow or shrink by at most this factor over the stack",
    ),
    click.option(
        "--max-angle-rate",
        type=float,
        default=0.05,
        show_default=True,
        help="(a standard block) nearby tokens may merge or separate at most this fast per block",
    ),
    click.option("--json", "as_json", is_flag=True),
)


def _axis_text(values, design) -> str:
    """A parsed axis as the range text of the design options (Sobol: its bounds)."""
    v = np.unique(np.asarray(values, float))
    if design != "grid" and v.size > 1:
        return f"{float(v.min())!r}:{float(v.max())!r}"
    return ",".join(repr(float(x)) for x in v)


def _block_axes(block_spec, axis_texts, flags, design="grid") -> tuple:
    """(block spec without numbers, run axis texts (sigma_w, alpha, alpha_a, alpha_m, sigma_a)):
    the block's numbers, from ``--axis`` or fixed in ``--block``, as the runs' columns
    (:data:`phasefield.vit.train.RUN_NUMBERS`); the paper flags are the paper block's only."""
    from ..layers import registry, spec
    from ..vit.train import RUN_NUMBERS
    from .blockopt import flag

    name = spec_name(block_spec)
    flagged = paper_flags(flags)
    if registry.lookup(name).numbers_class is not None:  # the runs' numbers are the block's own
        name, fixed, axes = resolve(block_spec, axis_texts, {}, extra_axes=("alpha",))
        for k in list(fixed) + list(axes):
            clash = [
                f
                for f in flagged
                if f == k
                or (f == "alpha" and k in ("alpha_a", "alpha_m"))
                or (k == "alpha" and f in ("alpha_a", "alpha_m"))
            ]
            if clash:
                raise UsageError(f"{k} given twice: in --block or --axis and as {flag(clash[0])}")
        inv = {"sigma_w": "sigma_w", "sigma_a": "sigma_a", "alpha_a": "alpha_a", "alpha_m": "alpha_m", "alpha": "alpha"}
    else:
        name, fixed, axes = resolve(block_spec, axis_texts, flagged, grid=True)
        inv = {number: run for run, number in RUN_NUMBERS[name].items()}
        if "alpha_attn" in inv:
            inv["alpha"] = "alpha"
        if "sigma_w" not in inv.values():  # the runs' sigma_w and alpha set no number of the block
            flags = dict(flags, sigma_w="1", alpha="0.5", alpha_a=None, alpha_m=None)
    numbers = {k: np.asarray([float(v)]) for k, v in fixed.items() if k in spec.NUMBERS[name]}
    bad = sorted(k for k in list(axes) + list(numbers) if k not in inv)
    if bad:
        raise UsageError(f"block {name}: {bad[0]} is not a number a run sets; the runs set {', '.join(sorted(inv))}")
    rest = {k: v for k, v in fixed.items() if k not in numbers}
    spec_text = name + "".join(
        f"{':' if i == 0 else ','}{k}={str(v).lower() if isinstance(v, bool) else v}"
        for i, (k, v) in enumerate(rest.items())
    )
    runs = dict(flags)
    for k, v in {**numbers, **axes}.items():
        col = inv[k]
        if col == "alpha" or col in ("alpha_a", "alpha_m"):
            if col == "alpha":
                runs["alpha_a"] = runs["alpha_m"] = None
            else:
                runs["alpha"] = None
        runs[col] = v
    if runs.get("alpha") is None and runs.get("alpha_a") is None and runs.get("alpha_m") is not None:
        runs["alpha_a"] = "0.5"
    texts = {k: (_axis_text(v, design) if isinstance(v, np.ndarray) else v) for k, v in runs.items()}
    return spec_text, tuple(texts[k] for k in ("sigma_w", "alpha", "alpha_a", "alpha_m", "sigma_a"))


@click.command("train-sweep")
@options(*TRAIN_SWEEP_OPTIONS)
def train_sweep(block_spec, axis_texts, design, points_file, out, quiet, as_json, data_dir, tfds_dir, download, **o):
    """Train ViTs over an initialization grid or design (the paper's Appendix D model, shared block).

    Every chunk of grid points is trained by one vmapped, compiled program; results go to
    OUT/results.{jsonl,csv,json}, per-run metrics to OUT/metrics/, final params to
    OUT/checkpoints/. Rerunning resumes without redoing finished runs. OUT is locked: a
    second train-sweep on it stops at once (exit 2).

    Single process only: train-sweep does not split work across jax.distributed
    processes (run separate sweeps into separate OUT directories instead)."""
    from ..vit import plan

    names = ("sigma_w", "alpha", "alpha_a", "alpha_m", "sigma_a")
    block, texts = _block_axes(block_spec, axis_texts, {k: o[k] for k in names}, design)
    if points_file is not None and axis_texts:
        raise UsageError("give either --points or --axis, not both")
    o.update(zip(names, texts))
    cfg, runs = plan.plan(block=block, design=design, points_file=points_file, out=out, **o)
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    summary = plan.train(cfg, runs, out, o["chunk"], data_dir, tfds_dir, download, progress=not quiet, log=log)
    if as_json:
        echo_json(summary)
    else:
        click.echo(
            f"trained {summary['trained']} runs ({summary['already_done']} already done, "
            f"{summary['diverged']} diverged) in {summary['seconds']:.1f} s; "
            f"table: {os.path.join(out, 'results.csv')}"
        )


@click.command("fit")
@options(*FIT_OPTIONS)
def fit_cmd(runs, out, folds, repeats, num_classes, only_lr, per_lr, as_json, figure, block_spec, nested):
    """Does the initialization predict the trained loss? Cross-validated over configurations
    (seed-averaged losses): the noise floor, exponent models (collapsed point, measured input
    geometry with the paper and exact maps, +- the softmax-derivative term, trees), raw-
    hyperparameter models (with the effective depth), hybrids, transfer tests; writes the best
    model of every family by CV, with its interval."""
    if out is None and not as_json and figure is None:
        raise UsageError("nothing to do: give --out, --json and/or --figure")
    from ..vit.fitting import fit_runs

    docs = fit_runs(
        runs,
        folds=folds,
        repeats=repeats,
        num_classes=num_classes,
        only_lr=only_lr,
        per_lr=per_lr,
        block=block_spec,
        nested=nested,
        out=out,
        figure=figure,
        echo=lambda m: click.echo(m, err=True),
    )
    if as_json:
        echo_json(next(iter(docs.values())) if len(docs) == 1 else {f"{k:g}": v for k, v in docs.items()})
    else:
        for doc in docs.values():
            _print_report(doc["report"])


@click.command("predict")
@options(*PREDICT_OPTIONS)
def predict_cmd(fit_path, sigma_w, alpha, alpha_a, alpha_m, sigma_a, depth, block_spec, as_json):
    """Predicted final test loss at one initialization, with an interval from the model's
    cross-validated residuals, both exponents, and warnings outside the fitted region."""
    kw = dict(sigma_w=sigma_w, sigma_a=sigma_a, alpha=alpha, alpha_a=alpha_a, alpha_m=alpha_m)
    for k, v in kw.items():
        if v is not None and not math.isfinite(v):
            raise UsageError(f"--{k.replace('_', '-')} must be finite (got {v})")
    option("--depth", depth, 1, MAX_DEPTH, integer=True)
    from ..layers import spec as _spec
    from ..vit import predict as vpredict

    # a block's packaged model (load_model refuses, in one line, a block without one)
    shipped_block = spec_name(block_spec) if block_spec is not None and fit_path is None else None
    doc = vpredict.load_model(fit_path, block=shipped_block)
    fitted = vpredict.block_of(doc)
    name, fixed, _ = resolve(block_spec if block_spec is not None else fitted, (), paper_flags(kw))
    _same_block(name, fixed, fitted, fit_path)
    sigma_w, sigma_a, aa, am = _run_numbers(name, fixed)
    check_hparams_values(dict(sigma_w=[sigma_w], sigma_a=[sigma_a], alpha_a=[aa], alpha_m=[am], depth=[depth]))
    res = vpredict.predict(sigma_w, sigma_a, aa, am, depth, doc)
    if as_json:
        return echo_json(res)
    at = {k: v for k, v in fixed.items() if k in _spec.NUMBERS[name]}
    _print_prediction(res, doc, at, depth)


def _print_prediction(res, doc, at, depth) -> None:
    """``predict``'s lines (``at``: the block's numbers, for a block without a closed form)."""
    from ..vit import predict as vpredict
    from ..vit.analysis import EFFECTIVE, effective_depths

    lo, hi = res["interval"]
    click.echo(
        f"predicted test loss = {res['predicted_loss']:.4f}  ({100 * res['interval_level']:.0f} % "
        f"interval {lo:.3f} - {hi:.3f}; chance {res['chance_loss']:.4f})"
    )
    if res.get("p_fail") is not None:
        click.echo(
            f"P(fails to train) = {res['p_fail']:.3f}  (a run fails: {res['fail_criterion']}; "
            "the loss above is the expected loss, failures included)"
        )
    else:
        click.echo("P(fails to train): not available (this fit file has no failure model; refit it)")
    r2 = res.get("cv_r2")
    click.echo(
        f"model {res['model']} (family: {res.get('family') or 'exponents'}; cross-validated R2 "
        + ("not measured" if r2 is None else f"{r2:.2f}")
        + f"; fitted for {_fitted_for(doc)})"
    )
    if not vpredict.closed_form(res["block"]):
        click.echo(f"block {res['block']} at {', '.join(f'{k}={v:g}' for k, v in at.items())}")
    if "angle_rate" in res and math.isnan(res["lambda_a"]):  # a block without a fixed point
        angle = f"angle_rate = {res['angle_rate']:+.4f} (no fixed point: no lambda_a)"
    else:
        angle = f"lambda_a = {res['lambda_a']:+.4f}"
    click.echo(f"{angle}   lambda_g(L={depth}) = {res['lambda_g_collapse']:+.4f}")
    if set(EFFECTIVE) & set(res["features"]):
        e = effective_depths(depth, res["alpha_a"], res["alpha_m"])
        click.echo(
            f"effective depth L (alpha_A^2 + alpha_M^2) = {float(e['effective_depth']):.4g} "
            f"(attention {float(e['effective_depth_attention']):.4g}, "
            f"MLP {float(e['effective_depth_mlp']):.4g})"
        )
    for w in res["warnings"]:
        click.echo(f"warning: {w}")


@click.command("recommend")
@options(*RECOMMEND_OPTIONS)
def recommend_cmd(block_spec, axis_texts, n_tokens, depth, max_gradient_factor, max_angle_rate, as_json, **o):
    """Initializations the theory recommends. The paper block: where lambda_a = lambda_g = 0
    inside the box of the free hyperparameters (or the nearest points), and the lowest
    predicted loss; no point whose P(fails to train) exceeds --max-fail-prob is proposed.
    A standard block (--block pre-ln, ...: the list under --block): the (sigma, alpha_attn, alpha_mlp)
    whose stack keeps the gradient within --max-gradient-factor and the angle rate of nearby
    tokens within --max-angle-rate (box: --axis sigma=LO:HI:N ...), ranked by the distance
    max(|lambda_g| L / log F, |angle_rate| / r); where no point meets both, a paragraph on the
    trade-off."""
    kw = {k: o[k] for k in ("sigma_w", "sigma_a", "alpha", "alpha_a", "alpha_m", "activation")}
    name, spec_fixed, axes = resolve(block_spec, axis_texts, paper_flags(kw), grid=True, causal=True)
    from ..layers import registry

    if not registry.lookup(name).fast_engine:  # the closed-form engine's critical set, else a box
        return _recommend_block(name, spec_fixed, axes, n_tokens, depth, max_gradient_factor, max_angle_rate, as_json)
    refuse_causal(name, spec_fixed)  # the paper block's critical set is the (q, p) one
    if axis_texts:
        raise UsageError(
            "--axis sets the box of a standard block (--block pre-ln ...); the paper block's "
            "numbers are fixed with --sigma-w, --sigma-a, --alpha, --alpha-a, --alpha-m"
        )
    for opt in given("max_gradient_factor", "max_angle_rate"):
        raise UsageError(
            f"--{opt.replace('_', '-')} is for a standard block (--block pre-ln ...); the paper "
            "block's recommendation is its critical set lambda_a = lambda_g = 0"
        )
    res = _recommend_paper(spec_fixed, n_tokens, depth, **o)
    if as_json:
        return echo_json(res)
    _print_paper_recommend(res, n_tokens, depth, spec_fixed.get("activation", o["activation"]))


def _recommend_paper(spec_fixed, n_tokens, depth, activation, sigma_w, sigma_a, alpha, alpha_a, alpha_m, **o):
    """:func:`phasefield.vit.recommend.recommend` of the paper block (numbers fixed by the
    flags or in ``--block paper:...``), with the loss model unless ``--no-loss``."""
    other = sorted(set(spec_fixed) - {"sigma_w", "sigma_a", "alpha_a", "alpha_m", "activation"})
    if other:
        raise UsageError(
            f"recommend searches the paper block over sigma_w, sigma_a, alpha_a, alpha_m with the "
            f"rest at its defaults; it cannot fix {', '.join(other)}"
        )
    if spec_fixed:
        sigma_w, sigma_a = spec_fixed.get("sigma_w"), spec_fixed.get("sigma_a")
        alpha, alpha_a, alpha_m = None, spec_fixed.get("alpha_a"), spec_fixed.get("alpha_m")
        activation = spec_fixed.get("activation", activation)
    if alpha is not None and (alpha_a is not None or alpha_m is not None):
        raise UsageError("give either --alpha or --alpha-a/--alpha-m, not both")
    fixed = dict(
        sigma_w=sigma_w,
        sigma_a=sigma_a,
        alpha_a=alpha if alpha is not None else alpha_a,
        alpha_m=alpha if alpha is not None else alpha_m,
    )
    for k, v in fixed.items():
        if v is not None and not math.isfinite(v):
            raise UsageError(f"--{k.replace('_', '-')} must be finite (got {v})")
    check_hparams_values({k: [v] for k, v in fixed.items() if v is not None})
    option("--n-tokens", n_tokens, 2, 100_000, integer=True)
    option("--depth", depth, 1, MAX_DEPTH, integer=True)
    if o["max_fail_prob"] is not None:
        if o["no_loss"]:
            raise UsageError("--max-fail-prob needs the loss model's failure model: drop --no-loss")
        option("--max-fail-prob", o["max_fail_prob"], 0.0, 1.0)
    from ..activations import names

    if activation not in names():
        raise UsageError(f"unknown activation {activation!r}; choose one of {', '.join(names())}")
    from ..vit import predict as vpredict
    from ..vit.recommend import MAX_FAIL_PROB, recommend

    doc = None
    if not o["no_loss"]:
        doc = vpredict.load_model(o["fit_path"])
        if not vpredict.closed_form(vpredict.block_of(doc)):
            raise UsageError(
                f"recommend searches the paper block's critical set; {o['fit_path']} was fitted "
                f"on {vpredict.block_of(doc)!r} runs (use 'phasefield block sweep' for its phase diagram)"
            )
    max_fail_prob = MAX_FAIL_PROB if o["max_fail_prob"] is None else o["max_fail_prob"]
    return recommend(
        n_tokens, depth, activation, fixed, model=doc, predict_loss=not o["no_loss"], max_fail_prob=max_fail_prob
    )


def _print_paper_recommend(res, n_tokens, depth, activation) -> None:
    names = ("sigma_w", "sigma_a", "alpha_a", "alpha_m")
    click.echo(
        f"critical set lambda_a = lambda_g({depth}) = 0 (n = {n_tokens}, {activation})"
        + ("" if res["critical_found"] else ": no exact zero in the box; nearest points")
    )
    for c in res["critical"]:
        click.echo(
            "  "
            + "  ".join(f"{k} {c[k]:.4f}" for k in names)
            + f"  lambda_a {c['lambda_a']:+.2e}  lambda_g {c['lambda_g_collapse']:+.2e}"
            + (f"  predicted loss {c['predicted_loss']:.3f}" if "predicted_loss" in c else "")
            + (f"  P(fail) {c['p_fail']:.3f}" if c.get("p_fail") is not None else "")
        )
    ex = res.get("excluded") or {}
    if ex.get("critical"):
        click.echo(f"  ({ex['critical']} critical point(s) dropped: P(fail) > {res['max_fail_prob']:g})")
    if "lowest_predicted_loss" in res:
        b = res["lowest_predicted_loss"]
        click.echo(
            "lowest predicted loss: "
            + "  ".join(f"{k} {b[k]:.4f}" for k in names)
            + f"  loss {b['predicted_loss']:.3f} [{b['interval'][0]:.3f}, {b['interval'][1]:.3f}]"
            + (f"  P(fail) {b['p_fail']:.3f} (<= {res['max_fail_prob']:g})" if b.get("p_fail") is not None else "")
        )
        for w in b["warnings"]:
            click.echo(f"warning: {w}")


def _recommend_block(name, fixed, axes, n_tokens, depth, max_factor, max_rate, as_json):
    """``recommend --block NAME`` for a standard block (:mod:`phasefield.layers.recommend`)."""
    from ..layers import recommend as rb

    if name not in rb.BLOCKS:
        raise UsageError(f"recommend --block takes paper, {', '.join(rb.BLOCKS)} (got {name})")
    for opt in given("fit_path", "no_loss", "max_fail_prob", "activation"):
        flag = {"fit_path": "--fit"}.get(opt, "--" + opt.replace("_", "-"))
        raise UsageError(
            f"{flag} is for the paper block's recommendation (no loss model exists for block {name}; "
            f"give its activation as --block {name}:activation=NAME)"
        )
    option("--n-tokens", n_tokens, 2, 100_000, integer=True)
    option("--depth", depth, 1, MAX_DEPTH, integer=True)
    option("--max-gradient-factor", max_factor, 1.0, 1e300, lo_open=True)
    option("--max-angle-rate", max_rate, 0.0, 100.0, lo_open=True)
    bad = sorted(set(axes) - set(rb.KEYS))
    if bad:
        raise UsageError(
            f"--axis {bad[0]}: recommend ranges over {', '.join(rb.KEYS)} (alpha sets both: give "
            "alpha_attn and alpha_mlp)"
        )
    for k, v in axes.items():
        if len(v) > 16:
            raise UsageError(f"--axis {k}: at most 16 values (a coarse grid; the best point is refined)")
        axes[k] = np.unique(v)
    fixed = dict(fixed)
    alpha = fixed.pop("alpha", None)
    for k in rb.KEYS:
        v = fixed.pop(k, alpha if k != "sigma" else None)
        if v is not None:
            axes[k] = np.asarray([float(v)])
    res = rb.recommend(
        name,
        depth=int(depth),
        n_tokens=int(n_tokens),
        max_factor=max_factor,
        max_angle_rate=max_rate,
        axes=axes,
        fixed=fixed,
    )
    if as_json:
        return echo_json(res)
    _print_block_recommend(res, name, n_tokens, depth, max_factor, max_rate)


def _print_block_recommend(res, name, n_tokens, depth, max_factor, max_rate) -> None:
    click.echo(
        f"{name}, depth {depth}, n = {n_tokens}: gradient factor within {max_factor:g} over the stack, "
        f"|angle rate| <= {max_rate:g} per block (box "
        + ", ".join(f"{k} {lo:g}-{hi:g}" for k, (lo, hi) in res["box"].items())
        + f"; {res['evaluated']} points)"
    )
    if not res["found"]:
        click.echo(res["message"])
        click.echo("nearest points (distance > 1: a criterion is missed):")
    g_name, a_name = res["rates"]
    click.echo(
        f"  {'sigma':>7} {'alpha_attn':>10} {'alpha_mlp':>9} {g_name:>15} {'grad factor':>11} "
        f"{a_name:>15} {'distance':>8}"
    )
    for p in res["points"]:
        click.echo(
            f"  {p['sigma']:7.4f} {p['alpha_attn']:10.4f} {p['alpha_mlp']:9.4f} {p[g_name]:+15.5f} "
            f"{p['gradient_factor']:11.4g} {p[a_name]:+15.5f} {p['distance']:8.3f}"
        )
    if res["found"] and res["at_lower_edge"]:
        click.echo(
            f"note: the best point sits at the box's lowest {', '.join(res['at_lower_edge'])}: smaller "
            "scales bring the blocks nearer the identity (trivially critical, and doing less); raise the "
            "box's lower bounds (--axis NAME=LO:HI:N) to ask for blocks that do more"
        )


def register(cli):
    for cmd in (train_sweep, fit_cmd, predict_cmd, recommend_cmd):
        cli.add_command(cmd)


def spec_name(spec_text: str) -> str:
    """The preset name of a block spec (``NAME[:k=v,...]`` or a JSON file)."""
    from ..layers import spec

    return check(spec.parse, spec_text)[0]


def _same_block(name, fixed, fitted, fit_path) -> None:
    """UsageError unless block ``name`` with keywords ``fixed`` (its numbers aside) is the
    block ``fitted`` (a spec) the model was fitted on."""
    from ..layers import spec

    f_name, f_kw = spec.parse(fitted)
    numbers = set(spec.NUMBERS[name])
    mine = {k: v for k, v in fixed.items() if k not in numbers}
    theirs = {k: v for k, v in f_kw.items() if k not in numbers}
    if (name, mine) != (f_name, theirs):
        src = "the packaged model" if fit_path is None else f"the model {fit_path}"
        asked = name + "".join(f"{':' if i == 0 else ','}{k}={v}" for i, (k, v) in enumerate(mine.items()))
        raise UsageError(
            f"model fitted on block {fitted}; {src} cannot predict for {asked}: train that block "
            f"(train-sweep --block {asked} ...) and fit it (phasefield fit)"
        )


def _run_numbers(name, fixed) -> tuple:
    """(sigma_w, sigma_a, alpha_a, alpha_m) of a run from the block's numbers (the paper block's
    own; the standard blocks' sigma, alpha_attn, alpha_mlp through :data:`RUN_NUMBERS`)."""
    from ..layers import registry
    from ..vit.train import RUN_NUMBERS

    own = registry.lookup(name).numbers_class is not None
    if not own and "sigma_w" not in RUN_NUMBERS[name]:
        raise UsageError(
            f"predict --block {name}: its runs' sigma_w and alpha are not block numbers; "
            "predict it with the library (phasefield.vit.predict.predict)"
        )
    if own:  # the runs' numbers are the block's own
        w, a, aa, am = (fixed.get(k) for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m"))
        flags = ("--sigma-w", "--alpha (or --alpha-a)")
    else:
        inv = {number: run for run, number in RUN_NUMBERS[name].items()}
        alpha = fixed.get("alpha")
        w = fixed.get("sigma")
        aa, am = fixed.get("alpha_attn", alpha), fixed.get("alpha_mlp", alpha)
        a = None
        flags = (f"--block {name}:sigma=...", f"--block {name}:alpha=... (or alpha_attn)")
        assert inv["sigma"] == "sigma_w"
    if w is None:
        raise UsageError(f"give {flags[0]}")
    if aa is None:
        raise UsageError(f"give {flags[1]}")
    return float(w), float(1.0 if a is None else a), float(aa), float(am if am is not None else aa)


def _fitted_for(doc: dict) -> str:
    """'digits, Adam lr 0.001, 15 epochs' from a model document."""
    tc = doc.get("train_config", {})
    opt = {"adam": "Adam", "sgd_momentum": "SGD + momentum 0.9"}.get(tc.get("optimizer", "adam"), tc.get("optimizer"))
    lr = doc.get("lr")
    return (
        f"{tc.get('dataset', '?')}, {opt} lr {lr:g}, {tc.get('epochs', '?')} epochs" if lr else str(tc.get("dataset"))
    )


def _print_report(rep: dict) -> None:
    fl = rep["noise_floor"]
    click.echo(
        f"{rep['n_configs']} configurations, {rep['n_runs']} runs ({rep['seeds']} seeds), depths "
        f"{', '.join(map(str, rep['depths']))}; "
        + (
            f"{rep['k_folds']}-fold CV over configurations x {rep['repeats']}"
            if rep.get("cross_validated", True)
            else "not cross-validated"
        )
    )
    if rep.get("message"):
        click.echo(rep["message"])
    if fl.get("rmse") == fl.get("rmse"):
        click.echo(f"noise floor: RMSE {fl['rmse']:.4f} (best R2 {fl['r2_max']:.3f}; seed sd {fl['seed_sd']:.3f})")
    else:
        click.echo("noise floor: not measured (one seed per configuration)")
    if rep.get("cross_validated", True):
        click.echo(f"  {'model':24s} {'inputs':9s} {'CV RMSE':>14s} {'CV R2':>7s} {'/floor':>7s}")
        for name, m in sorted(rep["models"].items(), key=lambda kv: kv[1]["cv_rmse"]):
            click.echo(
                f"  {name:24s} {m['group']:9s} {m['cv_rmse']:7.4f}+-{m['cv_rmse_sd']:.4f} {m['cv_r2']:7.3f} "
                f"{m['cv_over_floor']:7.2f}"
            )
    for split, t in rep["transfer"].items():
        fl_t = t["_noise_floor"]["rmse"]
        best = sorted(
            ((m, d["rmse"]) for m, d in t.items() if not m.startswith("_") and d["rmse"] == d["rmse"]),
            key=lambda kv: kv[1],
        )
        click.echo(f"transfer {split} (noise floor {fl_t:.4f}): " + ", ".join(f"{m} {v:.4f}" for m, v in best[:6]))
    if rep.get("cross_validated", True):
        click.echo(
            f"best exponent model: {rep['best_exponent_model']}; best raw: {rep['best_raw_model']}; "
            f"best hybrid: {rep.get('best_hybrid_model')}"
        )
    best = rep.get("best_model") or rep["best_exponent_model"]
    iv = rep.get("interval") or {}
    line = f"shipped model: {best} ({rep['models'][best]['group']})"
    if iv:
        cv = iv.get("cv_coverage")
        line += f"; {100 * iv['level']:.0f} % interval: {iv['method']}" + (
            f", CV coverage {100 * cv['runs']:.0f} % of runs" if cv else ""
        )
    click.echo(line)
    nest = rep.get("nested")
    if nest:
        click.echo(
            f"nested CV of the whole procedure (selection, interval, refit; configurations held out): "
            f"R2 {nest['r2']:.3f}, RMSE {nest['rmse']:.4f}, coverage {100 * nest['coverage_runs']:.0f} % of runs, "
            f"{100 * nest['coverage_means']:.0f} % of seed means"
        )
