#!/usr/bin/env python
"""The trainability study: does the initialization predict the trained loss? (issue 15)

    python scripts/trainability_study.py run       # train (resumes; ~75 min on 2 CPU cores)
    python scripts/trainability_study.py analyze   # CV analysis, figures, packaged model
    python scripts/trainability_study.py plan      # print the design and its projected cost
    python scripts/trainability_study.py score --study corners   # the packaged model on unseen runs
    python scripts/trainability_study.py failure [--ship]        # P(fails to train): grouped CV (issue 35)
    python scripts/trainability_study.py failure --study edges   # ... scored on the boundary runs
    ... --study lr | depth | mnist1d              # the regime studies of issue 27 (see STUDIES)

Digits ViTs with the trainer's defaults (width 64, 15 epochs, batch 64, Adam 1e-3, tanh),
scrambled Sobol configurations over sigma_w in [0.3, 3], sigma_A in [0.3, 4], alpha_A and
alpha_M in [0.05, 0.95] independently, one Sobol sequence (its own scrambling seed) per
depth, 3 seeds per configuration. The runs are trained in blocks of 8 configurations,
depths interleaved (16, 8, 32, 16, 8, 16, ...), so that any prefix of the study is a
balanced design at every depth it reached (the first 2^k points of a Sobol sequence are
balanced). Results go to ``docs/data/trainability/`` (results tables only: no checkpoints,
no per-step metrics) and are committed, so the analysis runs without retraining and a
later session can extend the study with a larger --plan.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(ROOT, "docs", "data", "trainability")

BOUNDS = dict(sigma_w=(0.3, 3.0), sigma_a=(0.3, 4.0), alpha_a=(0.05, 0.95), alpha_m=(0.05, 0.95))
SEEDS = 3
BLOCK = 8
# configurations per depth; measured cost on the 2-core CPU (2026-11-23): 15 / 31 / 62 s per
# run at depth 8 / 16 / 32, so this plan is 4,440 s of training plus ~3 min of compilation.
# The issue asks for 128 / 48 / 48 (about 6 h here): pass --plan 16:128,8:48,32:48.
DEFAULT_PLAN = "16:24,8:16,32:8"
SEC_PER_RUN_PER_BLOCK = 31.0 / 16  # measured, see above

# The studies (issue 27). Each is a set of sweep directories (one training config each:
# the optimizer is part of it, the learning rate is a per-run number) over Sobol designs.
#   main   the original study: Adam 1e-3, depths 16 / 8 / 32, Sobol seed 1000 + L
#   lr     the learning-rate axis on the main study's L = 16 design (the same configurations):
#          Adam at 1e-4 and 3e-4 and SGD with momentum 0.9 at one rate, one seed per
#          configuration (the CPU allows ~50 runs per session); Adam 1e-3 is the main study
#   depth  depth transfer: fresh Sobol designs (seed 2000 + L) at L = 4, 8, 16, 32, Adam 1e-3
#   mnist1d  a harder offline data set: MNIST-1D (the optional mnist1d package), the main
#          study's L = 16 design at Adam 1e-3, one seed; 1-D patches of 4 samples (n = 11)
#   corners  where a user probes first: the box's 16 corners and its centre at L = 16; scored
#          ('score') by the model fitted without them, then pooled into the main analysis
#   faces  the centres of the box's 8 faces at L = 16: scored ('score') by the model fitted
#          on everything before them (never used to choose a family), then pooled
STUDIES = {
    "main": dict(plan=DEFAULT_PLAN, seed0=1000, settings="adam:1e-3", out=DEFAULT_OUT, seeds=SEEDS),
    "lr": dict(plan="16:24", seed0=1000, settings="adam:1e-4,adam:3e-4,sgd_momentum:0.01",
               out=os.path.join(DEFAULT_OUT, "lr"), seeds=1),
    "depth": dict(plan="4:32,8:32,16:32,32:32", seed0=2000, settings="adam:1e-3",
                  out=os.path.join(DEFAULT_OUT, "depth"), seeds=SEEDS),
    "mnist1d": dict(plan="16:24", seed0=1000, settings="adam:1e-3", out=os.path.join(DEFAULT_OUT, "mnist1d"),
                    seeds=1, dataset="mnist1d"),
    "corners": dict(plan="16:17", seed0="corners", settings="adam:1e-3", out=os.path.join(DEFAULT_OUT, "corners"),
                    seeds=SEEDS),
    "faces": dict(plan="16:8", seed0="faces", settings="adam:1e-3", out=os.path.join(DEFAULT_OUT, "faces"),
                  seeds=SEEDS),
    "edges": dict(plan="16:20", seed0="edges", settings="adam:1e-3", out=os.path.join(DEFAULT_OUT, "edges"),
                  seeds=SEEDS),
    # issue 35: configurations trained after the shipped models (loss + failure, fitted on the
    # pooled studies with the edges) were fixed on 2026-11-26: 32 fresh Sobol points of the
    # whole box and 16 of the boundary box (BOUNDARY_BOX), L = 16, 3 seeds; never pooled. Extended
    # the same day (the same Sobol sequences, the same fixed models) to 96 and 48 configurations,
    # so that the held-out AUC rests on more than the 7 failures of the first 144 runs
    "holdout": dict(plan="16:96", seed0=6000, settings="adam:1e-3", out=os.path.join(DEFAULT_OUT, "holdout"),
                    seeds=SEEDS),
    "holdout-boundary": dict(plan="16:48", seed0=7000, settings="adam:1e-3", seeds=SEEDS, bounds="boundary",
                             out=os.path.join(DEFAULT_OUT, "holdout-boundary")),
    # issue 35, sixth stop (2026-11-26): the held-out sets above are spent (scored, then pooled).
    # 'extra' and 'extra-boundary' are more training configurations (fresh Sobol sequences of the
    # whole box at L = 16 / 8 / 32 and of BOUNDARY_BOX at L = 16), trained on a GPU and pooled;
    # 'holdout2' and 'holdout2-boundary' are trained only after the refitted models are committed,
    # and scored by them unchanged (never pooled)
    **{name: dict(plan=plan, seed0=seed0, settings="adam:1e-3", seeds=SEEDS, out=os.path.join(DEFAULT_OUT, name),
                  **({"bounds": "boundary"} if name.endswith("-boundary") else {}))
       for name, plan, seed0 in (("extra", "16:128,8:32,32:16", 8000), ("extra-boundary", "16:48", 9000),
                                 ("holdout2", "16:128", 10000), ("holdout2-boundary", "16:64", 11000),
                                 # the scaled interval (analysis.conformal_scaled) was chosen after
                                 # holdout2's coverage was seen (86 % whole box, 65 % boundary), so
                                 # its test is a third pair, trained after it was fixed
                                 ("holdout3", "16:128", 12000), ("holdout3-boundary", "16:64", 13000))},
    # issue 35: the blocks people train (pre-LN, post-LN ViTs, 4 heads, GELU MLP 4x), Sobol over
    # their init numbers (sigma: every weight's scale, sigma_A = sigma^2; alpha_attn, alpha_mlp:
    # the branch scales) and depth, 3 seeds; the run's sigma_w / alpha_a / alpha_m set sigma /
    # alpha_attn / alpha_mlp (phasefield.vit.train.RUN_NUMBERS)
    "pre-ln": dict(plan="16:48,8:24,32:24", seed0=4000, settings="adam:1e-3", seeds=SEEDS,
                   out=os.path.join(DEFAULT_OUT, "blocks", "pre-ln"), block="pre-ln:heads=4", bounds="block"),
    "post-ln": dict(plan="16:48,8:24,32:24", seed0=5000, settings="adam:1e-3", seeds=SEEDS,
                    out=os.path.join(DEFAULT_OUT, "blocks", "post-ln"), block="post-ln:heads=4", bounds="block"),
}
# the standard blocks' box (run names; sigma_a is not a number of theirs: held at 1)
BLOCK_BOUNDS = dict(sigma_w=(0.2, 2.5), sigma_a=(1.0, 1.0), alpha_a=(0.05, 1.0), alpha_m=(0.05, 1.0))
# ---- issue 35, the standard blocks' loss predictors (engineer "blockpred"; see block_* below) ----
# Held-out sets, trained after the families and the shipping procedure were fixed (commit of
# 2026-11-26, before 04:00 UTC): 16 fresh Sobol configurations per block (8 at L = 16, 4 at L = 8,
# 4 at L = 32; new scrambling seeds 6000 / 7000 + L) x 3 seeds, scored by 'score --study <block>-holdout'
BLOCK_HOLDOUT_PLAN = "16:8,8:4,32:4"
STUDIES.update({
    "pre-ln-holdout": dict(plan=BLOCK_HOLDOUT_PLAN, seed0=6000, settings="adam:1e-3", seeds=SEEDS,
                           out=os.path.join(DEFAULT_OUT, "blocks", "pre-ln-holdout"), block="pre-ln:heads=4",
                           bounds="block", holdout_of="pre-ln"),
    "post-ln-holdout": dict(plan=BLOCK_HOLDOUT_PLAN, seed0=7000, settings="adam:1e-3", seeds=SEEDS,
                            out=os.path.join(DEFAULT_OUT, "blocks", "post-ln-holdout"), block="post-ln:heads=4",
                            bounds="block", holdout_of="post-ln"),
    # the blocks on MNIST-1D (issue 35, "and MNIST-1D"): the L = 16 part of each block study's
    # design (its first 16 Sobol configurations, the same scrambling seed: paired with digits),
    # 3 seeds, the MNIST-1D data set (1-D patches of 4 samples)
    "pre-ln-mnist1d": dict(plan="16:16", seed0=4000, settings="adam:1e-3", seeds=SEEDS, dataset="mnist1d",
                           out=os.path.join(DEFAULT_OUT, "blocks", "pre-ln-mnist1d"), block="pre-ln:heads=4",
                           bounds="block"),
    "post-ln-mnist1d": dict(plan="16:16", seed0=5000, settings="adam:1e-3", seeds=SEEDS, dataset="mnist1d",
                            out=os.path.join(DEFAULT_OUT, "blocks", "post-ln-mnist1d"), block="post-ln:heads=4",
                            bounds="block"),
})
# ---- end of the standard blocks' study entries ----
# issue 35: the failure boundary (alpha_M large; sigma_w small). 'edges' is the 12 midpoints of
# the edges of the box's alpha_M = 0.95 facet (one of sigma_w, sigma_A, alpha_A at its middle, the
# other two at their ends), then 8 scrambled Sobol points of BOUNDARY_BOX. Trained on 2026-11-25
# after the failure model (phasefield.vit.failure.SHIPPED) was fixed on the pooled studies, and
# scored by it ('failure --study edges'), then (2026-11-26) pooled into the shipped models.
BOUNDARY_BOX = dict(sigma_w=(0.3, 1.2), sigma_a=(0.3, 4.0), alpha_a=(0.05, 0.95), alpha_m=(0.6, 0.95))
DATA = {"digits": dict(image_size=8, patch_size=2), "mnist1d": dict(image_size=40, patch_size=4)}
# The main analysis (and the shipped model) pools the studies trained with the main study's
# config (digits, Adam 1e-3, the trainer's defaults): the main design, the depth study, the
# box's corners and its faces (each scored by the model fitted without it first: 'score').
POOLED = ("main", "depth", "corners", "faces", "edges",
          # sixth stop (2026-11-26): the spent held-out sets and the GPU-trained extension
          "holdout", "holdout-boundary", "extra", "extra-boundary")
# The configurations the shipped model's candidate families were chosen on (2026-11-25: the
# effective-depth models were added after looking at these 64; the forest on the branches'
# effective depths after the corners as well); every configuration trained later is held out
# and scores the shipping procedure fitted on these 64.
FAMILIES_FIXED_ON = {"main": DEFAULT_PLAN, "depth": "4:8,8:8"}


def parse_plan(text: str) -> dict:
    plan = {}
    for part in text.split(","):
        d, _, n = part.partition(":")
        plan[int(d)] = int(n)
    return plan


def parse_settings(text: str) -> dict:
    """'adam:1e-4,adam:1e-3,sgd_momentum:0.1' -> {optimizer: [learning rates]}."""
    out = {}
    for part in text.split(","):
        opt, _, lr = part.partition(":")
        out.setdefault(opt, []).append(float(lr))
    return out


def blocks(plan: dict):
    """(depth, lo, hi) blocks of configurations, depths interleaved."""
    done = {d: 0 for d in plan}
    while any(done[d] < plan[d] for d in plan):
        for d in plan:
            if done[d] < plan[d]:
                hi = min(plan[d], done[d] + BLOCK)
                yield d, done[d], hi
                done[d] = hi


def configs(depth: int, n: int, seed0: int | str = 1000, bounds: dict | None = None) -> list:
    """The first ``n`` configurations of a study at ``depth``: its Sobol sequence (scrambling
    seed seed0 + depth); seed0 "corners": the box's 16 corners, then its centre; "faces": the
    centres of its 8 faces (one number at an end of its range, the others at their middles);
    "edges": the 12 edge midpoints of the alpha_M = 0.95 facet, then Sobol points of
    BOUNDARY_BOX (seed 3000 + depth)."""
    from phasefield.vit import design

    mid = {k: (lo + hi) / 2 for k, (lo, hi) in BOUNDS.items()}
    if seed0 == "corners":
        import itertools

        pts = [dict(zip(BOUNDS, v)) for v in itertools.product(*BOUNDS.values())] + [mid]
    elif seed0 == "faces":
        pts = [dict(mid, **{k: end}) for k in BOUNDS for end in BOUNDS[k]]
    elif seed0 == "edges":
        import itertools

        pts = []
        for free in ("sigma_w", "sigma_a", "alpha_a"):
            ends = [k for k in ("sigma_w", "sigma_a", "alpha_a") if k != free]
            for v in itertools.product(*(BOUNDS[k] for k in ends)):
                pts.append(dict(mid, **dict(zip(ends, v)), alpha_m=BOUNDS["alpha_m"][1]))
        if n > len(pts):
            pts += design.sobol(n - len(pts), BOUNDARY_BOX, seed=3000 + depth)
    else:
        pts = design.sobol(n, bounds or BOUNDS, seed=seed0 + depth)
    return [dict(c, depth=depth) for c in pts[:n]]


def study_configs(st: dict, depth: int, n: int) -> list:
    """:func:`configs` in the study's box (the standard blocks': :data:`BLOCK_BOUNDS`)."""
    bounds = {"block": BLOCK_BOUNDS, "boundary": BOUNDARY_BOX}.get(st.get("bounds"))
    return configs(depth, n, st["seed0"], bounds)


def _study(args) -> dict:
    st = dict(STUDIES[args.study])
    for k in ("plan", "settings", "out", "seeds"):
        if getattr(args, k, None):
            st[k] = getattr(args, k)
    return st


def sweep_dirs(st: dict) -> dict:
    """{optimizer: sweep directory} of a study (the main and depth studies: one Adam directory)."""
    opts = parse_settings(st["settings"])
    if len(opts) == 1 and "adam" in opts:
        return {"adam": st["out"]}
    return {opt: os.path.join(st["out"], opt) for opt in opts}


def cmd_plan(args):
    st = _study(args)
    plan, settings = parse_plan(st["plan"]), parse_settings(st["settings"])
    n_set = sum(len(v) for v in settings.values())
    total = 0.0
    for d, lo, hi in blocks(plan):
        cost = (hi - lo) * st["seeds"] * n_set * SEC_PER_RUN_PER_BLOCK * d
        total += cost
        print(f"depth {d:3d}  configurations {lo:3d}-{hi:3d}  {(hi - lo) * st['seeds'] * n_set:3d} runs  ~{cost / 60:5.1f} min "
              f"(cumulative {total / 60:5.1f} min)")


def _train_config(optimizer: str = "adam", dataset: str = "digits", block: str = "paper"):
    from phasefield.vit.train import TrainConfig

    return TrainConfig(dataset=dataset, **DATA[dataset], batch_size=64, depth=16, optimizer=optimizer, block=block)


def _dataset(st: dict) -> str:
    return st.get("dataset", "digits")


def cmd_run(args):
    import phasefield

    phasefield.use_all_cpu_cores()  # the script owns its process: shard chunks over every core
    from phasefield.vit import data as vdata
    from phasefield.vit import design
    from phasefield.vit import sweep as vsweep

    st = _study(args)
    plan, settings = parse_plan(st["plan"]), parse_settings(st["settings"])
    dirs = sweep_dirs(st)
    dataset = _dataset(st)
    data = vdata.load(dataset, DATA[dataset]["image_size"])
    trainers = {opt: {} for opt in settings}
    t0 = time.time()
    for d, lo, hi in blocks(plan):
        for opt, lrs in settings.items():
            if args.until and time.time() - t0 > args.until:
                print(f"stopping: --until {args.until:.0f} s reached (resume by rerunning)", flush=True)
                return
            runs = design.expand(study_configs(st, d, hi)[lo:hi], lrs=lrs, seeds=st["seeds"])
            print(f"[{time.time() - t0:7.0f} s] depth {d}, configurations {lo}-{hi}, {opt} lr "
                  f"{', '.join(f'{v:g}' for v in lrs)}", flush=True)
            s = vsweep.run_sweep(_train_config(opt, dataset, st.get("block", "paper")), runs, dirs[opt], data, chunk=args.chunk, progress=not args.quiet,
                                 metrics=False, checkpoints=False, trainers=trainers[opt],
                                 theory=not args.no_theory)
            print(f"   trained {s['trained']} ({s['already_done']} done before, {s['diverged']} diverged) "
                  f"in {s['seconds']:.0f} s", flush=True)
    for opt, out in dirs.items():
        print(f"{opt}: {len(vsweep.read_results(out))} runs in {out}")


def feature_path(out):
    return os.path.join(out, "features.csv")


def _hp_key(cid: str) -> str:
    """A configuration's name without its learning rate (the features do not depend on it)."""
    import re

    return re.sub(r"_lr[^_]+", "", cid)


