"""A resumable training sweep over any list of runs (a grid, a Sobol design, a point file:
:mod:`phasefield.vit.design`).

Layout of an output directory (one :class:`TrainConfig` per directory; the depth may vary
from run to run)::

    sweep.json               the training config (a rerun with a different one is refused)
    results.jsonl            one line per finished run, appended after each chunk (source of truth)
    results.csv/.json        the results table, rewritten atomically after each chunk
    metrics/<run>.jsonl      big_vision-style metrics: one line per step and per epoch, then a final line
    checkpoints/chunk_NNNN/  orbax checkpoint of the chunk's final params (leading run axis) + runs.json

A run is identified by its values (sigma_w, sigma_a, alpha_a, alpha_m, lr, depth, seed);
rerunning a sweep trains only the runs not yet in results.jsonl, so an interrupted sweep
resumes where it stopped (the chunk in flight is redone). Runs of one depth are trained
together (one compiled program per depth and chunk size). A run whose loss becomes NaN/inf
or ends far above chance (more than twice log C) is recorded with ``diverged = true``; the
sweep goes on. ``metrics=False`` / ``checkpoints=False`` keep only the results tables (the
trainability study commits those).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable

import numpy as np

from .. import HParams, grid, io
from .design import run_id
from .train import TrainConfig, Trainer, chance_loss, diverged, make_points, steps_per_epoch

RESULT_FIELDS = (
    "run",
    "sigma_w",
    "sigma_a",
    "alpha_a",
    "alpha_m",
    "lr",
    "seed",
    "n_tokens",
    "depth",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "diverged",
    "lambda_a",
    "angle_rate",
    "lambda_g_collapse",
    "lambda_g_inf",
    "chunk",
    "seconds",
)


class SweepError(ValueError):
    """Inconsistent sweep directory or request (one-line message)."""


@functools.cache
def _vmapped_exponents(engine):
    """``engine.exponents`` vmapped and jitted, once per process (a new jit per call traced
    and lowered it again for every sweep)."""
    import jax

    return jax.jit(jax.vmap(engine.exponents))


def theory_exponents(cfg: TrainConfig, runs: list[dict]):
    """lambda_a, lambda_g_collapse (finite depth: each run's depth), lambda_g_inf at the collapsed /
    stable fixed points, from the block's closed-form engine (the paper block's
    :mod:`phasefield.layers.paper`) vmapped in float64; a block without one: :func:`block_theory`'s
    (with its ``angle_rate``)."""
    import jax
    import jax.numpy as jnp

    n = len(runs)
    if n == 0:
        return {k: np.zeros(0) for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf")}
    preset = cfg.preset()
    if not preset.fast_engine:
        th = block_theory(cfg, runs)
        return {k: th[k] for k in ("lambda_a", "angle_rate", "lambda_g_collapse", "lambda_g_inf")}
    engine = preset.engine
    col = lambda k: np.array([r.get(k, cfg.depth) if k == "depth" else r[k] for r in runs], float)
    with jax.enable_x64(True):
        hp = cfg.hparams(
            col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), depth=col("depth"), dtype=jnp.float64
        )
        ex = jax.device_get(_vmapped_exponents(engine)(hp))
    return {k: np.asarray(ex[k], float).reshape(n) for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf")}


def block_theory(cfg: TrainConfig, runs: list[dict], **over):
    """The theory point of each run of a :mod:`phasefield.layers` block (``cfg.block``), at
    the ViT's n tokens and each run's depth, from collapsed input tokens (the paper's
    convention): ``lambda_a`` the angle exponent where the block has a finite fixed point (NaN
    without one); ``angle_rate`` the finite-depth angle rate (1/L) log[(1 - rho_L)/(1 - rho_0)]
    (rho_0 -> 1), at every point;
    ``lambda_g_collapse`` = lambda_g(L); ``lambda_g_inf`` and ``rho_star`` at the stable fixed point
    (NaN without one). ``over``: preset keywords to set (``attention="exact"``)."""
    from .. import layers

    keys = ("lambda_a", "angle_rate", "lambda_g_collapse", "lambda_g_inf", "rho_star")
    cache, out = {}, {k: np.empty(len(runs)) for k in keys}
    for i, r in enumerate(runs):
        depth = int(r.get("depth", cfg.depth))
        key = (float(r["sigma_w"]), float(r["sigma_a"]), float(r["alpha_a"]), float(r["alpha_m"]), depth)
        if key not in cache:
            blk = cfg.block_for(HParams(sigma_w=key[0], sigma_a=key[1], alpha_a=key[2], alpha_m=key[3]), **over)
            r = layers.rates(blk, q0=1.0, rho0=1.0, n_tokens=cfg.n_tokens, depth=depth)
            lam_a = r["lambda_a"] if r["has_fixed_point"] else np.nan
            cache[key] = tuple(
                float(v) for v in (lam_a, r["angle_rate"], r["lambda_g_collapse"], r["lambda_g_inf"], r["rho_star"])
            )
        for k, v in zip(keys, cache[key]):
            out[k][i] = v
    return out


def _clean(v):
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _write_atomic(path: str, text: str) -> None:
    with io.atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)


def read_results(out_dir: str) -> list[dict]:
    """Finished runs of a sweep directory (last record per run wins; a torn last line, left by
    a kill in mid-write, is skipped). Run names are recomputed from the values, so tables of
    older versions (names without the depth) resume too."""
    rows = {}
    for r in io.read_jsonl(os.path.join(out_dir, "results.jsonl")):
        try:
            if r.get("depth") is not None:
                r["run"] = run_id(r)
            rows[r["run"]] = r
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
    return list(rows.values())


def _repair_tail(path: str) -> None:
    """Cut a torn last line (no newline) so that the next record starts on its own line."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def write_tables(out_dir: str, rows: list[dict]) -> None:
    rows = sorted(
        rows,
        key=lambda r: (r.get("depth") or 0, r["sigma_a"], r["alpha_a"], r["alpha_m"], r["sigma_w"], r["lr"], r["seed"]),
    )
    _write_atomic(os.path.join(out_dir, "results.json"), json.dumps(rows, indent=1) + "\n")
    import io as _io

    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(RESULT_FIELDS), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in RESULT_FIELDS})
    _write_atomic(os.path.join(out_dir, "results.csv"), buf.getvalue())


