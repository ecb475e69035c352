"""Halo exchange: neighbours' edge rows for a stencil on row-sharded data.

A stencil of radius ``w`` along a sharded dimension needs, on each device,
``w`` rows from each neighbour. :func:`halo_exchange` fetches them with two
``ppermute``s (last rows one device forward, first rows one device back);
the stencil then runs on the padded block alone. The recipes apply the
3-point second difference ``x[r-1] - 2 x[r] + x[r+1]`` with a periodic
(ring) and with a zero (open line) boundary, and match the stencil on one
device.

The exchange, the stencil bodies, the global programs and the NumPy oracles
are ``recipes/halo_exchange.py``'s; this module adds the facts the library
needs about them and the validating public :func:`halo_exchange`.
"""

from __future__ import annotations

import functools

from collectives._costs import fixed
from collectives._layout import body_axis_size
from collectives._layout import on_axes
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import halo_exchange as file


def halo_exchange(x, axis, width: int = 1, *, periodic: bool = True):
    """Surround this block with ``width`` rows of each neighbour; call in a body.

    For a stencil along dim 0 of an array sharded by rows: afterwards each
    device can apply the stencil to its padded block with no further
    communication. Two ``ppermute`` calls: the last rows go one device forward,
    the first rows one device back.

    Args:
      x: this device's block, ``[k, ...]``.
      axis: the mesh axis name, or a tuple of them.
      width: halo rows per side, ``1 <= width <= k`` (a stencil of radius
        ``width``).
      periodic: wrap around the ends of the axis. Otherwise the first device
        gets zeros above and the last device zeros below (the ppermute has no
        pair for them): a zero (Dirichlet) boundary.

    Returns:
      ``[width + k + width, ...]``: the neighbours' rows around this block.

    Raises:
      ValueError: ``width`` is not an int in ``1..k``.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> def laplacian(block):  # block: [k] -> [k]
      ...     padded = cx.halo_exchange(block, "i", periodic=False)
      ...     return padded[:-2] - 2 * padded[1:-1] + padded[2:]
      >>> f = jax.shard_map(laplacian, mesh=mesh, in_specs=jax.P("i"),
      ...                   out_specs=jax.P("i"))
      >>> np.asarray(jax.jit(f)(np.arange(8) ** 2)).tolist()
      [1, 2, 2, 2, 2, 2, 2, -62]
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width: expected an int >= 1, got {width!r}.")
    if x.ndim == 0:
        raise ValueError(
            "halo_exchange: x is a scalar; the halo is made of rows. Fix: pass an "
            "array with at least one dimension, e.g. x[None].")
    rows = x.shape[0]
    if width > rows:
        raise ValueError(
            f"halo_exchange: width={width} is more than the {rows} rows of the "
            "block, so the halo would need rows from beyond the next device. Fix: "
            f"use width <= {rows}, or give each device more rows.")
    body_axis_size(axis, "halo_exchange")
    return file.halo_exchange(x, axis, width, periodic)


# -- recipes ---------------------------------------------------------------
# The file's stencil bodies; the legacy pmap form shifts one mesh axis at a
# time (vmap maps all but the first), via the file's stepwise_shift.

def _stencil_recipe(name: str, summary: str, periodic: bool) -> Recipe:
    return register(Recipe(
        name=name, recipe_file="halo_exchange.py",
        cost_model=fixed({"collective-permute": 2}), summary=summary,
        body=functools.partial(file.stencil_body, periodic=periodic),
        pmap_body=functools.partial(file.stencil_body, periodic=periodic,
                                    shift=file.stepwise_shift),
        program=on_axes(file.stencil_program, periodic=periodic),
        oracle=on_axes(file.stencil_numpy, periodic=periodic),
        in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
        example_shapes=one_grid, n_terms=lambda axes: 3,
        dtype_kinds=frozenset({"float", "int", "complex"})))


halo_exchange_recipe = _stencil_recipe(
    "halo_exchange",
    "3-point stencil on rows sharded over a ring (periodic), via halos", True)

halo_exchange_open_recipe = _stencil_recipe(
    "halo_exchange_open",
    "3-point stencil on rows sharded over a line (zero boundary), via halos", False)