def _read_feature_rows(path: str) -> dict:
    import csv

    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["config"]: r for r in csv.DictReader(f)}


def _batches(items: list, until: float | None, size: int = 8):
    """``(start, batch)`` of ``items``, ``size`` at a time; stops (and says so) once ``until``
    seconds have passed (the caller's work is appended per batch: a rerun resumes)."""
    t0 = time.time()
    for i in range(0, len(items), size):
        if until and time.time() - t0 > until:
            print(f"stopping: --until {until:.0f} s reached (resume by rerunning)", flush=True)
            return
        yield i, items[i:i + size]


def _append_features(path: str, names: list, ids: list, feats: dict) -> None:
    """Rows ``config, <names>`` of ``feats`` appended to the features cache ``path`` (header first)."""
    import csv

    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["config"] + names)
        for j, cid in enumerate(ids):
            w.writerow([cid] + [repr(float(feats[k][j])) for k in names])


def cmd_features(args):
    """Measure the input geometry once and compute the theory features of every planned
    configuration not yet in the study's features.csv (appended: resumable). Rows of the
    same hyperparameters in the main study's features.csv are reused (features do not
    depend on the learning rate)."""
    import csv
    import json
    import shutil

    import phasefield  # noqa: F401
    from phasefield.vit import data as vdata
    from phasefield.vit import design, features

    st = _study(args)
    dataset = _dataset(st)
    cfg = _train_config(dataset=dataset)
    out = st["out"]
    os.makedirs(out, exist_ok=True)
    gpath = os.path.join(out, "input_geometry.json")
    main_g = os.path.join(DEFAULT_OUT, "input_geometry.json")
    same_data = dataset == "digits"      # the main study's data, embedding and token count
    if not os.path.exists(gpath) and os.path.exists(main_g) and out != DEFAULT_OUT and same_data:
        shutil.copy(main_g, gpath)  # the same trainer config, data and embedding: the same geometry
    if not os.path.exists(gpath):
        geo = features.input_geometry(cfg, vdata.load(dataset, cfg.image_size), inits=16, images=512)
        with open(gpath + ".part", "w") as f:
            json.dump(geo, f, indent=1)
        os.replace(gpath + ".part", gpath)
    with open(gpath) as f:
        geo = json.load(f)
    print(f"input geometry: q0 = {geo['q0']:.4f} +- {geo['q0_se']:.4f}, rho0 = {geo['rho0']:.4f} +- {geo['rho0_se']:.4f}")
    fpath = feature_path(out)
    have = _read_feature_rows(fpath)
    known = ({_hp_key(cid): r for cid, r in _read_feature_rows(feature_path(DEFAULT_OUT)).items()}
             if same_data else {})
    plan, settings = parse_plan(st["plan"]), parse_settings(st["settings"])
    lrs = sorted({v for vals in settings.values() for v in vals})
    todo, reuse = [], []
    for d, lo, hi in blocks(plan):
        for c in study_configs(st, d, hi)[lo:hi]:
            for lr in lrs:
                c2 = dict(c, lr=lr)
                cid = design.config_id(c2)
                if cid in have:
                    continue
                src = known.get(_hp_key(cid))
                (reuse if src is not None else todo).append((cid, c2, src))
                have[cid] = True
    names = None
    if reuse:
        names = sorted(k for k in reuse[0][2] if k != "config")
        new = not os.path.exists(fpath)
        with open(fpath, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["config"] + names)
            for cid, _, src in reuse:
                w.writerow([cid] + [src[k] for k in names])
        print(f"reused the features of {len(reuse)} configurations from {feature_path(DEFAULT_OUT)}")
    for i, part in _batches(todo, args.until):
        t0 = time.time()
        feats = features.features(cfg, [c for _, c, _ in part], geo["q0"], geo["rho0"])
        names = sorted(feats)
        _append_features(fpath, names, [cid for cid, _, _ in part], feats)
        print(f"features of {i + len(part)}/{len(todo)} configurations ({time.time() - t0:.0f} s)", flush=True)


