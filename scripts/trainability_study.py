#!/usr/bin/env python
"""The trainability study: does the initialization predict the trained loss?

    python scripts/trainability_study.py run       # train (resumes; ~75 min on 2 CPU cores)
    python scripts/trainability_study.py analyze   # CV analysis, figures, packaged model
    python scripts/trainability_study.py plan      # print the design and its projected cost
    python scripts/trainability_study.py score --study corners   # the packaged model on unseen runs
    python scripts/trainability_study.py failure [--ship]        # P(fails to train): grouped CV
    python scripts/trainability_study.py failure --study edges   # ... scored on the boundary runs
    python scripts/trainability_study.py heldout --study holdout3  # a pair of held-out sets pooled
    ... --study lr | depth | mnist1d | pre-ln | ...   # the other studies (phasefield.vit.study.registry)

Digits ViTs with the trainer's defaults (width 64, 15 epochs, batch 64, Adam 1e-3, tanh),
scrambled Sobol configurations over sigma_w in [0.3, 3], sigma_A in [0.3, 4], alpha_A and
alpha_M in [0.05, 0.95] independently, one Sobol sequence (its own scrambling seed) per
depth, 3 seeds per configuration. The runs are trained in blocks of 8 configurations,
depths interleaved (16, 8, 32, 16, 8, 16, ...), so that any prefix of the study is a
balanced design at every depth it reached (the first 2^k points of a Sobol sequence are
balanced). Results go to ``docs/data/trainability/`` (results tables only: no checkpoints,
no per-step metrics) and are committed, so the analysis runs without retraining and a
later session can extend the study with a larger --plan.

The studies, their designs and every procedure live in ``phasefield.vit.study``; this script
is its command line.
"""

from __future__ import annotations

import argparse
import sys
import time

from phasefield.vit.study import registry as R
from phasefield.vit.study.registry import POOLED, STUDIES


def _study(args) -> dict:
    return R.study(args.study, **{k: getattr(args, k, None) for k in ("plan", "settings", "out", "seeds")})


def cmd_plan(args):
    from phasefield.vit.study import training

    for e in training.plan_cost(_study(args)):
        print(
            f"depth {e['depth']:3d}  configurations {e['lo']:3d}-{e['hi']:3d}  {e['runs']:3d} runs  "
            f"~{e['seconds'] / 60:5.1f} min (cumulative {e['cumulative'] / 60:5.1f} min)"
        )


def cmd_run(args):
    import phasefield
    from phasefield.vit.study import training

    phasefield.use_all_cpu_cores()  # the script owns its process: shard chunks over every core
    training.run_study(
        _study(args), chunk=args.chunk, until=args.until, progress=not args.quiet, theory=not args.no_theory
    )


def cmd_features(args):
    import phasefield  # noqa: F401
    from phasefield.vit.study import feature_cache

    feature_cache.study_features(_study(args), args.until)


def block_features_cmd(args):
    from phasefield.cli import _compilation_cache
    from phasefield.vit.study import feature_cache

    _compilation_cache()  # the CLI's persistent XLA cache: a rerun (and predict) compiles nothing again
    feature_cache.block_study_features(_study(args), args.until)


def cmd_analyze(args):
    """main: OUT/analysis.json, docs/images/trainability_*.png and (--ship) the packaged model;
    lr: the analysis per optimizer and learning rate (OUT/analysis.json)."""
    from phasefield.vit.study import loss

    if args.study == "lr":
        from phasefield.vit.study import lr_axis

        return lr_axis.analyze_lr(_study(args), args.folds, args.repeats)
    if args.study in POOLED and args.study != "main":
        print(
            f"the {args.study} study is analyzed together with the main study (same training config): "
            "running the main analysis"
        )
        args.study = "main"
    if args.ship and args.study != "main":
        raise SystemExit(f"--ship writes the packaged model: only from the main study (not {args.study})")
    st = _study(args)
    doc = loss.analyze(st, args.study, args.folds, args.repeats)
    rep = doc["report"]
    loss.write_report(st["out"], rep)
    loss.figures(rep, args.study, dataset=R.dataset_of(st))
    if args.ship:
        print(f"packaged model: {loss.ship(doc, args.folds, args.repeats)}")
    from phasefield.cli.train import _print_report

    _print_report(rep)
    for variant, h in rep.get("holdout", {}).items():
        print(
            f"held out, {variant} ({h['n_test']} configurations trained after the families were fixed; fitted on "
            f"{h['n_train']}): chose {h['chosen']}, R2 {h['r2']:.3f}, RMSE {h['rmse']:.4f}, coverage "
            f"{100 * h['coverage']['runs']:.0f} % of runs, {100 * h['coverage']['means']:.0f} % of seed means; "
            + "; ".join(
                f"{n} ({e['n']}): R2 "
                + ("-" if e["r2"] is None else f"{e['r2']:.3f}")
                + f", coverage {100 * e['coverage']['runs']:.0f} %"
                for n, e in h["by_study"].items()
            )
        )