def _metrics_lines(cfg: TrainConfig, n_train: int, m: dict, i: int) -> str:
    spe = steps_per_epoch(cfg, n_train)
    lines = []
    for e in range(cfg.epochs):
        for s in range(spe):
            lines.append(
                dict(
                    step=e * spe + s + 1,
                    epoch=e + 1,
                    train_loss=_clean(m["step_loss"][i, e, s]),
                    train_acc=_clean(m["step_acc"][i, e, s]),
                )
            )
        lines.append(
            dict(
                step=(e + 1) * spe,
                epoch=e + 1,
                epoch_train_loss=_clean(np.mean(m["step_loss"][i, e])),
                test_loss=_clean(m["test_loss"][i, e]),
                test_acc=_clean(m["test_acc"][i, e]),
            )
        )
    lines.append(
        dict(
            step=cfg.epochs * spe,
            final=True,
            train_loss=_clean(m["train_loss"][i]),
            train_acc=_clean(m["train_acc"][i]),
            test_loss=_clean(m["final_test_loss"][i]),
            test_acc=_clean(m["final_test_acc"][i]),
        )
    )
    return "".join(json.dumps(l) + "\n" for l in lines)


def _save_checkpoint(path: str, params, run_ids: list[str]) -> None:
    import orbax.checkpoint as ocp

    path = os.path.abspath(path)
    if os.path.exists(path):
        import shutil

        shutil.rmtree(path)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(path, "params"), params)
    ckptr.wait_until_finished()
    _write_atomic(os.path.join(path, "runs.json"), json.dumps(run_ids) + "\n")


def load_checkpoint(path: str):
    """(params with a leading run axis, run ids) of one chunk checkpoint."""
    import orbax.checkpoint as ocp

    path = os.path.abspath(path)
    params = ocp.StandardCheckpointer().restore(os.path.join(path, "params"))
    return params, io.read_json(os.path.join(path, "runs.json"))


