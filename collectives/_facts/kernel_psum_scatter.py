"""``kernel_psum_scatter`` and ``kernel_psum_scatter_bidirectional``:
``lax.psum_scatter`` (tiled, dim 0) as a ring of remote DMAs.

The kernels, programs and oracle are ``recipes/kernel_psum_scatter.py``'s;
both recipes mirror ``psum_scatter``'s layouts, validation and oracle
(``_kernel.kernel_recipe``). Partial sums travel ``n - 1`` steps round the
ring, each device adding its own chunk: what a ring reduce-scatter sends.
The bidirectional kernel sends half of each chunk's columns each way.
"""

from __future__ import annotations

from typing import Any

from collectives._costs import block_bytes
from collectives._facts import psum_scatter as _psum_scatter
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives.recipes import kernel_psum_scatter as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """``n - 1`` steps, one chunk (``1/n`` of the block) each: in one DMA,
    or in two of half the columns, one each way (bidirectional)."""
    (x,) = args
    return DmaCost(steps=axes.size - 1, bytes_per_step=block_bytes(axes, x) / axes.size)


kernel_psum_scatter = kernel_recipe(
    _psum_scatter.psum_scatter, name="kernel_psum_scatter",
    summary="psum_scatter as a Pallas kernel: n-1 ring steps of partial sums",
    body=file.kernel_psum_scatter_body, recipe_file="kernel_psum_scatter.py",
    program=by_axis_size(file.psum_scatter_program),
    explicit_program=by_axis_size(file.psum_scatter_explicit_program),
    oracle=by_axis_size(file.psum_scatter_numpy))

kernel_psum_scatter_bidirectional = kernel_recipe(
    _psum_scatter.psum_scatter, name="kernel_psum_scatter_bidirectional",
    summary="psum_scatter as a Pallas kernel: two rings, half the columns each way",
    body=file.kernel_psum_scatter_bidirectional_body,
    recipe_file="kernel_psum_scatter.py",
    program=by_axis_size(file.psum_scatter_program),
    explicit_program=by_axis_size(file.psum_scatter_explicit_program),
    oracle=by_axis_size(file.psum_scatter_numpy))
