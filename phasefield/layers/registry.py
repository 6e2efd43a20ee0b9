"""The named blocks as data: each preset is a :class:`Preset` that says what numbers it
takes and what it can do, and every caller asks it instead of branching on its name.

    from phasefield.layers import registry
    p = registry.lookup("pre-ln")
    p.build({"sigma": 0.55, "alpha": 0.2})     # its Serial
    p.numbers, p.options, p.defaults           # sweepable numbers (ranges), static options
    p.build({"causal": True})                  # every preset's option: its attention masked
    p.causal_default, p.input_geometry         # causal unless NAME:causal=false; its input (q0, rho0)
    p.engine, p.numbers_class                  # capabilities (a closed-form engine, its numbers)

The built-in presets are registered by :mod:`.presets`; :func:`register` adds another (a
preset with the same capabilities takes the same routes through the library and the command
line), :func:`unregister` takes it away.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# options every preset takes besides its own (:attr:`Preset.options`), applied by
# :meth:`Preset.build` to the built block: ``causal`` masks every attention layer
# (:func:`phasefield.layers.causal.masked`)
BLOCK_OPTIONS = {"causal": bool}


@dataclasses.dataclass(frozen=True, eq=False)
class Engine:
    """A preset's own closed-form theory, described by what it provides. Its functions take
    one ``numbers_class`` object (the block's numbers; traced leaves allowed):

    numbers_class       the class whose one object holds all the block's numbers, validated
                        by its ``validate()``: the command line's flags of those numbers
                        (``--sigma-w``, ``--alpha`` ...) set its fields, a ViT run's
                        hyperparameters are one, and the ViT's own block is built from it
    exponents(numbers)  the fixed-point exponents and attractors at one point (a dict under
                        :mod:`phasefield.schema`'s names)
    trajectory(numbers, q0, p0, num_layers)         (q, p) per layer from (q0, p0)
    gradient_exponent(numbers, q0, p0, num_layers)  lambda_g(L) from the input (q0, p0)
    stable_points(numbers)                          the stable fixed points' cosines
    sweep(fixed, axes, numbers, **options)          its grid evaluator: the route of
                        :func:`phasefield.diagram.sweep` for the block (``fixed``: the spec's
                        keywords, ``axes``: {name: values}, ``numbers``: keyword numbers)
    namespace           the engine's own module, for what only this block has (the paper's
                        full-Gram mean field and its figures' helpers)
    """

    numbers_class: type
    exponents: Callable[..., Any]
    trajectory: Callable[..., Any]
    gradient_exponent: Callable[..., Any]
    stable_points: Callable[..., Any]
    sweep: Callable[..., Any]
    namespace: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class Preset:
    """A named block and its capabilities.

    name            its spelling (``--block NAME[:k=v,...]``)
    builder         the block from its numbers: ``builder(numbers_class(**kw))`` where
                    ``numbers_class`` is set, else ``builder(**kw)``
    numbers         number -> (low, high, low open): the numbers a block sweep can range over
    options         option -> type (int, float, str, bool): the static choices of its own
                    (:attr:`all_options` adds :data:`BLOCK_OPTIONS`, which every preset takes)
    engine          its own closed-form theory (:class:`Engine`: its numbers class, exponents,
                    sweep evaluator, fixed points): the block's sweeps, point commands,
                    recommendations and ViT theory features go through it, and its numbers
                    are one ``engine.numbers_class`` object; None: the generic layers
                    evaluator, and the numbers are keywords of ``builder``
    default_heads   the attention heads of the block when ``heads`` is not given
    run_numbers     a ViT run's number (sigma_w, sigma_a, alpha_a, alpha_m) -> the block
                    number it sets (:data:`phasefield.vit.train.RUN_NUMBERS`)
    stack_depth     the option the depth of the stack sets (the block's numbers depend on
                    it: deepscalelm's residual scale), or None: a block independent of it
    network_defaults keywords of ``numbers_class`` under which the theory describes the
                    block's network (the probe's default numbers)
    check           extra validation of checked keywords (ValueError, one line), or None
    causal_default  the block is causal unless spelled ``NAME:causal=false`` (a decoder's
                    preset): :func:`phasefield.layers.spec.check` writes ``causal=True`` into
                    the keywords of a spelling that does not give it, so every keyword dict
                    downstream says whether the block is masked (:meth:`build` itself masks
                    only for ``causal=True``)
    input_geometry  the stack's input at init, ``kw -> (q0, rho0)`` (the preset's checked
                    keywords -> squared norm per component and cosine of distinct tokens:
                    GPT-2's token plus position embeddings), or None: the point commands'
                    defaults (q0 = 1; rho0 = 0.5, the trajectory 0.3)
    number_defaults the defaults of numbers that follow the options, ``options -> {number:
                    value}`` (gpt2's sigma from its width), or None: the builder's defaults
    """

    name: str
    builder: Callable[..., Any]
    numbers: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    options: Mapping[str, type] = dataclasses.field(default_factory=dict)
    engine: Engine | None = None
    default_heads: int = 12
    run_numbers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    network_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stack_depth: str | None = None
    check: Callable[[dict], None] | None = None
    causal_default: bool = False
    input_geometry: Callable[[dict], tuple[float, float]] | None = None
    number_defaults: Callable[[dict], dict] | None = None

    def __post_init__(self):
        if self.engine is not None and not isinstance(self.engine, Engine):
            raise ValueError(f"block {self.name}: engine must be a registry.Engine (got {type(self.engine).__name__})")

    @property
    def fast_engine(self) -> bool:
        """Whether the preset has its own closed-form engine (:attr:`engine`)."""
        return self.engine is not None

    @property
    def numbers_class(self) -> type | None:
        """The class of the object that holds all the block's numbers (its engine's), or
        None: the numbers are keywords of ``builder``."""
        return None if self.engine is None else self.engine.numbers_class

    @property
    def all_options(self) -> dict:
        """Its own options and :data:`BLOCK_OPTIONS` (option -> type): what ``NAME:k=v`` takes
        besides the numbers."""
        return {**self.options, **BLOCK_OPTIONS}

    @property
    def defaults(self) -> dict:
        """The default of each number and option (from ``numbers_class`` or ``builder``; a
        number that follows the options, :attr:`number_defaults`, at their defaults)."""
        return self.defaults_for({})

    def defaults_for(self, kw: Mapping) -> dict:
        """The default of each number and option given the keywords ``kw`` (the numbers that
        follow the options, :attr:`number_defaults`, at ``kw``'s options)."""
        keys = set(self.numbers) | set(self.options)
        if self.numbers_class is not None:
            return {f.name: f.default for f in dataclasses.fields(self.numbers_class) if f.name in keys}
        params = inspect.signature(self.builder).parameters
        out = {k: p.default for k, p in params.items() if k in keys and p.default is not p.empty}
        if self.number_defaults is not None:
            out.update(self.number_defaults({**out, **{k: v for k, v in kw.items() if k in self.options}}))
        return out

    def geometry(self, kw: Mapping | None = None) -> tuple[float, float] | None:
        """``(q0, rho0)`` of the stack's input at init (:attr:`input_geometry`) for the
        checked keywords ``kw``, or None: the preset says nothing of its input."""
        if self.input_geometry is None:
            return None
        q0, rho0 = self.input_geometry(dict(kw or {}))
        return float(q0), float(rho0)

    def validate(self, kw: dict) -> None:
        """ValueError (one line) unless the checked keywords ``kw`` make a valid block (the
        preset's ``check`` sees :data:`BLOCK_OPTIONS` too)."""
        if self.check is not None:
            self.check(kw)
        if self.numbers_class is not None:
            try:
                self.numbers_class(**_own(kw)).validate()
            except (TypeError, ValueError) as exc:
                raise ValueError(f"block {self.name}: {exc}") from None

    def build(self, numbers: Mapping | None = None):
        """The block (a :class:`.base.Serial`) from its keywords; ``causal=True``: every
        attention in it masked (:func:`phasefield.layers.causal.masked`)."""
        kw = dict(numbers or {})
        causal = bool(kw.pop("causal", False))
        if self.numbers_class is not None:
            block = self.builder(self.numbers_class(**kw))
        else:
            block = self.builder(**kw)
        if not causal:
            return block
        from .base import masked

        return masked(block)


def _own(kw: dict) -> dict:
    """``kw`` without :data:`BLOCK_OPTIONS` (the keywords of a preset's builder)."""
    return {k: v for k, v in kw.items() if k not in BLOCK_OPTIONS}


_REGISTRY: dict[str, Preset] = {}


def register(preset: Preset) -> Preset:
    """Add ``preset`` (ValueError if its name is taken)."""
    if preset.name in _REGISTRY:
        raise ValueError(f"block {preset.name!r} is registered already")
    _REGISTRY[preset.name] = preset
    return preset


def unregister(name: str) -> None:
    """Take the preset ``name`` away (nothing if there is none)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered presets' names, in the order they were registered."""
    return tuple(_REGISTRY)


def lookup(name: str) -> Preset:
    """The preset ``name`` (ValueError, one line, for an unknown name)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown block {name!r}; choose one of {', '.join(_REGISTRY)}") from None


class _Field(Mapping):
    """name -> one attribute of each registered preset (a live view of the registry)."""

    def __init__(self, attr: str):
        self._attr = attr

    def __getitem__(self, name):
        if name not in _REGISTRY:
            raise KeyError(name)
        return getattr(_REGISTRY[name], self._attr)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


def field(attr: str) -> Mapping:
    """A read-only mapping name -> ``attr`` of every registered preset, kept up to date."""
    return _Field(attr)