def _config_doc(cfg: TrainConfig) -> dict:
    """The part of a config that must match to resume (the depth is a per-run value)."""
    d = cfg.to_dict()
    d.pop("depth", None)
    return d


def prepare_dir(out_dir: str, cfg: TrainConfig, num_classes: int | None = None, metrics: bool = True) -> None:
    os.makedirs(os.path.join(out_dir, "metrics") if metrics else out_dir, exist_ok=True)
    path = os.path.join(out_dir, "sweep.json")
    if os.path.exists(path):
        try:
            old = io.read_json(path).get("config", {})
        except (OSError, ValueError, AttributeError):  # unreadable, malformed, too large or too deep
            raise SweepError(f"{path} is not a sweep config written by phasefield; use a new --out directory") from None
        old = {k: v for k, v in old.items() if k != "depth"}
        new = _config_doc(cfg)
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise SweepError(
                f"{out_dir} holds a sweep with a different training config ({', '.join(diff)}); "
                "use a new --out directory"
            )
    else:
        _write_atomic(path, json.dumps({"config": cfg.to_dict(), "num_classes": num_classes}, indent=1) + "\n")


def far_above_chance(metrics: dict, num_classes: int, factor: float = 2.0) -> np.ndarray:
    """Runs whose final train or test loss ends above ``factor`` x the chance loss log C: they
    blew up (e.g. lr = 10 gives losses 24-78) even though every number stayed finite."""
    lim = factor * chance_loss(num_classes)
    return (np.asarray(metrics["train_loss"]) > lim) | (np.asarray(metrics["final_test_loss"]) > lim)


