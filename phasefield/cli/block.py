"""``phasefield block exponents|sweep``: any block (a preset, ``NAME:key=value,...`` or a
JSON spec file) — its rates and exponents at one point; ``block sweep`` is the alias of
``phasefield sweep`` (:mod:`phasefield.cli.sweep`), its phase diagram over its numbers."""

from __future__ import annotations


def register(cli):
    @cli.group("block")
    def block():
        """Any block: its rates at one point (exponents) and phase diagrams (sweep)."""

    from .theory import EXPONENTS_HELP, exponents_options, run_exponents

    @block.command("exponents", help="The same command as `phasefield exponents` (an alias). " + EXPONENTS_HELP)
    @exponents_options
    def exponents_cmd(block_spec, q0, rho0, as_json, **kw):
        run_exponents(block_spec, q0, rho0, as_json, kw)

    from .sweep import sweep_command

    block.add_command(sweep_command, "sweep")  # the alias of ``phasefield sweep`` (same command)