def cmd_score(args):
    from phasefield.vit.study import scoring

    rep = scoring.score_study(_study(args), args.study, args.fit)
    for e in rep["runs"]:
        print(
            f"{e['run']:48s} loss {e['loss']:.3f}  predicted {e['pred']:.3f}  [{e['interval'][0]:.2f}, "
            f"{e['interval'][1]:.2f}]" + ("" if e["interval"][0] <= e["loss"] <= e["interval"][1] else "  outside")
        )
    print(
        f"{rep['model']} ({rep['family']}, fitted on {rep['fitted_on']} configurations) on {rep['n_runs']} runs it "
        f"never saw: R2 {rep['r2_runs']:.3f}, RMSE {rep['rmse_runs']:.3f}, {100 * rep['coverage_runs']:.0f} % inside "
        f"its interval; mean loss {rep['mean_loss']:.3f}, {rep['at_chance']} near chance"
        + (
            ""
            if rep["r2_means"] is None
            else f"; on the {rep['n_configs']} configurations' seed means: R2 "
            f"{rep['r2_means']:.3f}, RMSE {rep['rmse_means']:.3f}"
        )
    )


def cmd_failure(args):
    """main: OUT/failure.json (--ship: the failure model into the packaged model, and its
    figure); another study: the packaged model and the candidates scored on its runs
    (OUT/failure_score.json)."""
    from phasefield.vit import predict as vpredict
    from phasefield.vit.study import failure_model, pooled

    t0 = time.time()
    table = pooled.pooled_table()
    if args.study == "main":
        rep = failure_model.cross_validate(args.folds, args.repeats, table)
        _print_failure(
            rep["candidates"]["platt_loss"],
            f"platt_loss (shipped), grouped {args.folds}-fold CV x "
            f"{args.repeats}, {rep['n_configs']} configurations x {rep['seeds']} seeds",
        )
        if args.ship:
            path = failure_model.ship(rep, table[0], args.folds, args.repeats)
            print(f"packaged failure model: {path}")
            failure_model.figure(vpredict.load_model(path), table[0])
    else:
        rep = failure_model.score_study(_study(args), args.study, args.fit, table, draw=args.ship)
        for name, c in rep["candidates"].items():
            print(f"  candidate {name:26s} AUC {c['auc']:.3f}  Brier {c['brier']:.4f}")
        _print_failure(
            rep["shipped"],
            f"{rep['model']} (packaged) on the {rep['n_configs']} configurations x 3 seeds "
            f"of '{args.study}' it never saw",
        )
    print(f"({time.time() - t0:.0f} s)")


def cmd_heldout(args):
    from phasefield.vit.study import heldout

    sets = R.HELDOUT.get(args.study)
    rep = heldout.pool(args.study)
    b = rep["bootstrap_95"]
    print(
        f"{rep['model']} on {rep['n_configs']} held-out configurations x 3 seeds ({rep['n_runs']} runs, "
        f"{rep['n_failed']} failed):"
    )
    for k in ("r2_runs", "r2_means", "coverage_runs", "auc", "brier"):
        print(
            f"  {k:14s} {rep[k]:.3f}  (95 % bootstrap {b[k][0]:.3f}-{b[k][1]:.3f})  "
            + "  ".join(f"{n}: {rep['per_study'][n][k]:.3f}" for n in sets)
        )
    print(f"  Brier of the base rate {rep['brier_base']:.4f}")
    for r in rep["reliability"]:
        if r["n"]:
            print(
                f"  P(fail) [{r['lo']:.2f}, {r['hi']:.2f}): {r['n']:4d} runs, mean {r['mean_pred']:.3f}, "
                f"observed {r['observed']:.3f} ({r['failed']})"
            )


def _print_failure(s: dict, title: str) -> None:
    print(
        f"{title}: AUC {s['auc']:.3f}, Brier {s['brier']:.4f} (base rate {s['base_rate']:.3f}: "
        f"{s['brier_base']:.4f}), log loss {s['log_loss']:.3f}; {s['n_failed']} of {s['n_runs']} runs failed"
    )
    print(f"  {'P(fail) bin':14s} {'runs':>5s} {'mean P':>7s} {'observed':>8s}")
    for b in s["reliability"]:
        if b["n"]:
            print(f"  [{b['lo']:.2f}, {b['hi']:.2f})  {b['n']:5d} {b['mean_pred']:7.3f} {b['observed']:8.3f}")


def block_analyze(args):
    """A standard block's study (phasefield.vit.study.blocks): OUT/analysis.json (and the model
    with --ship, and its figures)."""
    from phasefield.vit.study import blocks

    t0 = time.time()
    rep, model = blocks.analyze_block(
        _study(args),
        args.study,
        args.folds,
        args.repeats,
        subset=getattr(args, "subset", None),
        available=getattr(args, "available", False),
    )
    if args.ship:
        path = blocks.ship(model, args.study, args.folds, args.repeats, available=getattr(args, "available", False))
        print(f"packaged model: {path}")
    _print_block(rep, model)
    if args.ship:
        blocks.figures()
    print(f"({time.time() - t0:.0f} s)")
    return rep, model


