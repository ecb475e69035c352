"""All-reduce recipes: ``psum``, ``pmean``, ``pmax``, ``pmin``.

The bodies, global programs and NumPy oracles are ``recipes/reductions.py``'s;
this module adds the facts the library needs about them.

Layout (every reduction): ``x`` has dim 0 sharded over the collective axes
and dim 1 over the remaining mesh axes. Each device holds a block
``x_block: [k, m, ...]``; the result ``[k, m, ...]`` is the reduction of the
blocks across the collective axes, replicated over them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._layout import rows_replicated
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import reductions as file


def _n_terms(axes: Axes) -> int:
    return axes.size


_SUMMABLE = frozenset({"float", "int", "complex"})
_ORDERED = frozenset({"float", "int"})

psum = register(Recipe(
    name="psum", family="core", recipe_file="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.psum(x, axis), "all-reduce",
                    default=True, jit_target=True),
    diagram=DiagramSpec(relation="combine"),
    cost_model=one_collective("all-reduce"),
    summary="sum of every device's block, on every device",
    body=file.psum_body, program=by_axis_size(file.psum_program),
    explicit_program=by_axis_size(file.psum_explicit_program),
    oracle=by_axis_size(file.psum_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
    example_shapes=one_grid,
    n_terms=_n_terms, dtype_kinds=_SUMMABLE))

pmean = register(Recipe(
    name="pmean", family="core", recipe_file="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmean(x, axis), "all-reduce"),
    diagram=DiagramSpec(relation="combine"),
    cost_model=one_collective("all-reduce"),
    summary="mean of every device's block, on every device",
    body=file.pmean_body, program=by_axis_size(file.pmean_program),
    explicit_program=by_axis_size(file.pmean_explicit_program),
    oracle=by_axis_size(file.pmean_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
    example_shapes=one_grid,
    n_terms=lambda axes: axes.size + 1, dtype_kinds=_SUMMABLE))

pmax = register(Recipe(
    name="pmax", family="core", recipe_file="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmax(x, axis), "all-reduce"),
    diagram=DiagramSpec(),
    cost_model=one_collective("all-reduce"),
    summary="elementwise max over devices, on every device",
    body=file.pmax_body, program=by_axis_size(file.pmax_program),
    explicit_program=by_axis_size(file.pmax_explicit_program),
    oracle=by_axis_size(file.pmax_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
    example_shapes=one_grid,
    dtype_kinds=_ORDERED))

pmin = register(Recipe(
    name="pmin", family="core", recipe_file="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmin(x, axis), "all-reduce"),
    diagram=DiagramSpec(),
    cost_model=one_collective("all-reduce"),
    summary="elementwise min over devices, on every device",
    body=file.pmin_body, program=by_axis_size(file.pmin_program),
    explicit_program=by_axis_size(file.pmin_explicit_program),
    oracle=by_axis_size(file.pmin_numpy),
    in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
    example_shapes=one_grid,
    dtype_kinds=_ORDERED))
