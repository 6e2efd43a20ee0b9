"""The named blocks as data (phasefield.layers.registry): no code outside the paper preset's
own definition branches on the block name "paper"; every registered preset builds its
default block and its capabilities agree with each other; a preset registered by a caller
takes the same routes as a built-in one with the same capabilities, with no library edit."""

import dataclasses
import math
import os
import re

import numpy as np
import pytest

import phasefield
from phasefield import HParams, layers
from phasefield.cli.blockopt import resolve
from phasefield.cli.common import UsageError
from phasefield.layers import presets, registry, spec
from phasefield.layers.registry import Preset
from phasefield.vit.train import RUN_NUMBERS, TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "phasefield")
OWN = os.path.join(PKG, "layers", "paper")  # the paper preset's own engine may name itself

# a comparison of a value with the name "paper" (either side, either quote), or a membership
# test in a literal that holds it; lines about the attention-map option (also "paper") aside
_COMPARE = re.compile(r"""(==|!=)\s*(['"])paper\2|(['"])paper\3\s*(==|!=)|(['"])paper\5\s+(not\s+)?in\b""")
_MEMBER = re.compile(r"""\bin\s*[(\[{][^)\]}]*(['"])paper\1""")


def _branches(line: str) -> bool:
    """Whether ``line`` branches on the block name "paper"."""
    if "attention" in line:
        return False
    if _COMPARE.search(line):
        return True
    return any(not re.search(r"\bfor\s+[\w, ]+\s$", line[: m.start()]) for m in _MEMBER.finditer(line))


def test_the_pattern_finds_name_branches_and_not_the_attention_option():
    for line in (
        'if name == "paper":',
        "    if name != 'paper':",
        'if cfg.block_spec()[0] != "paper":',
        'heads = kw.get("heads", 1 if name == "paper" else 12)',
        "f\"{', '.join(sorted(kw if name == 'paper' else taken))}\"",
        'if "paper" == name:',
        'if name in ("paper", "pre-ln"):',
        'ok = name not in {"paper"}',
    ):
        assert _branches(line), line
    for line in (
        'if out.get("attention", "paper") not in ("paper", "exact"):',
        'chunk = int(chunk_size or (DEFAULT_CHUNK if attention == "paper" else 64))',
        'for m in ("paper", "exact"):',
        'name, kw = ("paper", {}) if text is None else parse(text)',
        'block: str = "paper"',
    ):
        assert not _branches(line), line


def test_no_branch_on_the_block_name_paper():
    hits = []
    for root, _, files in os.walk(PKG):
        if root == OWN or root.startswith(OWN + os.sep):
            continue
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as fh:
                    for i, line in enumerate(fh, 1):
                        if _branches(line):
                            hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not hits, "branches on the block name (ask the preset's capabilities):\n" + "\n".join(hits)


# ---- every registered preset ------------------------------------------------------------


def _heads(layer) -> list:
    """The ``heads`` of every attention layer inside ``layer``."""
    out = [layer.heads] if hasattr(layer, "heads") else []
    if dataclasses.is_dataclass(layer):
        for f in dataclasses.fields(layer):
            v = getattr(layer, f.name)
            for x in v if isinstance(v, tuple) else (v,):
                if isinstance(x, layers.Layer):
                    out += _heads(x)
    return out


@pytest.mark.parametrize("name", registry.names())
def test_every_preset_builds_its_default_block(name):
    p = registry.lookup(name)
    assert p.name == name
    block = p.build()
    layers.check_layer(block)
    assert isinstance(block, layers.Serial)
    assert spec.check(name, {}) == ({"causal": True} if p.causal_default else {})  # gpt2, llama: causal
    assert isinstance(spec.build(name, {}), layers.Serial)
    assert isinstance(presets.get(name), layers.Serial)
    assert _heads(block) and set(_heads(block)) == {p.default_heads}


@pytest.mark.parametrize("name", registry.names())
def test_every_preset_capabilities_agree(name):
    p = registry.lookup(name)
    defaults = p.defaults
    assert set(p.numbers).isdisjoint(p.options)
    assert set(defaults) <= set(p.numbers) | set(p.options)
    for key, (lo, hi, lo_open) in p.numbers.items():
        assert lo < hi and isinstance(lo_open, bool), key
        v = defaults.get(key)
        if v is not None:
            assert lo <= v <= hi and not (lo_open and v == lo), (key, v)
    assert set(p.options.values()) <= {int, float, str, bool}
    p.validate({k: v for k, v in defaults.items() if v is not None})
    if "heads" in p.options:
        assert defaults["heads"] == p.default_heads
    assert set(p.run_numbers) <= {"sigma_w", "sigma_a", "alpha_a", "alpha_m"}
    assert set(p.run_numbers.values()) <= set(p.numbers)
    if p.numbers_class is None:
        assert not p.fast_engine and not p.network_defaults
        return
    # a preset whose numbers are one object: it validates through that object's class
    fields = {f.name for f in dataclasses.fields(p.numbers_class)}
    assert set(p.numbers) | set(p.options) | set(p.network_defaults) <= fields
    p.numbers_class(**p.network_defaults).validate()
    with pytest.raises(ValueError, match=rf"^block {re.escape(name)}: "):
        spec.check(name, {"residual": "no-such-residual"} if "residual" in p.options else {"no_such": 1})
    if p.fast_engine:
        engine = p.engine
        assert callable(engine.exponents) and callable(engine.trajectory)