def cmd_analyze(args):
    """Cross-validated analysis of whatever the study has trained so far. main: writes
    OUT/analysis.json, docs/images/trainability_*.png and (--ship) the packaged model, and
    scores the shipping procedure on the configurations beyond the default plan (held out:
    trained after the model families were chosen). lr: the analysis per optimizer and
    learning rate, written to OUT/analysis.json."""
    if args.study == "lr":
        return analyze_lr(args)
    if args.study in POOLED and args.study != "main":
        print(f"the {args.study} study is analyzed together with the main study (same training config): "
              "running the main analysis")
        args.study = "main"
    if args.ship and args.study != "main":
        raise SystemExit(f"--ship writes the packaged model: only from the main study (not {args.study})")
    import json

    import numpy as np

    from phasefield.vit import analysis, features, figure, models, predict
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id
    from phasefield.vit.train import TrainConfig

    out = _study(args)["out"]
    cfg = TrainConfig.from_dict(vsweep.read_sweep(out)["config"])
    dirs = [out]
    if args.study == "main":
        for name in POOLED[1:]:
            d = STUDIES[name]["out"]
            if os.path.exists(os.path.join(d, "results.jsonl")):
                if TrainConfig.from_dict(vsweep.read_sweep(d)["config"]) != cfg:
                    raise SystemExit(f"{d} was trained with another config than {out}: cannot pool")
                dirs.append(d)
    rows, source = [], {}
    for d in dirs:
        for r in vsweep.read_results(d):
            rows.append(r)
            source[config_id(r)] = next(n for n in STUDIES if STUDIES[n]["out"] == d)
    geometry, feats, order = features.read_caches(dirs, cfg)
    missing = {config_id(r) for r in rows} - set(order or [])
    if missing:
        print(f"{len(missing)} configurations have no features yet (run 'features' first); left out")
        rows = [r for r in rows if config_id(r) not in missing]
    print(f"{len({config_id(r) for r in rows})} configurations, {len(rows)} runs from " + ", ".join(
        os.path.relpath(d, ROOT) for d in dirs), flush=True)
    # the paper block's interval follows the configuration (sixth stop: the Mondrian bins of the
    # predicted loss covered 70 % of the boundary box's runs and 84 % of the rest under CV)
    interval = "scaled" if args.study == "main" else "binned"
    doc = predict.fit_sweep(rows, 10, cfg, geometry, feats, order, k=args.folds, repeats=args.repeats,
                            interval=interval)
    rep = doc["report"]
    planned = {config_id(dict(c, lr=1e-3)) for name, plan in FAMILIES_FIXED_ON.items()
               for d, lo, hi in blocks(parse_plan(plan)) for c in configs(d, hi, STUDIES[name]["seed0"])[lo:hi]}
    tab = {k: (np.asarray(v) if isinstance(v, list) and k not in analysis.LISTS else v)
           for k, v in rep["table"].items()}
    extra = np.array([c not in planned for c in tab["config"]])
    if extra.any() and (~extra).sum() >= 10:
        specs = analysis.model_specs(tab)
        ship = analysis.shippable(specs)
        rep["holdout"] = {}
        # the procedure as shipped, and as it was before the effective-depth candidates
        for variant, names in (("shipped", ship), ("without_effective_depth",
                                                    [n for n in ship if not set(analysis.EFFECTIVE) & set(specs[n][1])])):
            h = analysis.evaluate_split(tab, ~extra, extra, names, specs, args.folds, interval=interval)
            y, p = np.asarray(h["loss"]), np.asarray(h["pred"])
            held = [c for c, e in zip(tab["config"], extra) if e]
            r2 = models.r2
            by_study = {}
            for name in dict.fromkeys(source[c] for c in held):
                m = np.array([source[c] == name for c in held])
                lo, hi = (np.asarray(b)[m] for b in h["bounds"])
                by_study[name] = dict(n=int(m.sum()), r2=r2(y[m], p[m]) if m.sum() > 1 else None,
                                      rmse=float(np.sqrt(np.mean((y[m] - p[m]) ** 2))),
                                      coverage=analysis.bounds_coverage(
                                          lo, hi, [h["run_losses"][i] for i in np.flatnonzero(m)]))
            rep["holdout"][variant] = dict(
                n_train=int((~extra).sum()), n_test=int(extra.sum()), chosen=h["chosen"], r2=r2(y, p),
                rmse=float(np.sqrt(np.mean((y - p) ** 2))), coverage=h["coverage"], by_study=by_study,
                configs=held, pred=h["pred"], loss=h["loss"])
        doc["model"]["holdout"] = {k: v for k, v in rep["holdout"]["shipped"].items()
                                   if k not in ("configs", "pred", "loss")}
    from phasefield import io

    with open(os.path.join(out, "analysis.json"), "w") as f:
        f.write(io.dumps(rep, indent=1))
    img = os.path.join(ROOT, "docs", "images")
    tag = "" if args.study == "main" else f"_{args.study}"
    figure.fig7(rep, os.path.join(img, f"trainability{tag}_fig7.png"), dataset=_dataset(_study(args)))
    figure.plane(rep, os.path.join(img, f"trainability{tag}_plane.png"))
    figure.transfer(rep, os.path.join(img, f"trainability{tag}_transfer.png"))
    if "effective_depth" in rep["table"] and args.study == "main":
        figure.shipped(rep, os.path.join(img, "trainability_shipped.png"),
                       held_out=rep.get("holdout", {}).get("shipped", {}).get("configs"))
    if args.ship:
        path = os.path.join(ROOT, "phasefield", "vit", predict.RESOURCE)
        with open(path, "w") as f:
            f.write(io.dumps(doc["model"], indent=1))
        print(f"packaged model: {path}")
    from phasefield.cli.train import _print_report

    _print_report(rep)
    for variant, h in rep.get("holdout", {}).items():
        print(f"held out, {variant} ({h['n_test']} configurations trained after the families were fixed; fitted on "
              f"{h['n_train']}): chose {h['chosen']}, R2 {h['r2']:.3f}, RMSE {h['rmse']:.4f}, coverage "
              f"{100 * h['coverage']['runs']:.0f} % of runs, {100 * h['coverage']['means']:.0f} % of seed means; " +
              "; ".join(f"{n} ({e['n']}): R2 " + ("-" if e["r2"] is None else f"{e['r2']:.3f}") +
                        f", coverage {100 * e['coverage']['runs']:.0f} %" for n, e in h["by_study"].items()))


