"""A resumable training sweep over the initialization grid.

Layout of an output directory (one :class:`TrainConfig` per directory)::

    sweep.json               the training config (a rerun with a different one is refused)
    results.jsonl            one line per finished run, appended after each chunk (source of truth)
    results.csv/.json        the results table, rewritten atomically after each chunk
    metrics/<run>.jsonl      big_vision-style metrics: one line per step and per epoch, then a final line
    checkpoints/chunk_NNNN/  orbax checkpoint of the chunk's final params (leading run axis) + runs.json

A run is identified by its values (sigma_w, sigma_a, alpha_a, alpha_m, lr, seed); rerunning a
sweep trains only the runs not yet in results.jsonl, so an interrupted sweep resumes where it
stopped (the chunk in flight is redone). A run whose loss becomes NaN/inf is recorded with
``diverged = true`` and the sweep goes on.
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
from typing import Callable, Iterable, Optional

import numpy as np

from .train import TrainConfig, Trainer, diverged, make_points, steps_per_epoch

RESULT_FIELDS = ("run", "sigma_w", "sigma_a", "alpha_a", "alpha_m", "lr", "seed", "n_tokens", "depth",
                 "train_loss", "train_acc", "test_loss", "test_acc", "diverged",
                 "lambda_a", "lambda_g", "lambda_g_inf", "chunk", "seconds")


class SweepError(ValueError):
    """Inconsistent sweep directory or request (one-line message)."""


def run_id(sigma_w, sigma_a, alpha_a, alpha_m, lr, seed) -> str:
    return f"sw{sigma_w:.6g}_sa{sigma_a:.6g}_aa{alpha_a:.6g}_am{alpha_m:.6g}_lr{lr:.6g}_s{int(seed)}"


def grid(sigma_w: Iterable[float], alpha_a: Iterable[float], alpha_m: Optional[Iterable[float]] = None,
         sigma_a: Iterable[float] = (1.0,), lr: Iterable[float] = (1e-3,), seeds: int = 1) -> list[dict]:
    """Cartesian product; ``alpha_m=None`` ties alpha_m to alpha_a (the paper's alpha_A = alpha_M)."""
    runs = []
    am_list = [None] if alpha_m is None else list(alpha_m)
    for sa in sigma_a:
        for aa in alpha_a:
            for am in am_list:
                for sw in sigma_w:
                    for l in lr:
                        for s in range(seeds):
                            r = dict(sigma_w=float(sw), sigma_a=float(sa), alpha_a=float(aa),
                                     alpha_m=float(aa if am is None else am), lr=float(l), seed=int(s))
                            r["run"] = run_id(**r)
                            runs.append(r)
    seen, out = set(), []
    for r in runs:
        if r["run"] not in seen:
            seen.add(r["run"])
            out.append(r)
    return out


def theory_exponents(cfg: TrainConfig, runs: list[dict]):
    """lambda_a, lambda_g (finite depth cfg.depth), lambda_g_inf from ``phasefield.theory``,
    vmapped in float64; all-NaN plus a message when the theory engine is unavailable."""
    n = len(runs)
    nan = {k: np.full(n, np.nan) for k in ("lambda_a", "lambda_g", "lambda_g_inf")}
    if n == 0:
        return nan, None
    try:
        import jax
        import jax.numpy as jnp

        from .. import theory

        exponents = theory.exponents
    except (ImportError, AttributeError) as exc:
        return nan, f"theory engine unavailable ({exc}); exponents left empty ('phasefield fit' fills them in)"
    col = lambda k: np.array([r[k] for r in runs], float)
    hp = cfg.hparams(col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), dtype=jnp.float64)
    try:
        ex = jax.jit(jax.vmap(exponents))(hp)
    except Exception:  # an engine that does not vmap: point by point
        ex = {}
        for i in range(n):
            one = jax.tree.map(lambda a: a[i], hp)
            for k, v in exponents(one).items():
                ex.setdefault(k, []).append(v)
    out = {k: np.asarray(ex[k], float).reshape(n) if k in ex else nan[k] for k in nan}
    return out, None


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
    from ..cli.common import atomic_path

    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)


def read_results(out_dir: str) -> list[dict]:
    """Finished runs of a sweep directory (last record per run wins; a torn last line is skipped)."""
    path = os.path.join(out_dir, "results.jsonl")
    rows = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rows[r["run"]] = r
    return list(rows.values())


