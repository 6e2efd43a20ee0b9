"""Training the causal character-level language model: the static :class:`LMConfig`,
:func:`make_train` (purejaxrl-style: ``make_train(cfg, corpus)`` returns a pure
``train(rng)``, jittable and vmappable over seeds) and the per-run :func:`summary`.

One run: the model (:class:`.model.CharLM`) initialized from ``rng`` (its block parameters
optionally times per-parameter multipliers: a recipe's, :func:`recipe_multipliers`, or the
probe's fix, :func:`knob_multipliers`), then ``steps`` Adam steps on random windows of the
training split (linear warmup over ``warmup`` steps, gradients clipped to global norm
``clip``), the held-out loss measured before and after on fixed windows
(:func:`.data.eval_windows`). The learning rate and the multipliers are traced arguments of
the compiled program (:func:`make_train_parts`), so a new value compiles nothing.

Losses are in bits per character (nats / ln 2 per byte). A run **trains** when its final
held-out bpc is finite and at least :attr:`LMConfig.margin` (0.5) bits below the unigram
bpc of the corpus (:meth:`.data.Corpus.unigram_bpc`, the held-out split under the training
split's byte frequencies: what a model reading no context reaches); the bigram bpc (one byte
of context, :meth:`.data.Corpus.bigram_bpc`) is reported beside it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import data as lm_data
from .model import CharLM, ends_in_norm

DEFAULT_HEADS = 4
LIMITS = dict(width=16384, depth=10_000, n=65_536, batch=1_000_000, steps=10_000_000, eval_batches=10_000)
LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Everything static about a run (one compiled program)."""

    block: str = "pre-ln"  # a layers block spec NAME[:k=v,...]; the model masks it causally
    width: int = 128
    depth: int = 4
    heads: int | None = None  # default: the block spec's heads, else DEFAULT_HEADS (paper: one head)
    n: int = 64  # context (window length)
    batch: int = 32
    steps: int = 300
    lr: float = 1e-3
    warmup: int = 0
    clip: float | None = 1.0
    eval_batches: int = 4
    embed_std: float = 1.0
    pos_std: float = 1.0
    head_std: float = 1.0
    curve_points: int = 5
    margin: float = 0.5

    def block_spec(self) -> tuple[str, dict]:
        """(preset name, checked keywords) of the block: the heads, and the width and depth
        of a preset whose options take them (gpt2), filled in."""
        from ..layers import registry, spec

        name, kw = spec.parse(self.block)
        preset = registry.lookup(name)
        kw = dict(kw)
        if "heads" in preset.options:
            if self.heads is not None:
                if kw.get("heads", self.heads) != self.heads:
                    raise ValueError(f"heads {self.heads} and the block's heads={kw['heads']} disagree")
                kw["heads"] = self.heads
            kw.setdefault("heads", DEFAULT_HEADS)
        elif self.heads not in (None, 1):
            raise ValueError(f"block {name} has one attention head (got heads {self.heads})")
        for option, value in (("width", self.width), ("depth", self.depth)):
            if option in preset.options:
                kw.setdefault(option, value)
        if preset.stack_depth is not None:
            kw.setdefault(preset.stack_depth, self.depth)
        return name, spec.check(name, kw)

    def build_block(self):
        from ..layers import spec

        return spec.build(*self.block_spec())

    def model(self) -> CharLM:
        return CharLM(
            block=self.build_block(),
            width=self.width,
            depth=self.depth,
            n=self.n,
            embed_std=self.embed_std,
            pos_std=self.pos_std,
            head_std=self.head_std,
        )

    def validate(self) -> LMConfig:
        """ValueError (one line) for a bad value, before any work."""
        for k, hi in LIMITS.items():
            v = getattr(self, k)
            if not (isinstance(v, int) and 1 <= v <= hi):
                raise ValueError(f"{k.replace('_', '-')} must be an integer in [1, {hi}] (got {v!r})")
        if self.width < 2:
            raise ValueError(f"width must be >= 2 (got {self.width})")
        for k in ("lr", "embed_std", "pos_std", "head_std", "margin"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0) or (k == "lr" and v == 0):
                raise ValueError(
                    f"{k.replace('_', '-')} must be a finite number {'> 0' if k == 'lr' else '>= 0'} (got {v!r})"
                )
        if not (isinstance(self.warmup, int) and 0 <= self.warmup <= self.steps):
            raise ValueError(f"warmup must be an integer in [0, steps = {self.steps}] (got {self.warmup!r})")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a finite number > 0 (got {self.clip!r})")
        if not (isinstance(self.curve_points, int) and self.curve_points >= 1):
            raise ValueError(f"curve-points must be an integer >= 1 (got {self.curve_points!r})")
        name, kw = self.block_spec()
        if self.width % kw.get("heads", 1):
            raise ValueError(f"block {name}: width {self.width} is not a multiple of heads {kw['heads']}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _optimizer(cfg: LMConfig, lr):
    warm = (lambda t: jnp.minimum(1.0, (t + 1.0) / cfg.warmup)) if cfg.warmup else (lambda t: 1.0)
    parts = [optax.clip_by_global_norm(cfg.clip)] if cfg.clip is not None else []
    parts += [optax.scale_by_adam(), optax.scale_by_schedule(lambda t: -lr * warm(t))]
    return optax.chain(*parts)


def scale(params, mult):
    """``params`` with each block parameter at a path of ``mult`` (``{path: multiplier}``,
    paths under ``blocks``, as :func:`block_roles` names them) multiplied."""
    from ..probing.paths import param_path

    if not mult:
        return params

    def f(path, leaf):
        k = param_path(path)
        return leaf * jnp.asarray(mult[k], leaf.dtype) if k in mult else leaf

    return dict(params, blocks=jax.tree_util.tree_map_with_path(f, params["blocks"]))


def make_train_parts(cfg: LMConfig, corpus: lm_data.Corpus):
    """The run cut into pure pieces whose arguments carry every value (``tokens``: the
    training split; ``held``: the held-out windows ``(x, y)``; ``lr`` a scalar; ``mult``
    ``{path: multiplier}`` or ``{}``):

        init(rng, lr, mult, held)             -> state (parameters, Adam's state, step keys)
        steps(state, lr, keys, tokens)        -> (state, per-step training losses in nats)
        evaluate(params, held)                -> mean held-out loss in nats

    and the arrays ``(tokens, held)`` of ``corpus``. :func:`make_train` composes them."""
    cfg.validate()
    model = cfg.model()
    held = lm_data.eval_windows(corpus.held, cfg.eval_batches * cfg.batch, cfg.n)
    arrays = (jnp.asarray(corpus.train), tuple(jnp.asarray(a) for a in held))
    if corpus.train.size < cfg.n + 1:
        raise ValueError(f"the training split ({corpus.train.size} bytes) is shorter than a window of {cfg.n + 1}")

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x).astype(jnp.float32)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

    def evaluate(params, held):
        hx, hy = (a.reshape(cfg.eval_batches, cfg.batch, cfg.n) for a in held)
        return jnp.mean(jax.lax.map(lambda b: loss_fn(params, *b), (hx, hy)))

    def init(rng, lr, mult, held):
        k_init, k_data = jax.random.split(rng)
        params = scale(model.init(k_init, held[0][:1])["params"], mult)
        return dict(params=params, opt_state=_optimizer(cfg, lr).init(params), keys=jax.random.split(k_data, cfg.steps))

    def steps(state, lr, keys, tokens):
        tx = _optimizer(cfg, lr)

        def step(carry, key):
            params, opt_state = carry
            x, y = lm_data.windows(key, tokens, cfg.batch, cfg.n)
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (state["params"], state["opt_state"]), keys)
        return dict(state, params=params, opt_state=opt_state), losses

    return (init, steps, evaluate), arrays


