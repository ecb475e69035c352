"""Ring algorithms built from ``ppermute``: all-reduce, all-gather, reduce-scatter.

A ring moves data only between neighbours: ``n - 1`` steps, each a
``ppermute`` by one place, carry every block (or every partial sum) around
an axis of ``n`` devices. The algorithms, the global programs and the NumPy
oracles are ``recipes/ring_algorithms.py``'s; this module adds the facts the
library needs about them and the public, validating body utilities. The
rings are checked against the native collectives, with the same inputs and
layouts:

* :func:`ring_reduce_scatter` mirrors ``lax.psum_scatter(x, axis,
  tiled=True)`` (recipe ``psum_scatter``): ``n - 1`` permutes;
* :func:`ring_all_gather` mirrors ``lax.all_gather(x, axis, tiled=True)``
  (recipe ``all_gather``): ``n - 1`` permutes;
* :func:`ring_all_reduce` mirrors ``lax.psum(x, axis)`` (recipe ``psum``): a
  reduce-scatter phase then an all-gather phase, ``2 (n - 1)`` permutes, each
  carrying ``1/n`` of the data (bandwidth-optimal).

:func:`stepwise_shift` is the ring shift that the legacy pmap form can batch.

The ring results of all-gather and all-reduce hold the same value on every
device, but a ``ppermute`` result is typed *varying*: a shard_map that
returns them with a replicated ``out_specs`` needs ``check_vma=False``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from collectives._costs import GLOBAL_FORMS
from collectives._facts import all_gather as _all_gather
from collectives._facts import psum_scatter as _psum_scatter
from collectives._facts import reductions as _reductions
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import by_axis_size
from collectives._recipe import CostModel
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import ring_algorithms as file

RING_OF = {"psum": "ring_all_reduce", "all_gather": "ring_all_gather",
           "psum_scatter": "ring_reduce_scatter"}
"""The ring-from-ppermute recipe that mirrors each native collective recipe:
same arguments and layouts; its global program and oracle compute what the
native recipe's do."""

Shift = Callable[[Any, Any, int], Any]
"""``shift(x, axis, k)``: the ring shift a ring algorithm is built on."""


def stepwise_shift(x, axis, shift: int):
    """``ring_shift`` by +1 or -1, one mesh axis at a time.

    Same result as ``ring_shift(x, axis, shift)``, but every ``ppermute`` runs
    over a single axis, which is all ``vmap`` can batch: the legacy pmap form
    maps mesh axes after the first with ``vmap``. (The file's
    ``stepwise_shift``, with ``shift`` checked first.)
    """
    if shift not in (1, -1):
        raise ValueError(f"shift: stepwise_shift moves one place, got {shift!r}.")
    return file.stepwise_shift(x, axis, shift)


def _check_block(x, axis, what: str, *, summed: bool = False,
                 rows: bool = True, split: bool = False) -> None:
    """``axis`` is bound; a sum takes no bool; blocks of rows are not scalars;
    a reduce-scatter's rows split into one chunk per device."""
    n = body_axis_size(axis, what)
    if summed and jnp.issubdtype(x.dtype, jnp.bool_):
        raise TypeError(
            f"{what}: x has dtype bool, which a sum over devices does not take "
            "(psum rejects it too). Fix: cast first, e.g. x.astype(jnp.int32).")
    if rows and x.ndim == 0:
        raise ValueError(
            f"{what}: x is a scalar; the ring moves blocks of rows. Fix: pass an "
            "array with at least one dimension, e.g. x[None].")
    if split and (x.ndim == 0 or x.shape[0] % n):
        raise ValueError(
            f"{what}: x has shape {x.shape}; its dim 0 must split into {n} equal "
            f"chunks, one per device along the axis. Fix: pad dim 0 to a multiple "
            f"of {n}.")


def ring_reduce_scatter(x, axis):
    """Reduce-scatter from ``n - 1`` ring shifts; call inside a body.

    The same result as ``lax.psum_scatter(x, axis, scatter_dimension=0,
    tiled=True)``: device ``d`` gets rows ``d * c : (d + 1) * c`` of the sum of
    every device's ``x``, where ``c = x.shape[0] // n``. Partial sums travel
    one way round the ring; each step moves ``1/n`` of ``x``.

    Args:
      x: this device's block, ``[n * c, ...]``.
      axis: the mesh axis name, or a tuple of them (devices numbered as
        ``lax.axis_index(axis)`` counts).

    Returns:
      ``[c, ...]``: this device's chunk of the sum.

    Raises:
      ValueError: dim 0 of ``x`` does not split into ``n`` chunks, or
        ``axis`` is not bound here.
      TypeError: ``x`` is bool.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> f = jax.shard_map(lambda x: cx.ring_reduce_scatter(x, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P("i"))
      >>> x = np.arange(16).reshape(16, 1) % 4  # each device holds [0, 1, 2, 3]
      >>> np.asarray(jax.jit(f)(x)).ravel().tolist()  # 4 devices * [0, 1, 2, 3]
      [0, 4, 8, 12]
    """
    _check_block(x, axis, "ring_reduce_scatter", summed=True, split=True)
    return file.ring_reduce_scatter(x, axis)