def write_tables(out_dir: str, rows: list[dict]) -> None:
    rows = sorted(rows, key=lambda r: (r["sigma_a"], r["alpha_a"], r["alpha_m"], r["sigma_w"], r["lr"], r["seed"]))
    _write_atomic(os.path.join(out_dir, "results.json"), json.dumps(rows, indent=1) + "\n")
    import io

    buf = io.StringIO()
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
            lines.append(dict(step=e * spe + s + 1, epoch=e + 1, train_loss=_clean(m["step_loss"][i, e, s]),
                              train_acc=_clean(m["step_acc"][i, e, s])))
        lines.append(dict(step=(e + 1) * spe, epoch=e + 1, epoch_train_loss=_clean(np.mean(m["step_loss"][i, e])),
                          test_loss=_clean(m["test_loss"][i, e]), test_acc=_clean(m["test_acc"][i, e])))
    lines.append(dict(step=cfg.epochs * spe, final=True, train_loss=_clean(m["train_loss"][i]),
                      train_acc=_clean(m["train_acc"][i]), test_loss=_clean(m["final_test_loss"][i]),
                      test_acc=_clean(m["final_test_acc"][i])))
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
    with open(os.path.join(path, "runs.json")) as f:
        return params, json.load(f)


def prepare_dir(out_dir: str, cfg: TrainConfig, num_classes: Optional[int] = None) -> None:
    os.makedirs(os.path.join(out_dir, "metrics"), exist_ok=True)
    path = os.path.join(out_dir, "sweep.json")
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f).get("config", {})
        if old != cfg.to_dict():
            diff = sorted(k for k in set(old) | set(cfg.to_dict()) if old.get(k) != cfg.to_dict().get(k))
            raise SweepError(f"{out_dir} holds a sweep with a different training config ({', '.join(diff)}); "
                             "use a new --out directory")
    else:
        _write_atomic(path, json.dumps({"config": cfg.to_dict(), "num_classes": num_classes}, indent=1) + "\n")


def run_sweep(cfg: TrainConfig, runs: list[dict], out_dir: str, data, chunk: int = 12,
              progress: bool = True, log: Callable[[str], None] = print, trainer: Optional[Trainer] = None) -> dict:
    """Train every run of ``runs`` not yet finished in ``out_dir``; returns a summary dict."""
    if chunk < 1:
        raise SweepError(f"chunk must be >= 1 (got {chunk})")
    prepare_dir(out_dir, cfg, data.num_classes)
    done = {r["run"] for r in read_results(out_dir)}
    todo = [r for r in runs if r["run"] not in done]
    summary = dict(requested=len(runs), already_done=len(runs) - len(todo), trained=0, diverged=0, seconds=0.0)
    if not todo:
        write_tables(out_dir, read_results(out_dir))
        return summary
    lam, note = theory_exponents(cfg, todo)
    if note:
        log(f"note: {note}")
    for i, r in enumerate(todo):
        r.update({k: _clean(v[i]) for k, v in lam.items()})
    trainer = trainer or Trainer(cfg, data)
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    next_chunk = 1 + max([int(n.split("_")[1]) for n in os.listdir(ckpt_dir) if n.startswith("chunk_")] or [0])
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", desc="train-sweep")
    t_all = time.time()
    try:
        # balanced chunks (sizes differ by at most one): at most two compiled programs
        n_chunks = -(-len(todo) // chunk)
        bounds = np.linspace(0, len(todo), n_chunks + 1).round().astype(int)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = todo[lo:hi]
            col = lambda k: [r[k] for r in part]
            pts = make_points(cfg, col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("lr"), col("seed"))
            t0 = time.time()
            params, m = trainer.train_many(pts)
            dt = time.time() - t0
            bad = diverged(m)
            name = f"chunk_{next_chunk:04d}"
            _save_checkpoint(os.path.join(ckpt_dir, name), params, col("run"))
            lines = []
            for i, r in enumerate(part):
                _write_atomic(os.path.join(out_dir, "metrics", r["run"] + ".jsonl"),
                              _metrics_lines(cfg, len(data.y_train), m, i))
                row = dict(r, n_tokens=cfg.n_tokens, depth=cfg.depth,
                           train_loss=_clean(m["train_loss"][i]), train_acc=_clean(m["train_acc"][i]),
                           test_loss=_clean(m["final_test_loss"][i]), test_acc=_clean(m["final_test_acc"][i]),
                           diverged=bool(bad[i]), chunk=name, seconds=dt / len(part))
                lines.append(json.dumps({k: row.get(k) for k in RESULT_FIELDS}) + "\n")
            with open(os.path.join(out_dir, "results.jsonl"), "a") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
            write_tables(out_dir, read_results(out_dir))
            next_chunk += 1
            summary["trained"] += len(part)
            summary["diverged"] += int(bad.sum())
            if bar is not None:
                bar.update(len(part))
                bar.set_postfix(chunk_s=f"{dt:.0f}", diverged=summary["diverged"])
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
    with open(path) as f:
        return json.load(f)
