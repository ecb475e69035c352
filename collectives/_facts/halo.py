"""Halo exchange: neighbours' edge rows for a stencil on row-sharded data.

A stencil of radius ``w`` along a sharded dimension needs, on each device,
``w`` rows from each neighbour. :func:`halo_exchange` fetches them with two
``ppermute``s (last rows one device forward, first rows one device back);
the stencil then runs on the padded block alone. The recipes apply the
3-point second difference ``x[r-1] - 2 x[r] + x[r+1]`` with a periodic
(ring) and with a zero (open line) boundary, and match the stencil on one
device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from collectives._costs import fixed
from collectives._facts.permute import body_axis_size
from collectives._facts.permute import permute
from collectives._facts.permute import ring_shift
from collectives._facts.ring import Shift
from collectives._facts.ring import stepwise_shift
from collectives._layout import Axes
from collectives._layout import grid_shape
from collectives._layout import make_spec
from collectives._numpy import widen
from collectives._recipe import Recipe
from collectives._registry import register


def _halo(x, axis, width: int, periodic: bool, shift: Shift | None):
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
    n = body_axis_size(axis, "halo_exchange")
    first, last = x[:width], x[rows - width:]
    if shift is None:  # one ppermute per direction over the whole axis
        if periodic:
            from_left = ring_shift(last, axis, 1)
            from_right = ring_shift(first, axis, -1)
        else:  # the ends receive nothing, so they get zeros
            from_left = permute(last, axis, [(s, s + 1) for s in range(n - 1)])
            from_right = permute(first, axis, [(s + 1, s) for s in range(n - 1)])
    else:
        from_left, from_right = shift(last, axis, 1), shift(first, axis, -1)
        if not periodic:
            me = lax.axis_index(axis)
            from_left = jnp.where(me == 0, jnp.zeros_like(from_left), from_left)
            from_right = jnp.where(me == n - 1, jnp.zeros_like(from_right), from_right)
    # [width + rows + width, ...]
    return jnp.concatenate([from_left, x, from_right], axis=0)


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
    return _halo(x, axis, width, periodic, None)


# -- recipes ---------------------------------------------------------------

def _stencil(padded):
    # padded: [1 + k + 1, ...] -> [k, ...]: the 3-point second difference
    return padded[:-2] - 2 * padded[1:-1] + padded[2:]


def halo_periodic_body(x, *, axis):
    # x: [k, m] on each device -> [k, m]: the stencil over the whole ring
    return _stencil(halo_exchange(x, axis, 1, periodic=True))


def halo_open_body(x, *, axis):
    return _stencil(halo_exchange(x, axis, 1, periodic=False))


def _halo_pmap_body(periodic: bool) -> Callable[..., Any]:
    def body(x, *, axis):
        return _stencil(_halo(x, axis, 1, periodic, stepwise_shift))
    return body


def halo_periodic_program(x, *, axes):
    # x: [n*k, m] global; the rolls of a sharded dim become collective-permutes
    del axes
    return jnp.roll(x, 1, axis=0) - 2 * x + jnp.roll(x, -1, axis=0)


def halo_open_program(x, *, axes):
    # Rolls with the wrapped-around row zeroed: two collective-permutes. (The
    # same stencil written as jnp.pad + slices compiles to many more: 11 on 8
    # devices with XLA:CPU.)
    del axes
    rows = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1))
    above = jnp.where(rows == 0, jnp.zeros_like(x), jnp.roll(x, 1, axis=0))
    below = jnp.where(rows == x.shape[0] - 1, jnp.zeros_like(x),
                      jnp.roll(x, -1, axis=0))
    return above - 2 * x + below


def _stencil_oracle(x, periodic: bool):
    wide = widen(x)
    if periodic:
        padded = np.concatenate([wide[-1:], wide, wide[:1]])
    else:
        padded = np.pad(wide, [(1, 1)] + [(0, 0)] * (x.ndim - 1))
    return _stencil(padded).astype(x.dtype)


def halo_periodic_oracle(x, *, axes):
    del axes
    return _stencil_oracle(x, periodic=True)


def halo_open_oracle(x, *, axes):
    del axes
    return _stencil_oracle(x, periodic=False)


def _rows_spec(axes: Axes):
    return make_spec(axes.entry, axes.others_entry)


def _halo_shapes(axes: Axes, dims):
    return (grid_shape(axes, dims),)


_STENCIL_KINDS = frozenset({"float", "int", "complex"})

halo_exchange_recipe = register(Recipe(
    name="halo_exchange", source="halo_exchange.py",
    hlo=fixed({"collective-permute": 2}),
    summary="3-point stencil on rows sharded over a ring (periodic), via halos",
    body=halo_periodic_body, pmap_body=_halo_pmap_body(periodic=True),
    program=halo_periodic_program, oracle=halo_periodic_oracle,
    in_specs=lambda axes: (_rows_spec(axes),), out_specs=_rows_spec,
    example_shapes=_halo_shapes, count_terms=lambda axes: 3,
    dtype_kinds=_STENCIL_KINDS))

halo_exchange_open_recipe = register(Recipe(
    name="halo_exchange_open", source="halo_exchange.py",
    hlo=fixed({"collective-permute": 2}),
    summary="3-point stencil on rows sharded over a line (zero boundary), via halos",
    body=halo_open_body, pmap_body=_halo_pmap_body(periodic=False),
    program=halo_open_program, oracle=halo_open_oracle,
    in_specs=lambda axes: (_rows_spec(axes),), out_specs=_rows_spec,
    example_shapes=_halo_shapes, count_terms=lambda axes: 3,
    dtype_kinds=_STENCIL_KINDS))