def _print_block(rep: dict, model: dict) -> None:
    m, nest = rep["models"], rep.get("nested") or {}
    print(
        f"{model['block']}: {rep['n_configs']} configurations, {rep['n_runs']} runs; noise floor RMSE "
        f"{rep['noise_floor']['rmse']:.4f} (best R2 {rep['noise_floor']['r2_max']:.3f})"
    )
    for name in (rep["best_model"], rep["best_exponent_model"], rep["best_raw_model"], rep["best_hybrid_model"]):
        print(f"  {name:26s} ({m[name]['group']:9s}) CV R2 {m[name]['cv_r2']:+.3f}  RMSE {m[name]['cv_rmse']:.4f}")
    if nest:
        print(
            f"  shipped {model['name']}; nested CV R2 {nest['r2']:.3f}, RMSE {nest['rmse']:.4f}, coverage "
            f"{100 * nest['coverage_runs']:.0f} % of runs; chosen {nest['chosen']}"
        )
    for e in rep["rates_vs_raw"]["pairs"]:
        print(
            f"  {e['with_rates']:24s} - {e['raw']:20s}: {e['all']['mean']:+.5f} +- {e['all']['se']:.5f}  "
            + "  ".join(f"L={d}: {v['mean']:+.5f} +- {v['se']:.5f}" for d, v in e["by_depth"].items())
        )
    f = rep["failure"]
    if "shipped" in f:
        print(
            f"  P(fail): Platt on {model['name']}, grouped CV AUC {f['shipped']['auc']:.3f}, Brier "
            f"{f['shipped']['brier']:.4f} ({f['shipped']['n_failed']} of {f['shipped']['n_runs']} runs failed)"
        )
    else:
        print(f"  P(fail): {model['failure']['note']}")


def block_score(args):
    from phasefield.vit.study import scoring

    rep = scoring.score_block(_study(args), args.study, args.fit)
    print(
        f"{rep['block']} model {rep['model']} ({rep['family']}, fitted on {rep['fitted_on']} configurations) on "
        f"{rep['n_runs']} held-out runs ({rep['n_configs']} configurations): loss R2 {rep['r2_runs']:.3f} (runs), "
        f"{rep['r2_means']:.3f} (seed means), RMSE {rep['rmse_runs']:.4f}; {100 * rep['coverage_runs']:.0f} % of "
        f"runs inside the {100 * rep['interval_level']:.0f} % interval"
    )
    _print_failure(rep["failure"], f"P(fail) ({rep['failure_model']})")
    return rep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "plan", "features", "analyze", "score", "failure", "heldout"):
        p = sub.add_parser(name)
        p.add_argument("--study", choices=sorted(STUDIES), default="main", help="which study (default %(default)s)")
        p.add_argument("--plan", default=None, help="depth:configurations,... (default: the study's)")
        p.add_argument("--settings", default=None, help="optimizer:lr,... (default: the study's)")
        p.add_argument("--out", default=None, help="study directory (default: the study's)")
        p.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default: the study's)")
        p.add_argument("--chunk", type=int, default=12, help="runs trained at once (one compiled program)")
        p.add_argument("--until", type=float, default=None, help="start no new block after this many seconds")
        p.add_argument("--quiet", action="store_true")
        p.add_argument(
            "--no-theory",
            action="store_true",
            help="run: leave the rows' lambda columns empty (the features hold the theory)",
        )
        p.add_argument("--folds", type=int, default=5)
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--ship", action="store_true", help="analyze: write the packaged model")
        p.add_argument("--fit", default=None, help="score: a fit file (default: the packaged model)")
        p.add_argument(
            "--available",
            action="store_true",
            help="analyze a block study on the configurations whose features are cached so far",
        )
        p.add_argument(
            "--subset",
            type=int,
            default=None,
            help="analyze a block study on its first N configurations only (a quick check; writes nothing "
            "but --ship's model)",
        )
    args = ap.parse_args(argv)
    block = R.is_block_study(args.study)
    try:
        if args.cmd == "run":
            cmd_run(args)
        elif args.cmd == "plan":
            cmd_plan(args)
        elif args.cmd == "analyze" and block:
            block_analyze(args)
        elif args.cmd == "features" and block:
            block_features_cmd(args)
        elif args.cmd == "features":
            cmd_features(args)
        elif args.cmd == "score" and block:
            block_score(args)
        elif args.cmd == "score":
            cmd_score(args)
        elif args.cmd == "failure":
            cmd_failure(args)
        elif args.cmd == "heldout":
            cmd_heldout(args)
        else:
            cmd_analyze(args)
    except R.StudyError as exc:
        raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())