def ring_all_gather(x, axis):
    """All-gather from ``n - 1`` ring shifts; call inside a body.

    The same result as ``lax.all_gather(x, axis, tiled=True)``: every device
    gets all blocks, concatenated along dim 0 in device order. The result is
    typed varying over ``axis`` (it comes from ``ppermute``).

    Args:
      x: this device's block, ``[k, ...]``.
      axis: the mesh axis name, or a tuple of them.

    Returns:
      ``[n * k, ...]``, the same on every device.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> f = jax.shard_map(lambda x: cx.ring_all_gather(x, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P(),
      ...                   check_vma=False)  # replicated in value, not in type
      >>> np.asarray(jax.jit(f)(np.arange(4))).tolist()
      [0, 1, 2, 3]
    """
    _check_block(x, axis, "ring_all_gather")
    return file.ring_all_gather(x, axis)


def ring_all_reduce(x, axis):
    """All-reduce (sum) as ring reduce-scatter + ring all-gather; call inside a body.

    The same result as ``lax.psum(x, axis)``, in ``2 (n - 1)`` ppermutes that
    each move ``1/n`` of ``x`` (padded to a multiple of ``n`` elements): the
    bandwidth-optimal all-reduce. Sums are added in ring order, so floats may
    differ from ``psum`` in the last bits.

    Args:
      x: this device's block, any shape.
      axis: the mesh axis name, or a tuple of them.

    Returns:
      The elementwise sum over devices, shaped like ``x``; the same on every
      device, typed varying over ``axis``.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((8,), "i")
      >>> f = jax.shard_map(lambda x: cx.ring_all_reduce(x, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P(),
      ...                   check_vma=False)
      >>> np.asarray(jax.jit(f)(np.arange(24).reshape(8, 3))).tolist()
      [[84, 92, 100]]
    """
    _check_block(x, axis, "ring_all_reduce", summed=True, rows=False)
    return file.ring_all_reduce(x, axis)


# -- recipes ---------------------------------------------------------------
# The ring recipes take the inputs and layouts of the native recipes they
# mirror, so the two time and check side by side. Their pmap bodies shift one
# mesh axis at a time (vmap maps all but the first), via the file's
# stepwise_shift.


def _mirror(native: Recipe, name: str, summary: str, ring: Callable[..., Any],
            program: Callable[..., Any], explicit_program: Callable[..., Any],
            oracle: Callable[..., Any]) -> Recipe:
    """``native`` with the file's ring as its body (and its programs and oracle):
    the same specs, shapes and checks, so the two compare directly. The ring's
    results are varying by type (they come from ppermute), hence no VMA check;
    the tests prove them equal on every device."""
    return register(dataclasses.replace(
        native, name=name, summary=summary, body=ring,
        pmap_body=functools.partial(ring, shift=file.stepwise_shift),
        program=by_axis_size(program),
        explicit_program=by_axis_size(explicit_program), oracle=by_axis_size(oracle),
        check_vma=False, family="pattern", recipe_file="ring_algorithms.py",
        diagram=None,
        # timed as the native collective's ``ring`` form, not on its own
        bench=None if native.bench is None else dataclasses.replace(
            native.bench, default=False),
        cost_model=_ring_fact(native)))


def _ring_fact(native: Recipe) -> CostModel:
    """The jit and explicit forms are the native program; the shard_map form
    is ring steps: 2(n-1) permutes for an all-reduce (chunks padded to n
    equal parts), else n-1 permutes moving the native collective's bytes."""

    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        (expected,) = native.expected_costs("shard_map", axes, args)
        if form in GLOBAL_FORMS:
            return native.cost_model(axes, args, form)
        (kind,) = expected.counts
        permute = "collective-permute"
        if kind == "all-reduce":
            return Expectation({permute: 2 * (axes.size - 1)})
        return Expectation({permute: axes.size - 1}, {permute: expected.bytes[kind]})

    return fact


ring_all_reduce_recipe = _mirror(
    _reductions.psum, "ring_all_reduce",
    "psum as ring reduce-scatter + all-gather, 2(n-1) ppermutes (mirrors psum)",
    file.ring_all_reduce, file.all_reduce_program, file.all_reduce_explicit_program,
    file.all_reduce_numpy)

ring_all_gather_recipe = _mirror(
    _all_gather.all_gather, "ring_all_gather",
    "all_gather from n-1 ring ppermutes (mirrors all_gather)",
    file.ring_all_gather, file.all_gather_program, file.all_gather_explicit_program,
    file.all_gather_numpy)

ring_reduce_scatter_recipe = _mirror(
    _psum_scatter.psum_scatter, "ring_reduce_scatter",
    "psum_scatter from n-1 ring ppermutes (mirrors psum_scatter)",
    file.ring_reduce_scatter, file.reduce_scatter_program,
    file.reduce_scatter_explicit_program,
    file.reduce_scatter_numpy)
