"""Hugging Face's Flax GPT-2 at its shipped initialization against the ``gpt2`` preset's
causal theory, per position (docs/theory.md, "Causal stacks").

The network: ``transformers`` 4.x ``FlaxGPT2Model`` from a config (no download), width 768,
12 heads, dropout off, random token ids and positions 0..n-1; the tokens leaving the last
``FlaxGPT2Block`` are read with :func:`phasefield.probing.capture.runner`. Per position i
after L blocks: ``q_L_pos`` (token i's squared norm per component) and ``rho_L_pos`` (its
mean cosine with the tokens j < i; position 0: none), averaged over the ``--batch``
sequences of one draw; mean and standard error over ``--inits`` independent draws of the
weights and token ids.

The theory: :func:`phasefield.layers.causal_trajectory` of ``gpt2:width=768,depth=L``
(causal, exact-softmax map; beside it the same stack unmasked, whose last token the mask
moves) from the preset's input geometry (token plus position
embedding: q0 = 2 x 0.02^2, rho0 = 0). Two weight variants: ``shipped`` (Hugging Face's Flax
GPT-2 draws every weight, ``c_proj`` included, with std 0.02: the theory's ``alpha = 1``)
and ``scaled`` (GPT-2's 1/sqrt(2L) on both ``c_proj``: the preset's default). Two LayerNorm
epsilons: GPT-2's 1e-5 (1.2 % of the first block's input variance 8e-4) and 0, the mean
field's.

One JSON line per (depth, variant, epsilon) in ``--out`` (resumable: the lines already there
are skipped; ``--retheory`` recomputes the theory and z of the lines there, keeping the
network's numbers), then the largest |z| per line and the table of the first line asked for.

    PYTHONPATH=FOLDER_WITH_TRANSFORMERS nice python scripts/hf_gpt2_causal.py [--depths 12 48]
        [--inits 8] [--batch 4] [--n-tokens 16] [--out scripts/results/hf_gpt2_causal.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

WIDTH, HEADS, VOCAB, STD = 768, 12, 50257, 0.02
VARIANTS = ("shipped", "scaled")
EPSILONS = (1e-5, 0.0)


def per_position(x) -> tuple[np.ndarray, np.ndarray]:
    """(q [n], rho [n]) of tokens [batch, n, d], averaged over the batch (float64)."""
    x = np.asarray(x, np.float64)
    d, n = x.shape[-1], x.shape[-2]
    g = np.einsum("bid,bjd->bij", x, x) / d
    q = np.diagonal(g, axis1=1, axis2=2)
    r = g / np.sqrt(q[:, :, None] * q[:, None, :])
    lower = np.tril(np.ones((n, n)), -1)
    rho = (r * lower).sum(-1) / np.maximum(lower.sum(-1), 1.0)
    return q.mean(0), rho.mean(0)


def network(depth, variant, eps, inits, batch, n_tokens, seed=0) -> dict:
    """Mean and se over ``inits`` draws of the last block's per-position q and rho."""
    import jax
    import jax.numpy as jnp
    import transformers

    from phasefield.probing import capture

    cfg = transformers.GPT2Config(
        n_layer=depth,
        n_embd=WIDTH,
        n_head=HEADS,
        n_positions=1024,
        vocab_size=VOCAB,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=eps,
    )
    module = transformers.FlaxGPT2Model(cfg, _do_init=False).module

    def call(ids):
        pos = jnp.broadcast_to(jnp.arange(n_tokens), ids.shape)
        return dict(input_ids=ids, attention_mask=jnp.ones_like(ids), position_ids=pos, deterministic=True)

    def apply_fn(params, ids):
        return module.apply(params, **call(ids))

    def scale(path, x):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        return x / np.sqrt(2.0 * depth) if variant == "scaled" and name.endswith("c_proj/kernel") else x

    @jax.jit
    def draw(key):
        k_init, k_ids = jax.random.split(key)
        ids = jax.random.randint(k_ids, (batch, n_tokens), 0, VOCAB)
        params = module.init({"params": k_init, "dropout": k_init}, **call(ids))
        params = jax.tree_util.tree_map_with_path(scale, params)
        _, outs = capture.runner(apply_fn, ids, blocks="FlaxGPT2Block")(params)
        return outs[-1]

    qs, rhos = [], []
    for k in range(inits):
        q, rho = per_position(draw(jax.random.PRNGKey(seed + k)))
        qs.append(q)
        rhos.append(rho)
        print(f"  L {depth} {variant} eps {eps:g}: draw {k + 1}/{inits}", file=sys.stderr, flush=True)
    qs, rhos = np.array(qs), np.array(rhos)

    def se(a):
        return a.std(0, ddof=1) / np.sqrt(len(a))

    return dict(q=qs.mean(0), q_se=se(qs), rho=rhos.mean(0), rho_se=se(rhos))


