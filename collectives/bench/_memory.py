"""Memory per device of a compiled program, from XLA's ``memory_analysis()``.

XLA reports, for one device's share of a compiled program, the bytes of its
arguments, its outputs and the temporaries it allocates (buffers live only
inside the program), and how many output bytes alias (reuse) argument bytes.
Backends that do not provide the analysis give ``None``. The reading is
:func:`collectives.compiled_memory`'s, under the bench schema's key names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collectives._memory import compiled_memory

MEMORY_FIELDS: tuple[str, ...] = (
    "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes")
"""The keys of :func:`memory_per_device`'s result."""

_COMPILED_NAMES = {"argument_bytes": "arguments", "output_bytes": "outputs",
                   "temp_bytes": "temporaries", "alias_bytes": "aliased"}


def memory_per_device(fn: Callable[..., Any], *args: Any) -> dict[str, int] | None:
    """Per-device argument, output, temporary and aliased bytes of ``fn(*args)``.

    Args:
      fn: a ``jax.jit`` (or ``jax.pmap``) callable; it is lowered and compiled
        for ``args``, not run.
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
      ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes``
      for one device, or None where the backend gives no memory analysis.

    Raises:
      TypeError: ``fn`` cannot be lowered (not a jitted callable).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from collectives.bench import memory_per_device
      >>> mem = memory_per_device(jax.jit(lambda x: x * 2), jnp.ones(256))
      >>> mem is None or (mem["argument_bytes"], mem["output_bytes"])
      (1024, 1024)
    """
    memory = compiled_memory(fn, *args)
    if memory["temporaries"] is None:
        return None
    return {key: memory[name] for key, name in _COMPILED_NAMES.items()}
