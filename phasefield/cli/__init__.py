"""The ``phasefield`` command line (click).

Each topic registers its commands from its own module (``register(cli)``); this file names
them, loads a topic only when one of its commands is asked for, and turns bad input into a
one-line message with exit code 2 (never a traceback). ``phasefield --help`` and
``phasefield --version`` import no topic and no JAX: the one-line summaries of the commands
live here (:data:`COMMANDS`; ``tests/test_cli_start.py`` holds them to the commands' own help).

The command configures what it owns, when a command runs (not for ``--help``): the command
runs with float64 enabled (``jax.enable_x64``, scoped to the command) and compilations kept
between runs (:func:`_compilation_cache`), and as the process entry point (``argv=None``: the
``phasefield`` script, ``python -m phasefield``) it exposes every CPU core as a JAX device
(:func:`phasefield.use_all_cpu_cores`; ``PHASEFIELD_HOST_DEVICES=1`` opts out). Called with
an explicit ``argv`` (tests, other programs) it leaves the environment alone.

Errors: bad input (a ``UsageError``/``ValueError`` from the checks, which run before any
work), an output that cannot be written (``OSError``: read-only, full disk, a directory),
too little memory, an overflow -- each is one line on stderr and exit code 2; a store
another process is writing likewise (``phasefield.grid.StoreLocked``). Anything else is a
bug: one line naming it and exit code 1 (``PHASEFIELD_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys

import click

from .. import __version__

# every top-level command: (the topic module that registers it, its one-line summary: the
# first sentence of its help, which ``phasefield --help`` shows without importing the topic)
COMMANDS = {
    "block": ("block", "Any block: its rates at one point (exponents) and phase diagrams (sweep)."),
    "compare": (
        "simulate",
        "Agreement table of a theory grid and a simulated grid: median, 90th percentile "
        "and maximum |sim - theory| of each common quantity, overall and by the theory's "
        "phase.",
    ),
    "demo": (
        "figures",
        "Theory sweep, a quick finite-width check and every figure (CPU, a few minutes), then "
        "a summary: where lambda_a = lambda_g = 0 and the theory-vs-simulation agreement.",
    ),
    "exponents": ("theory", "λ_a, λ_g and the attractors of a block at one point."),
    "figures": ("figures", "The paper's figures 2-6 and the phase diagram, as PNG and PDF in OUT."),
    "fit": (
        "train",
        "Does the initialization predict the trained loss? Cross-validated over configurations "
        "(seed-averaged losses): the noise floor, exponent models (collapsed point, measured "
        "input geometry with the paper and exact maps, +- the softmax-derivative term, trees), "
        "raw- hyperparameter models (with the effective depth), hybrids, transfer tests; writes "
        "the best model of every family by CV, with its interval.",
    ),
    "gram": ("gram", "Full-Gram mean field: causal attention, two-group inputs, exact softmax."),
    "predict": (
        "train",
        "Predicted final test loss at one initialization, with an interval from the model's "
        "cross-validated residuals, both exponents, and warnings outside the fitted region.",
    ),
    "probe": (
        "probe",
        "Measure a model's blocks at initialization over independent inits: per-block q, rho, "
        "angle growth of nearby tokens and gradient growth, the phase and a verdict "
        "(docs/probe.md).",
    ),
    "recommend": ("train", "Initializations the theory recommends."),
    "seeds": ("seeds", "The other seed theories: rank-collapse gradients (Noci et al."),
    "simulate": ("simulate", "Finite-width simulations of random transformers (docs/theory.md §1, §6, §7)."),
    "sweep": ("theory", "The theory of any block on a grid -> netCDF (xarray)."),
    "train-lm": (
        "lm",
        "Train the causal character-level language model on the Python standard library's sources "
        "(docs/lm.md): held-out bits per character per seed, written as JSON lines.",
    ),
    "train-sweep": (
        "train",
        "Train ViTs over an initialization grid or design (the paper's Appendix D model, shared block).",
    ),
    "trajectory": (
        "theory",
        "q and p per layer of the mean-field map of a block (default: the paper's) from input (q0, p0 = rho0 q0).",
    ),
}


class LazyGroup(click.Group):
    """A group that imports a topic module on the first use of one of its commands.

    ``get_command``/``list_commands`` and the help listing load only what they need;
    ``commands`` (the attribute of ``click.Group``) loads every topic first, so code walking
    the command tree sees all of it. A command of a loaded topic runs inside
    :func:`_command_setup` (the settings the process entry point owns)."""

    def __init__(self, *args, lazy: dict, **kw):
        self._lazy = dict(lazy)
        self._loaded: set = set()
        super().__init__(*args, **kw)

    @property
    def commands(self) -> dict:
        for topic in sorted({t for t, _ in self._lazy.values()}):
            self._load(topic)
        return self._commands

    @commands.setter
    def commands(self, value) -> None:
        self._commands = value

    def add_command(self, cmd, name=None) -> None:
        self._commands[name or cmd.name] = _with_setup(cmd)

    def _load(self, topic: str) -> None:
        if topic not in self._loaded:
            self._loaded.add(topic)
            importlib.import_module(f"{__name__}.{topic}").register(self)
            for cmd in self._commands.values():  # a group's subcommands come after the group
                _with_setup(cmd)

    def list_commands(self, ctx) -> list:
        return sorted(set(self._lazy) | set(self._commands))

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self._commands and cmd_name in self._lazy:
            self._load(self._lazy[cmd_name][0])
        return self._commands.get(cmd_name)

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self._commands.get(name) or click.Command(name, help=self._lazy[name][1])
            if not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


@click.group(
    cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="phasefield")
def cli():
    """Mean-field signal propagation in deep transformers: exponents, sweeps, simulations,
    figures and trainability predictions."""


def _with_setup(cmd):
    """``cmd`` (and every command under it) running inside :func:`_command_setup`."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _with_setup(sub)
    elif cmd.callback is not None and not getattr(cmd.callback, "_phasefield_setup", False):
        callback = cmd.callback

        @functools.wraps(callback)
        def run(*args, **kw):
            with _command_setup():
                return callback(*args, **kw)

        run._phasefield_setup = True
        cmd.callback = run
    return cmd


