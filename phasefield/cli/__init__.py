"""The ``phasefield`` command line (click).

Each topic registers its commands from its own module; this file only assembles them and
turns bad input into a one-line message with exit code 2 (never a traceback).

The command configures what it owns: every command runs with float64 enabled
(``jax.enable_x64``, scoped to the command), and as the process entry point
(``argv=None``: the ``phasefield`` script, ``python -m phasefield``) it exposes every CPU
core as a JAX device (:func:`phasefield.use_all_cpu_cores`; ``PHASEFIELD_HOST_DEVICES=1``
opts out). Called with an explicit ``argv`` (tests, other programs) it leaves the
environment alone.

Errors: bad input (a ``UsageError``/``ValueError`` from the checks, which run before any
work), an output that cannot be written (``OSError``: read-only, full disk, a directory),
too little memory, an overflow -- each is one line on stderr and exit code 2; a store
another process is writing likewise (``phasefield.grid.StoreLocked``). Anything else is a
bug: one line naming it and exit code 1 (``PHASEFIELD_DEBUG=1`` shows the traceback).
"""
from __future__ import annotations

import importlib
import os
import sys

import click
import jax

from .._runtime import use_all_cpu_cores, use_compilation_cache
from .common import UsageError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="phasefield")
def cli():
    """Mean-field signal propagation in deep transformers: exponents, sweeps, simulations,
    figures and trainability predictions."""


# topic modules; each defines ``register(cli)``
_TOPICS = ("theory", "block", "simulate", "gram", "figures", "train", "seeds", "probe")


def _register_all():
    for name in _TOPICS:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a topic not yet present in this checkout
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        mod.register(cli)


_register_all()


def _compilation_cache():
    """Persist XLA compilations between CLI runs: :func:`phasefield._runtime.use_compilation_cache`
    (``PHASEFIELD_CACHE`` names the folder, or ``off``; programs compiling in ≥ 0.5 s, or
    ``PHASEFIELD_CACHE_MIN_SECS``; ``PHASEFIELD_CACHE_MAX_BYTES``: the size limit, 8 GiB)."""
    use_compilation_cache(min_compile_secs=0.5)


def main(argv=None) -> int:
    """Console entry point: one-line errors, exit code 2 for bad input."""
    if argv is None:
        use_all_cpu_cores()
    try:
        _compilation_cache()
        with jax.enable_x64(True):
            cli.main(args=argv, prog_name="phasefield", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("phasefield: aborted", err=True)
        return 130
    except (click.ClickException, UsageError, ValueError) as exc:
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
        if _resource_exhausted(exc):
            return _fail("out of device memory; use a smaller grid, width, --chunk or number of draws")
        if os.environ.get("PHASEFIELD_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:300]
        click.echo(f"phasefield: internal error: {type(exc).__name__}: {text} "
                   "(a bug; PHASEFIELD_DEBUG=1 shows the traceback)", err=True)
        return 1
    return 0


def _fail(msg) -> int:
    msg = " ".join(str(msg).split())
    click.echo(f"phasefield: error: {msg}", err=True)
    return 2


def _resource_exhausted(exc) -> bool:
    return "RESOURCE_EXHAUSTED" in str(exc) or "Out of memory" in str(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
