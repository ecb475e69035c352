"""The ``all_to_all`` recipe: resharding rows to columns in one collective.

With ``split_axis=1, concat_axis=0, tiled=True`` every device cuts its row
block into ``n`` column chunks, sends chunk ``j`` to device ``j`` and stacks
what it receives: the global array is unchanged, but it is now sharded by
columns instead of rows. ``jit`` emits the same all-to-all for a change of
``out_shardings`` from ``P(axis)`` to ``P(None, axis)``.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._recipe import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register


def all_to_all_body(x, *, axis):
    # x: [k, n*c] on each device (a row block) -> [n*k, c] (a column block)
    return lax.all_to_all(x, axis, split_axis=1, concat_axis=0, tiled=True)


def all_to_all_program(x, *, axes: Axes):
    # Same values; the column-sharded out_shardings make jit emit an all-to-all.
    del axes
    return x


def all_to_all_oracle(x, *, axes: Axes):
    del axes
    return x.copy()


def _in_specs(axes: Axes):
    return (make_spec(axes.on, None, axes.batch),)


def _out_specs(axes: Axes):
    return make_spec(None, axes.on, axes.batch)


def _shapes(axes: Axes, dims):
    # [n*k, n*c, ...]; with other mesh axes a third dim is sharded over them
    k, c, *more = (*dims, 1)[:max(2, len(dims))]
    if axes.rest:
        m, *more = more or [1]
        more = [axes.rest_size * m, *more]
    return ((axes.size * k, axes.size * c, *more),)


def _check(axes: Axes, args) -> None:
    (x,) = args
    shape = x.shape
    if len(shape) < 2:
        raise ValueError(
            f"all_to_all: argument x has shape {shape}, but the recipe moves column "
            "chunks of a 2-D (or higher) array. Fix: pass an array with at least 2 "
            "dimensions.")
    if shape[1] % axes.size:
        raise ValueError(
            f"all_to_all: argument x has {shape[1]} columns, which must split into "
            f"{axes.size} equal chunks (one per device along {axes.names}). Fix: "
            f"make dim 1 a multiple of {axes.size}.")


all_to_all = register(Recipe(
    name="all_to_all", family="core", source="all_to_all.py",
    diagram=DiagramSpec(dims=(1, 1)),
    hlo=one_collective("all-to-all"),
    summary="rows-sharded to columns-sharded: each device swaps chunks with all",
    body=all_to_all_body, program=all_to_all_program, oracle=all_to_all_oracle,
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    validate=_check))
