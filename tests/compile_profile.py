"""Where the suite's time goes to JAX compilation, opt-in.

``PHASEFIELD_COMPILE_PROFILE=FOLDER pytest ...`` loads these hooks (``tests/conftest.py``):
every worker records, per test (set-up, call and tear-down together), per jitted
function and per (function, test) pair, the seconds JAX spent tracing (``/jax/core/compile/jaxpr_trace_duration``),
lowering to MLIR (``.../jaxpr_to_mlir_module_duration``) and compiling or loading from the
persistent cache (``.../backend_compile_duration``) -- wall seconds and the process's CPU
seconds over the same span (a nested trace counts in its parent's too) -- how many programs each function
compiled (different shapes, static arguments, depths), and the test's process CPU seconds
(its own and its finished subprocesses') and wall seconds. Each worker rewrites
``FOLDER/profile-<worker>.json`` after every test; ``python tests/compile_profile.py FOLDER``
ranks them. Compilation inside subprocesses (CLI runs) shows only as the test's child CPU.
The process's memory maps after each test (``maps``; the kernel's limit is
``vm.max_map_count``) show how close a worker keeping its compiled programs gets to it.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_current = ["<collection>"]
_tests: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_funs: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_pairs: dict = collections.defaultdict(lambda: collections.defaultdict(float))  # "fun | test"


_started: dict = collections.defaultdict(list)  # event -> process CPU seconds at each open start


def _start(event, value, **kwargs):  # noqa: ARG001 - JAX records each start as a scalar
    if event in EVENTS:
        _started[event].append(time.process_time())


def _duration(event, duration, **kwargs):
    kind = EVENTS.get(event)
    if kind is None:
        return
    cpu = time.process_time() - _started[event].pop() if _started[event] else 0.0
    name = str(kwargs.get("fun_name", "?"))
    test, fun, pair = _tests[_current[0]], _funs[name], _pairs[f"{name} | {_current[0]}"]
    for rec in (test, fun, pair):
        rec[kind] += duration
        rec[kind + "_cpu"] += cpu
    if kind == "compile":
        for rec in (test, fun, pair):
            rec["programs"] += 1
        fun.setdefault("first_test", _current[0])


def _event(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
        _tests[_current[0]]["cache_hits"] += 1


def _register():
    import jax.monitoring as mon

    mon.register_scalar_listener(_start)
    mon.register_event_duration_secs_listener(_duration)
    mon.register_event_listener(_event)


_register()


def _cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _maps():
    try:
        with open("/proc/self/maps", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - a pytest hook
    _current[0] = item.nodeid
    (own0, kids0), wall0 = _cpu(), time.perf_counter()
    yield
    (own1, kids1), wall1 = _cpu(), time.perf_counter()
    rec = _tests[item.nodeid]
    rec["cpu"] += own1 - own0
    rec["child_cpu"] += kids1 - kids0
    rec["wall"] += wall1 - wall0
    rec["maps"] = max(rec.get("maps", 0), _maps())
    _current[0] = "<between tests>"
    _write()  # after every test: an interrupted run still leaves its profile


pytest_runtest_protocol.hookwrapper = True  # what ``@pytest.hookimpl(hookwrapper=True)`` sets


def _write():
    folder = os.environ["PHASEFIELD_COMPILE_PROFILE"]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"profile-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"tests": _tests, "functions": _funs, "pairs": _pairs}, fh)
    os.replace(path + ".tmp", path)


def pytest_sessionfinish(session):  # noqa: ARG001 - a pytest hook
    _write()


def _load(folder):
    tests, funs = collections.defaultdict(lambda: collections.defaultdict(float)), {}
    pairs = collections.defaultdict(lambda: collections.defaultdict(float))
    for name in sorted(os.listdir(folder)):
        if name.startswith("profile-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as fh:
                data = json.load(fh)
            for k, rec in data["tests"].items():
                for key, v in rec.items():
                    if key == "maps":  # a peak, not a sum
                        tests[k][key] = max(tests[k][key], v)
                    else:
                        tests[k][key] += v
            for k, rec in data.get("pairs", {}).items():
                for key, v in rec.items():
                    pairs[k][key] += v
            for k, rec in data["functions"].items():
                into = funs.setdefault(k, collections.defaultdict(float))
                for key, v in rec.items():
                    if key == "first_test":
                        into.setdefault(key, v)
                    else:
                        into[key] += v
    return tests, funs, pairs


def _jit(rec, cpu=True):
    suffix = "_cpu" if cpu else ""
    return sum(rec.get(k + suffix, 0.0) for k in ("trace", "lower", "compile"))


def report(folder, top=25) -> str:
    """Ranked tables (markdown) of a profile folder: totals, files, tests, functions."""
    tests, funs, pairs = _load(folder)
    files = collections.defaultdict(lambda: collections.defaultdict(float))
    for k, rec in tests.items():
        for key, v in rec.items():
            f = files[k.split("::")[0]]
            f[key] = max(f[key], v) if key == "maps" else f[key] + v
    tot = collections.defaultdict(float)
    for rec in tests.values():
        for key, v in rec.items():
            tot[key] = max(tot[key], v) if key == "maps" else tot[key] + v
    out = [
        f"total: {tot['cpu']:.0f} CPU-s in the workers + {tot['child_cpu']:.0f} CPU-s in their "
        f"subprocesses; JAX {_jit(tot):.0f} CPU-s, {_jit(tot, False):.0f} s wall (trace "
        f"{tot['trace_cpu']:.0f}, lower {tot['lower_cpu']:.0f}, compile {tot['compile_cpu']:.0f} CPU-s) for {tot['programs']:.0f} programs "
        f"({tot['cache_hits']:.0f} from the persistent cache); at most {tot['maps']:.0f} memory maps "
        f"in a worker",
        "",
    ]
    out += ["| file | CPU-s | child CPU-s | JAX CPU-s | programs |", "|---|---|---|---|---|"]
    for k, rec in sorted(files.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["child_cpu"]))[:top]:
        out.append(f"| {k} | {rec['cpu']:.1f} | {rec['child_cpu']:.1f} | {_jit(rec):.1f} | {rec['programs']:.0f} |")
    out += ["", "| test | CPU-s | child CPU-s | JAX CPU-s | programs |", "|---|---|---|---|---|"]
    for k, rec in sorted(tests.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["child_cpu"]))[:top]:
        out.append(f"| {k} | {rec['cpu']:.1f} | {rec['child_cpu']:.1f} | {_jit(rec):.1f} | {rec['programs']:.0f} |")
    out += ["", "| jitted function | JAX CPU-s | compile CPU-s | programs | first test |", "|---|---|---|---|---|"]
    for k, rec in sorted(funs.items(), key=lambda kv: -_jit(kv[1]))[:top]:
        out.append(
            f"| {k} | {_jit(rec):.1f} | {rec.get('compile_cpu', 0.0):.1f} | {rec['programs']:.0f} | "
            f"{rec.get('first_test', '')} |"
        )
    if pairs:  # where each function's programs come from: the costliest (function, test) pairs
        out += ["", "| jitted function | test | JAX CPU-s | programs |", "|---|---|---|---|"]
        for k, rec in sorted(pairs.items(), key=lambda kv: -_jit(kv[1]))[:top]:
            fun, test = k.split(" | ", 1)
            out.append(f"| {fun} | {test} | {_jit(rec):.1f} | {rec['programs']:.0f} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(sys.argv[1], top=int(sys.argv[2]) if len(sys.argv) > 2 else 25))
