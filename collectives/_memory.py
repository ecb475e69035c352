"""Memory per device: what arrays hold, and what a compiled program needs.

Two measurements, for the strategies' "memory per device" tables:

* :func:`device_bytes`: the bytes each device stores for the arrays of a
  pytree, read from their ``addressable_shards`` (what is resident now).
* :func:`compiled_memory`: XLA's account of one compiled program, per device:
  its arguments, outputs and temporaries (``compiled.memory_analysis()``).
  Where a backend gives no analysis, the arguments and outputs are computed
  from their shardings and the temporaries are ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def device_bytes(tree: Any) -> dict[int, int]:
    """Bytes each device stores for the arrays in ``tree``.

    Args:
      tree: a pytree of ``jax.Array`` (other leaves are ignored).

    Returns:
      ``{device id: bytes}`` over the devices holding a shard of any leaf;
      a replicated leaf counts in full on every device.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((8,), "i")
      >>> rows = jax.sharding.NamedSharding(mesh, jax.P("i"))
      >>> whole = jax.sharding.NamedSharding(mesh, jax.P())
      >>> tree = {"split": jax.device_put(np.ones((8, 4), np.float32), rows),
      ...         "copied": jax.device_put(np.ones(4, np.float32), whole)}
      >>> sorted(set(cx.device_bytes(tree).values()))  # 16 + 16 on each device
      [32]
    """
    totals: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            totals[shard.device.id] = totals.get(shard.device.id, 0) + \
                shard.data.nbytes
    return totals


def sharded_bytes(avals: Any, shardings: Any) -> int:
    """Bytes of one device's shard of each ``aval`` under its sharding (the
    two trees leaf for leaf)."""
    total = 0
    for aval, sharding in zip(jax.tree_util.tree_leaves(avals),
                              jax.tree_util.tree_leaves(shardings), strict=True):
        shape = sharding.shard_shape(aval.shape)
        total += math.prod(shape) * np.dtype(aval.dtype).itemsize
    return total


def compiled_memory(fn: Callable[..., Any], *args: Any) -> dict[str, int | None]:
    """Memory one device needs to run ``fn`` on ``args``, from the compiled program.

    Args:
      fn: a jitted callable (``jax.jit``, or a recipe's ``compiled(form, axes)``).
      *args: its arguments, placed as the program expects them.

    Raises:
      TypeError: ``fn`` cannot be lowered (not a jitted callable).

    Returns:
      ``{"arguments": ..., "outputs": ..., "temporaries": ..., "aliased":
      ...}`` in bytes per device (the per-partition figures of an SPMD
      program). ``temporaries`` and ``aliased`` are ``None`` where the backend
      gives no memory analysis.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((8,), "i")
      >>> x = jax.device_put(np.ones((8, 4), np.float32),
      ...                    jax.sharding.NamedSharding(mesh, jax.P("i")))
      >>> cx.compiled_memory(jax.jit(lambda x: 2 * x), x)["arguments"]  # 1/8 of 128
      16
    """
    lower = getattr(fn, "lower", None)
    if lower is None:
        raise TypeError(
            f"fn: expected a jax.jit or jax.pmap callable (with .lower), got "
            f"{type(fn).__name__}. Fix: wrap it, compiled_memory(jax.jit(fn), ...).")
    compiled = lower(*args).compile()
    analysed = analysed_memory(compiled)
    if analysed is not None:
        return analysed
    outputs = jax.eval_shape(fn, *args)
    return {"arguments": sharded_bytes(args, compiled.input_shardings[0]),
            "outputs": sharded_bytes(outputs, compiled.output_shardings),
            "temporaries": None, "aliased": None}


def analysed_memory(compiled: Any) -> dict[str, int] | None:
    """XLA's memory analysis of a compiled program, per device: arguments,
    outputs, temporaries and aliased bytes; ``None`` where the backend gives
    none."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):  # backends without the analysis
        stats = None
    if stats is None:
        return None
    return {"arguments": int(stats.argument_size_in_bytes),
            "outputs": int(stats.output_size_in_bytes),
            "temporaries": int(stats.temp_size_in_bytes),
            "aliased": int(stats.alias_size_in_bytes)}
