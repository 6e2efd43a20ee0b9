"""A chunk's points placed over devices: one definition for every sweep.

A chunk is a batch of points along a leading axis. :func:`shard` places per-point arrays
with that axis split over the devices; :func:`over_points` compiles a chunk function whose
per-point arguments arrive so split (the rest replicated): either one program over the whole
chunk (XLA partitions it) or, with ``per_device``, one program per device over its own share
(``jax.shard_map``: a device runs its points in the order it chooses, e.g. tile by tile).
With one device both are plain: the arrays stay where they are, the function is ``jax.jit``.
:func:`pad_to_devices` fills a batch to whole points per device, :func:`replicate` places
what every point reads (a training set) whole on every device.
"""

from __future__ import annotations

import numpy as np

AXIS = "points"


def mesh(devices):
    """A one-axis (:data:`AXIS`) mesh over ``devices``."""
    from jax.sharding import Mesh

    return Mesh(np.array(list(devices)), (AXIS,))


def split(devices):
    """The sharding that splits a leading points axis over ``devices`` (None for one device)."""
    devices = list(devices)
    if len(devices) < 2:
        return None
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh(devices), P(AXIS))


def shard(tree, devices):
    """``tree`` (arrays with a leading points axis, its length a multiple of the device
    count) placed with that axis split over ``devices``; unchanged for one device."""
    sharding = split(devices)
    if sharding is None:
        return tree
    import jax

    return jax.device_put(tree, sharding)


def pad_to_devices(tree, devices):
    """``tree`` (arrays with a leading points axis) padded to a multiple of the device count
    by repeating its last point; unchanged when it divides. The caller drops the copies."""
    import jax
    import jax.numpy as jnp

    count = len(list(devices))
    k = int(np.shape(jax.tree.leaves(tree)[0])[0])
    extra = -(-k // count) * count - k
    if extra == 0:
        return tree
    return jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], extra, 0)]), tree)


def replicate(tree, devices):
    """``tree`` placed whole on every one of ``devices`` (one device: on it)."""
    import jax

    devices = list(devices)
    if len(devices) < 2:
        return jax.device_put(tree, devices[0])
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.device_put(tree, NamedSharding(mesh(devices), P()))


def over_points(fn, devices, per_point: tuple, per_device: bool = False):
    """``fn`` compiled for ``devices``: the arguments flagged True in ``per_point`` carry the
    points (leading axis split over the devices, as :func:`shard` places them), the others
    are replicated; the outputs carry the points too. ``per_device``: each device runs ``fn``
    on its own share of the points (``jax.shard_map``); else ``fn`` sees the whole chunk."""
    import jax

    devices = list(devices)
    if len(devices) < 2:
        return jax.jit(fn)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    m = mesh(devices)
    specs = tuple(P(AXIS) if p else P() for p in per_point)
    if per_device:
        fn = jax.shard_map(fn, mesh=m, in_specs=specs, out_specs=P(AXIS), check_vma=False)
    return jax.jit(
        fn,
        in_shardings=tuple(NamedSharding(m, s) for s in specs),
        out_shardings=NamedSharding(m, P(AXIS)),
    )


def place_like(x, ref):
    """``x`` as a device array placed as the array ``ref`` is (a sharded chunk's per-point
    indices stay with its points); a plain device array where ``ref`` has no placement."""
    import jax
    import jax.numpy as jnp

    sharding = getattr(ref, "sharding", None)
    return jax.device_put(x, sharding) if sharding is not None else jnp.asarray(x)
