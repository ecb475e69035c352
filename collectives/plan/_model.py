"""The model a plan is for: its widths, depth and batch, and named sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Model:
    """A model to plan for, in the terms the strategy recipes take.

    ``layers`` transformer blocks, each an MLP from ``width`` to ``ffn`` and
    back (two matmuls; a gated MLP's third is left out, as the scaling book
    does), one attention of ``seq`` tokens over ``heads`` heads, or a
    mixture-of-experts layer of experts that size. The strategies' recipes
    each compile one *unit* of it: two blocks' MLPs (four matmuls, DP, TP,
    FSDP), one stage's layer (pipeline), one attention over ``batch *
    heads`` independent heads (sequence parallel), one MoE layer (expert
    parallel).

    Attributes:
      name: how the plan's table names it.
      width: the model (hidden) width, ``D``.
      layers: the number of blocks.
      seq: tokens per sequence.
      batch: sequences per training step, over all devices.
      heads: attention heads (``width`` divides by it).
      ffn: the MLP's hidden width, ``F`` (an expert's, in MoE).
      dtype: the parameters' and activations' dtype.

    Examples:
      >>> from collectives.plan import MODELS
      >>> m = MODELS["8b"]
      >>> m.width, m.ffn, m.layers, f"{m.parameters / 1e9:.1f}B"
      (4096, 16384, 64, '8.6B')
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
        """How many parameters the blocks' MLPs have (two weights and two
        biases a block)."""
        return self.layers * (2 * self.width * self.ffn + self.ffn + self.width)

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
                f"blocks, MLP {self.width} -> {self.ffn} -> {self.width}), "
                f"{self.batch} x {self.seq} tokens per step, {self.heads} heads, "
                f"{self.dtype}")


def _model(name: str, width: int, layers: int, seq: int = 4096,
           batch: int = 2048) -> Model:
    return Model(name=name, width=width, layers=layers, seq=seq, batch=batch,
                 heads=width // 128, ffn=4 * width)


MODELS: Mapping[str, Model] = {
    m.name: m for m in (
        # sized for this machine: each collective between 4 KB and a few MB,
        # the sizes bench's fit covers (plan --versus-bench)
        Model(name="laptop", width=256, layers=2, seq=512, batch=32, heads=4,
              ffn=256, dtype="float32"),
        _model("1b", width=2048, layers=32),
        _model("8b", width=4096, layers=64),
        _model("70b", width=8192, layers=128),
        # the scaling book's example (its MLP: D 5120, F 13824, 40 blocks)
        Model(name="llama2-13b", width=5120, layers=40, seq=4096, batch=4096,
              heads=40, ffn=13824),
    )}
"""Named model sizes (by the parameters of their MLPs): ``1b``, ``8b`` (the
default), ``70b``, each an MLP of ``F = 4 D`` in every block, trained on 2048
sequences of 4096 tokens per step in bfloat16; ``llama2-13b``, the MLP shape
of LLaMA-2 13B (whose attention, gate and embeddings make up the rest of its
13B), on 16M tokens a step; and ``laptop``, small enough to run here
(``plan --versus-bench``)."""

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
