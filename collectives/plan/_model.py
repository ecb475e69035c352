"""The model a plan is for: its widths, depth and batch, and named sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Model:
    """A model to plan for, in the terms the strategy recipes take.

    The strategies' recipes each compile one *unit* of it: four dense layers
    of ``width`` (DP, TP, FSDP), one stage's layer (pipeline), one attention
    of ``seq`` tokens over ``batch * heads`` independent heads (sequence
    parallel), one mixture-of-experts layer with experts of hidden size
    ``ffn`` (expert parallel). A training step runs ``layers`` dense layers
    and ``layers`` of the others.

    Attributes:
      name: how the plan's table names it.
      width: the model (hidden) width.
      layers: the number of layers.
      seq: tokens per sequence.
      batch: sequences per training step, over all devices.
      heads: attention heads (``width`` divides by it).
      ffn: an expert's hidden width.
      dtype: the parameters' and activations' dtype.

    Examples:
      >>> from collectives.plan import MODELS
      >>> m = MODELS["8b"]
      >>> m.width, m.layers, f"{m.parameters / 1e9:.1f}B"
      (8192, 128, '8.6B')
    """

    name: str
    width: int
    layers: int
    seq: int
    batch: int
    heads: int
    ffn: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for field in ("width", "layers", "seq", "batch", "heads", "ffn"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"model {self.name!r}: {field}={value!r}; expected a "
                                 "positive integer.")
        if self.width % self.heads:
            raise ValueError(
                f"model {self.name!r}: width={self.width} does not divide by "
                f"heads={self.heads}. Fix: pick heads that divide the width "
                "(head size = width / heads).")
        jnp.dtype(self.dtype)  # a bad name raises here

    @property
    def parameters(self) -> int:
        """How many parameters the dense stack has (``layers`` weights and
        biases)."""
        return self.layers * (self.width * self.width + self.width)

    @property
    def tokens(self) -> int:
        """How many tokens one training step takes, ``batch * seq``."""
        return self.batch * self.seq

    @property
    def itemsize(self) -> int:
        """Bytes per element of ``dtype``."""
        return jnp.dtype(self.dtype).itemsize

    def describe(self) -> str:
        """One line: name, parameters, depth and width, tokens, heads, dtype."""
        return (f"{self.name}: {self.parameters / 1e9:.2f}B parameters ({self.layers} "
                f"layers of width {self.width}), {self.batch} x {self.seq} tokens per "
                f"step, {self.heads} heads, experts of width {self.ffn}, {self.dtype}")


def _model(name: str, width: int, layers: int, heads: int, seq: int = 4096,
           batch: int = 2048) -> Model:
    return Model(name=name, width=width, layers=layers, seq=seq, batch=batch,
                 heads=heads, ffn=4 * width)


MODELS: Mapping[str, Model] = {
    m.name: m for m in (
        # sized for this machine: each collective between 4 KB and a few MB,
        # the sizes bench's fit covers (plan --versus-bench)
        Model(name="laptop", width=256, layers=4, seq=512, batch=32, heads=4,
              ffn=256, dtype="float32"),
        _model("1b", width=4096, layers=64, heads=32),
        _model("8b", width=8192, layers=128, heads=64),
        _model("70b", width=16384, layers=256, heads=128),
    )}
"""Named model sizes (by parameters): ``1b``, ``8b`` (the default), ``70b``,
each trained on 2048 sequences of 4096 tokens per step in bfloat16; and
``laptop``, small enough to run here (``plan --versus-bench``)."""

DEFAULT_MODEL = "8b"
"""The model `plan` uses without --model."""


def model_from(name: str = DEFAULT_MODEL, **overrides: int | str | None) -> Model:
    """A named model with some fields replaced (``None`` keeps a field).

    Raises:
      ValueError: an unknown name, or a field that is not positive.
    """
    if name not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {name!r}. "
                         "Fix: pick one, and change fields with --width, --layers, "
                         "--seq, --batch, --heads, --ffn, --dtype.")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if changes:
        changes.setdefault("name", name + "*")
    return dataclasses.replace(MODELS[name], **changes)
