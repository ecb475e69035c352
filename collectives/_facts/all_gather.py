"""Gather recipes: ``all_gather`` (tiled) and ``all_gather_stacked``.

``all_gather`` is the inverse of sharding: every device ends up with the whole
array.

The bodies (and their legacy pmap variants), global programs and NumPy
oracles are ``recipes/all_gather.py``'s; this module adds the facts the
library needs about them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._layout import rows_replicated
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import all_gather as gather_file


def _stacked_out_specs(axes: Axes):
    return make_spec(None, None, axes.others_entry)


all_gather = register(Recipe(
    name="all_gather", family="core", recipe_file="all_gather.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.all_gather(x, axis, tiled=True), "all-gather",
        bare_check_vma=False, default=True, jit_target=True),
    diagram=DiagramSpec(),
    cost_model=one_collective("all-gather"),
    summary="every device gets the whole array (tiled)",
    body=gather_file.all_gather_body,
    program=on_axes(gather_file.all_gather_program),
    explicit_program=on_axes(gather_file.all_gather_explicit_program),
    oracle=on_axes(gather_file.all_gather_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
    example_shapes=one_grid, pmap_body=gather_file.all_gather_pmap_body))

all_gather_stacked = register(Recipe(
    name="all_gather_stacked", family="core", recipe_file="all_gather.py",
    bench=BenchSpec(lambda x, axis, n: lax.all_gather(x, axis),
                    "all-gather", bare_check_vma=False),
    diagram=DiagramSpec(),
    cost_model=one_collective("all-gather"),
    summary="every device gets all blocks stacked on a new axis (untiled)",
    body=gather_file.all_gather_stacked_body,
    program=by_axis_size(gather_file.all_gather_stacked_program),
    explicit_program=by_axis_size(
        gather_file.all_gather_stacked_explicit_program),
    oracle=by_axis_size(gather_file.all_gather_stacked_numpy),
    in_specs=one_input(rows_on_axes), out_specs=_stacked_out_specs,
    example_shapes=one_grid,
    pmap_body=gather_file.all_gather_stacked_pmap_body))
