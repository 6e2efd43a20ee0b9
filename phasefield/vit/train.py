"""Training many ViTs at once: ``train(point, ...)`` is a pure function of one run's traced
hyperparameters (a :class:`Point`), and :func:`train_many` vmaps it over a chunk of grid
points (and seeds) and, when more than one device is visible, shards the leading config
axis over the devices. A chunk is trained by three compiled programs (init, one epoch, final
evaluation; :func:`make_train_parts`), called epoch by epoch so that long chunks report
progress and stop promptly on Ctrl-C; :func:`make_train` composes the same pieces into one
pure function.

Static settings shared by a sweep live in the frozen :class:`TrainConfig` ("config as
code"); per-run numbers (sigma_w, sigma_A, alpha_A, alpha_M, learning rate, seed) are pytree
leaves. The learning rate is injected into Adam with ``optax.inject_hyperparams`` so it is
traced state, not a compile-time constant.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from .. import HParams, driver
from .._runtime import options_known
from ..layers import registry
from .model import ViT, n_tokens, preprocess


def sgd_momentum(learning_rate, momentum=0.9):
    """SGD with heavy-ball momentum 0.9 (optax.sgd; PyTorch's SGD(momentum=0.9) without dampening)."""
    return optax.sgd(learning_rate, momentum=momentum)


OPTIMIZERS = {"adam": optax.adam, "sgd_momentum": sgd_momentum}

# A run's numbers (train-sweep's --sigma-w, --sigma-a, --alpha-a, --alpha-m; --alpha sets both
# branch scales) and the number of each block they set: a block takes these and no others
# (name -> its preset's ``run_numbers``, a live view of the registry)
RUN_NUMBERS = registry.field("run_numbers")


def run_mapping(name: str) -> str:
    """'--sigma-w -> sigma, --alpha-a -> alpha_attn, ...': how a run's numbers set block ``name``'s."""
    m = RUN_NUMBERS[name]
    text = ", ".join(f"--{run.replace('_', '-')} -> {number}" for run, number in m.items())
    return text + (" (--alpha sets both branch scales)" if {"alpha_a", "alpha_m"} <= set(m) else "")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything static about a sweep (one compiled program per chunk size)."""

    dataset: str = "digits"
    image_size: int = 8
    patch_size: int = 2
    width: int = 64
    depth: int = 16
    epochs: int = 15
    batch_size: int = 256
    eval_batch_size: int = 512
    activation: str = "tanh"
    mlp_layers: int = 1
    mlp_hidden: int | None = None
    sigma_v: float = 1.0
    pos_std: float = 1.0
    optimizer: str = "adam"
    block: str = "paper"  # a layers block spec (NAME[:k=v,...]); its init numbers come from the runs

    def block_spec(self) -> tuple:
        """(preset name, fixed keywords) of ``block``."""
        from ..layers import spec

        return spec.parse(self.block)

    def preset(self):
        """The :class:`phasefield.layers.registry.Preset` of ``block``."""
        return registry.lookup(self.block_spec()[0])

    def block_for(self, hp: HParams, **over):
        """The :mod:`phasefield.layers` block of one run (``None`` for a preset whose numbers
        are the run's ``hp`` itself, ``numbers_class``: the ViT's own ``Block(hp)``, the
        paper's). A run's numbers map onto the preset's (:data:`RUN_NUMBERS`): the standard
        blocks take ``sigma = sigma_w``, ``alpha_attn = alpha_A`` and ``alpha_mlp = alpha_M``,
        deepscalelm ``sigma_a`` (its depth is the model's unless given). ``over``: preset
        keywords to set (e.g. ``attention="exact"``)."""
        name, kw = self.block_spec()
        preset = registry.lookup(name)
        if preset.numbers_class is not None:
            return None
        from ..layers import spec

        numbers = {number: getattr(hp, run) for run, number in RUN_NUMBERS[name].items()}
        if preset.stack_depth is not None:  # the block's numbers follow the model's depth unless given
            numbers = {preset.stack_depth: self.depth, **kw, **numbers}
        return spec.build(name, {**kw, **numbers, **over})

    @property
    def n_tokens(self) -> int:
        from .data import ONE_D

        return n_tokens(self.image_size, self.patch_size, 1 if self.dataset in ONE_D else 2)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        # the defaults are left out: configs written before the options match
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for key in ("optimizer", "block"):
            if d[key] == defaults[key]:
                d.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def validate(self) -> TrainConfig:
        for k in (
            "image_size",
            "patch_size",
            "width",
            "depth",
            "epochs",
            "batch_size",
            "eval_batch_size",
            "mlp_layers",
        ):
            v = getattr(self, k)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{k.replace('_', '-')} must be an integer >= 1 (got {v!r})")
        if self.image_size % self.patch_size:
            raise ValueError(f"patch size {self.patch_size} does not divide image size {self.image_size}")
        if self.width < 2:
            raise ValueError(f"width must be >= 2 (got {self.width})")
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ValueError(f"mlp-hidden must be >= 1 (got {self.mlp_hidden})")
        HParams(activation=self.activation, mlp_layers=self.mlp_layers).validate()
        name, kw = self.block_spec()
        preset = registry.lookup(name)
        taken = set(preset.run_numbers.values()) | ({"alpha"} if "alpha_attn" in preset.run_numbers.values() else set())
        from_runs = set(kw) if preset.numbers_class is not None else taken & set(kw)  # hp holds all its numbers
        if from_runs:
            raise ValueError(
                f"block {name}: {', '.join(sorted(from_runs))} "
                f"come from the runs ({run_mapping(name)}), not the block spec"
            )
        heads = kw.get("heads", preset.default_heads)
        if self.width % heads:
            raise ValueError(f"block {name}: width {self.width} is not a multiple of heads {heads}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        return self

    def hparams(self, sigma_w=1.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, depth=None, dtype=jnp.float32) -> HParams:
        """The HParams of one (or a batch of) runs: the theory's n = patches + 1, L = depth
        (default: this config's depth)."""
        depth = self.depth if depth is None else depth
        vals = jnp.broadcast_arrays(*(jnp.asarray(v, dtype) for v in (sigma_w, sigma_a, alpha_a, alpha_m, depth)))
        sw, sa, aa, am, L = vals
        return HParams(
            sigma_w=sw,
            sigma_a=sa,
            alpha_a=aa,
            alpha_m=am,
            sigma_v=jnp.full(sw.shape, self.sigma_v, dtype),
            n_tokens=jnp.full(sw.shape, self.n_tokens, dtype),
            depth=L,
            activation=self.activation,
            mlp_layers=self.mlp_layers,
        )


@struct.dataclass
class Point:
    """One run's traced numbers (leaves may carry a leading batch axis)."""

    hp: HParams
    lr: Any
    seed: Any


def make_points(cfg: TrainConfig, sigma_w, sigma_a, alpha_a, alpha_m, lr, seed) -> Point:
    """Stack per-run values (1-d sequences of equal length) into a batched :class:`Point`."""
    return Point(
        hp=cfg.hparams(np.asarray(sigma_w), np.asarray(sigma_a), np.asarray(alpha_a), np.asarray(alpha_m)),
        lr=jnp.asarray(np.asarray(lr), jnp.float32),
        seed=jnp.asarray(np.asarray(seed), jnp.uint32),
    )


def model_for(cfg: TrainConfig, hp: HParams, num_classes: int) -> ViT:
    return ViT(
        hp=hp,
        num_classes=num_classes,
        width=cfg.width,
        depth=cfg.depth,
        mlp_hidden=cfg.mlp_hidden,
        pos_std=cfg.pos_std,
        block=cfg.block_for(hp),
    )


def steps_per_epoch(cfg: TrainConfig, n_train: int) -> int:
    return max(1, n_train // min(cfg.batch_size, n_train))


def make_train_parts(cfg: TrainConfig, num_classes: int, scale: float, eval_batch_size: int | None = None):
    """The training run cut at epoch boundaries: three pure functions

        init(point, x_train)                          -> state
        epoch(state, x_train, y_train, x_test, y_test) -> (state, epoch metrics)
        final(state, x_train, y_train)                 -> final metrics

    ``state`` carries the parameters, Adam's state, the epoch counter and the per-epoch
    shuffling keys, so a driver can compile one epoch, report progress and stop between
    epochs. :func:`make_train` composes them into one pure ``train`` with ``lax.scan``.
    ``eval_batch_size`` overrides ``cfg.eval_batch_size`` (the evaluation batch changes only
    the summation order of the evaluated losses)."""
    ps = cfg.patch_size
    eval_bs = eval_batch_size or cfg.eval_batch_size

    def loss_and_acc(model, params, xb, yb):
        logits = model.apply({"params": params}, preprocess(xb, scale, ps))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
        return loss, (jnp.argmax(logits, -1) == yb).astype(jnp.float32)

    def evaluate(model, params, x, y):
        n = x.shape[0]
        eb = min(eval_bs, n)
        nb = -(-n // eb)
        pad = nb * eb - n
        xp = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((nb, eb) + x.shape[1:])
        yp = jnp.pad(y, (0, pad)).reshape(nb, eb)
        mask = (jnp.arange(nb * eb) < n).reshape(nb, eb)

        def body(args):
            xb, yb, mb = args
            loss, correct = loss_and_acc(model, params, xb, yb)
            return jnp.sum(jnp.where(mb, loss, 0.0)), jnp.sum(jnp.where(mb, correct, 0.0))

        losses, correct = jax.lax.map(body, (xp, yp, mask))
        return jnp.sum(losses) / jnp.float32(n), jnp.sum(correct) / jnp.float32(n)

    def parts(point):
        model = model_for(cfg, point.hp, num_classes)
        tx = optax.inject_hyperparams(OPTIMIZERS[cfg.optimizer])(learning_rate=point.lr)
        return model, tx

    def init(point: Point, x_train):
        model, tx = parts(point)
        k_init, k_data = jax.random.split(jax.random.PRNGKey(point.seed))
        params = model.init(k_init, preprocess(x_train[:1], scale, ps))["params"]
        return dict(
            point=point,
            params=params,
            opt_state=tx.init(params),
            epoch=jnp.zeros((), jnp.int32),
            keys=jax.random.split(k_data, cfg.epochs),
        )

    def epoch(state, x_train, y_train, x_test, y_test):
        model, tx = parts(state["point"])
        n = x_train.shape[0]
        b = min(cfg.batch_size, n)
        spe = steps_per_epoch(cfg, n)

        def step(carry, idx):
            params, opt_state = carry
            xb, yb = x_train[idx], y_train[idx]

            def f(p):
                loss, correct = loss_and_acc(model, p, xb, yb)
                return jnp.mean(loss), jnp.mean(correct)

            (loss, acc), grads = jax.value_and_grad(f, has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (loss, acc)

        key = state["keys"][jnp.minimum(state["epoch"], cfg.epochs - 1)]
        perm = jax.random.permutation(key, n)[: spe * b].reshape(spe, b)
        (params, opt_state), (loss, acc) = jax.lax.scan(step, (state["params"], state["opt_state"]), perm)
        test_loss, test_acc = evaluate(model, params, x_test, y_test)
        state = dict(state, params=params, opt_state=opt_state, epoch=state["epoch"] + 1)
        return state, dict(step_loss=loss, step_acc=acc, test_loss=test_loss, test_acc=test_acc)

    def final(state, x_train, y_train):
        model, _ = parts(state["point"])
        train_loss, train_acc = evaluate(model, state["params"], x_train, y_train)
        return dict(train_loss=train_loss, train_acc=train_acc)

    return init, epoch, final


def make_train(cfg: TrainConfig, num_classes: int, scale: float, eval_batch_size: int | None = None):
    """Return ``train(point, x_train, y_train, x_test, y_test) -> (params, metrics)`` (pure):
    :func:`make_train_parts` composed, every epoch in one ``lax.scan``."""
    init, epoch, final = make_train_parts(cfg, num_classes, scale, eval_batch_size)

    def train(point: Point, x_train, y_train, x_test, y_test):
        state = init(point, x_train)
        state, hist = jax.lax.scan(
            lambda s, _: epoch(s, x_train, y_train, x_test, y_test), state, None, length=cfg.epochs
        )
        return state["params"], assemble_metrics(hist, final(state, x_train, y_train))

    return train


def assemble_metrics(hist: dict, fin: dict) -> dict:
    """Per-epoch metrics (leading epoch axis, after any run axis) and the final evaluation ->
    the metrics dict of a run (``final_test_*`` are the last epoch's)."""
    return dict(hist, **fin, final_test_loss=hist["test_loss"][..., -1], final_test_acc=hist["test_acc"][..., -1])


# XLA:CPU (jaxlib 0.10) routes dots fused with their neighbouring reductions/elementwise ops
# to YNNPACK by default; for these small batched matmuls (the [K, B*n, d] x [K, d, d] dots of
# a vmapped chunk) that fusion is several times slower than XLA's own dots (one fused
# 3-dot + reduce took 13.7 ms, ~15 GFLOP/s; see docs/training.md). Keeping YNNPACK to
# individual dots made the vmapped d = 64 step ~1.9x and the single-model step ~1.3x faster.
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(devices) -> dict | None:
    """Compiler options for the training programs on ``devices`` (None: XLA's defaults).

    Only on CPU, only when the user has not set the YNN fusion flag in XLA_FLAGS, and only
    when this jaxlib knows the option (:func:`phasefield._runtime.options_known`)."""
    import os

    if not devices or devices[0].platform != "cpu" or "ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        return None
    return dict(CPU_COMPILER_OPTIONS) if options_known(CPU_COMPILER_OPTIONS) else None


class Trainer:
    """Compiled, vmapped (and sharded) training of chunks of runs on one dataset."""

    def __init__(self, cfg: TrainConfig, data, devices=None, xla_options="auto"):
        self.cfg = cfg.validate()
        if data.image_size != cfg.image_size:
            raise ValueError(f"data has {data.image_size}px images, config wants {cfg.image_size}px")
        self.data = data
        self.devices = list(devices) if devices is not None else jax.devices()
        train = make_train(cfg, data.num_classes, data.scale)
        # under vmap every model evaluates its own batch: K x 512 images of activations do not
        # stay in a CPU core's cache (~8 % of the chunk's time at K = 16); evaluate in
        # training-sized batches instead
        init, epoch, final = make_train_parts(
            cfg, data.num_classes, data.scale, min(cfg.eval_batch_size, cfg.batch_size)
        )
        opts = compiler_options(self.devices) if xla_options == "auto" else xla_options
        self.xla_options = opts
        vm = lambda f, n_data: jax.jit(jax.vmap(f, in_axes=(0,) + (None,) * n_data), compiler_options=opts)
        self._init, self._epoch, self._final = vm(init, 1), vm(epoch, 4), vm(final, 2)
        self._single = jax.jit(train, compiler_options=opts)
        self._arrays = None
        self._arrays1 = None

    def arrays(self):
        if self._arrays is None:
            d = self.data
            arrays = (d.x_train, d.y_train.astype(np.int32), d.x_test, d.y_test.astype(np.int32))
            self._arrays = driver.replicate(arrays, self.devices)  # every run reads all of it
        return self._arrays

    def train_many(self, points: Point, on_epoch: Callable[[int], None] | None = None):
        """Train every run of the batched ``points`` together (vmapped, sharded over the devices),
        one compiled epoch at a time; ``on_epoch(e)`` is called after epoch e. Numpy results."""
        k = int(np.shape(points.lr)[0])
        # whole runs per device (the copies of the last run are dropped below), split over them
        points = driver.shard(driver.pad_to_devices(points, self.devices), self.devices)
        xtr, ytr, xte, yte = self.arrays()
        state = self._init(points, xtr)
        # init hands back parts of the state replicated, every epoch sharded by run: one
        # epoch program, not one for the first epoch
        state = driver.shard(state, self.devices)
        hist = []
        for e in range(self.cfg.epochs):  # one compiled epoch per call: progress, prompt Ctrl-C
            state, m = self._epoch(state, xtr, ytr, xte, yte)
            hist.append(jax.device_get(m))
            if on_epoch is not None:
                on_epoch(e + 1)
        fin = jax.device_get(self._final(state, xtr, ytr))
        hist = {key: np.stack([h[key] for h in hist], axis=1) for key in hist[0]}
        params, metrics = jax.device_get(state["params"]), assemble_metrics(hist, fin)
        return jax.tree.map(lambda a: np.asarray(a)[:k], params), jax.tree.map(lambda a: np.asarray(a)[:k], metrics)

    def train_one(self, point: Point):
        """The same pure function without vmap, on the first device only (for the benchmark
        and the tests; on a multi-device trainer the replicated data would otherwise make it
        an SPMD program that computes the same run on every device)."""
        if self._arrays1 is None:
            dev = self.devices[0]
            self._arrays1 = tuple(jax.device_put(a, dev) for a in self.arrays())
            self._point_dev = dev
        point = jax.device_put(point, self._point_dev)
        params, metrics = self._single(point, *self._arrays1)
        return jax.device_get((params, metrics))


def diverged(metrics: dict) -> np.ndarray:
    """A run diverged when any step loss or a final loss is not finite."""
    bad = ~np.all(np.isfinite(np.asarray(metrics["step_loss"]).reshape(len(metrics["train_loss"]), -1)), axis=1)
    for k in ("train_loss", "final_test_loss"):
        bad |= ~np.isfinite(np.asarray(metrics[k]))
    return bad


def chance_loss(num_classes: int) -> float:
    return math.log(num_classes)
