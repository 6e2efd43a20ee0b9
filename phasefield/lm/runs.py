"""Seeds of one configuration trained one after the other, one JSON line per finished seed
appended to a results file (the source of truth: a rerun skips the seeds already there, and
refuses a file that holds runs of another configuration).

The run's program is :func:`.train.make_train_parts`' pieces, jitted once (the learning rate
and the multipliers are arguments), the steps called in a few equal chunks so that a
progress callback hears of them. Training runs in float32 (JAX's x64 switched off for it).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from .. import io
from . import train as lm_train


def identity(cfg, corpus, mult_info: dict) -> dict:
    """What a result line must share with the others of its file: the configuration, the
    corpus and the multipliers."""
    return dict(config=cfg.to_dict(), corpus=corpus.describe(), init=mult_info)


def chunks(steps: int) -> int:
    """The number of equal chunks the steps run in: the largest divisor of ``steps`` <= 10."""
    return max(p for p in range(1, 11) if steps % p == 0)


def done_seeds(path, ident: dict) -> set:
    """The seeds already in ``path``; ValueError where a line holds another configuration."""
    seeds = set()
    for rec in io.read_jsonl(path):
        if {k: rec.get(k) for k in ident} != io.finite(ident):
            raise ValueError(f"{path} holds runs of another configuration (or corpus); give another --out")
        seeds.add(rec.get("seed"))
    return seeds


def train_seeds(cfg, corpus, seeds, out, mult: dict | None = None, mult_info: dict | None = None, progress=None):
    """Train ``cfg`` on ``corpus`` for each seed of ``seeds`` not yet in ``out`` and append
    its line (:func:`.train.summary`, the seed, the seconds it took and :func:`identity`).
    ``progress(steps)`` is called as steps finish. Returns the lines written."""
    ident = identity(cfg, corpus, mult_info or {})
    todo = [s for s in seeds if s not in done_seeds(out, ident)]
    if not todo:
        return []
    written = []
    with jax.enable_x64(False):
        (init, steps, evaluate), (tokens, held) = lm_train.make_train_parts(cfg, corpus)
        init, steps, evaluate = jax.jit(init), jax.jit(steps), jax.jit(evaluate)
        mult = {k: jnp.float32(v) for k, v in (mult or {}).items()}
        lr = jnp.float32(cfg.lr)
        parts = chunks(cfg.steps)
        size = cfg.steps // parts
        for seed in todo:
            t0 = time.perf_counter()
            state = init(jax.random.PRNGKey(seed), lr, mult, held)
            init_loss = evaluate(state["params"], held)
            losses = []
            for i in range(parts):
                state, loss = steps(state, lr, state["keys"][i * size : (i + 1) * size], tokens)
                losses.append(loss)
                if progress is not None:
                    jax.block_until_ready(loss)
                    progress(size)
            metrics = dict(
                step_loss=jnp.concatenate(losses), init_loss=init_loss, held_loss=evaluate(state["params"], held)
            )
            rec = dict(seed=seed, **lm_train.summary(cfg, corpus, metrics))
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            rec.update(ident)
            io.append_jsonl(out, io.finite(rec))
            written.append(rec)
    return written


def estimate_bytes(cfg) -> int:
    """A rough size of a run's memory (float32 parameters with Adam's two moments, the
    activations of one batch kept for the backward pass)."""
    d, L = cfg.width, cfg.depth
    params = 13 * d * d * L + 2 * 256 * d + cfg.n * d
    heads = cfg.block_spec()[1].get("heads", 1)
    acts = cfg.batch * cfg.n * L * (20 * d + 3 * cfg.n * heads) + cfg.batch * cfg.n * 256 * 3
    return 4 * (4 * params + acts)


MAX_BYTES = 64 << 30


def check_size(cfg) -> None:
    """ValueError where a run would need more than :data:`MAX_BYTES` (before any work)."""
    need = estimate_bytes(cfg)
    if need > MAX_BYTES:
        raise ValueError(
            f"the run needs about {need / 2**30:.3g} GiB (at most {MAX_BYTES >> 30} GiB): "
            "use a smaller width, depth, context or batch"
        )
