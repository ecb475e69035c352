"""``kernel_all_to_all``: ``lax.all_to_all`` (tiled, columns to rows) as
remote DMAs of one chunk from every device to every other.

The kernel, programs and oracle are ``recipes/kernel_all_to_all.py``'s; the
recipe mirrors ``all_to_all``'s layouts, validation and oracle
(``_kernel.kernel_recipe``). Each device keeps one of its ``n`` column
chunks and sends the other ``n - 1``, one to each device, all in flight
together: what ``lax.all_to_all`` sends.
"""

from __future__ import annotations

from typing import Any

from collectives._costs import block_bytes
from collectives._facts import all_to_all as _all_to_all
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import on_axes
from collectives.recipes import kernel_all_to_all as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """``n - 1`` remote DMAs, one chunk (``1/n`` of the block) each."""
    (x,) = args
    return DmaCost(steps=axes.size - 1,
                   bytes_per_step=block_bytes(axes, x) / axes.size)


kernel_all_to_all = kernel_recipe(
    _all_to_all.all_to_all, name="kernel_all_to_all",
    summary="all_to_all as a Pallas kernel: n-1 chunk DMAs per device, one to each",
    body=file.kernel_all_to_all_body, recipe_file="kernel_all_to_all.py",
    program=on_axes(file.all_to_all_program),
    explicit_program=on_axes(file.all_to_all_explicit_program),
    oracle=on_axes(file.all_to_all_numpy))