def make_train(cfg: LMConfig, corpus: lm_data.Corpus, mult: dict | None = None):
    """``train(rng) -> metrics`` (pure; ``jax.jit``, ``jax.vmap`` over keys): ``step_loss``
    (nats, per step), ``init_loss`` and ``held_loss`` (held-out nats before and after);
    ``mult``: multipliers of the block parameters at init (:func:`scale`)."""
    (init, steps, evaluate), (tokens, held) = make_train_parts(cfg, corpus)
    mult = {k: float(v) for k, v in (mult or {}).items()}

    def train(rng):
        state = init(rng, cfg.lr, mult, held)
        init_loss = evaluate(state["params"], held)
        state, losses = steps(state, cfg.lr, state["keys"], tokens)
        return dict(step_loss=losses, init_loss=init_loss, held_loss=evaluate(state["params"], held))

    return train


def summary(cfg: LMConfig, corpus: lm_data.Corpus, metrics: dict) -> dict:
    """One run's JSON-ready result: bits per character before (``init_bpc``) and after
    (``held_bpc``) on the held-out windows, the training loss curve (``curve``: the mean
    bpc over ``curve_points`` (at most ``steps``) equal spans of steps, with the span's last step), the unigram
    and bigram bpc and ``trains`` (module docstring)."""
    losses = np.asarray(metrics["step_loss"], np.float64) / LN2
    spans = np.array_split(np.arange(losses.size), min(cfg.curve_points, losses.size))
    held = float(metrics["held_loss"]) / LN2
    uni = corpus.unigram_bpc()
    return dict(
        init_bpc=float(metrics["init_loss"]) / LN2,
        held_bpc=held,
        curve=[[int(s[-1]) + 1, float(losses[s].mean())] for s in spans],
        unigram_bpc=uni,
        bigram_bpc=corpus.bigram_bpc(),
        trains=bool(math.isfinite(held) and held < uni - cfg.margin),
    )