def analyze_lr(args):
    """The learning-rate axis: per (optimizer, lr), the cross-validated families on the same
    L = 16 configurations (Adam 1e-3: the main study's runs, seed 0 alone to match the one
    seed of the others, and all three seeds), and the exponents' share of the explained
    variance, max(0, R2_CV(best exponent model)) / R2_CV(best model)."""
    import json
    import math

    import numpy as np

    from phasefield import io
    from phasefield.vit import analysis
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id

    st = _study(args)
    main_feats = _read_feature_rows(feature_path(DEFAULT_OUT))
    fe = {_hp_key(cid): r for cid, r in main_feats.items()}
    names = [k for k in next(iter(main_feats.values())) if k != "config"]
    main_rows = vsweep.read_results(DEFAULT_OUT)
    design_ids = {_hp_key(config_id(dict(c, lr=1e-3))) for c in configs(16, 24)}
    sets = {}
    for opt, out in sweep_dirs(st).items():
        for r in vsweep.read_results(out) if os.path.exists(os.path.join(out, "results.jsonl")) else []:
            sets.setdefault((opt, float(r["lr"])), []).append(r)
    ids_done = {k: {_hp_key(config_id(r)) for r in v} for k, v in sets.items()}
    common = set.intersection(*ids_done.values()) if ids_done else set()
    base = [r for r in main_rows if _hp_key(config_id(r)) in design_ids]
    sets[("adam", 1e-3)] = [r for r in base if int(r["seed"]) == 0]
    sets[("adam (3 seeds)", 1e-3)] = base
    width = _train_config().width
    res = {}
    for (opt, lr), rows in sorted(sets.items(), key=lambda kv: (kv[0][0].startswith("sgd"), kv[0][1], kv[0][0])):
        rows = [r for r in rows if _hp_key(config_id(r)) in common] if common else rows
        order = sorted({config_id(r) for r in rows})
        feats = {k: np.array([float(fe[_hp_key(c)][k]) for c in order]) for k in names}
        rep = analysis.analyze(rows, 10, feats, order, k=args.folds, repeats=args.repeats, nested_cv=False)
        if not rep["cross_validated"]:
            print(f"{opt:15s} lr {lr:<7g}: {rep['message']}")
            continue
        m = rep["models"]
        r2 = lambda nm: m[nm]["cv_r2"]
        be, br, bh = rep["best_exponent_model"], rep["best_raw_model"], rep["best_hybrid_model"]
        best = max((be, br, bh), key=r2)
        tab = rep["table"]
        sw = np.asarray(tab["sigma_w"])
        res[f"{opt} {lr:g}"] = dict(
            optimizer=opt, lr=lr, n_configs=rep["n_configs"], n_runs=rep["n_runs"],
            relative_update=float(np.median(lr * math.sqrt(width) / sw)) if not opt.startswith("sgd") else None,
            mean_loss=float(np.mean(tab["loss"])), at_chance=int(np.sum(tab["n_failed"])),
            loss_sd=float(np.std(tab["loss"])), best_exponent=be, best_exponent_r2=r2(be),
            best_exponent_rmse=m[be]["cv_rmse"], best_raw=br, best_raw_r2=r2(br), best_raw_rmse=m[br]["cv_rmse"],
            best_hybrid=bh, best_hybrid_r2=r2(bh), constant_rmse=m["constant"]["cv_rmse"],
            exponent_share=float(max(0.0, r2(be)) / r2(best)) if r2(best) > 0 else None,
            exponent_vs_raw=rep["best_vs_raw_cv"].get(br), noise_floor=rep["noise_floor"].get("rmse"),
            r2={nm: v["cv_r2"] for nm, v in m.items()})
        e = res[f"{opt} {lr:g}"]
        print(f"{opt:15s} lr {lr:<7g} {e['n_configs']:3d} configs  mean loss {e['mean_loss']:.3f} (sd {e['loss_sd']:.3f}, "
              f"{e['at_chance']} at chance)  CV R2: exponents {e['best_exponent_r2']:+.3f} ({be}), raw "
              f"{e['best_raw_r2']:+.3f} ({br}), hybrid {e['best_hybrid_r2']:+.3f} ({bh}); exponents' share "
              + ("-" if e["exponent_share"] is None else f"{e['exponent_share']:.2f}")
              + f"; paired sq. err. exp - raw {e['exponent_vs_raw']['mean']:+.4f} +- {e['exponent_vs_raw']['se']:.4f}",
              flush=True)
    with open(os.path.join(st["out"], "analysis.json"), "w") as f:
        f.write(io.dumps(res, indent=1))


def cmd_score(args):
    """Score the packaged model (or --fit FILE) on a study's runs it never saw: R^2 of its
    predictions over single runs and over seed means, and the coverage of its interval.
    Written to OUT/score.json."""
    import numpy as np

    from phasefield import io
    from phasefield.vit import analysis, models
    from phasefield.vit import predict as vpredict
    from phasefield.vit import sweep as vsweep

    out = _study(args)["out"]
    rows = vsweep.read_results(out)
    if not rows:
        raise SystemExit(f"{out} has no runs yet ('run --study {args.study}' first)")
    doc = vpredict.load_model(args.fit)
    col = lambda k: np.array([float(r[k]) for r in rows])
    res = vpredict.predict(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc)
    l_sat = doc["L_sat"]
    y = np.array([l_sat if analysis._failed(r, "test_loss", l_sat) else float(r["test_loss"]) for r in rows])
    p = np.array([r["predicted_loss"] for r in res])
    lo, hi = np.array([r["interval"] for r in res]).T
    r2 = models.r2
    from phasefield.vit.design import config_id

    ids = [config_id(r) for r in rows]
    groups = {c: [i for i, d in enumerate(ids) if d == c] for c in dict.fromkeys(ids)}
    ym = np.array([y[g].mean() for g in groups.values()])
    pm = np.array([p[g[0]] for g in groups.values()])
    rep = dict(model=doc.get("name"), family=doc.get("family"), fitted_on=doc.get("n_configs"), n_runs=len(rows),
               n_configs=len(groups), r2_means=r2(ym, pm) if len(groups) < len(rows) else None,
               rmse_means=float(np.sqrt(np.mean((ym - pm) ** 2))),
               r2_runs=r2(y, p), rmse_runs=float(np.sqrt(np.mean((y - p) ** 2))),
               coverage_runs=float(np.mean((lo <= y) & (y <= hi))), mean_loss=float(y.mean()),
               at_chance=int(sum(analysis.at_chance(r, l_sat) for r in rows)),  # the shared criterion (issue 35)
               warned=int(sum(bool(r["warnings"]) for r in res)),
               runs=[dict(run=r["run"], loss=float(a), pred=float(b), interval=[float(c), float(d)])
                     for r, a, b, c, d in zip(rows, y, p, lo, hi)])
    with io.atomic_path(os.path.join(out, "score.json")) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(rep, indent=1))
    for e in rep["runs"]:
        print(f"{e['run']:48s} loss {e['loss']:.3f}  predicted {e['pred']:.3f}  [{e['interval'][0]:.2f}, "
              f"{e['interval'][1]:.2f}]" + ("" if e["interval"][0] <= e["loss"] <= e["interval"][1] else "  outside"))
    print(f"{rep['model']} ({rep['family']}, fitted on {rep['fitted_on']} configurations) on {rep['n_runs']} runs it "
          f"never saw: R2 {rep['r2_runs']:.3f}, RMSE {rep['rmse_runs']:.3f}, {100 * rep['coverage_runs']:.0f} % inside "
          f"its interval; mean loss {rep['mean_loss']:.3f}, {rep['at_chance']} near chance"
          + ("" if rep["r2_means"] is None else f"; on the {rep['n_configs']} configurations' seed means: R2 "
             f"{rep['r2_means']:.3f}, RMSE {rep['rmse_means']:.3f}"))


