"""A block named on the command line or in a small file: ``NAME``, ``NAME:key=value,...``
or the path of a JSON file ``{"block": NAME, "key": value, ...}``, checked before any work.

    spec.parse("pre-ln:sigma=0.55,alpha=0.2,heads=12")   -> ("pre-ln", {"sigma": 0.55, ...})
    spec.build("pre-ln", {"sigma": 0.55})                  -> the preset's Serial

The numbers a preset takes (:data:`NUMBERS`, each with its range) are the ones a block sweep
can range over by name; :data:`OPTIONS` are the static choices (heads, activation, maps); both
are read from the preset's :class:`.registry.Preset`, which also validates them.
Every preset also takes ``causal`` (:data:`.registry.BLOCK_OPTIONS`: ``NAME:causal=true`` is the
block with every attention masked, whose results are per position, :mod:`.causal`); the
decoders' presets (``gpt2``, ``llama``: :attr:`.registry.Preset.causal_default`) are causal
unless spelled ``NAME:causal=false``, and their checked keywords always say which.
``paper`` takes the :class:`phasefield.HParams` fields (``sigma_w``, ``sigma_a``, ``sigma_v``,
``alpha_a``, ``alpha_m``, ...); the standard presets ``sigma``, ``alpha`` (both branches) and
``alpha_attn``, ``alpha_mlp`` (one branch each, overriding ``alpha``); ``dyt`` those and ``a``
(DyT's alpha0).
"""

from __future__ import annotations

import os

from .. import io
from ..activations import names as _activations
from . import presets, registry  # noqa: F401  (the package registers the built-in presets)

# name -> the preset's numbers (number -> (low, high, low open)) and options (option -> type):
# live views of the registry
NUMBERS = registry.field("numbers")
OPTIONS = registry.field("options")
HEADS_MAX = 4096
MULT_MAX = 64.0


def _value(name, key, text, kind):
    if kind is bool:
        if str(text).lower() in ("1", "true", "yes", "on"):
            return True
        if str(text).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"block {name}: {key} must be true or false (got {text!r})")
    try:
        if kind is int:
            v = float(text)
            if v != int(v):
                raise ValueError
            return int(v)
        return kind(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"block {name}: {key} must be {'an integer' if kind is int else 'a number'} (got {text!r})"
        ) from None


def check(name: str, kw: dict) -> dict:
    """``kw`` with its values converted and range-checked (ValueError: one line)."""
    preset = registry.lookup(name)
    nums, opts = preset.numbers, preset.all_options
    out = {}
    for key, text in kw.items():
        if key in nums:
            v = _value(name, key, text, float)
            lo, hi, lo_open = nums[key]
            if not (v == v) or v > hi or v < lo or (lo_open and v == lo):
                raise ValueError(f"block {name}: {key} = {v:g} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]")
        elif key in opts:
            v = _value(name, key, text, opts[key])
        else:
            allowed = ", ".join(list(nums) + list(opts))
            raise ValueError(f"block {name} has no {key!r}; it takes {allowed}")
        out[key] = v
    if "heads" in out and not 1 <= out["heads"] <= HEADS_MAX:
        raise ValueError(f"block {name}: heads must lie in [1, {HEADS_MAX}] (got {out['heads']})")
    if "mult" in out and not 0 < out["mult"] <= MULT_MAX:
        raise ValueError(f"block {name}: mult must lie in (0, {MULT_MAX:g}] (got {out['mult']:g})")
    if "depth" in out and not 1 <= out["depth"] <= 10_000:
        raise ValueError(f"block {name}: depth must lie in [1, 10000] (got {out['depth']})")
    if "activation" in out and out["activation"] not in _activations():
        raise ValueError(
            f"block {name}: unknown activation {out['activation']!r}; choose one of {', '.join(_activations())}"
        )
    if out.get("attention", "paper") not in ("paper", "exact"):
        raise ValueError(f"block {name}: attention must be paper or exact (got {out['attention']!r})")
    if preset.causal_default:  # a decoder's preset: causal unless causal=false, which stays said
        out.setdefault("causal", True)
    elif out.get("causal") is False:  # ``causal=false`` spells the plain block
        del out["causal"]
    preset.validate(out)
    return out


def parse(text: str) -> tuple[str, dict]:
    """``(name, checked keywords)`` from ``NAME[:k=v,...]`` or a JSON file's path."""
    text = str(text).strip()
    if text.endswith(".json") or os.path.isfile(text):
        try:  # unreadable, malformed, too large or nested too deep (io.read_json), not UTF-8
            doc = io.read_json(text, "the file")
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read block file {text}: {exc}") from None
        if not isinstance(doc, dict) or "block" not in doc:
            raise ValueError(f"block file {text} must hold a JSON object with a 'block' name")
        doc = dict(doc)
        name = str(doc.pop("block"))
        return name, check(name, doc)
    name, _, rest = text.partition(":")
    kw = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"block {name}: expected key=value, got {item!r}")
        kw[key.strip().replace("-", "_")] = val.strip()
    return name, check(name, kw)


def build(name: str, kw: dict):
    """The block (a :class:`.base.Serial`) of the preset ``name`` from its keywords."""
    return registry.lookup(name).build(kw)
