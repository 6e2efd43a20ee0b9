"""The studies' feature caches: the theory features of every trained configuration, kept in
the study's ``features.csv`` (one row per configuration, appended: resumable) beside its
measured ``input_geometry.json``.

The paper block's features are :func:`phasefield.vit.features.features` (collapsed point and
input geometry); a standard block's are :func:`phasefield.vit.features.block_features` with
the exact attention map (:data:`BLOCK_ATTENTION`) and no input-geometry map
(:func:`block_maps`).
"""

from __future__ import annotations

import os
import time

from ... import io
from . import registry as R

BLOCK_ATTENTION = "exact"  # the accurate softmax map for a standard block's theory (passed explicitly)


def feature_path(out: str) -> str:
    return os.path.join(out, "features.csv")


def hp_key(cid: str) -> str:
    """A configuration's name without its learning rate (the features do not depend on it)."""
    import re

    return re.sub(r"_lr[^_]+", "", cid)


def read_feature_rows(path: str) -> dict:
    """{config id: row} of a features cache ({} when there is none)."""
    import csv

    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["config"]: r for r in csv.DictReader(f)}


def batches(items: list, until: float | None, size: int = 8, log=print):
    """``(start, batch)`` of ``items``, ``size`` at a time; stops (and says so) once ``until``
    seconds have passed (the caller's work is appended per batch: a rerun resumes)."""
    t0 = time.time()
    for i in range(0, len(items), size):
        if until and time.time() - t0 > until:
            log(f"stopping: --until {until:.0f} s reached (resume by rerunning)", flush=True)
            return
        yield i, items[i : i + size]


def append_features(path: str, names: list, ids: list, feats: dict) -> None:
    """Rows ``config, <names>`` of ``feats`` appended to the features cache ``path`` (header first)."""
    import csv

    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["config"] + names)
        for j, cid in enumerate(ids):
            w.writerow([cid] + [repr(float(feats[k][j])) for k in names])


def study_features(st: dict, until: float | None = None, log=print) -> None:
    """Measure the input geometry once and compute the theory features of every planned
    configuration of the study ``st`` (:func:`registry.study`) not yet in its features.csv
    (appended: resumable). Rows of the same hyperparameters in the main study's features.csv
    are reused (features do not depend on the learning rate)."""
    import csv
    import json
    import shutil

    from .. import data as vdata
    from .. import design, features

    dataset = R.dataset_of(st)
    cfg = R.train_config(dataset=dataset)
    out = st["out"]
    os.makedirs(out, exist_ok=True)
    gpath = os.path.join(out, "input_geometry.json")
    main_g = os.path.join(R.DEFAULT_OUT, "input_geometry.json")
    same_data = dataset == "digits"  # the main study's data, embedding and token count
    if not os.path.exists(gpath) and os.path.exists(main_g) and out != R.DEFAULT_OUT and same_data:
        shutil.copy(main_g, gpath)  # the same trainer config, data and embedding: the same geometry
    if not os.path.exists(gpath):
        geo = features.input_geometry(cfg, vdata.load(dataset, cfg.image_size), inits=16, images=512)
        with open(gpath + ".part", "w") as f:
            json.dump(geo, f, indent=1)
        os.replace(gpath + ".part", gpath)
    geo = io.read_json(gpath)
    log(f"input geometry: q0 = {geo['q0']:.4f} +- {geo['q0_se']:.4f}, rho0 = {geo['rho0']:.4f} +- {geo['rho0_se']:.4f}")
    fpath = feature_path(out)
    have = read_feature_rows(fpath)
    known = {hp_key(cid): r for cid, r in read_feature_rows(feature_path(R.DEFAULT_OUT)).items()} if same_data else {}
    plan, settings = R.parse_plan(st["plan"]), R.parse_settings(st["settings"])
    lrs = sorted({v for vals in settings.values() for v in vals})
    todo, reuse = [], []
    for d, lo, hi in R.blocks(plan):
        for c in R.study_configs(st, d, hi)[lo:hi]:
            for lr in lrs:
                c2 = dict(c, lr=lr)
                cid = design.config_id(c2)
                if cid in have:
                    continue
                src = known.get(hp_key(cid))
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
        log(f"reused the features of {len(reuse)} configurations from {feature_path(R.DEFAULT_OUT)}")
    for i, part in batches(todo, until, log=log):
        t0 = time.time()
        feats = features.features(cfg, [c for _, c, _ in part], geo["q0"], geo["rho0"])
        names = sorted(feats)
        append_features(fpath, names, [cid for cid, _, _ in part], feats)
        log(f"features of {i + len(part)}/{len(todo)} configurations ({time.time() - t0:.0f} s)", flush=True)


def block_maps(cfg) -> tuple:
    """The attention maps of a block's input-geometry features: none. Post-LN's first attention
    reads the raw (unnormalized) embedding, where the exact map is undefined
    (phasefield.vit.features.block_features); for pre-LN they are left out for time (a
    trajectory per point is not cheap, and they are never shipped). Both blocks have the
    collapsed-point rates alone."""
    return ()


def block_geometry(out: str, dataset: str = "digits") -> dict:
    """The input geometry of the digits ViT (the embedding is the blocks' common input: the main
    study's measurement, copied). Another data set (MNIST-1D): not measured — the blocks'
    features read no input-geometry map (:func:`block_maps` is empty), so NaN, and no file."""
    import shutil

    if dataset != "digits":
        return dict(q0=float("nan"), rho0=float("nan"))
    gpath = os.path.join(out, "input_geometry.json")
    if not os.path.exists(gpath):
        shutil.copy(os.path.join(R.DEFAULT_OUT, "input_geometry.json"), gpath)
    return io.read_json(gpath)


def block_study_features(st: dict, until: float | None = None, log=print) -> None:
    """The block's theory features of every trained configuration of a block study not yet in its
    features.csv (appended 8 at a time: resumable)."""
    from .. import features
    from .. import predict as vpredict
    from .. import sweep as vsweep

    out, cfg = st["out"], R.block_cfg(st)
    geo = block_geometry(out, R.dataset_of(st))
    rows = vsweep.read_results(out)
    ids, cfgs = vpredict.configs_of(rows)
    fpath = feature_path(out)
    have = read_feature_rows(fpath)
    names = list(next(iter(have.values())))[1:] if have else None
    todo = [(cid, c) for cid, c in zip(ids, cfgs) if cid not in have]
    log(
        f"{cfg.block}: {len(ids)} configurations, {len(todo)} without features (attention={BLOCK_ATTENTION}, "
        f"input-geometry maps {', '.join(block_maps(cfg))})",
        flush=True,
    )
    for i, part in batches(todo, until, log=log):
        t0 = time.time()
        feats = features.block_features(
            cfg, [c for _, c in part], geo["q0"], geo["rho0"], maps=block_maps(cfg), attention=BLOCK_ATTENTION
        )
        if names is None:
            names = sorted(feats)
        elif set(names) != set(feats):
            raise R.StudyError(
                f"features of configurations {i}-{i + len(part)} have columns {sorted(feats)}, the cache {names}"
            )
        append_features(fpath, names, [cid for cid, _ in part], feats)
        log(f"features of {i + len(part)}/{len(todo)} configurations ({time.time() - t0:.0f} s)", flush=True)