def test_views_and_names_follow_the_registry():
    names = registry.names()
    assert set(spec.NUMBERS) == set(spec.OPTIONS) == set(RUN_NUMBERS) == set(names)
    for name in names:
        p = registry.lookup(name)
        assert spec.NUMBERS[name] is p.numbers and spec.OPTIONS[name] is p.options
        assert RUN_NUMBERS[name] is p.run_numbers
    assert presets.NAMES == names[: len(presets.NAMES)]
    with pytest.raises(ValueError, match=r"^unknown block 'gpt-5'; choose one of paper, pre-ln"):
        registry.lookup("gpt-5")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.lookup("pre-ln"))
    with pytest.raises(ValueError, match="engine must be a registry.Engine"):
        Preset("no-class", presets.pre_ln, engine="phasefield.layers.paper")


# ---- a preset registered by a caller ----------------------------------------------------


@pytest.fixture
def toy():
    """'toy' (pre-ln's builder and capabilities) and 'toy-paper' (the paper preset's),
    registered for one test."""
    std = registry.lookup("pre-ln")
    own = registry.lookup("paper")
    registry.register(dataclasses.replace(std, name="toy"))
    registry.register(dataclasses.replace(own, name="toy-paper"))
    try:
        yield
    finally:
        registry.unregister("toy")
        registry.unregister("toy-paper")
    assert "toy" not in registry.names() and "toy" not in spec.NUMBERS


def test_a_registered_preset_takes_the_library_routes(toy):
    text = "sigma=0.8,alpha=0.3,heads=2,attention=paper,softmax_correction=false"
    name, kw = spec.parse("toy:" + text)
    assert name == "toy" and kw == spec.parse("pre-ln:" + text)[1]
    block = spec.build(name, kw)
    assert block == spec.build("pre-ln", kw)
    mine = layers.fixed_point_exponents(block, n_tokens=8, depth=4)
    ref = layers.fixed_point_exponents(spec.build("pre-ln", kw), n_tokens=8, depth=4)
    # pre-LN has no finite fixed point (q_star = inf): the fixed point's quantities are NaN on
    # both sides, the same answer; every other quantity is a number
    no_fixed_point = {"lambda_a", "lambda_g_collapse", "lambda_g_inf", "rho_star", "rho_star_min", "rho_star_max"}
    for k, v in ref.items():
        assert np.isnan(v).all() if k in no_fixed_point else not np.isnan(v).any(), (k, v)
        assert np.array_equal(np.asarray(mine[k]), np.asarray(v), equal_nan=True), k
    point = phasefield.exponents("toy:" + text, n_tokens=8, depth=4)
    assert math.isfinite(point["lambda_g_input"])
    with pytest.raises(ValueError, match=r"^block toy: sigma = 0 is outside \(0, "):
        spec.parse("toy:sigma=0")
    # the ViT: the standard run numbers and heads
    assert TrainConfig(block="toy:heads=2").block_for(HParams(sigma_w=0.9)) == spec.build(
        "pre-ln", {"heads": 2, "sigma": 0.9, "alpha_attn": 0.5, "alpha_mlp": 0.5}
    )
    with pytest.raises(ValueError, match="block toy: width 64 is not a multiple of heads 12"):
        TrainConfig(block="toy").validate()


def test_a_registered_paper_like_preset_validates_through_its_numbers_class(toy):
    assert spec.build("toy-paper", {"sigma_w": 2.0}) == presets.get("paper", HParams(sigma_w=2.0))
    with pytest.raises(ValueError, match=r"^block toy-paper: unknown residual 'half'"):
        spec.check("toy-paper", {"residual": "half"})
    # the paper flags set its numbers; another block refuses them
    assert resolve("toy-paper", (), {"sigma_w": 2.0})[:2] == ("toy-paper", {"sigma_w": 2.0})
    with pytest.raises(UsageError, match="block toy has no number for --sigma-w"):
        resolve("toy", (), {"sigma_w": 2.0})
    # the ViT's own block and heads; the runs hold all its numbers
    cfg = TrainConfig(block="toy-paper", width=6)
    assert cfg.validate() is cfg and cfg.block_for(HParams()) is None and cfg.preset().fast_engine
    with pytest.raises(ValueError, match="block toy-paper: activation come from the runs"):
        TrainConfig(block="toy-paper:activation=relu").validate()