def _chunks(todo: list[dict], chunk: int):
    """Runs grouped by depth (one compiled program each), cut into balanced chunks (sizes
    differ by at most one within a depth: at most two programs per depth)."""
    for depth in dict.fromkeys(r["depth"] for r in todo):
        part = [r for r in todo if r["depth"] == depth]
        n_chunks = -(-len(part) // chunk)
        bounds = np.linspace(0, len(part), n_chunks + 1).round().astype(int)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            yield depth, part[lo:hi]


def check_size(cfg: TrainConfig, runs: list[dict], chunk: int) -> None:
    """Refuse, before anything is created, a sweep whose chunk cannot fit in memory: the
    activations of one training step (batch x tokens x depth x width, with the attention
    maps and the MLP), times the runs trained together, plus parameters and Adam state
    (:func:`phasefield.grid.check_memory`; one-line ``ValueError``)."""
    depth = max([int(r.get("depth") or cfg.depth) for r in runs] or [cfg.depth])
    n, d = cfg.n_tokens, cfg.width
    h = cfg.mlp_hidden or 4 * d
    per_run = 4 * (
        3 * cfg.batch_size * depth * n * (6 * d + 2 * h + 2 * n)
        + 4 * (4 * d * d + 2 * d * h)
        + cfg.image_size**2 * 3 * d
    )
    together = min(int(chunk), max(len(runs), 1))
    grid.check_memory(
        per_run * together,
        f"training {together} runs of depth {depth} at width {d} (batch {cfg.batch_size}, {n} tokens) at once",
        "use a smaller --chunk, --depth, --width or --batch-size",
    )


def epoch_progress(bar, runs: int, epochs: int):
    """The progress bar's callback for a chunk of ``runs`` runs: after ``e`` of ``epochs``
    epochs the chunk counts ``runs e / epochs`` runs done. The count is set, not summed: fifteen
    steps of 0.2 runs add up to more than 3, and the bar would end above its total."""
    n0 = bar.n

    def on_epoch(e: int):
        bar.n = n0 + runs * e / epochs
        bar.refresh()

    return on_epoch


def run_sweep(
    cfg: TrainConfig,
    runs: list[dict],
    out_dir: str,
    data,
    chunk: int = 12,
    progress: bool = True,
    log: Callable[[str], None] = print,
    trainer: Trainer | None = None,
    metrics: bool = True,
    checkpoints: bool = True,
    trainers: dict | None = None,
    theory: bool = True,
) -> dict:
    """Train every run of ``runs`` not yet finished in ``out_dir``; returns a summary dict.
    ``theory=False`` leaves the rows' lambda columns empty (computed later, e.g. on another
    machine: the training is then all the work).

    Runs without a ``depth`` get ``cfg.depth``. ``trainer`` serves runs of cfg.depth;
    ``trainers`` ({depth: Trainer}) is a cache of compiled trainers that a caller may keep
    across calls (it is filled in here)."""
    if chunk < 1:
        raise SweepError(f"chunk must be >= 1 (got {chunk})")
    runs = [dict(r, depth=int(r.get("depth") or cfg.depth)) for r in runs]
    for r in runs:
        r["run"] = run_id(r)
    prepare_dir(out_dir, cfg, data.num_classes, metrics)
    results = os.path.join(out_dir, "results.jsonl")
    _repair_tail(results)
    done = {r["run"] for r in read_results(out_dir)}
    todo = [r for r in runs if r["run"] not in done]
    summary = dict(requested=len(runs), already_done=len(runs) - len(todo), trained=0, diverged=0, seconds=0.0)
    if not todo:
        write_tables(out_dir, read_results(out_dir))
        return summary
    lam = (
        theory_exponents(cfg, todo)
        if theory
        else {k: np.full(len(todo), np.nan) for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf")}
    )
    for i, r in enumerate(todo):
        r.update({k: _clean(v[i]) for k, v in lam.items()})
    trainers = {} if trainers is None else trainers
    if trainer is not None:
        trainers[cfg.depth] = trainer
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    if checkpoints:
        os.makedirs(ckpt_dir, exist_ok=True)
    names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    next_chunk = 1 + max([int(n.split("_")[1]) for n in names if n.startswith("chunk_")] or [0])
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(runs),
            initial=len(runs) - len(todo),
            unit="run",
            desc="train-sweep",
            bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )
    t_all = time.time()
    try:
        for depth, part in _chunks(todo, chunk):
            if depth not in trainers:
                trainers[depth] = Trainer(dataclasses.replace(cfg, depth=depth), data)
            dcfg = trainers[depth].cfg
            col = lambda k: [r[k] for r in part]
            pts = make_points(
                dcfg, col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("lr"), col("seed")
            )
            t0 = time.time()
            on_epoch = None
            if bar is not None:
                bar.set_postfix(depth=depth, diverged=summary["diverged"])
                on_epoch = epoch_progress(bar, len(part), dcfg.epochs)
            params, m = trainers[depth].train_many(pts, on_epoch=on_epoch)
            dt = time.time() - t0
            bad = diverged(m) | far_above_chance(m, data.num_classes)
            name = f"chunk_{next_chunk:04d}"
            if checkpoints:
                _save_checkpoint(os.path.join(ckpt_dir, name), params, col("run"))
            lines = []
            for i, r in enumerate(part):
                if metrics:
                    _write_atomic(
                        os.path.join(out_dir, "metrics", r["run"] + ".jsonl"),
                        _metrics_lines(dcfg, len(data.y_train), m, i),
                    )
                row = dict(
                    r,
                    n_tokens=dcfg.n_tokens,
                    depth=depth,
                    train_loss=_clean(m["train_loss"][i]),
                    train_acc=_clean(m["train_acc"][i]),
                    test_loss=_clean(m["final_test_loss"][i]),
                    test_acc=_clean(m["final_test_acc"][i]),
                    diverged=bool(bad[i]),
                    chunk=name,
                    seconds=dt / len(part),
                    test_loss_curve=[_clean(v) for v in m["test_loss"][i]],
                )
                lines.append(json.dumps({k: row.get(k) for k in RESULT_FIELDS + ("test_loss_curve",)}) + "\n")
            with open(results, "a") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
            write_tables(out_dir, read_results(out_dir))
            next_chunk += 1
            summary["trained"] += len(part)
            summary["diverged"] += int(bad.sum())
            if bar is not None:
                bar.n = round(bar.n)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    summary["seconds"] = time.time() - t_all
    return summary


def read_sweep(out_dir: str) -> dict:
    """The sweep.json of a sweep directory ({} when absent)."""
    path = os.path.join(out_dir, "sweep.json")
    if not os.path.exists(path):
        return {}
    return io.read_json(path)
