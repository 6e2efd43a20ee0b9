"""Does ``phasefield probe --fix`` make failing post-LN ViTs train? Resumable.

    python scripts/fix_study.py run                 # fixes, then trains before/after (rows appended)
    python scripts/fix_study.py run --depth 16 --configs 4
    python scripts/fix_study.py table               # summary.csv, the docs table, the figure

The configurations are those of the post-LN digits study (docs/block_studies.md; runs in
``docs/data/trainability/blocks/post-ln/results.jsonl``; at L = 64 its deep extension,
``post-ln-L64``) where every seed failed (test loss at chance): ``--configs`` of them per
depth, spread over sigma. For each:

1. **the fix**: ``phasefield.probe(model, fix=True)`` on a stack of the ViT's blocks
   (``post-ln:heads=4`` at the configuration's sigma, alpha_attn, alpha_mlp; width 64,
   17 tokens, the ViT's depth) from the ViT's measured input geometry (q0, rho0) =
   (1.63, 0.064) (``input_geometry.json``), 8 initializations, the search at 4, the
   verification at 16 (row in ``fixes.jsonl``);
2. **training**, as the study trained (phasefield.vit: 15 epochs, Adam 1e-3, batch 64,
   seeds 0-2), once as it is and once with the fix's multipliers applied to the ViT's block
   parameters at initialization (every weight matrix under ``blocks/`` times m_w, the
   attention ``out`` and MLP ``dense_1`` kernels times m_res on top: the probe's parameter
   groups; embeddings and head as drawn); one row per run in ``runs.jsonl``. A run trains
   when its final test loss is below 0.5 (chance: log 10 = 2.30).

A pre-LN case (``--block pre-ln``): the pre-LN configuration of the same study with the
highest seed-mean test loss at each depth given, the same two trainings.

MNIST-1D (``--data mnist1d``, the optional extra ``mnist1d``): the same for the study's
post-LN MNIST-1D runs (``blocks/post-ln-mnist1d``, L = 16, 40-sample signals in patches of
4: 11 tokens, input geometry from ``trainability/mnist1d/input_geometry.json``). There a
configuration failed when every seed ended at chance (test loss >= 0.95 log 10, the
criterion of ``phasefield.vit.analysis.at_chance``), and a run trains when its test loss is
below that (the study's good MNIST-1D runs end at 0.8-1.3).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

OUT = os.path.join(ROOT, "docs", "data", "fix")
STUDY = os.path.join(ROOT, "docs", "data", "trainability", "blocks")
IMAGE = os.path.join(ROOT, "docs", "images", "fix_study.png")
SEEDS = (0, 1, 2)
AT_CHANCE = 0.95 * math.log(10)
# per data set: the study's runs (suffix of the block's folder), the ViT's input, the
# tokens entering block 1 (q0, rho0: input_geometry.json of the study) and "trains"
DATA = {
    "digits": dict(
        suffix="", image_size=8, patch_size=2, n_tokens=17, trains=0.5, q0=1.631534792482853, rho0=0.06444805523694995
    ),
    "mnist1d": dict(
        suffix="-mnist1d",
        image_size=40,
        patch_size=4,
        n_tokens=11,
        trains=AT_CHANCE,
        q0=1.0110598355531693,
        rho0=0.017198480311174342,
    ),
}
TRAINS = DATA["digits"]["trains"]


def _rows(path):
    """The study's rows in ``path`` (``phasefield.io.read_jsonl``: [] where there is none, a
    line torn by a kill skipped)."""
    from phasefield.io import read_jsonl

    return read_jsonl(path)


def _append(path, row):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, default=float) + "\n")


def _study_dirs(block: str, data: str) -> list:
    """The block study's result folders on ``data``: the study (L 8-32) and its deep extension
    (``<block>-L64``, digits) where it has been trained."""
    name = block + DATA[data]["suffix"]
    return [os.path.join(STUDY, n) for n in (name, f"{name}-L64") if os.path.isdir(os.path.join(STUDY, n))]


def configurations(block: str, depth: int, n: int, data: str = "digits") -> list:
    """The study's configurations at ``depth``: post-LN, those where every seed failed, ``n``
    spread over sigma; pre-LN, the one with the highest seed-mean test loss."""
    runs = [r for d in _study_dirs(block, data) for r in _rows(os.path.join(d, "results.jsonl"))]
    fails = DATA[data]["trains"] if data == "digits" else AT_CHANCE
    by = {}
    for r in runs:
        if r["depth"] != depth:
            continue
        key = (r["sigma_w"], r["alpha_a"], r["alpha_m"])
        by.setdefault(key, []).append(r["test_loss"] if np.isfinite(r["test_loss"]) else np.inf)
    if block == "pre-ln":
        key = max(by, key=lambda k: np.mean(by[k]))
        return [dict(sigma_w=key[0], alpha_a=key[1], alpha_m=key[2], study_losses=by[key])]
    failed = sorted(k for k, v in by.items() if all(x >= fails for x in v))
    pick = [failed[i] for i in np.unique(np.round(np.linspace(0, len(failed) - 1, min(n, len(failed)))).astype(int))]
    return [dict(sigma_w=k[0], alpha_a=k[1], alpha_m=k[2], study_losses=by[k]) for k in pick]


def config_id(block, depth, c, data="digits"):
    return (
        "" if data == "digits" else f"{data}_"
    ) + f"{block}_L{depth}_sw{c['sigma_w']:.4f}_aa{c['alpha_a']:.4f}_am{c['alpha_m']:.4f}"


def find_fix(block, depth, c, data="digits"):
    import phasefield
    from phasefield.probing import models

    m = models.preset(
        block,
        depth=depth,
        width=64,
        n_tokens=DATA[data]["n_tokens"],
        heads=4,
        sigma=c["sigma_w"],
        alpha_attn=c["alpha_a"],
        alpha_mlp=c["alpha_m"],
        q0=DATA[data]["q0"],
        rho0=DATA[data]["rho0"],
    )
    t0 = time.perf_counter()
    res = phasefield.probe(m, inits=8, fix=True, fix_options=dict(inits=4, verify_inits=16))
    d = res.to_dict()
    fx = d["fix"]
    fx["search"].pop("points", None)
    return dict(
        angle_rate=d["angle_rate"],
        angle_rate_se=d["angle_rate_se"],
        lambda_g_input=d["lambda_g_input"],
        lambda_g_input_se=d["lambda_g_input_se"],
        first_failing_block=d["first_failing_block"],
        fix=fx,
        seconds=time.perf_counter() - t0,
    )


class Training:
    """The study's training of one depth and block, with multipliers on the block parameters
    at init (vmapped over runs)."""

    def __init__(self, block, depth, data="digits"):
        import jax

        from phasefield.probing import fix
        from phasefield.vit import data as vdata
        from phasefield.vit import train as vt

        self.trains = DATA[data]["trains"]
        self.cfg = vt.TrainConfig(
            dataset=data,
            image_size=DATA[data]["image_size"],
            patch_size=DATA[data]["patch_size"],
            width=64,
            depth=depth,
            epochs=15,
            batch_size=64,
            eval_batch_size=512,
            block=f"{block}:heads=4",
        )
        self.data = vdata.load(data, DATA[data]["image_size"])
        self.device = jax.devices()[0].device_kind  # where the runs train ("cpu", a GPU's name)
        d = self.data
        init, epoch, final = vt.make_train_parts(self.cfg, d.num_classes, d.scale, 64)
        self.vt = vt
        p0 = vt.make_points(self.cfg, [1.0], [1.0], [0.5], [0.5], [1e-3], [0])
        shape = jax.eval_shape(lambda p: init(jax.tree.map(lambda a: a[0], p), d.x_train), p0)["params"]
        self.sel = fix.check_selection(shape, weights=r"^blocks/")
        self.paths = sorted(self.sel)
        index = {p: i for i, p in enumerate(self.paths)}

        def init_fixed(point, mult, x):  # mult [paths]: each weight matrix's multiplier
            st = init(point, x)

            def f(path, leaf):
                i = index.get(fix.param_path(path))
                return leaf if i is None else leaf * mult[i].astype(leaf.dtype)

            st["params"] = jax.tree_util.tree_map_with_path(f, st["params"])
            return st

        opts = vt.compiler_options(jax.devices())
        self._init = jax.jit(jax.vmap(init_fixed, in_axes=(0, 0, None)), compiler_options=opts)
        self._epoch = jax.jit(jax.vmap(epoch, in_axes=(0, None, None, None, None)), compiler_options=opts)
        self._final = jax.jit(jax.vmap(final, in_axes=(0, None, None)), compiler_options=opts)

    def multipliers(self, run) -> np.ndarray:
        """float32 [paths]: ``run["mult"]`` ({path: multiplier}, 1 where absent), or the fix's
        ``m_w`` on every weight matrix and ``m_w m_res`` on the residual projections (the
        product in float32, as :func:`phasefield.probing.fix.scale` forms it)."""
        if "mult" in run:
            return np.asarray([run["mult"].get(p, 1.0) for p in self.paths], np.float32)
        mw, mr = np.float32(run["m_w"]), np.float32(run["m_res"])
        return np.asarray([mw * mr if self.sel[p][1] else mw for p in self.paths], np.float32)

    def train(self, runs):
        """``runs``: dicts with sigma_w, alpha_a, alpha_m, seed and the multipliers
        (:meth:`multipliers`) -> metrics per run."""
        import jax
        import jax.numpy as jnp

        d, vt = self.data, self.vt
        pts = vt.make_points(
            self.cfg,
            [r["sigma_w"] for r in runs],
            [1.0] * len(runs),
            [r["alpha_a"] for r in runs],
            [r["alpha_m"] for r in runs],
            [1e-3] * len(runs),
            [r["seed"] for r in runs],
        )
        mult = jnp.asarray(np.stack([self.multipliers(r) for r in runs]))
        xtr, ytr = jnp.asarray(d.x_train), jnp.asarray(d.y_train.astype(np.int32))
        xte, yte = jnp.asarray(d.x_test), jnp.asarray(d.y_test.astype(np.int32))
        st = self._init(pts, mult, xtr)
        hist = []
        for _ in range(self.cfg.epochs):
            st, m = self._epoch(st, xtr, ytr, xte, yte)
            hist.append(jax.device_get(m))
        fin = jax.device_get(self._final(st, xtr, ytr))
        curve = np.stack([h["test_loss"] for h in hist], 1)
        acc = np.stack([h["test_acc"] for h in hist], 1)
        steps = np.concatenate([np.asarray(h["step_loss"]).reshape(len(runs), -1) for h in hist], 1)
        out = []
        for i in range(len(runs)):
            tl = float(curve[i, -1])
            diverged = bool(not np.all(np.isfinite(steps[i])) or not np.isfinite(tl))
            out.append(
                dict(
                    test_loss=tl,
                    test_acc=float(acc[i, -1]),
                    train_loss=float(fin["train_loss"][i]),
                    diverged=diverged,
                    trains=bool(np.isfinite(tl) and tl < self.trains),
                    test_loss_curve=[float(x) for x in curve[i]],
                )
            )
        return out


def run(args):
    import phasefield  # noqa: F401

    fixes_path, runs_path = os.path.join(OUT, "fixes.jsonl"), os.path.join(OUT, "runs.jsonl")
    for depth in args.depth:
        for block in args.block:
            confs = configurations(block, depth, args.configs, args.data)
            training = None
            for c in confs:
                cid = config_id(block, depth, c, args.data)
                fixes = {r["config"]: r for r in _rows(fixes_path)}
                if cid not in fixes:
                    print(f"[fix] {cid}", flush=True)
                    row = dict(config=cid, data=args.data, block=block, depth=depth, **c)
                    row.update(find_fix(block, depth, c, args.data))
                    _append(fixes_path, row)
                    fixes[cid] = row
                    mult = row["fix"]["multipliers"]
                    print(f"      m_w {mult['weights']:.3f} m_res {mult['residual']:.3f} meets {row['fix']['meets']}")
                f = fixes[cid]["fix"]["multipliers"]
                done = {(r["config"], r["variant"], r["seed"]) for r in _rows(runs_path)}
                todo = [
                    dict(c, seed=s, variant=v, m_w=mw, m_res=mr)
                    for v, mw, mr in (("as is", 1.0, 1.0), ("fixed", f["weights"], f["residual"]))
                    for s in args.seeds
                    if (cid, v, s) not in done
                ]
                if not todo:
                    continue
                if training is None:
                    training = Training(block, depth, args.data)
                print(f"[train] {cid}: {len(todo)} runs", flush=True)
                t0 = time.perf_counter()
                res = training.train(todo)
                dt = time.perf_counter() - t0
                for r, m in zip(todo, res):
                    row = dict(
                        config=cid,
                        data=args.data,
                        block=block,
                        depth=depth,
                        sigma_w=r["sigma_w"],
                        alpha_a=r["alpha_a"],
                        alpha_m=r["alpha_m"],
                        seed=r["seed"],
                        variant=r["variant"],
                        m_w=r["m_w"],
                        m_res=r["m_res"],
                        **m,
                        seconds=dt / len(todo),
                    )
                    _append(runs_path, row)
                    print(f"      {r['variant']:6s} seed {r['seed']}: test loss {m['test_loss']:.3f}", flush=True)


def table(args):
    fixes = {r["config"]: r for r in _rows(os.path.join(OUT, "fixes.jsonl"))}
    runs = _rows(os.path.join(OUT, "runs.jsonl"))
    lines = [
        "| data | block | L | sigma | alpha_attn | alpha_mlp | study (seeds 0-2) | m_w | m_res | fix meets | "
        "as is: test loss per seed | trains | fixed: test loss per seed | trains |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    csv = ["config,data,block,depth,sigma_w,alpha_a,alpha_m,m_w,m_res,meets,variant,seed,test_loss,test_acc,trains"]
    summary = []
    for cid, fx in fixes.items():
        rs = [r for r in runs if r["config"] == cid]
        if not rs:
            continue
        by = {v: sorted((r for r in rs if r["variant"] == v), key=lambda r: r["seed"]) for v in ("as is", "fixed")}
        m = fx["fix"]["multipliers"]
        data = fx.get("data", "digits")
        cells = []
        for v in ("as is", "fixed"):
            cells.append(" / ".join(f"{r['test_loss']:.3f}" for r in by[v]) or "-")
            cells.append(f"{sum(r['trains'] for r in by[v])} of {len(by[v])}")
        lines.append(
            f"| {data} | {fx['block']} | {fx['depth']} | {fx['sigma_w']:.3f} | {fx['alpha_a']:.3f} | {fx['alpha_m']:.3f} | "
            + " / ".join(f"{x:.2f}" for x in fx["study_losses"])
            + f" | {m['weights']:.3f} | {m['residual']:.3f} | {'yes' if fx['fix']['meets'] else 'no'} | "
            + " | ".join(cells)
            + " |"
        )
        for v in ("as is", "fixed"):
            for r in by[v]:
                csv.append(
                    f"{cid},{data},{fx['block']},{fx['depth']},{fx['sigma_w']:.6g},{fx['alpha_a']:.6g},{fx['alpha_m']:.6g},"
                    f"{r['m_w']:.6g},{r['m_res']:.6g},{fx['fix']['meets']},{v},{r['seed']},{r['test_loss']:.6g},"
                    f"{r['test_acc']:.6g},{r['trains']}"
                )
        summary.append((fx, by))
    with open(os.path.join(OUT, "summary.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")
    with open(os.path.join(OUT, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    for data, block, depth in itertools.product(DATA, ("post-ln", "pre-ln"), (32, 16)):
        sel = [
            (fx, by)
            for fx, by in summary
            if fx.get("data", "digits") == data and fx["block"] == block and fx["depth"] == depth
        ]
        if not sel:
            continue
        n = {v: sum(len(by[v]) for _, by in sel) for v in ("as is", "fixed")}
        ok = {v: sum(r["trains"] for _, by in sel for r in by[v]) for v in ("as is", "fixed")}
        mean = {v: np.mean([r["test_loss"] for _, by in sel for r in by[v]]) for v in ("as is", "fixed")}
        print(
            f"{data} {block} L={depth}: {len(sel)} configurations; trains as is {ok['as is']} of {n['as is']} "
            f"(mean test loss {mean['as is']:.3f}), fixed {ok['fixed']} of {n['fixed']} "
            f"(mean test loss {mean['fixed']:.3f})"
        )
    if summary:
        figure(summary)


def figure(summary):
    from phasefield.figures import style

    sets = [d for d in DATA if any(fx.get("data", "digits") == d for fx, _ in summary)]
    with style.context() as plt:
        widths = [sum(fx.get("data", "digits") == d for fx, _ in summary) for d in sets]
        fig, axes = plt.subplots(
            1,
            len(sets),
            figsize=(style.COLUMN * 1.3 * max(1, len(sets) * 0.75), 2.4),
            squeeze=False,
            gridspec_kw=dict(width_ratios=widths),
        )
        for ax, d in zip(axes[0], sets):
            sel = [(fx, by) for fx, by in summary if fx.get("data", "digits") == d]
            for k, (_, by) in enumerate(sel):
                for v, color, dx in (("as is", "tab:red", -0.12), ("fixed", "tab:blue", 0.12)):
                    y = [r["test_loss"] for r in by[v]]
                    ax.plot([k + dx] * len(y), y, "o", ms=3, color=color, label=v if k == 0 else None)
            ax.axhline(DATA[d]["trains"], color="0.5", lw=0.6, ls="--")
            ax.axhline(math.log(10), color="0.7", lw=0.6, ls=":")
            ax.set_xticks(np.arange(len(sel)))
            ax.set_xticklabels(
                [f"{fx['block']}\nL={fx['depth']} σ={fx['sigma_w']:.2f}" for fx, _ in sel], rotation=90, fontsize=5
            )
            ax.set_ylabel(f"final test loss ({d})")
            ax.set_title(f"{d}: as is and after probe --fix (3 seeds)", fontsize=7)
        axes[0][0].legend(frameon=False, fontsize=6)
        fig.tight_layout()
        fig.savefig(IMAGE, dpi=style.DPI)
        plt.close(fig)
    print(f"wrote {IMAGE}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--depth", type=int, nargs="+", default=[32])
    r.add_argument("--block", nargs="+", default=["post-ln"], choices=["post-ln", "pre-ln"])
    r.add_argument("--configs", type=int, default=6)
    r.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    r.add_argument("--data", default="digits", choices=sorted(DATA))
    sub.add_parser("table")
    args = ap.parse_args(argv)
    {"run": run, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