def _pooled_table():
    """The configuration table of the pooled studies (POOLED; the shipped model's data) with
    their cached theory features attached, its run table, and the training config."""
    import numpy as np

    from phasefield.vit import analysis, features, failure
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id
    from phasefield.vit.train import TrainConfig

    dirs = [STUDIES[n]["out"] for n in POOLED if os.path.exists(os.path.join(STUDIES[n]["out"], "results.jsonl"))]
    cfg = TrainConfig.from_dict(vsweep.read_sweep(dirs[0])["config"])
    rows = [r for d in dirs for r in vsweep.read_results(d)]
    geometry, feats, order = features.read_caches(dirs, cfg)
    idx = {c: i for i, c in enumerate(order)}
    rows = [r for r in rows if config_id(r) in idx]
    tab = analysis.configurations(rows, 10)
    o = np.array([idx[c] for c in tab["config"]])
    tab = analysis.add_features(tab, {k: np.asarray(v)[o] for k, v in feats.items()})
    return tab, failure.run_table(tab), cfg


def _slim(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "oof"}


def cmd_failure(args):
    """P(fails to train) (issue 35). main: grouped CV (configurations whole) of the failure
    model candidates and of the shipped stacked model on the pooled studies, written to
    OUT/failure.json; --ship also puts the failure model (Platt scaling of the shipped loss
    model's out-of-fold predictions in analysis.json) into the packaged model, and draws
    docs/images/trainability_failure.png. Another study (edges): the packaged model and the
    candidates fitted on the pooled studies scored on its runs, which none of them saw
    (OUT/failure_score.json)."""
    import datetime
    import json

    import numpy as np

    from phasefield import io
    from phasefield.vit import analysis, failure
    from phasefield.vit import predict as vpredict

    t0 = time.time()
    tab, T, cfg = _pooled_table()
    if args.study == "main":
        specs = analysis.model_specs(tab)
        rep = dict(date=datetime.date.today().isoformat(), criterion="diverged, or test loss >= 0.95 log C",
                   n_configs=int(len(tab["loss"])), n_runs=int(len(T["failed"])), n_failed=int(T["failed"].sum()),
                   seeds=int(np.median(tab["n_seeds"])), k_folds=args.folds, repeats=args.repeats,
                   shipped=failure.SHIPPED, candidates={})
        main_rep = json.load(open(os.path.join(DEFAULT_OUT, "analysis.json")))
        # Platt scaling of the shipped loss model (the main analysis's choice)
        rep["stacked_on"] = main_rep["best_model"]
        st = failure.cross_validate_stacked(tab, T, specs[main_rep["best_model"]], args.folds, args.repeats)
        rep["candidates"]["platt_loss"] = _slim(st)
        oof = dict(zip(main_rep["table"]["config"], main_rep["models"][main_rep["best_model"]]["oof"]))
        # the loss model's own out-of-fold ranking (what a user of 'predict' had before)
        rank = np.array([oof[c] for c in T["config"]])
        rep["loss_ranking"] = dict(auc=failure.auc(T["failed"], rank), model=main_rep["best_model"],
                                   note="AUC of ranking runs by the loss model's out-of-fold predicted loss")
        for name in failure.CANDIDATES:
            rep["candidates"][name] = _slim(failure.cross_validate(name, T, args.folds, args.repeats))
            print(f"{name:26s} AUC {rep['candidates'][name]['auc']:.3f}  Brier {rep['candidates'][name]['brier']:.4f}",
                  flush=True)
        rep["oof_shipped"] = dict(config=T["config"], failed=T["failed"].tolist(), p=st["oof"])
        with io.atomic_path(os.path.join(DEFAULT_OUT, "failure.json")) as tmp:
            with open(tmp, "w") as f:
                f.write(io.dumps(rep, indent=1))
        _print_failure(rep["candidates"]["platt_loss"], f"platt_loss (shipped), grouped {args.folds}-fold CV x "
                       f"{args.repeats}, {rep['n_configs']} configurations x {rep['seeds']} seeds")
        if args.ship:
            path = os.path.join(ROOT, "phasefield", "vit", vpredict.RESOURCE)
            with open(path) as f:
                doc = json.load(f)
            order = main_rep["table"]["config"]
            run_failed = dict(zip(tab["config"], tab["run_failed"]))
            doc["failure"] = vpredict.failure_doc([oof[c] for c in order], [run_failed[c] for c in order],
                                                  doc["L_sat"], main_rep["best_model"])
            doc["failure"]["cv"] = {k: v for k, v in rep["candidates"]["platt_loss"].items()
                                    if k in ("auc", "brier", "log_loss", "brier_base", "n_runs", "n_failed",
                                             "k_folds", "repeats", "reliability")}
            doc["failure"]["cv"]["n_configs"] = rep["n_configs"]
            with io.atomic_path(path) as tmp:
                with open(tmp, "w") as f:
                    f.write(io.dumps(doc, indent=1))
            print(f"packaged failure model: {path}")
            from phasefield.vit import figure

            figure.failure_slice(vpredict.load_model(path), tab,
                                 os.path.join(ROOT, "docs", "images", "trainability_failure.png"))
    else:
        from phasefield.vit import sweep as vsweep

        out = _study(args)["out"]
        rows = vsweep.read_results(out)
        doc = vpredict.load_model(args.fit)
        l_sat = doc["L_sat"]
        col = lambda k: np.array([float(r[k]) for r in rows])
        res = vpredict.predict(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc)
        y = np.array([int(analysis.at_chance(r, l_sat)) for r in rows])
        p = np.array([r["p_fail"] for r in res])
        from phasefield.vit.design import config_id

        rep = dict(date=datetime.date.today().isoformat(), study=args.study, n_runs=len(rows),
                   n_configs=len({config_id(r) for r in rows}), model=doc["failure"]["name"],
                   fitted_on=doc["failure"]["n_configs"])
        rep["shipped"] = failure.scores(y, p)
        # the candidates, fitted on the pooled studies (chosen before: the shipped one is fixed)
        tab_new = analysis.add_features(analysis.configurations(rows, 10), {})
        T_new = failure.run_table(tab_new)
        rep["candidates"] = {}
        for name in failure.CANDIDATES:
            m = failure.fit(name, T)
            if not set(m.features) <= set(T_new):
                continue
            rep["candidates"][name] = {k: v for k, v in failure.scores(T_new["failed"], m.predict_proba(
                failure.X_of(T_new, m.features))).items() if k != "reliability"}
        rep["runs"] = [dict(run=r["run"], failed=int(a), p_fail=float(b), loss=float(r["test_loss"]),
                            predicted_loss=float(q["predicted_loss"])) for r, a, b, q in zip(rows, y, p, res)]
        with io.atomic_path(os.path.join(out, "failure_score.json")) as tmp:
            with open(tmp, "w") as f:
                f.write(io.dumps(rep, indent=1))
        for name, c in rep["candidates"].items():
            print(f"  candidate {name:26s} AUC {c['auc']:.3f}  Brier {c['brier']:.4f}")
        if args.ship:     # the figure with the held-out configurations marked
            from phasefield.vit import figure

            ids = [config_id(r) for r in rows]
            cs = {c: [i for i, d in enumerate(ids) if d == c] for c in dict.fromkeys(ids)}
            held = dict(sigma_w=[float(rows[g[0]]["sigma_w"]) for g in cs.values()],
                        alpha_m=[float(rows[g[0]]["alpha_m"]) for g in cs.values()],
                        frac=[float(np.mean(y[g])) for g in cs.values()])
            figure.failure_slice(doc, tab, os.path.join(ROOT, "docs", "images", "trainability_failure.png"),
                                 held_out=held)
        _print_failure(rep["shipped"], f"{rep['model']} (packaged) on the {rep['n_configs']} configurations x 3 seeds "
                       f"of '{args.study}' it never saw")
    print(f"({time.time() - t0:.0f} s)")


