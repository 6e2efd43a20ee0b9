"""How long the probe takes on Hugging Face's Flax GPT-2 small (d = 768, 12 blocks) at random
init: compile and run timed apart, in one process.

    .venv/bin/python scripts/bench_probe.py [--inits 8] [--n-tokens 32]

Prints the seconds of building the model, compiling the measurement and running it, and the
total (the goal: under a minute on this CPU); the run is also timed a second time
with the compiled program (what a sweep over seeds costs per probe).
"""

from __future__ import annotations

import argparse
import time

import jax

from phasefield.probing import capture, hf, measure


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inits", type=int, default=8)
    ap.add_argument("--n-tokens", type=int, default=32)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    m = hf.gpt2(n_tokens=a.n_tokens, batch=1)
    run = capture.runner(m.apply_fn, m.inputs, blocks=m.blocks)
    f = jax.jit(lambda ks: jax.lax.map(lambda k: measure.one(m.init_fn, run, k, 1e-3), ks))
    keys = jax.random.split(jax.random.PRNGKey(0), a.inits)
    t1 = time.perf_counter()
    compiled = f.lower(keys).compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(keys))
    t3 = time.perf_counter()
    jax.block_until_ready(compiled(jax.random.split(jax.random.PRNGKey(1), a.inits)))
    t4 = time.perf_counter()
    print(
        f"GPT-2 small, {a.inits} inits, {a.n_tokens} tokens: build {t1 - t0:.1f} s, compile {t2 - t1:.1f} s, "
        f"run {t3 - t2:.1f} s, total {t3 - t0:.1f} s; again with the compiled program {t4 - t3:.1f} s"
    )


if __name__ == "__main__":
    main()
