"""The parallelism strategies side by side: collectives, bytes and memory per device.

:func:`strategy_table` compiles each strategy's recipe on 8 devices and
measures, per device, what one training step sends (from the compiled HLO,
:func:`collectives.hlo.collective_stats`) and what it stores (the parameters'
shards, :func:`collectives.device_bytes`; the program's arguments,
:func:`collectives.compiled_memory`), next to what the cost model and the
layout predict. The docs page "Parallelism strategies" renders it at build
time, and a test checks every row's measurement against its formula.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from collectives._devices import make_mesh
from collectives._facts.dp_tp_mlp import init_mlp
from collectives._layout import spec_axes
from collectives._memory import compiled_memory
from collectives._memory import device_bytes
from collectives._registry import RECIPES
from collectives.hlo import collective_stats

STRATEGIES: tuple[tuple[str, str, tuple[int, ...], object, str], ...] = (
    ("DP", "dp_mlp", (8,), None, "the batch"),
    ("DP x TP", "dp_tp_mlp", (4, 2), None, "the batch; W1-W4, b1, b3 over model"),
    ("FSDP", "fsdp_mlp", (8,), None, "the batch and every parameter"),
    ("FSDP x TP", "fsdp_tp_mlp", (4, 2), None,
     "the batch, every parameter; W1-W4, b1, b3 also over model"),
    ("PP", "pipeline_mlp", (8,), None, "the layers (one per stage)"),
)
"""``(label, recipe, mesh shape, axis, what is sharded)`` per strategy."""


@dataclasses.dataclass(frozen=True)
class StrategyRow:
    """One strategy's measured step, next to its model.

    Attributes:
      label: e.g. ``"FSDP"``.
      recipe: the recipe compiled.
      mesh: e.g. ``"4x2"``.
      sharded: what the devices split.
      collectives: the shard_map form's compiled collectives, e.g.
        ``{"all-gather": 4, ...}``.
      sent: bytes one device sends per step, measured in the compiled HLO.
      sent_model: the same from the recipe's cost model.
      params: the parameter bytes one device stores, measured from shards.
      params_model: the same from the layout (total over the devices that
        split each parameter).
      params_total: the parameters' bytes, all together.
      arguments: the compiled program's argument bytes per device
        (parameters, batch).
    """

    label: str
    recipe: str
    mesh: str
    sharded: str
    collectives: dict[str, int]
    sent: float
    sent_model: float
    params: int
    params_model: int
    params_total: int
    arguments: int


def _split_bytes(params, specs, mesh) -> int:
    """Bytes of one device's share of ``params`` laid out by ``specs``."""
    total = 0
    for name, value in params.items():
        ways = math.prod(mesh.shape[a] for axes in spec_axes(specs[name], value.ndim)
                         for a in axes)
        total += value.nbytes // ways
    return total


def strategy_args(name: str, width: int = 16, batch: int = 32):
    """One model size for every strategy: the MLP ``(8, w, w, w, 8)`` on a
    batch of ``batch`` rows; the pipeline's 8 stages of width ``w``."""
    rng = np.random.default_rng(0)
    if name == "pipeline_mlp":
        params = {"w": rng.standard_normal((8, width, width)) / np.sqrt(width),
                  "b": np.zeros((8, width))}
        features = (width, width)
    else:
        params = init_mlp((8, width, width, width, 8))
        features = (8, 8)
    x, y = (rng.standard_normal((batch, f)) for f in features)
    as32 = functools.partial(np.asarray, dtype=np.float32)
    return ({k: as32(v) for k, v in params.items()}, as32(x), as32(y))


def strategy_table(width: int = 16, batch: int = 32) -> list[StrategyRow]:
    """Compile every strategy of ``STRATEGIES`` on 8 devices and measure it.

    Args:
      width: the hidden width of the MLP (a multiple of 8), and the width of
        the pipeline's layers.
      batch: the rows of the batch (a multiple of 8).

    Returns:
      One :class:`StrategyRow` per strategy.
    """
    rows = []
    for label, name, shape, axis, sharded in STRATEGIES:
        recipe = RECIPES[name]
        mesh = make_mesh(shape, ("i", "j")[:len(shape)])
        axes = recipe.axes(mesh, axis)
        args = strategy_args(name, width, batch)
        placed = recipe.place(*args, axes=axes)
        fn = recipe.compiled("shard_map", axes)
        stats = collective_stats(fn, *placed)
        models = recipe.expected_costs("shard_map", axes, args)
        model = next((m for m in models if m.mismatch(stats) is None), models[0])
        sent_model = float(sum(model.bytes.values()))
        params, specs = args[0], recipe.in_specs(axes)[0]
        stored = device_bytes(placed[0])
        rows.append(StrategyRow(
            label=label, recipe=name, mesh="x".join(map(str, shape)),
            sharded=sharded, collectives=stats.nonzero(), sent=stats.bytes(),
            sent_model=sent_model,
            params=max(stored.values()),
            params_model=_split_bytes(params, specs, mesh),
            params_total=sum(v.nbytes for v in params.values()),
            arguments=compiled_memory(fn, *placed)["arguments"]))
    return rows
