"""All-reduce recipes: ``psum``, ``pmean``, ``pmax``, ``pmin``.

Layout (every reduction): ``x`` has dim 0 sharded over the collective axes
and dim 1 over the remaining mesh axes. Each device holds a block
``x_block: [k, m, ...]``; the result ``[k, m, ...]`` is the reduction of the
blocks across the collective axes, replicated over them.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import grid_shape
from collectives._layout import make_spec
from collectives._numpy import blocks
from collectives._numpy import mean_dtype
from collectives._numpy import widen
from collectives._recipe import BenchSpec
from collectives._recipe import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register


def _in_specs(axes: Axes):
    return (make_spec(axes.entry, axes.others_entry),)


def _out_specs(axes: Axes):
    return make_spec(None, axes.others_entry)


def _shapes(axes: Axes, dims):
    return (grid_shape(axes, dims),)


def _terms(axes: Axes) -> int:
    return axes.size


# -- psum ------------------------------------------------------------------

def psum_body(x, *, axis):
    # x: [k, m] on each device -> [k, m], the same on every device of `axis`
    return lax.psum(x, axis)


def psum_program(x, *, axes: Axes):
    # x: [n*k, m] global -> [k, m]; jit turns the sum over shards into an all-reduce
    return blocks(x, axes.size).sum(0, dtype=x.dtype)


def psum_oracle(x, *, axes: Axes):
    return blocks(widen(x), axes.size).sum(0).astype(x.dtype)


# -- pmean -----------------------------------------------------------------

def pmean_body(x, *, axis):
    return lax.pmean(x, axis)


def pmean_program(x, *, axes: Axes):
    # lax.pmean is psum then divide, so integers sum as integers first
    return blocks(x, axes.size).sum(0, dtype=x.dtype) / axes.size


def pmean_oracle(x, *, axes: Axes):
    return blocks(widen(x), axes.size).mean(0).astype(mean_dtype(x.dtype))


# -- pmax / pmin -----------------------------------------------------------

def pmax_body(x, *, axis):
    return lax.pmax(x, axis)


def pmax_program(x, *, axes: Axes):
    return blocks(x, axes.size).max(0)


def pmax_oracle(x, *, axes: Axes):
    return np.max(blocks(x, axes.size), axis=0)


def pmin_body(x, *, axis):
    return lax.pmin(x, axis)


def pmin_program(x, *, axes: Axes):
    return blocks(x, axes.size).min(0)


def pmin_oracle(x, *, axes: Axes):
    return np.min(blocks(x, axes.size), axis=0)


_SUMMABLE = frozenset({"float", "int", "complex"})
_ORDERED = frozenset({"float", "int"})

psum = register(Recipe(
    name="psum", family="core", source="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.psum(x, axis), "all-reduce",
                    default=True, jit_target=True),
    diagram=DiagramSpec(relation="combine"),
    hlo=one_collective("all-reduce"),
    summary="sum of every device's block, on every device",
    body=psum_body, program=psum_program, oracle=psum_oracle,
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    count_terms=_terms, dtype_kinds=_SUMMABLE))

pmean = register(Recipe(
    name="pmean", family="core", source="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmean(x, axis), "all-reduce"),
    diagram=DiagramSpec(relation="combine"),
    hlo=one_collective("all-reduce"),
    summary="mean of every device's block, on every device",
    body=pmean_body, program=pmean_program, oracle=pmean_oracle,
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    count_terms=lambda axes: axes.size + 1, dtype_kinds=_SUMMABLE))

pmax = register(Recipe(
    name="pmax", family="core", source="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmax(x, axis), "all-reduce"),
    diagram=DiagramSpec(),
    hlo=one_collective("all-reduce"),
    summary="elementwise max over devices, on every device",
    body=pmax_body, program=pmax_program, oracle=pmax_oracle,
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    dtype_kinds=_ORDERED))

pmin = register(Recipe(
    name="pmin", family="core", source="reductions.py",
    bench=BenchSpec(lambda x, axis, n: lax.pmin(x, axis), "all-reduce"),
    diagram=DiagramSpec(),
    hlo=one_collective("all-reduce"),
    summary="elementwise min over devices, on every device",
    body=pmin_body, program=pmin_program, oracle=pmin_oracle,
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    dtype_kinds=_ORDERED))
