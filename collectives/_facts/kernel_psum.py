"""``kernel_psum``: ``lax.psum`` as a ring reduce-scatter and a ring
all-gather of remote DMAs, in one kernel.

The kernel, programs and oracle are ``recipes/kernel_psum.py``'s; the recipe
mirrors ``psum``'s layouts, example shapes and oracle
(``_kernel.kernel_recipe``). A block of ``k`` rows is cut into ``n`` chunks
of ``ceil(k / n)`` rows (zero rows pad it); each device sends one chunk per
step for ``2 (n - 1)`` steps: what a ring all-reduce sends.
"""

from __future__ import annotations

from typing import Any

from collectives._costs import block_bytes
from collectives._facts import reductions as _reductions
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives.recipes import kernel_psum as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """``2 (n - 1)`` steps, one chunk of ``ceil(k / n)`` rows each (a block
    of ``k`` rows, padded with zero rows to ``n`` chunks)."""
    (x,) = args
    n, rows = axes.size, x.shape[0] // axes.size
    row_bytes = block_bytes(axes, x) / rows if rows else 0.0
    return DmaCost(steps=2 * (n - 1), bytes_per_step=-(-rows // n) * row_bytes)


kernel_psum = kernel_recipe(
    _reductions.psum, name="kernel_psum",
    summary="psum as a Pallas kernel: ring reduce-scatter, then ring all-gather",
    body=file.kernel_psum_body, recipe_file="kernel_psum.py",
    explicit_program=by_axis_size(file.psum_explicit_program),
    program=by_axis_size(file.psum_program),
    oracle=by_axis_size(file.psum_numpy))