HELDOUT = {"holdout2": ("holdout2", "holdout2-boundary"), "holdout3": ("holdout3", "holdout3-boundary")}


def cmd_heldout(args):
    """A pair of held-out sets of the sixth stop together (issue 35; ``--study holdout2`` or
    ``holdout3``): the packaged models' scores (``score`` and ``failure --study``, which must
    have run first) pooled over the runs of both sets — loss R^2 over runs and over seed means,
    the 80 % interval's coverage, P(fail) AUC, Brier score and reliability — with 95 % bootstrap
    intervals over configurations (2,000 resamples, seed 0: the seeds of a configuration are
    resampled together). Written to docs/data/trainability/<study>.json (heldout2.json for
    holdout2)."""
    if args.study not in HELDOUT:
        raise SystemExit(f"heldout pools {' or '.join(HELDOUT)} (--study), not {args.study}")
    sets = HELDOUT[args.study]
    import json

    import numpy as np

    from phasefield import io
    from phasefield.vit import failure, models

    runs, model = [], None
    for name in sets:
        out = STUDIES[name]["out"]
        for fn, cmd in (("score.json", "score"), ("failure_score.json", "failure")):
            if not os.path.exists(os.path.join(out, fn)):
                raise SystemExit(f"{out} has no {fn} yet ('{cmd} --study {name}' first)")
        sc = json.load(open(os.path.join(out, "score.json")))
        fs = json.load(open(os.path.join(out, "failure_score.json")))
        model = model or sc["model"]
        pf = {r["run"]: r for r in fs["runs"]}
        for r in sc["runs"]:
            runs.append(dict(r, study=name, config=r["run"].rsplit("_s", 1)[0], failed=pf[r["run"]]["failed"],
                             p_fail=pf[r["run"]]["p_fail"]))
    cfgs = list(dict.fromkeys(r["config"] for r in runs))
    by = {c: [i for i, r in enumerate(runs) if r["config"] == c] for c in cfgs}
    y = np.array([r["loss"] for r in runs])
    p = np.array([r["pred"] for r in runs])
    lo, hi = np.array([r["interval"] for r in runs]).T
    f = np.array([r["failed"] for r in runs])
    q = np.array([r["p_fail"] for r in runs])

    def summary(sel_cfgs):
        ii = np.concatenate([by[c] for c in sel_cfgs])
        ym = np.array([y[by[c]].mean() for c in sel_cfgs])
        pm = np.array([p[by[c][0]] for c in sel_cfgs])
        return dict(r2_runs=models.r2(y[ii], p[ii]), r2_means=models.r2(ym, pm),
                    rmse_runs=models.rmse(y[ii], p[ii]), coverage_runs=float(np.mean((lo[ii] <= y[ii]) & (y[ii] <= hi[ii]))),
                    auc=failure.auc(f[ii], q[ii]), brier=failure.brier(f[ii], q[ii]))

    rep = dict(studies=list(sets), n_configs=len(cfgs), n_runs=len(runs), n_failed=int(f.sum()), model=model)
    rep.update(summary(cfgs))
    rep["brier_base"] = failure.brier(f, np.full(len(f), f.mean()))
    rep["reliability"] = failure.reliability(f, q)
    rng = np.random.default_rng(0)
    boot = [summary([cfgs[j] for j in rng.integers(0, len(cfgs), len(cfgs))]) for _ in range(2000)]
    rep["bootstrap_95"] = {k: [float(np.nanpercentile([b[k] for b in boot], 2.5)),
                               float(np.nanpercentile([b[k] for b in boot], 97.5))] for k in boot[0]}
    rep["bootstrap"] = "2,000 resamples of the configurations (seeds kept together), seed 0"
    rep["per_study"] = {n: summary([c for c in cfgs if runs[by[c][0]]["study"] == n]) for n in sets}
    with io.atomic_path(os.path.join(DEFAULT_OUT, "held" + args.study.removeprefix("hold") + ".json")) as tmp:
        with open(tmp, "w") as fh:
            fh.write(io.dumps(rep, indent=1))
    b = rep["bootstrap_95"]
    print(f"{rep['model']} on {rep['n_configs']} held-out configurations x 3 seeds ({rep['n_runs']} runs, "
          f"{rep['n_failed']} failed):")
    for k in ("r2_runs", "r2_means", "coverage_runs", "auc", "brier"):
        print(f"  {k:14s} {rep[k]:.3f}  (95 % bootstrap {b[k][0]:.3f}-{b[k][1]:.3f})  " +
              "  ".join(f"{n}: {rep['per_study'][n][k]:.3f}" for n in sets))
    print(f"  Brier of the base rate {rep['brier_base']:.4f}")
    for r in rep["reliability"]:
        if r["n"]:
            print(f"  P(fail) [{r['lo']:.2f}, {r['hi']:.2f}): {r['n']:4d} runs, mean {r['mean_pred']:.3f}, "
                  f"observed {r['observed']:.3f} ({r['failed']})")


def _print_failure(s: dict, title: str) -> None:
    print(f"{title}: AUC {s['auc']:.3f}, Brier {s['brier']:.4f} (base rate {s['base_rate']:.3f}: "
          f"{s['brier_base']:.4f}), log loss {s['log_loss']:.3f}; {s['n_failed']} of {s['n_runs']} runs failed")
    print(f"  {'P(fail) bin':14s} {'runs':>5s} {'mean P':>7s} {'observed':>8s}")
    for b in s["reliability"]:
        if b["n"]:
            print(f"  [{b['lo']:.2f}, {b['hi']:.2f})  {b['n']:5d} {b['mean_pred']:7.3f} {b['observed']:8.3f}")


# ------------------------------------------------------------------------------------------------
# issue 35: loss predictors for the standard blocks (pre-LN, post-LN; engineer "blockpred").
# 'features --study pre-ln' caches the block's own theory per trained configuration; 'analyze
# --study pre-ln [--ship]' runs the paper block's candidate families and shipping procedure
# (phasefield.vit.predict.fit_sweep) and writes the model to phasefield/vit/models/<block>.json;
# 'score --study pre-ln-holdout' scores the shipped model on the held-out set.
BLOCK_ATTENTION = "exact"     # the accurate softmax map for the block's theory (passed explicitly)


def _is_block_study(name: str) -> bool:
    return STUDIES[name].get("bounds") == "block"


def _block_cfg(st: dict):
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.train import TrainConfig

    path = os.path.join(st["out"], "sweep.json")
    if os.path.exists(path):
        return TrainConfig.from_dict(vsweep.read_sweep(st["out"])["config"])
    return _train_config(block=st["block"])


def block_maps(cfg) -> tuple:
    """The attention maps of a block's input-geometry features: none. Post-LN's first attention
    reads the raw (unnormalized) embedding, where the exact map is undefined
    (phasefield.vit.features.block_features); for pre-LN they were left out on 2026-11-26 for
    time (the 2-core CPU under a load of ~18 gave ~15 % of a core; they are never shipped: a
    trajectory per point is not cheap). Both blocks have the collapsed-point rates alone."""
    return ()


def _block_geometry(out: str, dataset: str = "digits") -> dict:
    """The input geometry of the digits ViT (the embedding is the blocks' common input: the main
    study's measurement, copied). Another data set (MNIST-1D): not measured — the blocks'
    features read no input-geometry map (:func:`block_maps` is empty), so NaN, and no file."""
    import json
    import shutil

    if dataset != "digits":
        return dict(q0=float("nan"), rho0=float("nan"))
    gpath = os.path.join(out, "input_geometry.json")
    if not os.path.exists(gpath):
        shutil.copy(os.path.join(DEFAULT_OUT, "input_geometry.json"), gpath)
    with open(gpath) as f:
        return json.load(f)


