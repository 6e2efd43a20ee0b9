"""What a probe measures: a model's ``init_fn``, ``apply_fn``, inputs and where its blocks
are (``--model module:factory`` returns one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Model:
    """What a ``--model module:factory`` returns: the arguments of :func:`probe`
    (``block``: a phasefield block for the theory curves, when the model is one; ``spec``:
    its preset ``(name, numbers)``, for the fix's theory answer; ``runner``: a ready
    ``run(params, inject, deltas, shift)`` of :func:`.capture.runner`'s contract, as
    :mod:`.nnx` builds; ``causal``: whether its attention is masked (a decoder: True; an
    encoder: False; None: not known, the probe then reads ``block`` or its ``causal=``))."""

    init_fn: Callable
    apply_fn: Callable
    inputs: Any
    blocks: Any = None
    stack: Callable | None = None
    block: Any = None
    name: str = "model"
    spec: tuple | None = None
    runner: Callable | None = None
    causal: bool | None = None
