"""The ``axis_index`` recipe: each device learns its position along the axis.

The body, global program and NumPy oracle are ``recipes/axis_index.py``'s;
this module adds the facts the library needs about them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import no_collectives
from collectives._layout import by_axis_size
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import axis_index as index_file

axis_index = register(Recipe(
    name="axis_index", family="core", recipe_file="axis_index.py",
    bench=BenchSpec(
        lambda x, axis, n: x + lax.axis_index(axis).astype(x.dtype)),
    diagram=DiagramSpec(relation="local"),
    cost_model=no_collectives, summary="each device adds its index along the axis",
    body=index_file.axis_index_body,
    program=by_axis_size(index_file.axis_index_program),
    explicit_program=by_axis_size(index_file.axis_index_explicit_program),
    oracle=by_axis_size(index_file.axis_index_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
    example_shapes=one_grid,
    n_terms=lambda axes: 1, dtype_kinds=frozenset({"float", "int", "complex"})))