# the settings of the running main(): None outside it (a command invoked another way, e.g.
# click's CliRunner on ``cli``, runs as it is)
_RUN: dict | None = None


@contextlib.contextmanager
def _command_setup():
    """What ``main`` configures for a command it runs, just before the command: every CPU
    core as a device (the process entry point only), the compilation cache, scoped x64."""
    run = _RUN
    if run is None or run["active"]:
        yield
        return
    run["active"] = True
    try:
        from .._runtime import use_all_cpu_cores

        if run["all_cores"]:
            use_all_cpu_cores()
        _compilation_cache()
        import jax

        with jax.enable_x64(True):
            yield
    finally:
        run["active"] = False


def _compilation_cache():
    """Persist XLA compilations between CLI runs: :func:`phasefield._runtime.use_compilation_cache`
    (``PHASEFIELD_CACHE`` names the folder, or ``off``; programs compiling in ≥ 0.5 s, or
    ``PHASEFIELD_CACHE_MIN_SECS``; ``PHASEFIELD_CACHE_MAX_BYTES``: the size limit, 8 GiB)."""
    from .._runtime import use_compilation_cache

    use_compilation_cache(min_compile_secs=0.5)


def main(argv=None) -> int:
    """Console entry point: one-line errors, exit code 2 for bad input."""
    global _RUN
    outer, _RUN = _RUN, {"all_cores": argv is None, "active": False}
    try:
        cli.main(args=argv, prog_name="phasefield", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("phasefield: aborted", err=True)
        return 130
    except (click.ClickException, ValueError) as exc:
        msg = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        return _fail(msg)
    except KeyboardInterrupt:
        click.echo("phasefield: interrupted (finished chunks are kept; rerun to resume)", err=True)
        return 130
    except OSError as exc:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        return _fail(f"cannot read or write{where}: {exc.strerror or exc}")
    except MemoryError:
        return _fail("out of memory; use a smaller grid, width or number of draws")
    except OverflowError as exc:
        return _fail(f"a value is too large ({exc}); use smaller numbers")
    except Exception as exc:  # noqa: BLE001 - a bug: one line, exit 1
        if _usage_error(exc):
            return _fail(str(exc))
        if _resource_exhausted(exc):
            return _fail("out of device memory; use a smaller grid, width, --chunk or number of draws")
        if os.environ.get("PHASEFIELD_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:300]
        click.echo(
            f"phasefield: internal error: {type(exc).__name__}: {text} (a bug; PHASEFIELD_DEBUG=1 shows the traceback)",
            err=True,
        )
        return 1
    finally:
        _RUN = outer
    return 0


def _usage_error(exc) -> bool:
    """Whether ``exc`` is the commands' :class:`phasefield.cli.common.UsageError` (only a
    loaded topic can raise one, so this imports nothing)."""
    common = sys.modules.get(f"{__name__}.common")
    return common is not None and isinstance(exc, common.UsageError)


def _fail(msg) -> int:
    msg = " ".join(str(msg).split())
    click.echo(f"phasefield: error: {msg}", err=True)
    return 2


def _resource_exhausted(exc) -> bool:
    return "RESOURCE_EXHAUSTED" in str(exc) or "Out of memory" in str(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