def block_features_cmd(args):
    """The block's theory features of every trained configuration of a block study not yet in its
    features.csv (appended 8 at a time: resumable)."""

    from phasefield.vit import features
    from phasefield.vit import predict as vpredict
    from phasefield.vit import sweep as vsweep

    from phasefield.cli import _compilation_cache

    _compilation_cache()      # the CLI's persistent XLA cache: a rerun (and predict) compiles nothing again
    st = _study(args)
    out, cfg = st["out"], _block_cfg(st)
    geo = _block_geometry(out, _dataset(st))
    rows = vsweep.read_results(out)
    ids, cfgs = vpredict._configs_of(rows)
    fpath = feature_path(out)
    have = _read_feature_rows(fpath)
    names = list(next(iter(have.values())))[1:] if have else None
    todo = [(cid, c) for cid, c in zip(ids, cfgs) if cid not in have]
    print(f"{cfg.block}: {len(ids)} configurations, {len(todo)} without features (attention={BLOCK_ATTENTION}, "
          f"input-geometry maps {', '.join(block_maps(cfg))})", flush=True)
    for i, part in _batches(todo, args.until):
        t0 = time.time()
        feats = features.block_features(cfg, [c for _, c in part], geo["q0"], geo["rho0"], maps=block_maps(cfg),
                                        attention=BLOCK_ATTENTION)
        if names is None:
            names = sorted(feats)
        elif set(names) != set(feats):
            raise SystemExit(f"features of configurations {i}-{i + len(part)} have columns {sorted(feats)}, "
                             f"the cache {names}")
        _append_features(fpath, names, [cid for cid, _ in part], feats)
        print(f"features of {i + len(part)}/{len(todo)} configurations ({time.time() - t0:.0f} s)", flush=True)


# the pairs of the rates-vs-raw comparison: a model on the raw numbers against the same form with the
# block's own rates added (hybrid), and the best rates-only model against the best raw one
BLOCK_PAIRS = (("linear_hybrid", "linear_hp"), ("forest_hybrid", "forest_hp"),
               ("two_part_forest_hybrid", "two_part_forest_hp"), ("linear_hybrid_eff", "linear_hp_eff"))


def block_model_path(block: str) -> str:
    from phasefield.vit import predict as vpredict

    return os.path.join(ROOT, "phasefield", "vit", vpredict.BLOCK_RESOURCES[block])


def rates_vs_raw(rep: dict) -> dict:
    """Do the block's own rates carry the trained loss beyond the raw numbers? Paired differences
    of the configurations' squared out-of-fold errors (negative: the first model is better), with
    their standard errors, overall and per depth, for the best rates-only model against the best
    raw model and for each raw form against the same form with the rates added."""
    import numpy as np

    from phasefield.vit import analysis

    m, tab = rep["models"], rep["table"]
    y, L = np.asarray(tab["loss"]), np.asarray(tab["depth"])
    sq = lambda name: (np.asarray(m[name]["oof"]) - y) ** 2
    pairs = [(rep["best_exponent_model"], rep["best_raw_model"])] + [p for p in BLOCK_PAIRS if p[0] in m and p[1] in m]
    out = []
    for a, b in pairs:
        e = dict(with_rates=a, raw=b, cv_r2=[m[a]["cv_r2"], m[b]["cv_r2"]], cv_rmse=[m[a]["cv_rmse"], m[b]["cv_rmse"]],
                 all=analysis.paired(sq(a), sq(b)), by_depth={})
        for d in sorted(set(L.tolist())):
            k = L == d
            e["by_depth"][str(int(d))] = dict(n=int(k.sum()), **analysis.paired(sq(a)[k], sq(b)[k]))
        for split, t in rep.get("transfer", {}).items():
            if "sq_err" in t.get(a, {}) and "sq_err" in t.get(b, {}):
                e.setdefault("transfer", {})[split] = dict(rmse=[t[a]["rmse"], t[b]["rmse"]],
                                                           **analysis.paired(t[a]["sq_err"], t[b]["sq_err"]))
        out.append(e)
    return dict(pairs=out, note="paired mean of (squared OOF error with rates) - (squared OOF error raw) over "
                                "configurations, +- its standard error; negative: the rates help")


def block_failure_doc(rep: dict, model: dict, folds: int, repeats: int) -> tuple[dict, dict]:
    """The failure part of a block's model and its grouped-CV scores: Platt scaling of the loss
    model's out-of-fold predictions (the paper block's procedure) where failures were seen; where
    none was (pre-LN), a constant P(fail) = 3 / N (the rule of three: the 95 % upper bound on a
    failure rate after N runs without one)."""
    import numpy as np

    from phasefield.vit import analysis, failure
    from phasefield.vit import predict as vpredict

    tab = {k: (np.asarray(v) if isinstance(v, list) and k not in analysis.LISTS else v)
           for k, v in rep["table"].items()}
    n_runs = int(sum(len(r) for r in tab["run_failed"]))
    n_failed = int(sum(sum(r) for r in tab["run_failed"]))
    if n_failed == 0:
        bound = 3.0 / n_runs
        platt = failure.Logistic(["predicted_loss"], degree=1, mean=[0.0], std=[1.0], coef=[0.0],
                                 intercept=float(np.log(bound / (1 - bound))))
        doc = dict(name="rule_of_three", model=platt.to_json(), loss_model=model["name"],
                   criterion=f"diverged, or final test loss >= {analysis.CHANCE_FRACTION:g} log C "
                             f"(= {analysis.CHANCE_FRACTION * rep['L_sat']:.4f})",
                   chance_fraction=analysis.CHANCE_FRACTION, threshold_loss=analysis.CHANCE_FRACTION * rep["L_sat"],
                   n_configs=len(tab["run_failed"]), n_runs=n_runs, n_failed=0,
                   note=f"no run failed in {n_runs} ({len(tab['run_failed'])} configurations): P(fail) is the rule "
                        f"of three's 95 % upper bound 3/{n_runs} = {bound:.4f}, the same at every point of the box")
        return doc, dict(n_runs=n_runs, n_failed=0, bound=bound)
    doc = vpredict.failure_doc(np.asarray(rep["models"][model["name"]]["oof"]), tab["run_failed"], rep["L_sat"],
                               model["name"])
    specs = analysis.model_specs(tab)
    T = failure.run_table(tab)
    st = failure.cross_validate_stacked(tab, T, specs[model["name"]], folds, repeats)
    cv = {k: v for k, v in st.items() if k in ("auc", "brier", "log_loss", "brier_base", "base_rate", "n_runs",
                                               "n_failed", "k_folds", "repeats", "reliability")}
    cv["n_configs"] = len(tab["loss"])
    cands = {}
    for name in failure.CANDIDATES:
        if set(failure.CANDIDATES[name][1]) <= set(T):
            c = failure.cross_validate(name, T, folds, repeats)
            cands[name] = {k: c[k] for k in ("auc", "brier") if k in c}
    doc["cv"] = cv
    return doc, dict(shipped=cv, candidates=cands)


def block_analyze(args):
    """A standard block's study: the paper block's candidate families and shipping procedure
    (phasefield.vit.predict.fit_sweep: grouped CV, nested CV, conformal interval), the
    rates-vs-raw comparison, the failure model; OUT/analysis.json (and the model with --ship)."""
    import datetime

    import numpy as np

    from phasefield import io
    from phasefield.vit import analysis, features
    from phasefield.vit import predict as vpredict
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id

    st = _study(args)
    if st.get("holdout_of"):
        raise SystemExit(f"{args.study} is a held-out set: score it ('score --study {args.study}')")
    out, cfg = st["out"], _block_cfg(st)
    t0 = time.time()
    geometry, feats, order = features.read_cache(out, cfg)
    rows = vsweep.read_results(out)
    if getattr(args, "subset", None):       # a quick look (tests): the first N configurations
        keep = set(list(dict.fromkeys(config_id(r) for r in rows))[:args.subset])
        rows = [r for r in rows if config_id(r) in keep]
    if getattr(args, "available", False) and feats is not None:     # the configurations with features so far
        rows = [r for r in rows if config_id(r) in set(order)]
    if feats is None or {config_id(r) for r in rows} - set(order):
        raise SystemExit(f"{out}: features missing ('features --study {args.study}' first)")
    doc = vpredict.fit_sweep(rows, 10, cfg, geometry, feats, order, k=args.folds, repeats=args.repeats)
    rep, model = doc["report"], doc["model"]
    block = cfg.block_spec()[0]
    model.update(block=block, attention=BLOCK_ATTENTION, date=datetime.date.today().isoformat(),
                 study=os.path.relpath(out, ROOT))
    fdoc, fcv = block_failure_doc(rep, model, args.folds, args.repeats)
    model["failure"] = fdoc
    rep["failure"] = fcv
    rep["rates_vs_raw"] = rates_vs_raw(rep)
    rep["date"] = model["date"]
    if not getattr(args, "subset", None):
        with io.atomic_path(os.path.join(out, "analysis.json")) as tmp:
            with open(tmp, "w") as f:
                f.write(io.dumps(rep, indent=1))
    if args.ship:
        with io.atomic_path(block_model_path(block)) as tmp:
            with open(tmp, "w") as f:
                f.write(io.dumps(model, indent=1))
        print(f"packaged model: {block_model_path(block)}")
    _print_block(rep, model)
    if args.ship:
        block_figures()
    print(f"({time.time() - t0:.0f} s)")
    return rep, model


