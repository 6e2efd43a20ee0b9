"""Where the suite's time goes to JAX compilation (issue 34), opt-in.

``PHASEFIELD_COMPILE_PROFILE=FOLDER pytest ...`` loads these hooks (``tests/conftest.py``):
every worker records, per test (set-up, call and tear-down together) and per jitted
function, the seconds JAX spent tracing (``/jax/core/compile/jaxpr_trace_duration``),
lowering to MLIR (``.../jaxpr_to_mlir_module_duration``) and compiling or loading from the
persistent cache (``.../backend_compile_duration``), how many programs each function
compiled (different shapes, static arguments, depths), and the test's process CPU seconds
(its own and its finished subprocesses') and wall seconds. Each worker writes
``FOLDER/profile-<worker>.json`` at the end; ``python tests/compile_profile.py FOLDER``
ranks them. Compilation inside subprocesses (CLI runs) shows only as the test's child CPU.
"""
from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}
_current = ["<collection>"]
_tests: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_funs: dict = collections.defaultdict(lambda: collections.defaultdict(float))


def _duration(event, duration, **kwargs):
    kind = EVENTS.get(event)
    if kind is None:
        return
    test, fun = _tests[_current[0]], _funs[str(kwargs.get("fun_name", "?"))]
    test[kind] += duration
    fun[kind] += duration
    if kind == "compile":
        test["programs"] += 1
        fun["programs"] += 1
        fun.setdefault("first_test", _current[0])


def _event(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
        _tests[_current[0]]["cache_hits"] += 1


def _register():
    import jax.monitoring as mon
    mon.register_event_duration_secs_listener(_duration)
    mon.register_event_listener(_event)


_register()


def _cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - a pytest hook
    _current[0] = item.nodeid
    (own0, kids0), wall0 = _cpu(), time.perf_counter()
    yield
    (own1, kids1), wall1 = _cpu(), time.perf_counter()
    rec = _tests[item.nodeid]
    rec["cpu"] += own1 - own0
    rec["child_cpu"] += kids1 - kids0
    rec["wall"] += wall1 - wall0
    _current[0] = "<between tests>"


pytest_runtest_protocol.hookwrapper = True   # what ``@pytest.hookimpl(hookwrapper=True)`` sets


def pytest_sessionfinish(session):  # noqa: ARG001 - a pytest hook
    folder = os.environ["PHASEFIELD_COMPILE_PROFILE"]
    os.makedirs(folder, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(folder, f"profile-{worker}.json"), "w") as fh:
        json.dump({"tests": _tests, "functions": _funs}, fh, indent=0)


def _load(folder):
    tests, funs = collections.defaultdict(lambda: collections.defaultdict(float)), {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("profile-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as fh:
                data = json.load(fh)
            for k, rec in data["tests"].items():
                for key, v in rec.items():
                    tests[k][key] += v
            for k, rec in data["functions"].items():
                into = funs.setdefault(k, collections.defaultdict(float))
                for key, v in rec.items():
                    if key == "first_test":
                        into.setdefault(key, v)
                    else:
                        into[key] += v
    return tests, funs


def _jit(rec):
    return rec.get("trace", 0.0) + rec.get("lower", 0.0) + rec.get("compile", 0.0)


def report(folder, top=25) -> str:
    """Ranked tables (markdown) of a profile folder: totals, files, tests, functions."""
    tests, funs = _load(folder)
    files = collections.defaultdict(lambda: collections.defaultdict(float))
    for k, rec in tests.items():
        for key, v in rec.items():
            files[k.split("::")[0]][key] += v
    tot = collections.defaultdict(float)
    for rec in tests.values():
        for key, v in rec.items():
            tot[key] += v
    out = [f"total: {tot['cpu']:.0f} CPU-s in the workers + {tot['child_cpu']:.0f} CPU-s in their "
           f"subprocesses; JAX {_jit(tot):.0f} s (trace {tot['trace']:.0f}, lower {tot['lower']:.0f}, "
           f"compile {tot['compile']:.0f}) for {tot['programs']:.0f} programs "
           f"({tot['cache_hits']:.0f} from the persistent cache)", ""]
    out += ["| file | CPU-s | child CPU-s | JAX s | programs |", "|---|---|---|---|---|"]
    for k, rec in sorted(files.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["child_cpu"]))[:top]:
        out.append(f"| {k} | {rec['cpu']:.1f} | {rec['child_cpu']:.1f} | {_jit(rec):.1f} | {rec['programs']:.0f} |")
    out += ["", "| test | CPU-s | child CPU-s | JAX s | programs |", "|---|---|---|---|---|"]
    for k, rec in sorted(tests.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["child_cpu"]))[:top]:
        out.append(f"| {k} | {rec['cpu']:.1f} | {rec['child_cpu']:.1f} | {_jit(rec):.1f} | {rec['programs']:.0f} |")
    out += ["", "| jitted function | JAX s | compile s | programs | first test |", "|---|---|---|---|---|"]
    for k, rec in sorted(funs.items(), key=lambda kv: -_jit(kv[1]))[:top]:
        out.append(f"| {k} | {_jit(rec):.1f} | {rec['compile']:.1f} | {rec['programs']:.0f} | "
                   f"{rec.get('first_test', '')} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(sys.argv[1], top=int(sys.argv[2]) if len(sys.argv) > 2 else 25))
