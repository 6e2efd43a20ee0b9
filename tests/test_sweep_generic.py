"""The block sweep knows no layer kind: it reads a block through the layer protocol
(:mod:`phasefield.layers.base`: ``children``, ``logit_scale``, ``kernel_scale``, ``prepare_for``
...), so it imports no layer class, every preset's grid equals the layers library point by
point, and a layer kind it has never seen passes through it."""

from __future__ import annotations

import ast
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from phasefield import layers
from phasefield.layers import base, presets, registry, spec
from phasefield.layers import sweep as layers_sweep
from phasefield.layers.state import Context, Kernel

SWEEP_PY = os.path.join(os.path.dirname(layers.__file__), "sweep.py")


def _layer_classes() -> set[str]:
    """Names of the layer classes of phasefield.layers (every subclass of base.Layer)."""
    out, todo = set(), [base.Layer]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("phasefield.layers"):
                out.add(sub.__name__)
            todo.append(sub)
    return out | {"Layer"}


def test_the_sweep_imports_no_layer_class_and_tests_no_layer_kind():
    tree = ast.parse(open(SWEEP_PY).read())
    classes = _layer_classes()
    assert {"Attention", "MLP", "GLU", "Serial", "Residual", "DyT"} <= classes
    layer_modules = {"attention", "base", "dyt", "glu", "mlp", "norm", "qknorm", "residual", "weights"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            # the module relative to phasefield.layers: ".attention" or "phasefield.layers.attention"
            mod = node.module or ""
            here = mod.split(".")[0] if node.level == 1 else mod.removeprefix("phasefield.layers.")
            names = {a.name for a in node.names}
            assert here not in layer_modules, f"line {node.lineno}: imports from the layer module {mod}"
            assert not names & classes, f"line {node.lineno}: imports {names & classes}"
            if node.level == 1 and not node.module:  # from . import x: modules, not layer modules
                assert not names & layer_modules, f"line {node.lineno}: imports {names & layer_modules}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            kinds = node.args[1]
            elts = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            named = {getattr(e, "id", None) or getattr(e, "attr", None) for e in elts}
            assert not named & classes, f"line {node.lineno}: isinstance on {named & classes}"


def _grid(name):
    """Two numbers of the preset, two values each inside their ranges."""
    nums = spec.NUMBERS[name]
    axes = {}
    for key in list(nums)[:2]:
        lo, hi, _ = nums[key]
        top = min(hi, lo + 2.0)
        axes[key] = [lo + 0.35 * (top - lo), lo + 0.7 * (top - lo)]
    # 2 heads, as the other tests' points of these presets (tests/test_branch_scales.py's
    # layers.rates at 8 tokens, depth 3); DyT's 4, as tests/test_dyt.py's and
    # tests/test_any_norm.py's (its sweep grid is this one)
    fixed = {"heads": 4 if name == "dyt" else 2} if "heads" in spec.OPTIONS[name] else {}
    if registry.lookup(name).causal_default:  # gpt2, llama: the (q, p) sweep takes the unmasked block
        fixed["causal"] = False
    return fixed, axes


@pytest.mark.parametrize("name", presets.NAMES)
def test_every_preset_sweep_equals_the_library_point_by_point(name):
    """The sweep (tables once per distinct scale, gathered per point) against ``layers.rates``
    of each point's block (``layers.finite_depth`` and the fixed-point exponents of
    ``layers.fixed_point_exponents`` in one program), to 1e-9. At the sizes of the other
    tests' points (8 tokens, depth 3, 2 heads; DyT's 4), so a point's program is shared with
    them."""
    n_tokens, depth = 8, 3
    fixed, axes = _grid(name)
    ds = layers_sweep.sweep_grid(name, axes, fixed=fixed, n_tokens=n_tokens, depth=depth)
    (ka, va), (kb, vb) = axes.items()
    for a in va:
        for b in vb:
            blk = spec.build(name, spec.check(name, dict(fixed, **{ka: a, kb: b})))
            fd = layers.rates(blk, q0=1.0, rho0=0.5, n_tokens=n_tokens, depth=depth)
            want = dict(
                angle_rate=fd["angle_rate"],
                lambda_g_input=fd["lambda_g_input"],
                lambda_g_collapse=fd["lambda_g_collapse"],
                lambda_a=fd["lambda_a"],
                rho_L=np.asarray(fd["rho"])[-1],
                q_L=np.asarray(fd["q"])[-1],
            )
            pt = ds.sel({ka: a, kb: b})
            for k, w in want.items():
                np.testing.assert_allclose(float(pt[k]), float(w), rtol=0, atol=1e-9, err_msg=f"{name} {k} {a} {b}")


# ---- a layer kind the sweep has never seen ----------------------------------------------------


@struct.dataclass
class Twice(base.Layer):
    """A container: its sub-layer applied twice (the same weights' maps, as a toy)."""

    inner: Any

    def children(self):
        return (self.inner,)

    def map_children(self, fn):
        return self.replace(inner=fn(self.inner))

    def prepare(self, ctx):
        return self.replace(inner=self.inner.prepare(ctx))

    def forward(self, k, ctx):
        return self.inner.forward(self.inner.forward(k, ctx), ctx)


@struct.dataclass
class Gain(base.Layer):
    """A leaf with a per-scale kernel: ``(q, p) -> kern (q, p)``, ``kern`` = c^2 built from c."""

    c: Any = 1.0
    kern: Any = None

    def kernel_scale(self):
        return self.c

    def kernel_at(self, scale, sigma_max):
        return jnp.minimum(jnp.square(scale), jnp.square(sigma_max))

    def with_kernel(self, kern):
        return self.replace(kern=kern)

    def forward(self, k, ctx):
        return Kernel(self.kern * k.q, self.kern * k.p)


def test_a_new_layer_kind_passes_through_the_sweep():
    block = base.Serial((layers.Residual(Twice(Gain(0.7)), alpha=0.5, kind="identity"), Twice(layers.Norm())))
    leaves = layers_sweep.leaf_layers(block)
    assert [type(x).__name__ for x in leaves] == ["Gain", "Norm"]
    assert layers_sweep.block_scales([block, block.replace(layers=(Twice(Gain(1.5)),))]) == (0.0, 1.5)
    ctx = Context(4)
    ready = layers_sweep.prepare_traced(block, ctx, 0.0, 2.0)
    assert float(layers_sweep.leaf_layers(ready)[0].kern) == pytest.approx(0.49)
    named = layers_sweep.map_leaves(ready, lambda x: x.replace(c=3.0) if isinstance(x, Gain) else x)
    assert float(named.layers[0].branch.inner.c) == 3.0
    # traced numbers: one program over a vector of c, the kernel from the per-scale tables
    k0 = Kernel(jnp.asarray(1.0), jnp.asarray(0.5))

    def out(c):
        blk = layers_sweep.prepare_traced(block.replace(layers=(Twice(Gain(c)),)), ctx, 0.0, 2.0)
        return blk.forward(k0, ctx).q

    cs = jnp.asarray([0.5, 1.0, 3.0])
    assert np.allclose(jax.vmap(out)(cs), np.minimum(cs**2, 4.0) ** 2)
    (pos, scale, leaf) = layers_sweep._kernel_scales(block, 1)[0]
    assert pos == 0 and float(scale[0]) == 0.7 and isinstance(leaf, Gain)
