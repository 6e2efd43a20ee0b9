"""One name per quantity: the public functions (module-level, name not starting with ``_``)
under phasefield/ named ``exponents``, ``sweep``, ``gradient_exponent``, ``angle_exponent``
or ``trajectory`` are exactly the ones below (read statically with ``ast``, no import runs).
Two of them share a name only where they compute the same quantity: a traced function of
:mod:`phasefield.layers.depth` and its float64 wrapper in :mod:`phasefield.layers`, the
paper block's closed form, the simulator's measurement. A new function computing something
else takes its own name (``fixed_point_exponents``, ``rates``, ``sweep_grid``, ``*_from_gram``,
a click callback's ``*_cmd``).
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "phasefield")

WATCHED = ("exponents", "sweep", "gradient_exponent", "angle_exponent", "trajectory")

DOCUMENTED = {
    "exponents": {
        "phasefield/layers/point.py",  # phasefield.exponents: everything a block answers at one point
        "phasefield/layers/paper/lyapunov.py",  # paper.exponents(hp): the engine's field Engine.exponents
    },
    "sweep": {
        "phasefield/diagram.py",  # phasefield.sweep: the one theory sweep of every block
    },
    "gradient_exponent": {  # lambda_g(L) from the input geometry
        "phasefield/layers/__init__.py",  # layers.gradient_exponent(block, q0, rho0): float64 wrapper
        "phasefield/layers/depth.py",  # its traced twin
        "phasefield/layers/paper/lyapunov.py",  # paper.gradient_exponent(hp, q0, p0): the closed form
        "phasefield/simulate/measure.py",  # simulated, identical tokens at q*
    },
    "angle_exponent": {  # lambda_a at the collapsed fixed point
        "phasefield/layers/depth.py",  # any block, traced
        "phasefield/layers/paper/fixed_points.py",  # paper.angle_exponent(hp): the closed form
        "phasefield/simulate/measure.py",  # simulated
    },
    "trajectory": {  # (q, p) per layer
        "phasefield/layers/__init__.py",  # layers.trajectory(block, q0, rho0): float64 wrapper
        "phasefield/layers/depth.py",  # its traced twin
        "phasefield/layers/paper/block.py",  # paper.trajectory(hp, q0, p0): the closed form
    },
}


def _public_functions():
    """name -> set of files (relative to the repository) defining it at module level."""
    found: dict[str, set[str]] = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    found.setdefault(node.name, set()).add(os.path.relpath(path, ROOT).replace(os.sep, "/"))
    return found


def test_the_watched_names_are_defined_exactly_where_documented():
    found = _public_functions()
    got = {name: found.get(name, set()) for name in WATCHED}
    assert got == DOCUMENTED


def test_the_scan_sees_module_level_functions():
    """The scan is not vacuous: it finds functions it must find, and the renamed ones."""
    found = _public_functions()
    assert "phasefield/layers/__init__.py" in found["fixed_point_exponents"]
    assert "phasefield/layers/depth.py" in found["fixed_point_exponents"]
    assert "phasefield/simulate/measure.py" in found["rates"]
    assert "phasefield/layers/sweep.py" in found["sweep_grid"]
    assert found["fixed_point_grid"] == {"phasefield/simulate/sweep.py"}
    assert found["rates_grid"] == {"phasefield/simulate/sweep.py"}
    assert found["gradient_exponent_from_gram"] == {"phasefield/layers/paper/gram.py"}
    assert found["angle_exponent_from_gram"] == {"phasefield/layers/paper/gram.py"}
    assert found["trajectory_from_gram"] == {"phasefield/layers/paper/gram.py"}
