"""A thin command line: no function in ``phasefield/cli/`` is longer than :data:`MAX_LINES`.

A function's length is counted from its first decorator (or its ``def``) to its last line,
for every function, nested ones included (``ast``: ``decorator_list[0].lineno`` or
``lineno`` to ``end_lineno``). A command parses its options, calls one library function and
formats the result; the computing and the checks live in the library.

:data:`FILES` is every module of ``phasefield/cli/``.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 80
# the modules checked (paths from the repository root): every phasefield/cli/*.py
FILES = tuple(
    sorted(f"phasefield/cli/{f}" for f in os.listdir(os.path.join(ROOT, "phasefield", "cli")) if f.endswith(".py"))
)


def function_lengths(path: str) -> dict:
    """``{qualified name: lines}`` of every function in the file ``path`` (from its first
    decorator, or its ``def``, to its last line)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = child.decorator_list[0].lineno if child.decorator_list else child.lineno
                name = f"{prefix}{child.name}"
                out[f"{name}:{child.lineno}"] = child.end_lineno - first + 1
                name += "."
            elif isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}."
            visit(child, name)

    visit(tree, "")
    return out


@pytest.mark.parametrize("path", FILES)
def test_cli_functions_are_short(path):
    lengths = function_lengths(os.path.join(ROOT, path))
    assert lengths, f"{path}: no functions found"
    long = {k: v for k, v in lengths.items() if v > MAX_LINES}
    assert not long, f"{path}: functions longer than {MAX_LINES} lines: {long}"
