"""What the mean field leaves out of a Llama stack by not modelling RoPE, at init: the
finite-width network of the ``llama`` preset (causal, sigma = 0.02 sqrt(4096), alpha 1,
from its embeddings q0 = 4e-4, rho0 = 0) with and without rotary position embeddings
(:func:`phasefield.layers.attention.rotary`, the attention's network-only ``rope``), the same
weights and inputs for both (paired draws).

Per position after L blocks: the squared norm per component ``q_i`` and the mean cosine
with the earlier tokens ``rho_i`` (positions 1..n-1; position 0 reads only itself, where
RoPE rotates by zero and changes nothing but rounding), their means over the draws with and
without RoPE, the paired difference and its standard error; the largest |difference| in
units of its se and relative to the value. Two head splits of the width: the preset's 32
heads (d_head = width / 32) and Llama's d_head = 128 (RoPE's frequencies depend on d_head).
The mean field's per-position values (``phasefield trajectory --block llama``) are printed
beside them.

    .venv/bin/python scripts/rope_gap.py [--width 256] [--n-tokens 8] [--depth 4]
        [--draws 4000] [--seed 0]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from phasefield import layers
from phasefield.layers import presets, spec
from phasefield.layers.attention import Attention
from phasefield.layers.measure import tokens
from phasefield.simulate.stack import stack_forward


def with_rope(layer):
    """``layer`` with every attention's network rotating its queries and keys."""
    if isinstance(layer, Attention):
        return layer.replace(rope=True)
    return layer.map_children(with_rope) if layer.children() else layer


def per_position(x):
    """(q_i, rho_i) of tokens ``[n, d]``: squared norm per component and the mean cosine
    with the earlier tokens (position 0: 0)."""
    n, d = x.shape
    g = x @ x.T / d
    q = jnp.diagonal(g)
    cos = g / jnp.sqrt(q[:, None] * q[None, :])
    lower = jnp.tril(jnp.ones((n, n)), -1)
    return q, jnp.sum(cos * lower, -1) / jnp.maximum(lower.sum(-1), 1.0)


def measure(block, n, d, depth, draws, seed, q0, rho0, batch=500):
    """[draws, 2 (plain, rope), 2 (q, rho), n] per-position values after ``depth`` blocks."""
    pair = (block, with_rope(block))

    def one(key):
        kx, kw = jax.random.split(key)
        x = tokens(kx, n, d, q0, rho0)
        out = [per_position(stack_forward(b, kw, x, depth)) for b in pair]
        return jnp.stack([jnp.stack(o) for o in out])

    f = jax.jit(jax.vmap(one))
    keys = jax.random.split(jax.random.PRNGKey(seed), draws)
    return np.concatenate([np.asarray(f(keys[i : i + batch])) for i in range(0, draws, batch)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--n-tokens", type=int, default=8)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    n, d, L = a.n_tokens, a.width, a.depth
    q0, rho0 = presets.LLAMA_INPUT
    name, kw = spec.parse("llama")
    theory = layers.trajectory(spec.build(name, kw), q0=q0, rho0=rho0, n_tokens=n, depth=L)
    th_q, th_rho = np.asarray(theory["q_pos"][-1]), np.asarray(theory["rho_pos"][-1])
    print(f"llama preset (sigma = {presets.INITIALIZER_RANGE * 4096**0.5:g}, alpha 1, causal), q0 = {q0:g}, ")
    print(f"rho0 = {rho0:g}; network width {d}, n = {n}, depth {L}, {a.draws} paired draws, seed {a.seed}")
    worst = []
    for heads in (32, d // 128):
        if heads < 1 or d % heads:
            continue
        block = spec.build(name, dict(kw, heads=heads))
        v = measure(block, n, d, L, a.draws, a.seed, q0, rho0)
        plain, rope = v[:, 0].mean(0), v[:, 1].mean(0)
        diff = v[:, 1] - v[:, 0]
        se = diff.std(0, ddof=1) / np.sqrt(len(diff))
        se_plain = v[:, 0].std(0, ddof=1) / np.sqrt(len(diff))
        print(f"\nheads {heads} (d_head {d // heads})")
        print(
            f"{'pos':>3} {'q plain':>10} {'q rope':>10} {'dq/se':>7} {'q theory':>10}   "
            f"{'rho plain':>9} {'rho rope':>9} {'drho/se':>7} {'rho theory':>10}"
        )
        for i in range(n):
            dq = (rope[0, i] - plain[0, i]) / se[0, i] if i else 0.0
            dr = (rope[1, i] - plain[1, i]) / se[1, i] if i else 0.0
            print(
                f"{i:3d} {plain[0, i]:10.5g} {rope[0, i]:10.5g} {dq:+7.2f} {th_q[i]:10.5g}   "
                f"{plain[1, i]:9.5f} {rope[1, i]:9.5f} {dr:+7.2f} {th_rho[i]:10.5f}"
            )
        z = np.abs(rope[:, 1:] - plain[:, 1:]) / se[:, 1:]  # position 0: RoPE is the identity there
        unpaired = np.abs(rope[:, 1:] - plain[:, 1:]) / (np.sqrt(2) * se_plain[:, 1:])
        dq_rel = np.abs(rope[0, 1:] - plain[0, 1:]) / plain[0, 1:]
        drho = np.abs(rope[1, 1:] - plain[1, 1:])
        line = (
            f"heads {heads}: max |dq|/q = {dq_rel.max():.2%} ({z[0, dq_rel.argmax()]:.1f} se paired), "
            f"max |drho| = {drho.max():.4f} ({z[1, drho.argmax()]:.1f} se paired); largest: {z.max():.1f} se "
            f"paired, {unpaired.max():.1f} se of two independent means"
        )
        worst.append(line)
        print(line)
    print("\nsummary:\n  " + "\n  ".join(worst))


if __name__ == "__main__":
    main()
