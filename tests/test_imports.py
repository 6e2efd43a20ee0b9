"""Imports inside phasefield point one way: cli -> vit, figures -> diagram,
simulate, seeds, probing -> block -> layers -> theory -> config, grid, io, activations, schema.

The module graph is built statically (``ast``, no import runs): every ``import`` and
``from ... import`` anywhere in a file, inside functions too, relative ones resolved;
``from pkg import name`` is an edge to the submodule ``pkg.name`` when there is one, else
to ``pkg``; importing ``a.b.c`` also runs the ``__init__`` of the packages ``a.b`` (an edge
to each, except the importer's own packages, which are already running).

And the public surface: ``phasefield.sweep``, ``phasefield.probe`` and ``phasefield.exponents``
are plain functions, loaded on first use (a bare ``import phasefield`` imports no JAX), and
every name of ``phasefield.__all__`` resolves.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# top-level units of phasefield, lowest first: an import may point to a lower rank (or
# within its own unit), never up
RANKS = {
    "phasefield._runtime": 0,
    "phasefield.io": 0,
    "phasefield.grid": 0,
    "phasefield.activations": 0,
    "phasefield.schema": 0,
    "phasefield.driver": 0,
    "phasefield.theory": 1,
    "phasefield.layers": 2,
    "phasefield.block": 3,
    "phasefield.diagram": 4,
    "phasefield.simulate": 4,
    "phasefield.seeds": 4,
    "phasefield.probing": 4,
    "phasefield.figures": 5,
    "phasefield.vit": 5,
    "phasefield.lm": 5,
    "phasefield.cli": 6,
    "phasefield.__main__": 7,
}
FOUNDATION = {m for m, r in RANKS.items() if r == 0}


def modules(root: str, package: str) -> dict[str, str]:
    """{dotted module name: file} of every .py file of ``package`` under ``root``."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, package)):
        for f in files:
            if not f.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(dirpath, f), root)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = os.path.join(dirpath, f)
    return out


def import_graph(root: str, package: str) -> dict[str, set[str]]:
    """{module: modules it imports (within ``package``)}, statically."""
    mods = modules(root, package)

    def owner(name):  # the longest module prefix of a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_pkg = os.path.basename(path) == "__init__.py"
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(owner(a.name) for a in node.names if a.name.split(".")[0] == package)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if full.split(".")[0] != package:
                    continue
                for a in node.names:
                    sub = f"{full}.{a.name}"
                    targets.add(sub if sub in mods else owner(full))
        own = {".".join(mod.split(".")[:k]) for k in range(1, mod.count(".") + 2)}
        for t in list(targets):  # the packages a.b of a.b.c run too
            if t is None:
                continue
            parts = t.split(".")
            targets.update(p for p in (".".join(parts[:k]) for k in range(1, len(parts))) if p in mods and p not in own)
        targets.discard(None)
        targets.discard(mod)
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def unit(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, "phasefield")


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The builder itself: relative, absolute, function-level, ``from . import x`` (an edge to
    the submodule) and a package's ``__init__`` run by importing its submodule."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .sub import c\n",
        "pkg/sub/__init__.py": "from . import d\n",
        "pkg/sub/c.py": "import pkg.e\n",
        "pkg/sub/d.py": "from ..a import thing\n",
        "pkg/e.py": "import os\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    g = import_graph(str(tmp_path), "pkg")
    assert g["pkg.a"] == {"pkg.b"}
    assert g["pkg.b"] == {"pkg.sub.c", "pkg.sub"}  # function-level; sub's __init__ runs
    assert g["pkg.sub"] == {"pkg.sub.d"}
    assert g["pkg.sub.c"] == {"pkg.e"}
    assert g["pkg.sub.d"] == {"pkg.a"}
    assert g["pkg.e"] == set()
    assert cycles(g) == [["pkg.a", "pkg.b", "pkg.sub", "pkg.sub.d"]]


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, "import cycles in phasefield:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_unit_has_a_rank(graph):
    missing = sorted({unit(m) for m in graph} - set(RANKS) - {"phasefield"})
    assert not missing, f"give these a rank in RANKS: {missing}"


