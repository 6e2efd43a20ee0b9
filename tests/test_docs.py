"""The documentation: the README's and the docs' promises about the package's surface, the
MkDocs site (``mkdocs build --strict``) and the links (none points outside the repository).

The import checks run in a fresh interpreter: in-process tests import the subpackages first
and would hide a missing lazy attribute of ``phasefield``.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_lazy_subpackages_in_a_fresh_interpreter():
    code = ("import sys, phasefield\n"
            "assert 'phasefield.probe' not in sys.modules and 'phasefield.layers' not in sys.modules\n"
            "phasefield.probe; phasefield.layers; phasefield.sweep; phasefield.theory; phasefield.simulate\n"
            "assert callable(phasefield.probe) and callable(phasefield.sweep)\n"
            "assert phasefield.probe.probe is phasefield.probe.__call__.__globals__['probe']\n"
            "assert hasattr(phasefield.layers, 'presets')\n"
            "print('ok')\n")
    res = _fresh(code)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
