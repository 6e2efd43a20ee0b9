"""Phase diagrams: grid sweeps of the theory of any block -> labeled ``xarray.Dataset``.
``phasefield.sweep(...)`` is :func:`sweep` of this module.

    ds = phasefield.sweep(sigma_w=np.linspace(.5, 4, 256), alpha=np.linspace(.01, .99, 256),
                          sigma_a=1.0, n_tokens=32, depth=16)          # the paper block
    ds = phasefield.sweep(block="pre-ln:heads=12", axes={"sigma": np.linspace(.1, 2, 64),
                          "alpha": np.linspace(.05, 1, 64)}, n_tokens=64, depth=24)
    ds.lambda_a.sel(sigma_w=2.0, method="nearest")

``block``: None or ``"paper"`` (the paper block), any preset as ``NAME[:k=v,...]``, a JSON
file or ``(name, dict)``; ``axes``: ``{number name: values}`` (and ``depth``, ``n_tokens``).
Every block runs through one chunk driver (:mod:`phasefield.driver`): a block whose preset
carries a closed-form engine with its engine's grid evaluator (the paper block's:
:mod:`phasefield.layers.paper.sweep`, its variables lambda_a, lambda_g_collapse,
lambda_g_inf, q_star, rho_star and the attractors), every other block with the layers
evaluator (:func:`phasefield.layers.sweep.sweep_grid`, its variables angle_rate, lambda_g_input,
lambda_g_collapse, lambda_a, rho_L, q_L). A causal block (``NAME:causal=true``, any preset's
option; ``gpt2`` and ``llama`` unless spelled ``causal=false``) runs the layers evaluator
too, each point on the full Gram (:func:`phasefield.layers.causal.causal_rates_traced`):
angle_rate_last and lambda_g_last over the grid, q_L_pos and rho_L_pos over the grid and
``position``.

    ds = phasefield.sweep(block="pre-ln:causal=true", axes={"sigma": s, "alpha": a},
                          n_tokens=16, depth=16)
    ds.rho_L_pos.isel(position=-1)                                  # the last token's cosine

How it runs, for every block:

* the flattened grid is cut into fixed-size chunks (one compiled program, bounded memory);
* with ``out=`` every finished chunk is written to ``<out>.chunks/`` at once
  (:class:`phasefield.grid.ChunkStore`), so an
  interrupted sweep resumes where it stopped; the netCDF file appears (atomically) only
  when the grid is complete;
* multi-host: after ``jax.distributed.initialize()`` each process computes the chunks
  ``i % process_count == process_index`` into the shared ``<out>.chunks/`` folder;
  process 0 then waits (up to ``wait`` seconds, default 24 h) until every chunk is present
  and assembles the file; the other processes return None.
* before any work the grid's size is checked (:func:`phasefield.grid.check_grid`), and
  the chunk store is locked: a second sweep writing the same ``out`` stops at once with
  :class:`phasefield.grid.StoreLocked`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from . import io


class Block(NamedTuple):
    """A checked block: its preset's name and checked keywords (what :func:`block_of` returns;
    given back to it, it is not checked again)."""

    name: str
    kw: dict


def block_of(block) -> Block:
    """``(name, checked keywords)`` of a block given as a spec string ``NAME[:k=v,...]``, the
    path of a JSON file or a ``(name, dict)`` pair (:mod:`phasefield.layers.spec`)."""
    from .layers import spec

    if isinstance(block, Block):
        return block
    if isinstance(block, (tuple, list)) and len(block) == 2:
        name, kw = block
        return Block(str(name), spec.check(str(name), dict(kw or {})))
    if isinstance(block, (str, os.PathLike)):
        return Block(*spec.parse(os.fspath(block)))
    raise ValueError(f"block must be a spec string NAME[:k=v,...], a JSON file or (name, dict) (got {block!r})")


def sweep(
    *,
    block=None,
    axes: dict | None = None,
    n_tokens=None,
    depth=None,
    q0: float | None = None,
    rho0: float | None = None,
    mesh: bool = True,
    out: str | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
    devices: Sequence | None = None,
    wait: float = 24 * 3600.0,
    log=None,
    _thorough: bool = False,
    **numbers,
):
    """The theory of any block on a grid -> ``xarray.Dataset`` (see the module docstring).

    ``block``: None or ``"paper"`` (the paper block), or any preset as a spec string ``NAME[:k=v,...]``, a JSON
    file or ``(name, dict)``. ``axes``: ``{number name: values}`` over any numbers of the block
    (``phasefield.layers.spec.NUMBERS``), ``depth`` and ``n_tokens``; ``n_tokens=``/``depth=``
    given as sequences are axes too. ``numbers``: keyword numbers of a block with a closed-form
    engine (the paper block's ``sigma_w=``, ``sigma_a=``, ``alpha=`` (alpha_A = alpha_M),
    ``alpha_a=``, ``alpha_m=``, ``sigma_v=`` and its options ``activation=``, ``mlp_layers=``,
    ``residual=``, ``attention=``, ``softmax_correction=``): a sequence is an axis, a number a
    scalar coordinate. A block with a closed-form engine (the paper block) runs
    the engine's grid evaluator (:func:`phasefield.layers.paper.sweep.sweep_grid`), every
    other block :func:`phasefield.layers.sweep.evaluate_chunk` (``q0``, ``rho0``: its input
    geometry, default 1 and 1/2; ``mesh``: see :func:`phasefield.layers.sweep.sweep_grid`); both
    through the chunk driver :mod:`phasefield.driver`. Returns None on a multi-host process
    other than 0. (``_thorough``: the engine's untiled evaluation refining every root bracket,
    the reference of the tiled one in tests/test_sweep.py and scripts/bench_theory.py.)"""
    given = {k: v for k, v in numbers.items() if v is not None}
    name, fixed = ("paper", {}) if block is None else block_of(block)
    causal = bool(fixed.get("causal"))
    axes = dict(axes or {})
    for k, v in (("n_tokens", n_tokens), ("depth", depth)):
        if v is not None and k in axes:
            raise ValueError(f"{k} is both an axis and {k}=")
    run = dict(out=out, progress=progress, devices=devices, wait=wait, log=log)
    from .layers import registry

    preset = registry.lookup(name)
    if preset.fast_engine and not causal:  # the block's own closed-form evaluator
        engine = preset.engine
        return engine.sweep(
            fixed,
            axes,
            given,
            n_tokens=n_tokens,
            depth=depth,
            q0=q0,
            rho0=rho0,
            chunk_size=chunk_size,
            _thorough=_thorough,
            **run,
        )
    # every other block (and every causal one): the layers evaluator
    if given:
        which = f"block {name}:causal=true" if causal and preset.fast_engine else f"block {name}"
        raise ValueError(
            f"{', '.join(k + '=' for k in given)}: options of the paper block; {which} "
            f"takes its own numbers as axes or in its spec ({', '.join(_numbers(name))})"
        )
    from .layers import sweep as layers_sweep

    for k, v in (("n_tokens", n_tokens), ("depth", depth)):
        if v is not None and np.ndim(v) == 1:
            axes[k] = v
    n = n_tokens if n_tokens is not None and np.ndim(n_tokens) == 0 else 32
    d = depth if depth is not None and np.ndim(depth) == 0 else 16
    return layers_sweep.sweep_grid(
        name,
        axes,
        fixed,
        n_tokens=n,
        depth=d,
        q0=1.0 if q0 is None else q0,
        rho0=0.5 if rho0 is None else rho0,
        chunk=chunk_size,
        mesh=mesh,
        **run,
    )


def _numbers(name):
    from .layers import spec

    return list(spec.NUMBERS.get(name, ())) + ["depth", "n_tokens"]


def save(ds, path) -> None:
    """Write a dataset to netCDF atomically (h5netcdf engine)."""
    io.write_netcdf(ds, path)


def load(path):
    """Open a sweep written by :func:`sweep` (or ``phasefield sweep``)."""
    return io.read_netcdf(path)
