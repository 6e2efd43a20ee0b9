"""Style and the easy bugs: ruff's lint (pyflakes, pycodestyle, isort, bugbear, pyupgrade) and
its formatter, configured in pyproject.toml, find nothing in the repository."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff(*args):
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_finds_nothing():
    out = _ruff("check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_changes_nothing():
    out = _ruff("format", "--check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout + out.stderr
