"""The causal character-level language model (phasefield.lm): the corpus, the causal mask,
the untrained loss against its bounds, a few training steps, the recipes' roles, and the
command's bad input. Tiny sizes (width 16, depth 2, heads 2, n 16)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield.cli import main
from phasefield.lm import data, runs, train

TINY = dict(block="pre-ln", width=16, depth=2, heads=2, n=16, batch=8, eval_batches=4)


@pytest.fixture(scope="module")
def corpus():
    return data.load()


def test_corpus_checksum_and_split(corpus):
    """The checksum is the SHA-256 of the listed files read one by one, the split the last
    10 % of those bytes, and CPython 3.11.7 gives the recorded reference."""
    blob = b""
    for name in data.FILES:
        with open(os.path.join(data.stdlib_root(), name), "rb") as fh:
            blob += fh.read()
    assert corpus.sha256 == hashlib.sha256(blob).hexdigest() == data.load().sha256
    assert list(data.FILES) == sorted(data.FILES)
    assert corpus.held.size == math.ceil(0.1 * len(blob)) and corpus.train.size + corpus.held.size == len(blob)
    assert np.concatenate([corpus.train, corpus.held]).tobytes() == blob
    if sys.version_info[:3] == (3, 11, 7) and sys.implementation.name == "cpython":
        assert corpus.matches_reference
    assert 3.0 < corpus.bigram_bpc() < corpus.unigram_bpc() < 8.0  # Python source: far from uniform bytes
    x, y = data.eval_windows(corpus.held, 4, 16)
    assert np.array_equal(x[:, 1:], y[:, :-1]) and x.dtype == np.int32


def test_causal_mask():
    """Changing byte k changes no logit before k (and does change those from k on)."""
    cfg = train.LMConfig(**TINY)
    model = cfg.model()
    x = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256, jnp.int32)
    params = model.init(jax.random.PRNGKey(0), x)
    apply = jax.jit(model.apply)
    k = 9
    a = np.asarray(apply(params, x))
    b = np.asarray(apply(params, x.at[:, k].set((x[:, k] + 1) % 256)))
    assert np.isfinite(a).all()
    assert np.array_equal(a[:, :k], b[:, :k])
    assert np.abs(a[:, k:] - b[:, k:]).max(axis=-1).min() > 1e-4


def test_untrained_bits_and_a_few_steps(corpus):
    """Untrained, the head's logits given the final LayerNorm's output (norm sqrt(width))
    are N(0, s^2) per byte (s = head_std): the loss averaged over the head's draw lies in
    [ln 256, ln 256 + s^2/2] (Jensen; the target is independent of the head), and the mean
    over positions is a sqrt(2) s-Lipschitz function of the head's standardized weights, so
    one draw lies within 5 sqrt(2) s of it (Gaussian concentration, p < 1e-5). Then 10 Adam
    steps must lower the held-out loss by half a bit."""
    s = 0.01
    cfg = train.LMConfig(**TINY, steps=10, lr=1e-2, head_std=s, curve_points=2)
    res = train.summary(cfg, corpus, jax.jit(train.make_train(cfg, corpus))(jax.random.PRNGKey(0)))
    slack = 5 * math.sqrt(2) * s
    lo, hi = (math.log(256) - slack) / math.log(2), (math.log(256) + s * s / 2 + slack) / math.log(2)
    assert lo <= res["init_bpc"] <= hi, (lo, res["init_bpc"], hi)
    assert res["held_bpc"] < res["init_bpc"] - 0.5, res
    assert len(res["curve"]) == 2 and res["curve"][-1][0] == 10 and res["trains"] is False


def test_recipe_roles_and_resume_check(tmp_path, corpus):
    """The recipes find the blocks' roles under the scanned stack (a LayerNorm's stacked
    scale is no weight matrix); a results file of another configuration is refused."""
    cfg = train.LMConfig(**TINY)
    roles = train.block_roles(cfg)
    assert sorted(roles.values()) == ["attn_out", "key", "mlp", "mlp_out", "query", "value"]
    mult = train.knob_multipliers(cfg, {"weights": 0.5, "residual": 0.2})
    assert {roles[p]: m for p, m in mult.items()}["attn_out"] == pytest.approx(0.1)
    assert {roles[p]: m for p, m in mult.items()}["query"] == 0.5
    ident = runs.identity(cfg, corpus, {})
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(dict(seed=3, **ident)) + "\n")
    assert runs.done_seeds(str(path), ident) == {3}
    with pytest.raises(ValueError, match="another configuration"):
        runs.done_seeds(str(path), runs.identity(train.LMConfig(**dict(TINY, depth=3)), corpus, {}))


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--width", "17"), "not a multiple of heads"),
        (("--steps", "0"), "steps must be an integer"),
        (("--seeds", "1,x"), "--seeds must be integers"),
        (("--lr", "nan"), "lr must be a finite number"),
        (("--recipe", "nope"), "unknown recipe"),
        (("--multipliers", "weights"), "--multipliers: expected"),
        (("--width", "8192", "--depth", "1000"), "GiB"),
        (("--block", "pre-ln:heads=4"), "disagree"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, tmp_path, args, needle):
    out = tmp_path / "r.jsonl"
    base = ("--width", "16", "--depth", "2", "--heads", "2", "--context", "16", "--steps", "2", "--quiet")
    code = main(["train-lm", "--out", str(out), *base, *args])
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == "" and err.count("\n") == 1 and needle in err, err
    assert not out.exists()
