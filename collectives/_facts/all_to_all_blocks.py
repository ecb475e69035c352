"""The ``all_to_all_blocks`` recipe: the exchange form of all-to-all.

The body, global program and NumPy oracle are ``recipes/all_to_all_blocks.py``'s;
this module adds the facts the library needs about them.
"""

from __future__ import annotations

import numpy as np

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives._layout import one_input
from collectives._layout import one_scatter_grid
from collectives._layout import rows_on_axes
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import all_to_all_blocks as blocks_file

# Each device cuts its block [n*c, ...] into n chunks along dim 0, sends chunk
# j to device j and concatenates what it receives, in device order, along dim
# 0. The form of JAX's shard_map tutorial and of every MoE dispatch. In the
# global view, [n*n*c, ...] seen as [n (source), n (chunk), c, ...] has its
# first two axes swapped.


def _check_blocks(axes: Axes, args) -> None:
    (x,) = args
    shape = tuple(np.shape(x))
    n = axes.size
    if len(shape) < 1 or shape[0] % (n * n):
        raise ValueError(
            f"all_to_all_blocks: argument x has shape {shape}; dim 0 must split "
            f"into {n} blocks (one per device along {axes.names}) of {n} equal "
            f"chunks (one for each device), i.e. be a multiple of n*n = {n * n}. "
            f"Fix: pad dim 0 to a multiple of {n * n}.")


all_to_all_blocks = register(Recipe(
    name="all_to_all_blocks", family="core", recipe_file="all_to_all_blocks.py",
    diagram=DiagramSpec(dims=(1,)),
    cost_model=one_collective("all-to-all"),
    summary="exchange: each device sends chunk j of its block to device j (dim 0)",
    body=blocks_file.all_to_all_blocks_body,
    program=by_axis_size(blocks_file.all_to_all_blocks_program),
    oracle=by_axis_size(blocks_file.all_to_all_blocks_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
    # [n*n*c] (1-D) or [n*n*c, rest*m, ...]: dim 0 splits into n blocks of n chunks
    example_shapes=one_scatter_grid, validate=_check_blocks))
