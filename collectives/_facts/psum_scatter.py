"""The ``psum_scatter`` recipe (tiled): a psum whose result stays sharded.

Each device keeps only its slice of the sum, moving half the bytes of an
all-reduce (``all_gather(psum_scatter(x)) == psum(x)``).

The body (and its legacy pmap variant), global program and NumPy oracle are
``recipes/psum_scatter.py``'s; this module adds the facts the library needs
about them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives._layout import one_input
from collectives._layout import one_scatter_grid
from collectives._layout import rows_on_axes
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import psum_scatter as scatter_file


def _check_scatter(axes: Axes, args) -> None:
    (x,) = args
    block = x.shape[0] // axes.size
    if block % axes.size:
        raise ValueError(
            f"psum_scatter: argument x has {x.shape[0]} rows, so each of the "
            f"{axes.size} devices holds a block of {block} rows, which must split "
            f"again into {axes.size} equal chunks. Fix: make dim 0 a multiple of "
            f"{axes.size}**2 = {axes.size ** 2}.")


psum_scatter = register(Recipe(
    name="psum_scatter", family="core", recipe_file="psum_scatter.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True),
        "reduce-scatter", default=True, jit_target=True),
    diagram=DiagramSpec(dims=(1, 1), relation="combine"),
    cost_model=one_collective("reduce-scatter", cpu_jit="all-reduce"),
    summary="sum over devices, each device keeps its slice (reduce-scatter)",
    body=scatter_file.psum_scatter_body,
    program=by_axis_size(scatter_file.psum_scatter_program),
    explicit_program=by_axis_size(scatter_file.psum_scatter_explicit_program),
    oracle=by_axis_size(scatter_file.psum_scatter_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
    example_shapes=one_scatter_grid, n_terms=lambda axes: axes.size,
    dtype_kinds=frozenset({"float", "int", "complex"}), validate=_check_scatter,
    pmap_body=scatter_file.psum_scatter_pmap_body))
