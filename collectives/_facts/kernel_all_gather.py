"""``kernel_all_gather``: ``lax.all_gather`` (tiled) as a ring of remote DMAs.

The kernel, programs and oracle are ``recipes/kernel_all_gather.py``'s; the
recipe mirrors ``all_gather``'s layouts and oracle (``_kernel.kernel_recipe``).
Each device sends ``n - 1`` blocks, one per step, to its right neighbour:
what ``lax.all_gather`` sends on a ring.
"""

from __future__ import annotations

from typing import Any

from collectives._costs import block_bytes
from collectives._facts import all_gather as _all_gather
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import on_axes
from collectives.recipes import kernel_all_gather as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """``n - 1`` steps, one block each."""
    (x,) = args
    return DmaCost(steps=axes.size - 1, bytes_per_step=block_bytes(axes, x))


kernel_all_gather = kernel_recipe(
    _all_gather.all_gather, name="kernel_all_gather",
    summary="all_gather as a Pallas kernel: n-1 ring steps of remote DMAs",
    body=file.kernel_all_gather_body, recipe_file="kernel_all_gather.py",
    explicit_program=on_axes(file.all_gather_explicit_program),
    program=on_axes(file.all_gather_program), oracle=on_axes(file.all_gather_numpy))