def block_roles(cfg: LMConfig) -> dict:
    """``{path: role}`` of the block parameters (paths under ``blocks``; the roles of
    :func:`phasefield.probing.recipes.roles`: query, key, value, attn_out, mlp, mlp_out, ...)."""
    from ..probing import recipes

    shapes = jax.eval_shape(lambda k: cfg.model().init(k, jnp.zeros((1, cfg.n), jnp.int32)), jax.random.PRNGKey(0))
    return recipes.roles(_select(shapes["params"]["blocks"]))


def _select(blocks) -> dict:
    """:func:`phasefield.probing.paths.select` of one block's parameters: the scanned stack's
    leading depth axis dropped (a LayerNorm's scale is no weight matrix)."""
    from ..probing.paths import select

    return select(jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), blocks))


def knob_multipliers(cfg: LMConfig, knobs: dict) -> dict:
    """``{path: multiplier}`` from multipliers per knob of the probe's fix (``weights``,
    ``residual``, ``attention``, ``mlp``: :data:`phasefield.probing.recipes.KNOBS`) or per
    role; a path's multiplier is the product of those of the knobs and roles it belongs to."""
    from ..probing.recipes import KNOBS, ROLES

    for k, v in knobs.items():
        if k not in KNOBS and k not in ROLES:
            raise ValueError(f"unknown multiplier {k!r}; choose knobs {', '.join(KNOBS)} or roles {', '.join(ROLES)}")
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"multiplier {k} must be a finite number >= 0 (got {v})")
    out = {}
    for path, role in block_roles(cfg).items():
        m = 1.0
        for k, v in knobs.items():
            if role in KNOBS.get(k, (k,)):
                m *= v
        out[path] = m
    return out


def recipe_multipliers(cfg: LMConfig, name: str, m: float | None = None) -> tuple[dict, dict]:
    """``({path: multiplier}, the recipe's plan)`` of the named recipe
    (:func:`phasefield.probing.recipes.plan`) on this model's blocks: its depth, the roles
    found, post-LN where the block ends in a normalization, decoder rules (T-Fixup's
    ``(9N)^(-1/4)``); GPT-2's std targets read the groups' std of the draw of key 0. Where
    it does not apply, every multiplier is 1 and the plan says why."""
    from ..probing import recipes

    if name not in recipes.NAMES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(recipes.NAMES)}")
    params = cfg.model().init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.n), jnp.int32))["params"]["blocks"]
    sel = _select(params)
    std = recipes.group_std(params, sel) if name == "gpt2" else None
    st = recipes.Structure(cfg.depth, recipes.roles(sel), ends_in_norm(cfg.build_block()), std)
    plan = recipes.plan(name, st, **({} if m is None else {"m": m}), decoder=True)
    return recipes.per_path(plan, st), plan