def block_figures():
    """docs/images/blocks_predicted.png (every block with an analysis and a shipped model) and
    docs/images/blocks_failure_post-ln.png (P(fail) over sigma x alpha, measured failures marked)."""
    import json

    import numpy as np

    from phasefield.vit import figure_blocks
    from phasefield.vit import predict as vpredict

    reports = {}
    for name in ("pre-ln", "post-ln"):
        path = os.path.join(STUDIES[name]["out"], "analysis.json")
        if os.path.exists(path) and name in vpredict.shipped_blocks():
            with open(path) as f:
                reports[name] = (json.load(f), vpredict.load_model(block=name))
    img = os.path.join(ROOT, "docs", "images")
    if reports:
        figure_blocks.predicted_vs_measured(reports, os.path.join(img, "blocks_predicted.png"))
    if "post-ln" in reports:
        rep, doc = reports["post-ln"]
        held = None
        hdir = STUDIES["post-ln-holdout"]["out"]
        if os.path.exists(os.path.join(hdir, "results.jsonl")):
            from phasefield.vit import analysis
            from phasefield.vit import sweep as vsweep

            held = analysis.configurations(vsweep.read_results(hdir), 10)
        tab = {k: (np.asarray(v) if isinstance(v, list) and k not in ("config", "run_losses", "run_failed", "lrs")
                   else v) for k, v in rep["table"].items()}
        figure_blocks.block_failure_slice(doc, tab, os.path.join(img, "blocks_failure_post-ln.png"), held_out=held)


def _print_block(rep: dict, model: dict) -> None:
    m, nest = rep["models"], rep.get("nested") or {}
    print(f"{model['block']}: {rep['n_configs']} configurations, {rep['n_runs']} runs; noise floor RMSE "
          f"{rep['noise_floor']['rmse']:.4f} (best R2 {rep['noise_floor']['r2_max']:.3f})")
    for name in (rep["best_model"], rep["best_exponent_model"], rep["best_raw_model"], rep["best_hybrid_model"]):
        print(f"  {name:26s} ({m[name]['group']:9s}) CV R2 {m[name]['cv_r2']:+.3f}  RMSE {m[name]['cv_rmse']:.4f}")
    if nest:
        print(f"  shipped {model['name']}; nested CV R2 {nest['r2']:.3f}, RMSE {nest['rmse']:.4f}, coverage "
              f"{100 * nest['coverage_runs']:.0f} % of runs; chosen {nest['chosen']}")
    for e in rep["rates_vs_raw"]["pairs"]:
        print(f"  {e['with_rates']:24s} - {e['raw']:20s}: {e['all']['mean']:+.5f} +- {e['all']['se']:.5f}  " +
              "  ".join(f"L={d}: {v['mean']:+.5f} +- {v['se']:.5f}" for d, v in e["by_depth"].items()))
    f = rep["failure"]
    if "shipped" in f:
        print(f"  P(fail): Platt on {model['name']}, grouped CV AUC {f['shipped']['auc']:.3f}, Brier "
              f"{f['shipped']['brier']:.4f} ({f['shipped']['n_failed']} of {f['shipped']['n_runs']} runs failed)")
    else:
        print(f"  P(fail): {model['failure']['note']}")


def block_score(args):
    """Score a block's shipped model (or --fit FILE, which must be of that block) on a held-out
    set (``<block>-holdout``, trained after the families and the shipping procedure were fixed):
    loss R2 over runs and seed means, RMSE, interval coverage; P(fail) AUC, Brier and its
    reliability table. Written to OUT/score.json."""
    import datetime

    import numpy as np

    from phasefield import io
    from phasefield.vit import analysis, failure, models
    from phasefield.vit import predict as vpredict
    from phasefield.vit import sweep as vsweep
    from phasefield.vit.design import config_id

    st = _study(args)
    out, cfg = st["out"], _block_cfg(st)
    rows = vsweep.read_results(out) if os.path.exists(os.path.join(out, "results.jsonl")) else []
    if not rows:
        raise SystemExit(f"{out} has no runs yet ('run --study {args.study} --no-theory' first)")
    doc = vpredict.load_model(args.fit, block=cfg.block)
    train = st.get("holdout_of")
    if train:
        seen = {config_id(r) for r in vsweep.read_results(STUDIES[train]["out"])}
        overlap = seen & {config_id(r) for r in rows}
        if overlap:
            raise SystemExit(f"{len(overlap)} configurations of {out} are in the training study {train}")
    col = lambda k: np.array([float(r[k]) for r in rows])
    res = vpredict.predict(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("depth"), doc,
                           block=cfg.block)
    l_sat = doc["L_sat"]
    y = np.array([l_sat if analysis._failed(r, "test_loss", l_sat) else float(r["test_loss"]) for r in rows])
    failed = np.array([int(analysis.at_chance(r, l_sat)) for r in rows])
    p = np.array([r["predicted_loss"] for r in res])
    pf = np.array([r["p_fail"] for r in res])
    lo, hi = np.array([r["interval"] for r in res]).T
    ids = [config_id(r) for r in rows]
    groups = {c: [i for i, d in enumerate(ids) if d == c] for c in dict.fromkeys(ids)}
    ym = np.array([y[g].mean() for g in groups.values()])
    pm = np.array([p[g[0]] for g in groups.values()])
    rep = dict(date=datetime.date.today().isoformat(), block=doc.get("block"), model=doc.get("name"),
               family=doc.get("family"), fitted_on=doc.get("n_configs"), n_runs=len(rows), n_configs=len(groups),
               r2_runs=models.r2(y, p), rmse_runs=float(np.sqrt(np.mean((y - p) ** 2))),
               r2_means=models.r2(ym, pm), rmse_means=float(np.sqrt(np.mean((ym - pm) ** 2))),
               coverage_runs=float(np.mean((lo <= y) & (y <= hi))), interval_level=doc["interval"]["level"],
               mean_loss=float(y.mean()), failure_model=doc["failure"]["name"], failure=failure.scores(failed, pf),
               warned=int(sum(bool(r["warnings"]) for r in res)),
               runs=[dict(run=r["run"], loss=float(a), pred=float(b), interval=[float(c), float(d)], failed=int(f),
                          p_fail=float(q)) for r, a, b, c, d, f, q in zip(rows, y, p, lo, hi, failed, pf)])
    with io.atomic_path(os.path.join(out, "score.json")) as tmp:
        with open(tmp, "w") as f:
            f.write(io.dumps(rep, indent=1))
    fs = rep["failure"]
    print(f"{rep['block']} model {rep['model']} ({rep['family']}, fitted on {rep['fitted_on']} configurations) on "
          f"{rep['n_runs']} held-out runs ({rep['n_configs']} configurations): loss R2 {rep['r2_runs']:.3f} (runs), "
          f"{rep['r2_means']:.3f} (seed means), RMSE {rep['rmse_runs']:.4f}; {100 * rep['coverage_runs']:.0f} % of "
          f"runs inside the {100 * rep['interval_level']:.0f} % interval")
    _print_failure(fs, f"P(fail) ({rep['failure_model']})")
    return rep


# ---- end of the standard blocks' section ----


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
        p.add_argument("--no-theory", action="store_true",
                       help="run: leave the rows' lambda columns empty (the features hold the theory)")
        p.add_argument("--folds", type=int, default=5)
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--ship", action="store_true", help="analyze: write the packaged model")
        p.add_argument("--fit", default=None, help="score: a fit file (default: the packaged model)")
        p.add_argument("--available", action="store_true",
                       help="analyze a block study on the configurations whose features are cached so far")
        p.add_argument("--subset", type=int, default=None,
                       help="analyze a block study on its first N configurations only (a quick check; writes nothing "
                            "but --ship's model)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        cmd_run(args)
    elif args.cmd == "plan":
        cmd_plan(args)
    elif args.cmd == "analyze" and _is_block_study(args.study):
        block_analyze(args)
    elif args.cmd == "features" and _is_block_study(args.study):
        block_features_cmd(args)
    elif args.cmd == "features":
        cmd_features(args)
    elif args.cmd == "score" and _is_block_study(args.study):
        block_score(args)
    elif args.cmd == "score":
        cmd_score(args)
    elif args.cmd == "failure":
        cmd_failure(args)
    elif args.cmd == "heldout":
        cmd_heldout(args)
    else:
        cmd_analyze(args)


if __name__ == "__main__":
    sys.exit(main())
