"""Hugging Face transformers' Flax GPT-2, BERT and ViT at random init from a config (no
download), as probe models (the optional extra ``probe-hf``: ``pip install
'phasefield[probe-hf]'``, transformers 4.x, which still ships the Flax classes).

    phasefield.probe(hf.gpt2(), inits=8)                          # GPT-2 small, as shipped
    phasefield.probe(hf.gpt2(std=0.02, scaled=True), inits=8)     # + 1/sqrt(2L) projections
    phasefield probe --model phasefield.probing.hf:gpt2 --set std=0.05 --depth 24

Keywords: ``depth`` (blocks), ``width`` (d), ``heads``, ``n_tokens`` (sequence length; the
ViT's patches + 1), ``batch`` (sequences per measurement), ``std`` (the std of every weight
matrix inside the blocks; None: as shipped), ``scaled`` (GPT-2's 1/sqrt(2L) on the
residual projections: attention ``c_proj`` and MLP ``c_proj`` for GPT-2, the ``output``
dense layers for BERT/ViT). Embeddings are as shipped. As shipped: GPT-2 and BERT draw
every weight N(0, 0.02^2) (Flax GPT-2's Conv1D ignores ``initializer_range``: 0.02 is
hard-coded); Flax ViT draws its dense kernels truncated-normal with variance
0.02^2 / fan_in (so std 0.02 there is a rescaling by sqrt(fan_in)).

GPT-2 is causal (its attention masks the later tokens: ``Model.causal`` True, the probe
measures it per position); BERT and ViT are not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .model import Model


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError("the Hugging Face models need transformers 4.x: pip install 'phasefield[probe-hf]'") from None
    if not hasattr(transformers, "FlaxGPT2Model"):
        raise ValueError(f"transformers {transformers.__version__} has no Flax models; install transformers<5")
    return transformers


def _check(**kw):
    for k, v in kw.items():
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    if kw["width"] % kw["heads"]:
        raise ValueError(f"width {kw['width']} is not a multiple of heads {kw['heads']}")


def _path(p):
    return "/".join(str(getattr(k, "key", k)) for k in p)


def _rescale(params, block_re, shipped_std, std, scaled, proj_re, depth):
    """Weight matrices (``kernel`` leaves under ``block_re``) to std ``std`` (from their
    shipped std ``shipped_std(leaf)``); residual projections (``proj_re``) times 1/sqrt(2L)."""
    import re

    def f(p, x):
        path = _path(p)
        if not path.endswith("kernel") or not re.search(block_re, path):
            return x
        if std is not None:
            x = x * (std / shipped_std(x))
        if scaled and re.search(proj_re, path):
            x = x / np.sqrt(2.0 * depth)
        return x

    return jax.tree_util.tree_map_with_path(f, params)


def _make(module, inputs, call, block_cls, block_re, shipped_std, proj_re, std, scaled, depth, name, causal):
    def init_fn(key):
        params = module.init({"params": key, "dropout": key}, **call(inputs))
        return _rescale(params, block_re, shipped_std, std, scaled, proj_re, depth)

    def apply_fn(params, x):
        return module.apply(params, **call(x))

    label = f"{name} L={depth}" + ("" if std is None else f" std={std:g}") + (" 1/sqrt(2L)" if scaled else "")
    return Model(init_fn, apply_fn, inputs, blocks=block_cls, name=label, causal=causal)


def gpt2(
    depth: int = 12,
    width: int = 768,
    heads: int = 12,
    n_tokens: int = 64,
    batch: int = 2,
    std=None,
    scaled: bool = False,
    vocab: int = 50257,
    seed: int = 0,
) -> Model:
    """Flax GPT-2 (``FlaxGPT2Module``) at random init; inputs: random token ids."""
    _check(depth=depth, width=width, heads=heads, n_tokens=n_tokens, batch=batch, vocab=vocab)
    tr = _transformers()
    cfg = tr.GPT2Config(
        n_layer=depth,
        n_embd=width,
        n_head=heads,
        n_positions=max(1024, n_tokens),
        vocab_size=vocab,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    module = tr.FlaxGPT2Model(cfg, _do_init=False).module
    ids = jax.random.randint(jax.random.PRNGKey(seed), (batch, n_tokens), 0, vocab)

    def call(x):
        return dict(
            input_ids=x,
            attention_mask=jnp.ones_like(x),
            position_ids=jnp.broadcast_to(jnp.arange(x.shape[-1]), x.shape),
            deterministic=True,
        )

    return _make(
        module,
        ids,
        call,
        "FlaxGPT2Block",
        r"(^|/)h/",
        lambda x: 0.02,
        r"c_proj/kernel$",
        std,
        scaled,
        depth,
        "GPT-2",
        causal=True,
    )


def bert(
    depth: int = 12,
    width: int = 768,
    heads: int = 12,
    n_tokens: int = 64,
    batch: int = 2,
    std=None,
    scaled: bool = False,
    vocab: int = 30522,
    seed: int = 0,
) -> Model:
    """Flax BERT (``FlaxBertModule``, post-LN) at random init; inputs: random token ids."""
    _check(depth=depth, width=width, heads=heads, n_tokens=n_tokens, batch=batch, vocab=vocab)
    tr = _transformers()
    cfg = tr.BertConfig(
        num_hidden_layers=depth,
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        vocab_size=vocab,
        max_position_embeddings=max(512, n_tokens),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    module = tr.FlaxBertModel(cfg, _do_init=False, add_pooling_layer=False).module
    ids = jax.random.randint(jax.random.PRNGKey(seed), (batch, n_tokens), 0, vocab)

    def call(x):
        return dict(
            input_ids=x,
            attention_mask=jnp.ones_like(x),
            token_type_ids=jnp.zeros_like(x),
            position_ids=jnp.broadcast_to(jnp.arange(x.shape[-1]), x.shape),
            head_mask=None,
            deterministic=True,
        )

    return _make(
        module,
        ids,
        call,
        "FlaxBertLayer",
        r"encoder/layer/",
        lambda x: cfg.initializer_range,
        r"output/dense/kernel$",
        std,
        scaled,
        depth,
        "BERT",
        causal=False,
    )


def vit(
    depth: int = 12,
    width: int = 768,
    heads: int = 12,
    n_tokens: int = 17,
    batch: int = 2,
    std=None,
    scaled: bool = False,
    patch: int = 16,
    seed: int = 0,
) -> Model:
    """Flax ViT (``FlaxViTModule``) at random init; ``n_tokens - 1`` must be a square (the
    patches of a square image); inputs: standard normal pixels."""
    _check(depth=depth, width=width, heads=heads, n_tokens=n_tokens, batch=batch, patch=patch)
    side = int(round((n_tokens - 1) ** 0.5))
    if side * side != n_tokens - 1:
        raise ValueError(f"ViT: n_tokens - 1 must be a square number of patches, got {n_tokens - 1}")
    tr = _transformers()
    cfg = tr.ViTConfig(
        num_hidden_layers=depth,
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        image_size=side * patch,
        patch_size=patch,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    module = tr.FlaxViTModel(cfg, _do_init=False, add_pooling_layer=False).module
    pix = jax.random.normal(jax.random.PRNGKey(seed), (batch, side * patch, side * patch, 3))

    def call(x):
        return dict(pixel_values=x, deterministic=True)

    fan_in_std = lambda x: cfg.initializer_range / np.sqrt(np.prod(x.shape[:-1]))
    return _make(
        module,
        pix,
        call,
        "FlaxViTLayer",
        r"encoder/layer/",
        fan_in_std,
        r"output/dense/kernel$",
        std,
        scaled,
        depth,
        "ViT",
        causal=False,
    )
