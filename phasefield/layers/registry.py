"""The named blocks as data: each preset is a :class:`Preset` that says what numbers it
takes and what it can do, and every caller asks it instead of branching on its name.

    from phasefield.layers import registry
    p = registry.lookup("pre-ln")
    p.build({"sigma": 0.55, "alpha": 0.2})     # its Serial
    p.numbers, p.options, p.defaults           # sweepable numbers (ranges), static options
    p.fast_engine, p.numbers_class             # capabilities

The built-in presets are registered by :mod:`.presets`; :func:`register` adds another (a
preset with the same capabilities takes the same routes through the library and the command
line), :func:`unregister` takes it away.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, eq=False)
class Preset:
    """A named block and its capabilities.

    name            its spelling (``--block NAME[:k=v,...]``)
    builder         the block from its numbers: ``builder(numbers_class(**kw))`` where
                    ``numbers_class`` is set, else ``builder(**kw)``
    numbers         number -> (low, high, low open): the numbers a block sweep can range over
    options         option -> type (int, float, str, bool): the static choices
    numbers_class   the class whose one object holds all the block's numbers, validated by
                    its ``validate()``: the command line's paper flags (``--sigma-w``,
                    ``--alpha`` ...) set its fields, a ViT run's hyperparameters are that
                    object and the ViT's own block is built from it; None: the numbers are
                    keywords of ``builder``
    engine          the module path of a fast vectorised closed-form engine over
                    ``numbers_class`` objects (``exponents``, ``trajectory``, ... as
                    :mod:`phasefield.layers.paper`): the block's sweeps, point commands,
                    recommendations and ViT theory features go through it; None: through
                    the generic layers evaluator
    default_heads   the attention heads of the block when ``heads`` is not given
    run_numbers     a ViT run's number (sigma_w, sigma_a, alpha_a, alpha_m) -> the block
                    number it sets (:data:`phasefield.vit.train.RUN_NUMBERS`)
    network_defaults keywords of ``numbers_class`` under which the theory describes the
                    block's network (the probe's default numbers)
    check           extra validation of checked keywords (ValueError, one line), or None
    """

    name: str
    builder: Callable[..., Any]
    numbers: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    options: Mapping[str, type] = dataclasses.field(default_factory=dict)
    numbers_class: type | None = None
    engine: str | None = None
    default_heads: int = 12
    run_numbers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    network_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    check: Callable[[dict], None] | None = None

    def __post_init__(self):
        if self.engine is not None and self.numbers_class is None:
            raise ValueError(f"block {self.name}: a closed-form engine reads a numbers_class object; give one")

    @property
    def fast_engine(self) -> bool:
        """Whether the preset has its own closed-form engine (:attr:`engine`)."""
        return self.engine is not None

    def load_engine(self):
        """The engine module (ValueError where the preset has none)."""
        if self.engine is None:
            raise ValueError(f"block {self.name} has no closed-form engine")
        return importlib.import_module(self.engine)

    @property
    def defaults(self) -> dict:
        """The default of each number and option (from ``numbers_class`` or ``builder``)."""
        keys = set(self.numbers) | set(self.options)
        if self.numbers_class is not None:
            return {f.name: f.default for f in dataclasses.fields(self.numbers_class) if f.name in keys}
        params = inspect.signature(self.builder).parameters
        return {k: p.default for k, p in params.items() if k in keys and p.default is not p.empty}

    def validate(self, kw: dict) -> None:
        """ValueError (one line) unless the checked keywords ``kw`` make a valid block."""
        if self.check is not None:
            self.check(kw)
        if self.numbers_class is not None:
            try:
                self.numbers_class(**kw).validate()
            except (TypeError, ValueError) as exc:
                raise ValueError(f"block {self.name}: {exc}") from None

    def build(self, numbers: Mapping | None = None):
        """The block (a :class:`.base.Serial`) from its keywords."""
        kw = dict(numbers or {})
        if self.numbers_class is not None:
            return self.builder(self.numbers_class(**kw))
        return self.builder(**kw)


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