def theory(depth, variant, n_tokens) -> dict:
    from phasefield import layers
    from phasefield.layers import registry, spec

    opts = dict(width=WIDTH, depth=depth, heads=HEADS)
    if variant == "shipped":
        opts["alpha"] = 1.0
    block = spec.build("gpt2", opts)
    q0, rho0 = registry.lookup("gpt2").geometry(opts)
    out = layers.causal_trajectory(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth, causal=True)
    plain = layers.causal_trajectory(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth, causal=False)
    return dict(
        q=np.asarray(out["q_pos"][-1]),
        rho=np.asarray(out["rho_pos"][-1]),
        q_acausal=np.asarray(plain["q_pos"][-1]),
        rho_acausal=np.asarray(plain["rho_pos"][-1]),
        q0=q0,
        rho0=rho0,
    )


def row(depth, variant, eps, inits, batch, n_tokens) -> dict:
    t0 = time.perf_counter()
    th = theory(depth, variant, n_tokens)
    net = network(depth, variant, eps, inits, batch, n_tokens)
    out = dict(depth=depth, variant=variant, eps=eps, inits=inits, batch=batch, n_tokens=n_tokens, width=WIDTH)
    out.update(scored(th, net))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def retheory(r) -> dict:
    """Row ``r`` with its theory (and z) computed again by this checkout (the network's
    numbers kept)."""
    th = theory(r["depth"], r["variant"], r["n_tokens"])
    net = {}
    for name in ("q", "rho"):
        net[name], net[name + "_se"] = np.asarray(r[name]["net"]), np.asarray(r[name]["se"])
    return dict(r, **scored(th, net))


def scored(th, net) -> dict:
    """The theory, the network's mean and se, and z per position."""
    out = dict(q0=th["q0"], rho0=th["rho0"])
    for name in ("q", "rho"):
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (net[name] - th[name]) / net[name + "_se"]
        if name == "rho":
            z[0] = np.nan  # position 0 has no earlier token: 0 by definition
        out[name] = dict(
            theory=th[name].tolist(),
            net=net[name].tolist(),
            se=net[name + "_se"].tolist(),
            z=[None if not np.isfinite(v) else float(v) for v in z],
            acausal=th[name + "_acausal"].tolist(),  # the theory without the mask
            z_acausal_last=float((net[name][-1] - th[name + "_acausal"][-1]) / net[name + "_se"][-1]),
        )
    return out


def key(r) -> tuple:
    return (r["depth"], r["variant"], r["eps"], r["inits"], r["batch"], r["n_tokens"])


def largest(r, name) -> tuple[float, int]:
    z = np.array([np.nan if v is None else v for v in r[name]["z"]])
    i = int(np.nanargmax(np.abs(z)))  # position 0's rho is NaN on purpose: no earlier token
    return float(z[i]), i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[12, 48])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--inits", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--n-tokens", type=int, default=16)
    ap.add_argument("--out", default="scripts/results/hf_gpt2_causal.jsonl")
    ap.add_argument("--retheory", action="store_true", help="recompute the theory of the rows in --out (and z)")
    a = ap.parse_args(argv)
    if a.inits < 2 or a.batch < 1 or a.n_tokens < 2 or min(a.depths) < 1:
        ap.error("inits >= 2, batch >= 1, n-tokens >= 2 and depths >= 1")
    from phasefield.io import append_jsonl, read_jsonl

    done = {key(r): r for r in (read_jsonl(a.out) if os.path.exists(a.out) else [])}
    if a.retheory:
        done = {k: retheory(r) for k, r in done.items()}
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in done.values())
        os.replace(tmp, a.out)
    asked = []
    for depth in a.depths:
        for variant in a.variants:
            for eps in a.eps:
                k = (depth, variant, eps, a.inits, a.batch, a.n_tokens)
                if k not in done:
                    done[k] = row(depth, variant, eps, a.inits, a.batch, a.n_tokens)
                    append_jsonl(a.out, done[k])
                asked.append(done[k])
    for r in asked:
        zq, iq = largest(r, "q")
        zr, ir = largest(r, "rho")
        print(
            f"L {r['depth']:>2} {r['variant']:<7} eps {r['eps']:<6g} ({r['inits']} draws x {r['batch']} sequences): "
            f"max |z| q {abs(zq):.2f} (position {iq}), rho {abs(zr):.2f} (position {ir}); "
            f"the unmasked theory at the last position: |z| q {abs(r['q']['z_acausal_last']):.1f}, "
            f"rho {abs(r['rho']['z_acausal_last']):.1f}"
        )
    r = asked[0]
    print(
        f"\nL {r['depth']}, {r['variant']}, eps {r['eps']:g}: position, q theory / net +- se (z), rho theory / net +- se (z)"
    )
    for i in range(r["n_tokens"]):
        q, rho = r["q"], r["rho"]
        zr = "" if rho["z"][i] is None else f"({rho['z'][i]:+.2f})"
        print(
            f"{i:>3}  {q['theory'][i]:.5f} / {q['net'][i]:.5f} +- {q['se'][i]:.5f} ({q['z'][i]:+.2f})   "
            f"{rho['theory'][i]:.4f} / {rho['net'][i]:.4f} +- {rho['se'][i]:.4f} {zr}"
        )
    print(json.dumps({"rows": len(asked)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
