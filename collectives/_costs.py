"""Cost-model facts that recipes declare: what each compiled form contains.

A recipe's ``cost_model`` is ``cost_model(axes, args, form)`` returning the
:class:`collectives.hlo.Expectation` its compiled program must meet; the
builders here cover the common shapes of that fact.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from collectives import _compat
from collectives._layout import Axes
from collectives.hlo import Expectation
from collectives.hlo import bytes_moved

_COMPILED_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "compiled_for", default=None)


def compiled_for() -> str:
    """The platform programs are compiled for: JAX's default backend, unless
    a plan compiles for another (a TPU topology, :func:`compiling_for`).
    Cost models whose compiled form differs by backend ask this."""
    return _COMPILED_FOR.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
    """Within the block, :func:`compiled_for` is ``platform``."""
    token = _COMPILED_FOR.set(platform)
    try:
        yield
    finally:
        _COMPILED_FOR.reset(token)


def block_bytes(axes: Axes, x: Any) -> int:
    """Bytes of the block of ``x`` that one device holds, ``x`` sharded over
    every mesh axis (the collective axes and the rest)."""
    return int(np.asarray(x).nbytes) // (axes.size * axes.others_size)


def unreduced_sum(size: float, sizes: Sequence[int], *, beside: float = 0
                  ) -> tuple[int, float]:
    """The all-reduces of a ``reshard`` to ``P()`` that sums a value of
    ``size`` bytes unreduced over mesh axes of ``sizes`` devices: their count
    and the bytes one device sends. ``beside``: the bytes of a value summed
    over the same devices in the same program (a loss), which XLA combines
    into that all-reduce where there is one.

    One all-reduce over all the axes; from JAX 0.12.1 one per axis, and the
    value beside it one of its own
    (:data:`collectives._compat.UNREDUCED_SUM_PER_AXIS`).
    """
    sizes = [s for s in sizes if s > 1]
    n = math.prod(sizes)
    if _compat.UNREDUCED_SUM_PER_AXIS and len(sizes) > 1:
        apart = sum(per_device_bytes("all-reduce", size, s) for s in sizes)
        if beside:
            return len(sizes) + 1, apart + per_device_bytes("all-reduce", beside, n)
        return len(sizes), apart
    return 1, per_device_bytes("all-reduce", size + beside, n)


def per_device_bytes(kind: str, block: float, n: int, *, whole: bool = False
                     ) -> float:
    """Bytes one device sends for a collective of ``kind`` over ``n`` devices
    on its ``block`` (the cost model's ``V`` is derived from the block:
    all-gather and all-to-all act on ``n`` blocks; ``whole`` says the block is
    already the whole array, as the unscattered input of a reduce-scatter)."""
    if kind == "collective-permute":
        return float(block)
    if kind in ("all-gather", "all-to-all") and not whole:
        return bytes_moved(kind, n * block, n)
    return bytes_moved(kind, block, n)


GLOBAL_FORMS = ("jit", "explicit")
"""The forms that compile a global program (the partitioner places the
collectives): a builder's ``jit`` facts hold for both, unless a recipe's
explicit program differs and its cost model says so."""


def no_collectives(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
    """The fact of a recipe that communicates nothing in any form."""
    del axes, args, form
    return Expectation({})


def one_collective(kind: str, *, cpu_jit: str | None = None
                   ) -> Callable[[Axes, tuple[Any, ...], str], Expectation]:
    """The fact "exactly one ``kind`` op on the one argument's block".

    Args:
      kind: the HLO kind every form compiles to.
      cpu_jit: where XLA's CPU pipeline writes the global-program forms (jit,
        explicit) differently (a sharded sum as all-reduce + dynamic-slice,
        which the GPU pipeline fuses into a reduce-scatter), the kind they
        have on CPU.
    """

    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        (x,) = args
        op = kind
        if form in GLOBAL_FORMS and cpu_jit is not None and compiled_for() == "cpu":
            op = cpu_jit
        whole = kind == "reduce-scatter"
        moved = per_device_bytes(op, block_bytes(axes, x), axes.size, whole=whole)
        return Expectation({op: 1}, {op: moved})

    return fact


def fixed(counts: Mapping[str, int], jit: Mapping[str, int] | None = None
          ) -> Callable[[Axes, tuple[Any, ...], str], Expectation]:
    """The fact "these counts" (``jit`` for the global-program forms, jit and
    explicit, where it differs), whatever the mesh and the sizes."""

    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        del axes, args
        return Expectation(jit if form in GLOBAL_FORMS and jit is not None else counts)

    return fact


def reshards_minor_axis(axes: Axes) -> int:
    """1 when the collective axes do not start at the mesh's first axis.

    The jit form's partitioner then moves the result between the layout it
    computes in and the declared output layout with one collective-permute.
    """
    return int(bool(axes.others) and axes.names[0] != axes.mesh.axis_names[0])
