"""The ``all_to_all`` recipe: resharding rows to columns in one collective.

With ``split_axis=1, concat_axis=0, tiled=True`` every device cuts its row
block into ``n`` column chunks, sends chunk ``j`` to device ``j`` and stacks
what it receives: the global array is unchanged, but it is now sharded by
columns instead of rows. ``jit`` emits the same all-to-all for a change of
``out_shardings`` from ``P(axis)`` to ``P(None, axis)``.

The body, global program and NumPy oracle are ``recipes/all_to_all.py``'s;
this module adds the facts the library needs about them.
"""

from __future__ import annotations

from jax import lax

from collectives._costs import one_collective
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import all_to_all as file


def _in_specs(axes: Axes):
    return (make_spec(axes.entry, None, axes.others_entry),)


def _out_specs(axes: Axes):
    return make_spec(None, axes.entry, axes.others_entry)


def _shapes(axes: Axes, dims):
    # [n*k, n*c, ...]; with other mesh axes a third dim is sharded over them
    k, c, *more = (*dims, 1)[:max(2, len(dims))]
    if axes.others:
        m, *more = more or [1]
        more = [axes.others_size * m, *more]
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
    name="all_to_all", family="core", recipe_file="all_to_all.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.all_to_all(x, axis, 1, 0, tiled=True), "all-to-all",
        default=True),
    diagram=DiagramSpec(dims=(1, 1)),
    cost_model=one_collective("all-to-all"),
    summary="rows-sharded to columns-sharded: each device swaps chunks with all",
    body=file.all_to_all_body, program=on_axes(file.all_to_all_program),
    explicit_program=on_axes(file.all_to_all_explicit_program),
    oracle=on_axes(file.all_to_all_numpy),
    in_specs=_in_specs, out_specs=_out_specs, example_shapes=_shapes,
    validate=_check))
