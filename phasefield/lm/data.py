"""The corpus every machine has offline: a fixed list of the Python standard library's own
source files (:data:`FILES`, chosen by name, in this order), read from
``sysconfig.get_paths()["stdlib"]`` and concatenated as bytes.

The vocabulary is the 256 byte values (:data:`VOCAB`): a character is a byte (the sources
are almost all ASCII). The corpus is identified by the SHA-256 of the concatenation
(:attr:`Corpus.sha256`); :data:`REFERENCE_SHA256` is CPython 3.11.7's, and
:attr:`Corpus.matches_reference` says whether this machine's standard library gives the
same bytes. The held-out split is fixed: the last :data:`HELD_OUT` (10 %) of the bytes.

Batches are random windows of ``n + 1`` bytes of the training split (inputs the first ``n``,
targets the last ``n``) from a JAX key (:func:`windows`); the held-out evaluation reads
evenly spaced windows of the held-out split (:func:`eval_windows`: the same for every run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sysconfig

import jax
import jax.numpy as jnp
import numpy as np

VOCAB = 256
HELD_OUT = 0.1
FILES = (
    "abc.py",
    "argparse.py",
    "ast.py",
    "bisect.py",
    "calendar.py",
    "codecs.py",
    "colorsys.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "glob.py",
    "heapq.py",
    "inspect.py",
    "keyword.py",
    "locale.py",
    "numbers.py",
    "operator.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
    "tokenize.py",
    "typing.py",
    "uuid.py",
    "warnings.py",
    "weakref.py",
)
# the SHA-256 of the concatenation of FILES in CPython 3.11.7's standard library
REFERENCE_SHA256 = "f45aff576b103766e271cb95a3a02d4b6e2a5d199ce0782a96a677253093c2fb"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The bytes of the corpus, split: ``train`` and ``held`` (uint8 arrays), the file list,
    the folder they were read from and the SHA-256 of the concatenation."""

    train: np.ndarray
    held: np.ndarray
    files: tuple
    root: str
    sha256: str

    @property
    def matches_reference(self) -> bool:
        return self.sha256 == REFERENCE_SHA256

    def unigram_bpc(self) -> float:
        """Bits per character of the held-out split under the training split's byte
        frequencies (add-one smoothed): the best a model that reads no context does."""
        counts = np.bincount(self.train, minlength=VOCAB).astype(np.float64) + 1.0
        logp = np.log2(counts / counts.sum())
        return float(-logp[self.held].mean())

    def bigram_bpc(self) -> float:
        """Bits per character of the held-out split under the training split's byte-pair
        counts (add-one smoothed): the best a model reading one byte of context does."""
        t, h = self.train.astype(np.int64), self.held.astype(np.int64)
        counts = np.bincount(t[:-1] * VOCAB + t[1:], minlength=VOCAB * VOCAB).reshape(VOCAB, VOCAB) + 1.0
        logp = np.log2(counts / counts.sum(axis=1, keepdims=True))
        return float(-logp[h[:-1], h[1:]].mean())

    def describe(self) -> dict:
        """What identifies the corpus in a result."""
        return dict(
            corpus="python-stdlib",
            files=list(self.files),
            sha256=self.sha256,
            matches_reference=self.matches_reference,
            train_bytes=int(self.train.size),
            held_bytes=int(self.held.size),
            vocab=VOCAB,
        )


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def load(root: str | None = None, files: tuple = FILES) -> Corpus:
    """The corpus read from ``root`` (default: this interpreter's standard library); a
    missing file is a ValueError naming it."""
    root = stdlib_root() if root is None else root
    parts = []
    for name in files:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise ValueError(f"the corpus file {name} is not in {root}")
        with open(path, "rb") as fh:
            parts.append(fh.read())
    blob = b"".join(parts)
    data = np.frombuffer(blob, np.uint8)
    cut = data.size - int(math.ceil(HELD_OUT * data.size))
    return Corpus(data[:cut].copy(), data[cut:].copy(), tuple(files), root, hashlib.sha256(blob).hexdigest())


def windows(key, tokens, batch: int, n: int):
    """``(inputs, targets)``, each ``[batch, n]`` int32: ``batch`` windows of ``n + 1``
    tokens at uniform random starts (``key``), targets shifted by one."""
    starts = jax.random.randint(key, (batch,), 0, tokens.shape[0] - n, dtype=jnp.int32)
    w = tokens[starts[:, None] + jnp.arange(n + 1, dtype=jnp.int32)].astype(jnp.int32)
    return w[:, :-1], w[:, 1:]


def eval_windows(tokens, count: int, n: int):
    """``(inputs, targets)`` of ``count`` evenly spaced windows of ``tokens`` (NumPy, int32)."""
    tokens = np.asarray(tokens)
    if tokens.size < n + 1:
        raise ValueError(f"the held-out split ({tokens.size} bytes) is shorter than a window of {n + 1}")
    starts = np.linspace(0, tokens.size - n - 1, count).astype(np.int64)
    w = tokens[starts[:, None] + np.arange(n + 1)].astype(np.int32)
    return w[:, :-1], w[:, 1:]