def test_imports_point_down(graph):
    up = sorted(
        f"{m} -> {t}"
        for m, ts in graph.items()
        for t in ts
        if unit(m) in RANKS and unit(t) in RANKS and unit(m) != unit(t) and RANKS[unit(t)] > RANKS[unit(m)]
    )
    assert not up, "imports pointing up:\n" + "\n".join(up)


def test_theory_imports_only_kernels_and_foundation(graph):
    """phasefield.theory (the Gaussian-integral kernels, the reference) imports nothing
    from layers, diagram, simulate, vit, figures, cli, ..."""
    bad = sorted(
        f"{m} -> {t}"
        for m, ts in graph.items()
        if unit(m) == "phasefield.theory"
        for t in ts
        if unit(t) != "phasefield.theory" and t not in FOUNDATION
    )
    assert not bad, "phasefield.theory imports from above it:\n" + "\n".join(bad)


def test_layers_import_nothing_above_them(graph):
    bad = sorted(
        f"{m} -> {t}"
        for m, ts in graph.items()
        if unit(m) == "phasefield.layers"
        for t in ts
        if RANKS.get(unit(t), 99) > RANKS["phasefield.layers"]
    )
    assert not bad, "phasefield.layers imports from above it:\n" + "\n".join(bad)


# -- the public surface, in a fresh interpreter (in-process, other tests import first) -------
PUBLIC = r"""
import inspect, json, sys
import phasefield
out = {"jax_after_import": sorted(m for m in sys.modules if m == "jax" or m.startswith("jax."))}
def kinds():
    return {n: inspect.isfunction(getattr(phasefield, n)) for n in ("sweep", "probe", "exponents")}
out["functions"] = kinds()
out["jax_after_names"] = "jax" in sys.modules
import phasefield.diagram, phasefield.probing.hf, phasefield.probing.fix, phasefield.layers.point  # noqa: E401
out["functions_after_submodules"] = kinds()
out["same"] = [phasefield.sweep is phasefield.diagram.sweep, phasefield.probe is phasefield.probing.probe]
out["all"] = {n: type(getattr(phasefield, n)).__name__ for n in phasefield.__all__}
out["dir"] = sorted(set(phasefield.__all__) - set(dir(phasefield)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def public():
    res = subprocess.run([sys.executable, "-c", PUBLIC], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_import_phasefield_imports_no_jax(public):
    assert public["jax_after_import"] == []
    assert public["jax_after_names"]  # the functions load their modules (and JAX) on first use


def test_sweep_probe_exponents_are_plain_functions_before_and_after_their_modules(public):
    every = {"sweep": True, "probe": True, "exponents": True}
    assert public["functions"] == every
    assert public["functions_after_submodules"] == every  # importing phasefield.probing.hf changes nothing
    assert public["same"] == [True, True]


def test_every_public_name_resolves(public):
    assert public["all"] == {
        "HParams": "type",
        "exponents": "function",
        "sweep": "function",
        "probe": "function",
        "theory": "module",
        "layers": "module",
        "diagram": "module",
        "simulate": "module",
        "probing": "module",
        "use_all_cpu_cores": "function",
    }
    assert public["dir"] == []


def test_the_paper_package_stays_home():
    """The paper preset's package (its numbers, engine and grid evaluator) is reached through
    the registry (``registry.lookup("paper").engine``): no module outside it imports it, and
    the package that holds the layers imports it once, to register it."""
    graph = import_graph(ROOT, "phasefield")
    home = "phasefield.layers.paper"
    outside = {
        mod: sorted(t for t in targets if t == home or t.startswith(home + "."))
        for mod, targets in graph.items()
        if not (mod == home or mod.startswith(home + ".")) and mod != "phasefield.layers"
    }
    assert {m: t for m, t in outside.items() if t} == {}
    assert home in graph["phasefield.layers"]
