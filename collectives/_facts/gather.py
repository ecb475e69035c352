"""Gather and scatter recipes: ``all_gather``, ``all_gather_stacked``,
``psum_scatter``.

``all_gather`` is the inverse of sharding: every device ends up with the whole
array. ``psum_scatter`` is a psum whose result stays sharded: each device
keeps only its slice of the sum, moving half the bytes of an all-reduce
(``all_gather(psum_scatter(x)) == psum(x)``).

The bodies (and their legacy pmap variants), global programs and NumPy
oracles are ``recipes/all_gather.py``'s and ``recipes/psum_scatter.py``'s;
this module adds the facts the library needs about them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives._layout import grid_shape
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import all_gather as gather_file
from collectives.recipes import psum_scatter as scatter_file


def _in_specs(axes: Axes):
    return (make_spec(axes.entry, axes.others_entry),)


def _shapes(axes: Axes, dims):
    return (grid_shape(axes, dims),)


def _stacked_out_specs(axes: Axes):
    return make_spec(None, None, axes.others_entry)


def _check_scatter(axes: Axes, args) -> None:
    (x,) = args
    block = x.shape[0] // axes.size
    if block % axes.size:
        raise ValueError(
            f"psum_scatter: argument x has {x.shape[0]} rows, so each of the "
            f"{axes.size} devices holds a block of {block} rows, which must split "
            f"again into {axes.size} equal chunks. Fix: make dim 0 a multiple of "
            f"{axes.size}**2 = {axes.size ** 2}.")


def _scatter_shapes(axes: Axes, dims):
    return (grid_shape(axes, dims, lead=axes.size),)


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
    oracle=on_axes(gather_file.all_gather_numpy),
    in_specs=_in_specs, out_specs=lambda axes: make_spec(None, axes.others_entry),
    example_shapes=_shapes, pmap_body=gather_file.all_gather_pmap_body))

all_gather_stacked = register(Recipe(
    name="all_gather_stacked", family="core", recipe_file="all_gather.py",
    bench=BenchSpec(lambda x, axis, n: lax.all_gather(x, axis),
                    "all-gather", bare_check_vma=False),
    diagram=DiagramSpec(),
    cost_model=one_collective("all-gather"),
    summary="every device gets all blocks stacked on a new axis (untiled)",
    body=gather_file.all_gather_stacked_body,
    program=by_axis_size(gather_file.all_gather_stacked_program),
    oracle=by_axis_size(gather_file.all_gather_stacked_numpy),
    in_specs=_in_specs, out_specs=_stacked_out_specs, example_shapes=_shapes,
    pmap_body=gather_file.all_gather_stacked_pmap_body))

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
    oracle=by_axis_size(scatter_file.psum_scatter_numpy), in_specs=_in_specs,
    out_specs=lambda axes: make_spec(axes.entry, axes.others_entry),
    example_shapes=_scatter_shapes, n_terms=lambda axes: axes.size,
    dtype_kinds=frozenset({"float", "int", "complex"}), validate=_check_scatter,
    pmap_body=scatter_file.psum_scatter_pmap_body))
