"""Gather and scatter recipes: ``all_gather``, ``all_gather_stacked``,
``psum_scatter``.

``all_gather`` is the inverse of sharding: every device ends up with the whole
array. ``psum_scatter`` is a psum whose result stays sharded: each device
keeps only its slice of the sum, moving half the bytes of an all-reduce
(``all_gather(psum_scatter(x)) == psum(x)``).
"""

from __future__ import annotations

from jax import lax

from collectives import _compat
from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import axis_tuple
from collectives._layout import grid_shape
from collectives._layout import make_spec
from collectives._numpy import blocks
from collectives._numpy import widen
from collectives._recipe import BenchSpec
from collectives._recipe import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register


def _in_specs(axes: Axes):
    return (make_spec(axes.entry, axes.others_entry),)


def _shapes(axes: Axes, dims):
    return (grid_shape(axes, dims),)


# -- all_gather (tiled) ------------------------------------------------------

def all_gather_body(x, *, axis):
    # x: [k, m] on each device -> [n*k, m], the same on every device.
    # The invariant gather types the result as replicated over `axis`, so
    # out_specs may leave `axis` out (a plain all_gather would fail the
    # shard_map VMA check there).
    return _compat.all_gather_invariant(x, axis, tiled=True)


def all_gather_pmap_body(x, *, axis):
    # The legacy form: pmap has no invariant types, so pmap code used the plain
    # gather. vmap (mapping the second mesh axis) gathers one axis at a time:
    # the innermost axis first keeps the blocks in row-major device order.
    for name in reversed(axis_tuple(axis)):
        x = lax.all_gather(x, name, tiled=True)
    return x


def all_gather_program(x, *, axes: Axes):
    # The value does not change; the replicated out_shardings make jit gather.
    del axes
    return x


def all_gather_oracle(x, *, axes: Axes):
    del axes
    return x.copy()


# -- all_gather_stacked (untiled) -------------------------------------------

def all_gather_stacked_body(x, *, axis):
    # x: [k, m] on each device -> [n, k, m]: a new leading axis, one row per device
    return _compat.all_gather_invariant(x, axis, tiled=False)


def all_gather_stacked_pmap_body(x, *, axis):
    # x: [k, m] -> [n_j, k, m] -> [n_i, n_j, k, m] -> [n_i * n_j, k, m]
    names = axis_tuple(axis)
    for name in reversed(names):
        x = lax.all_gather(x, name, tiled=False)
    return x.reshape(-1, *x.shape[len(names):])


def all_gather_stacked_program(x, *, axes: Axes):
    return blocks(x, axes.size)


def all_gather_stacked_oracle(x, *, axes: Axes):
    return blocks(x, axes.size).copy()


def _stacked_out_specs(axes: Axes):
    return make_spec(None, None, axes.others_entry)


# -- psum_scatter (tiled) ----------------------------------------------------

def psum_scatter_body(x, *, axis):
    # x: [n*k, m] on each device -> [k, m]: device d keeps rows d*k:(d+1)*k of
    # the sum over devices
    return lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)


def psum_scatter_pmap_body(x, *, axis):
    # vmap scatters one axis at a time: the outer axis picks a group of
    # chunks, the inner axis one chunk of it (row-major device order).
    for name in axis_tuple(axis):
        x = lax.psum_scatter(x, name, scatter_dimension=0, tiled=True)
    return x


def psum_scatter_program(x, *, axes: Axes):
    # Sum over shards; out_shardings keep the result sharded (a reduce-scatter).
    return blocks(x, axes.size).sum(0, dtype=x.dtype)


def psum_scatter_oracle(x, *, axes: Axes):
    return blocks(widen(x), axes.size).sum(0).astype(x.dtype)


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
    name="all_gather", family="core", source="all_gather.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.all_gather(x, axis, tiled=True), "all-gather",
        bare_check_vma=False, default=True, jit_target=True),
    diagram=DiagramSpec(),
    hlo=one_collective("all-gather"),
    summary="every device gets the whole array (tiled)",
    body=all_gather_body, program=all_gather_program, oracle=all_gather_oracle,
    in_specs=_in_specs, out_specs=lambda axes: make_spec(None, axes.others_entry),
    example_shapes=_shapes, pmap_body=all_gather_pmap_body))

all_gather_stacked = register(Recipe(
    name="all_gather_stacked", family="core", source="all_gather.py",
    bench=BenchSpec(lambda x, axis, n: lax.all_gather(x, axis),
                    "all-gather", bare_check_vma=False),
    diagram=DiagramSpec(),
    hlo=one_collective("all-gather"),
    summary="every device gets all blocks stacked on a new axis (untiled)",
    body=all_gather_stacked_body, program=all_gather_stacked_program,
    oracle=all_gather_stacked_oracle, in_specs=_in_specs,
    out_specs=_stacked_out_specs, example_shapes=_shapes,
    pmap_body=all_gather_stacked_pmap_body))

psum_scatter = register(Recipe(
    name="psum_scatter", family="core", source="psum_scatter.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True),
        "reduce-scatter", default=True, jit_target=True),
    diagram=DiagramSpec(dims=(1, 1), relation="combine"),
    hlo=one_collective("reduce-scatter", cpu_jit="all-reduce"),
    summary="sum over devices, each device keeps its slice (reduce-scatter)",
    body=psum_scatter_body, program=psum_scatter_program,
    oracle=psum_scatter_oracle, in_specs=_in_specs,
    out_specs=lambda axes: make_spec(axes.entry, axes.others_entry),
    example_shapes=_scatter_shapes, count_terms=lambda axes: axes.size,
    dtype_kinds=frozenset({"float", "int", "complex"}), validate=_check_scatter,
    pmap_body=psum_scatter_pmap_body))
