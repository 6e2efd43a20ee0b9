"""Does ``probe --fix`` beat the named initialization recipes? The ViT comparison. Resumable.

    python scripts/recipes_study.py run                       # every arm, the default configurations
    python scripts/recipes_study.py run --depth 16 --configs 1 --seeds 0
    python scripts/recipes_study.py init                      # the probe's rates at init of every arm
    python scripts/recipes_study.py table                     # docs/data/recipes/{table.md, summary.md, init.md}
                                                              # and the figure docs/images/recipes_study.png

The configurations are :mod:`fix_study`'s (``scripts/fix_study.py``: the digits block
study's failing post-LN configurations spread over sigma, and its worst pre-LN one). The fix
of each is the current ``probe --fix`` search's (:func:`fix_study.find_fix`, continuous in
every multiplier), kept in ``docs/data/recipes/fixes.jsonl`` and found there when missing. Each
configuration is trained, as that study trains (15 epochs, Adam 1e-3, batch 64, width 64,
4 heads), once per arm and seed, with the arm's multipliers on the ViT's block weight
matrices at initialization (embeddings and head as drawn):

* ``as is``; ``fixed``: the fix's ``m_w`` on every weight matrix, ``m_res`` on top on the
  residual output projections;
* every recipe of :mod:`phasefield.probing.recipes` (``deepnorm``, ``t-fixup``, ``gpt2``,
  ``depth-mup``, ``completep``, ``rezero``, ``small-std``), its multipliers per weight matrix
  from :func:`~phasefield.probing.recipes.plan` on the ViT's own parameter roles and depth,
  the group std for ``gpt2`` from the first seed's draw; a recipe that does not apply (DeepNorm
  on pre-LN) is recorded as not applicable, not trained;
* ``fixed-residual`` (trained when asked, ``--arms fixed-residual``): the search's point on
  the residual knob alone (``fix.search.axes.residual``: the least m_res change that meets the
  criteria with every other multiplier 1), the fix it would return if the residual output
  projections were its only knob; not applicable where the model as it is meets them;
* ``fixed-grid`` (not trained by ``run``; kept where it was trained): the fix an earlier
  search stored in ``docs/data/fix/fixes.jsonl``, whose residual multiplier took grid nodes
  only (0.933 is the node nearest 1), where it differs from the current search's;
* ``recommend``: the theory's own answer without a probe, ``phasefield recommend --block``'s
  (sigma, alpha_attn, alpha_mlp) closest to critical at the configuration's depth and tokens
  (found beside the fix, ``fix.theory.recommend`` of its row), trained at those numbers in place
  of the configuration's (the same for every configuration of a block and depth).

``init``: per configuration, the probe's measurement at init of every arm (the angle rate, the
gradient factor over the stack, the distance to the fix's criteria and whether it meets them:
what ``phasefield.probe(fix=True)`` measured on the configuration's preset stack as it found
the fix, before it, after it and after every recipe), in ``docs/data/recipes/init_rates.jsonl``.

One row per (configuration, arm, seed) in ``docs/data/recipes/runs.jsonl``, appended when
its batch of runs ends (a rerun trains only what is missing). A run trains when its final
test loss is below the study's threshold (digits: 0.5; chance log 10 = 2.30). ``table``:
every run, then per arm over the configurations where every arm ran (those in progress are
listed under the summary): runs that train,
mean final loss, the paired difference (arm - fixed) of the final loss, mean +- se over
the (configuration, seed) pairs, and the fix's wins, ties and losses against it per
configuration (a win: the arm's loss higher by more than 2 se of the paired difference over
the seeds; a loss: lower by more; a tie otherwise); the probe's rates at init beside each
arm's final losses (``init.md``); and every run's final loss per configuration and arm
(``docs/images/recipes_study.png``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fix_study as fs  # noqa: E402  (the study's configurations, fixes and training)

OUT = os.path.join(fs.ROOT, "docs", "data", "recipes")
ARMS = ("as is", "fixed", "deepnorm", "t-fixup", "gpt2", "depth-mup", "completep", "rezero", "small-std", "recommend")
EXTRA = ("fixed-residual",)  # trained when asked (``--arms``), not required of a configuration
EARLIER = ("fixed-grid",)  # arms kept from earlier runs, not trained by ``run`` (module docstring)
SHOWN = ARMS + EXTRA + EARLIER  # the table's and the summary's arms, in this order
FIXES = os.path.join(OUT, "fixes.jsonl")  # the current search's fix per configuration
IMAGES = os.path.join(fs.ROOT, "docs", "images")


def residual_axis(fix) -> float | None:
    """The fix search's point on the residual knob alone (``fix.search.axes.residual``), or
    None where it has none (the model as it is met the criteria, or the axis did not)."""
    axis = (fix["search"].get("axes") or {}).get("residual")
    return float(axis["residual"]) if isinstance(axis, dict) else None


def recommended(fix_row) -> dict:
    """``recommend --block``'s (sigma_w, alpha_a, alpha_m) for the configuration's block, depth
    and tokens, as the fix found beside it (``fix.theory.recommend`` of its row)."""
    rec = fix_row["fix"]["theory"]["recommend"]
    return dict(sigma_w=rec["sigma"], alpha_a=rec["alpha_attn"], alpha_m=rec["alpha_mlp"])


def arm_multipliers(training, arm, block, depth, fix_row, params=None) -> tuple[dict | None, dict]:
    """({path: multiplier} or None where the arm does not apply, the arm's description)."""
    from phasefield.probing import recipes

    if arm == "recommend":  # trained at the recommended numbers themselves (``run``)
        rec = recommended(fix_row)
        return {}, dict(
            text="recommend --block: sigma {sigma_w:.4g}, alpha_attn {alpha_a:.4g}, alpha_mlp {alpha_m:.4g}".format(
                **rec
            )
        )
    if arm == "as is":
        return {}, dict(text="the init as drawn")
    if arm == "fixed":
        f = fix_row["fix"]["multipliers"]
        run = dict(m_w=f["weights"], m_res=f["residual"])
        mult = dict(zip(training.paths, training.multipliers(run).astype(float)))
        return mult, dict(text=f"probe --fix: m_w {f['weights']:.4g}, m_res {f['residual']:.4g}")
    if arm == "fixed-residual":
        m = residual_axis(fix_row["fix"])
        if m is None:
            return None, dict(text=None, reason="the search found no point on the residual knob alone")
        mult = dict(zip(training.paths, training.multipliers(dict(m_w=1.0, m_res=m)).astype(float)))
        return mult, dict(text=f"probe --fix search, the residual knob alone: m_res {m:.4g}")
    std = recipes.group_std(params, training.sel) if arm == "gpt2" else None
    st = recipes.Structure(depth, recipes.roles(training.sel), block == "post-ln", std)
    plan = recipes.plan(arm, st)
    info = dict(text=plan.get("text"), reason=plan["reason"])
    return (recipes.per_path(plan, st) if plan["applicable"] else None), info


def first_params(training, c, seed):
    """The block parameters of the first seed's draw (for the recipes that read the std)."""
    import jax

    vt, d = training.vt, training.data
    pts = vt.make_points(training.cfg, [c["sigma_w"]], [1.0], [c["alpha_a"]], [c["alpha_m"]], [1e-3], [seed])
    ones = np.ones((1, len(training.paths)), np.float32)
    st = training._init(pts, ones, d.x_train)
    return jax.tree.map(lambda a: np.asarray(a[0]), jax.device_get(st["params"]))


def run(args):
    runs_path = os.path.join(OUT, "runs.jsonl")
    for depth in args.depth:
        for block in args.block:
            training = None
            for c in fs.configurations(block, depth, args.configs, args.data):
                cid = fs.config_id(block, depth, c, args.data)
                fixes = {r["config"]: r for r in fs._rows(FIXES)}
                if cid not in fixes:
                    print(f"[fix] {cid}", flush=True)
                    row = dict(config=cid, data=args.data, block=block, depth=depth, **c)
                    row.update(fs.find_fix(block, depth, c, args.data))
                    fs._append(FIXES, row)
                    fixes[cid] = row
                done = {(r["config"], r["arm"], r["seed"]) for r in fs._rows(runs_path)}
                todo_arms = [a for a in args.arms if any((cid, a, s) not in done for s in args.seeds)]
                if not todo_arms:
                    continue
                if training is None:
                    training = fs.Training(block, depth, args.data)
                params = first_params(training, c, args.seeds[0]) if "gpt2" in todo_arms else None
                todo = []
                for arm in todo_arms:
                    mult, info = arm_multipliers(training, arm, block, depth, fixes[cid], params)
                    for s in args.seeds:
                        if (cid, arm, s) in done:
                            continue
                        numbers = recommended(fixes[cid]) if arm == "recommend" else {}
                        base = dict(config=cid, data=args.data, block=block, depth=depth, arm=arm, seed=s, **info)
                        base.update({k: c[k] for k in ("sigma_w", "alpha_a", "alpha_m")}, **numbers)
                        if mult is None:  # not applicable: recorded, not trained
                            fs._append(runs_path, dict(base, applicable=False))
                            continue
                        todo.append((base, dict(c, seed=s, mult=mult, **numbers)))
                if not todo:
                    continue
                print(f"[train] {cid}: {len(todo)} runs", flush=True)
                t0 = time.perf_counter()
                for i in range(0, len(todo), args.batch):
                    part = todo[i : i + args.batch]
                    res = training.train([r for _, r in part])
                    dt = time.perf_counter() - t0
                    for (base, r), m in zip(part, res):
                        mult = r["mult"]
                        row = dict(base, applicable=True, **m, seconds=dt / len(part), device=training.device)
                        row["multipliers"] = {k: float(v) for k, v in mult.items() if v != 1.0}
                        fs._append(runs_path, row)
                        print(f"      {base['arm']:9s} seed {base['seed']}: test loss {m['test_loss']:.3f}", flush=True)
                    t0 = time.perf_counter()


def _at_init(after) -> dict:
    """The probe's measurement of a model at init (a fix's or a recipe's ``after``; older fix
    rows name the angle rate ``lambda_a``): angle rate, gradient factor, distance, meets."""
    if not after:
        return {}
    rate = after.get("angle_rate", after.get("lambda_a"))
    dist = after.get("distance")
    return dict(angle_rate=rate, gradient_factor=after.get("gradient_factor"), distance=dist, meets=dist <= 1.0)


def init_rates(args):
    """Per configuration of the runs: the probe's rates at init of every arm (module
    docstring), from its fix's row (the probe's measurement before the fix, after it and
    after every recipe) and, for ``fixed-grid``, the earlier search's row; appended to
    ``init_rates.jsonl``."""
    path = os.path.join(OUT, "init_rates.jsonl")
    done = {r["config"] for r in fs._rows(path)}
    fixes = {r["config"]: r for r in fs._rows(FIXES)}
    grid = {r["config"]: r for r in fs._rows(os.path.join(fs.OUT, "fixes.jsonl"))}
    configs = {r["config"] for r in fs._rows(os.path.join(OUT, "runs.jsonl")) if r["arm"] == "as is"}
    for cid in sorted(configs - done):
        fx = fixes[cid]["fix"]
        arms = {"as is": _at_init(fx["before"]), "fixed": _at_init(fx["after"])}
        arms.update({a["name"]: _at_init(a["after"]) for a in fx["recipes"] if a["applicable"]})
        if cid in grid:
            arms["fixed-grid"] = _at_init(grid[cid]["fix"]["after"])
        fs._append(path, dict(config=cid, arms=arms))


def summary_rows(runs, arms=ARMS, loss_key="test_loss") -> list:
    """Per arm of ``arms``: configurations, runs, runs that train, mean loss (``loss_key``),
    paired difference to the fix over the (configuration, seed) pairs both ran (mean, se,
    pairs). Also the language-model study's summary (``scripts/lm_study.py``)."""
    trained = [r for r in runs if r.get("applicable", True)]
    fixed = {(r["config"], r["seed"]): r[loss_key] for r in trained if r["arm"] == "fixed"}
    out = []
    for arm in arms:
        rs = [r for r in trained if r["arm"] == arm]
        skipped = sum(1 for r in runs if r["arm"] == arm and not r.get("applicable", True))
        if not rs and not skipped:
            continue
        loss = np.array([r[loss_key] for r in rs], float)
        diff = np.array(
            [r[loss_key] - fixed[(r["config"], r["seed"])] for r in rs if (r["config"], r["seed"]) in fixed], float
        )
        diff = diff[np.isfinite(diff)]
        wtl = _wins_ties_losses(rs, fixed, loss_key)
        out.append(
            dict(
                arm=arm,
                configs=len({r["config"] for r in rs}),
                runs=len(rs),
                not_applicable=skipped,
                trains=sum(bool(r["trains"]) for r in rs),
                mean_loss=float(np.nanmean(loss)) if loss.size else float("nan"),
                diff_mean=float(diff.mean()) if diff.size else float("nan"),
                diff_se=float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan"),
                pairs=int(diff.size),
                **wtl,
            )
        )
    return out


def complete_configs(runs, arms=ARMS) -> tuple[set, dict]:
    """(configurations where every arm has a row for every seed the configuration has,
    {configuration in progress: how many arms are complete there}): the summary compares the
    arms on the same configurations only."""
    seeds, have = {}, {}
    for r in runs:
        seeds.setdefault(r["config"], set()).add(r["seed"])
        have.setdefault((r["config"], r["arm"]), set()).add(r["seed"])
    count = {cid: sum(have.get((cid, a), set()) >= ss for a in arms) for cid, ss in seeds.items()}
    return {c for c, n in count.items() if n == len(arms)}, {c: n for c, n in count.items() if n < len(arms)}


def _wins_ties_losses(rs, fixed, loss_key) -> dict:
    """The fix against an arm per configuration with at least 2 paired seeds: a win where the
    arm's loss is higher by more than 2 se of the paired difference (over the seeds), a loss
    where lower by more than that, a tie otherwise."""
    by = {}
    for r in rs:
        key = (r["config"], r["seed"])
        if key in fixed and np.isfinite(r[loss_key] - fixed[key]):
            by.setdefault(r["config"], []).append(r[loss_key] - fixed[key])
    out = dict(wins=0, ties=0, losses=0)
    for d in (np.array(v) for v in by.values() if len(v) >= 2):
        band = 2.0 * d.std(ddof=1) / np.sqrt(d.size)
        out["wins" if d.mean() > band else "losses" if d.mean() < -band else "ties"] += 1
    return out


def table(args):
    runs = fs._rows(os.path.join(OUT, "runs.jsonl"))
    lines = ["| configuration | arm | seed | final test loss | trains |", "|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["config"], SHOWN.index(r["arm"]), r["seed"])):
        loss = f"{r['test_loss']:.3f}" if r.get("applicable", True) else "not applicable: " + str(r.get("reason"))
        trains = ("yes" if r["trains"] else "no") if r.get("applicable", True) else "-"
        lines.append(f"| {r['config']} | {r['arm']} | {r['seed']} | {loss} | {trains} |")
    summ = [
        "| arm | configurations | runs (not applicable) | train | mean final loss | arm - fixed (mean ± se, pairs) "
        "| fix wins / ties / losses (configurations) |"
    ]
    summ.append("|---|---|---|---|---|---|---|")
    done, partial = complete_configs(runs)
    for s in summary_rows([r for r in runs if r["config"] in done], SHOWN):
        summ.append(
            f"| {s['arm']} | {s['configs']} | {s['runs']} ({s['not_applicable']}) | {s['trains']} of {s['runs']} | "
            f"{s['mean_loss']:.3f} | {s['diff_mean']:+.3f} ± {s['diff_se']:.3f} ({s['pairs']}) | "
            + ("— |" if s["arm"] == "fixed" else f"{s['wins']} / {s['ties']} / {s['losses']} |")
        )
    if partial:
        summ += [
            "",
            "In progress, not in this summary (every run is in the table): "
            + "; ".join(f"{cid} ({n} of {len(ARMS)} arms)" for cid, n in sorted(partial.items()))
            + ".",
        ]
    init = {r["config"]: r["arms"] for r in fs._rows(os.path.join(OUT, "init_rates.jsonl"))}
    rows = [
        "| configuration | arm | angle rate at init | gradient factor at init | meets at init | "
        "final test loss (seeds) | train |",
        "|---|---|---|---|---|---|---|",
    ]
    for cid in sorted(init):
        for arm in SHOWN:
            at = init[cid].get(arm)
            rs = [r for r in runs if r["config"] == cid and r["arm"] == arm and r.get("applicable", True)]
            if not at or not rs:
                continue
            losses = " / ".join(f"{r['test_loss']:.3f}" for r in sorted(rs, key=lambda r: r["seed"]))
            rows.append(
                f"| {cid} | {arm} | {at['angle_rate']:+.3f} | {at['gradient_factor']:.3g} | "
                f"{'yes' if at['meets'] else 'no'} | {losses} | {sum(bool(r['trains']) for r in rs)} of {len(rs)} |"
            )
    split = {True: [0, 0], False: [0, 0]}  # meets at init -> [runs that train, runs]
    for cid, arms in init.items():
        for arm, at in arms.items():
            rs = [r for r in runs if r["config"] == cid and r["arm"] == arm and r.get("applicable", True)]
            if at and rs:
                split[bool(at["meets"])][0] += sum(bool(r["trains"]) for r in rs)
                split[bool(at["meets"])][1] += len(rs)
    rows += [
        "",
        f"Arms that meet the criteria at init: {split[True][0]} of {split[True][1]} runs train; "
        f"arms that do not: {split[False][0]} of {split[False][1]}.",
    ]
    os.makedirs(OUT, exist_ok=True)
    for name, text in (("table.md", lines), ("summary.md", summ), ("init.md", rows)):
        with open(os.path.join(OUT, name), "w") as f:
            f.write("\n".join(text) + "\n")
    print("\n".join(summ))
    trained = [dict(r, loss=r["test_loss"]) for r in runs if r.get("applicable", True)]
    panels = [
        (_title(cid), [r for r in trained if r["config"] == cid], fs.DATA[_order(cid)[0]]["trains"])
        for cid in sorted({r["config"] for r in trained}, key=_order)
    ]
    figure(panels, "recipes_study", "final test loss", np.log(10), log=True)


def _order(cid):
    """(data, block, depth, sigma) of a configuration, from its id: a row's own ``sigma_w`` is
    the arm's (``recommend`` trains at its own numbers), not the configuration's."""
    data = "mnist1d" if cid.startswith("mnist1d_") else "digits"
    block, depth, sw = cid.removeprefix("mnist1d_").split("_")[:3]
    return (data, block, int(depth[1:]), float(sw[2:]))


def _title(cid):
    data, block, depth, sw = _order(cid)
    return f"{block} L {depth} σ {sw:.2f}" + (" (MNIST-1D)" if data == "mnist1d" else "")


def figure(panels, name, ylabel, chance, log=False, arms=SHOWN) -> str:
    """One panel per configuration (``panels``: [(title, [run rows], threshold of "trains")]):
    every run's final loss (``loss`` of its row) per arm, in the order of ``arms``, the fix's
    in blue, the model as it is in red; dashed: the threshold, dotted: chance.
    ``docs/images/NAME.png``."""
    from phasefield.figures import style

    ncols = min(4, len(panels))
    nrows = -(-len(panels) // ncols)
    color = {"as is": "tab:red", "fixed": "tab:blue"}
    with style.context() as plt:
        fig, axes = plt.subplots(
            nrows, ncols, figsize=(style.COLUMN * 2, 1.55 * nrows + 0.3), squeeze=False, sharey=True
        )
        for ax in axes.flat[len(panels) :]:
            ax.set_visible(False)
        for ax, (title, rows, trains) in zip(axes.flat, panels):
            shown = [a for a in arms if any(r["arm"] == a for r in rows)]
            for k, arm in enumerate(shown):
                y = [r["loss"] for r in rows if r["arm"] == arm]
                x = k + np.linspace(-0.15, 0.15, len(y)) if len(y) > 1 else [k]
                ax.plot(x, y, "o", ms=2.2, color=color.get(arm, "0.3"), ls="none")
            ax.axhline(trains, color="0.5", lw=0.6, ls="--")
            ax.axhline(chance, color="0.7", lw=0.6, ls=":")
            ax.set_xticks(np.arange(len(shown)))
            ax.set_xticklabels(shown, rotation=90, fontsize=5)
            ax.set_title(title, fontsize=6)
            if log:
                ax.set_yscale("log")
        for row in axes:
            row[0].set_ylabel(ylabel)
        fig.tight_layout()
        path = style.save(fig, IMAGES, name, formats=("png",))[0]
    print(f"wrote {path}")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--depth", type=int, nargs="+", default=[16, 32])
    r.add_argument("--block", nargs="+", default=["post-ln", "pre-ln"], choices=["post-ln", "pre-ln"])
    r.add_argument("--configs", type=int, default=3)
    r.add_argument("--seeds", type=int, nargs="+", default=list(fs.SEEDS))
    r.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + EXTRA)
    r.add_argument("--batch", type=int, default=9, help="runs trained at once (vmapped)")
    r.add_argument("--data", default="digits", choices=sorted(fs.DATA))
    sub.add_parser("init")
    sub.add_parser("table")
    args = ap.parse_args(argv)
    {"run": run, "init": init_rates, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
