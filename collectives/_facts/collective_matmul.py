"""Collective matmuls: a matmul fused with the all-gather or reduce-scatter it needs.

Tensor-parallel layers pair two layouts (Megatron style):

* **all-gather matmul**: ``x`` rows sharded, ``w`` columns sharded. Each
  device needs every row of ``x`` to fill its columns of ``x @ w``:
  ``all_gather(x) @ w_block`` gives ``[M, N/n]`` (columns sharded).
* **matmul reduce-scatter**: ``x`` columns sharded, ``w`` rows sharded (the
  contraction dimension split). Each device's ``x_block @ w_block`` is a
  partial sum of the whole ``[M, N]``; ``psum_scatter`` adds the partials and
  leaves each device its rows, ``[M/n, N]`` (rows sharded, ready for the next
  all-gather matmul).

The *overlapped* versions replace the collective with ``n - 1`` ring
shifts, multiplying the block in hand while the next one travels, so
communication hides behind compute (the "collective matmul" of the JAX
shard_map tutorial and of Wang et al., ASPLOS 2023). The *bidirectional*
versions split each block in halves sent opposite ways round the ring: the
same number of steps, half the bytes per link direction. On XLA:CPU nothing
overlaps; the results are what matter here, and they equal ``x @ w`` exactly
on integer-valued data.

Mesh axes other than the collective ones hold replicas of ``x`` and ``w``.

The six bodies, the global program and the NumPy oracle are
``recipes/collective_matmul.py``'s; this module adds the facts the library
needs about them and the validating public :func:`allgather_matmul` and
:func:`matmul_reduce_scatter`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from collectives._costs import compiled_for
from collectives._costs import reshards_minor_axis
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import on_axes
from collectives._recipe import DEFAULT_DIMS
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import collective_matmul as file

OVERLAPS = (None, "unidirectional", "bidirectional")
"""The ``overlap`` choices: the plain collective, or a ring one or both ways."""

_ALLGATHER = dict(zip(OVERLAPS, (file.allgather_matmul,
                                 file.allgather_matmul_overlapped,
                                 file.allgather_matmul_bidirectional), strict=True))
_SCATTER = dict(zip(OVERLAPS, (file.matmul_reduce_scatter,
                               file.matmul_reduce_scatter_overlapped,
                               file.matmul_reduce_scatter_bidirectional), strict=True))


def _check_overlap(overlap) -> None:
    if overlap not in OVERLAPS:
        raise ValueError(
            f"overlap: expected one of {OVERLAPS}, got {overlap!r}. Fix: None for "
            "the plain collective, 'unidirectional' or 'bidirectional' for the "
            "ring versions.")


def _check_operands(x, w, what: str, *, blocks: bool = True) -> None:
    x_shape, w_shape = np.shape(x), np.shape(w)
    if len(x_shape) != 2 or len(w_shape) != 2 or x_shape[1] != w_shape[0]:
        m, k, c = ("m", "k", "c") if blocks else ("M", "K", "N")
        raise ValueError(
            f"{what}: expected {'blocks ' if blocks else ''}x: [{m}, {k}] and "
            f"w: [{k}, {c}] with matching {k}, got x {x_shape} and w {w_shape}. "
            f"Fix: pass 2-D {'blocks' if blocks else 'arrays'} whose inner "
            "dimensions agree.")


def _halves(rows: int, what: str, arg: str) -> int:
    if rows % 2:
        raise ValueError(
            f"{what}: overlap='bidirectional' sends half of each block each way, "
            f"so the block of {arg} needs an even number of rows, got {rows}. Fix: "
            "use an even block size or overlap='unidirectional'.")
    return rows // 2


def _output_rows(x, n: int) -> int:
    if x.shape[0] % n:
        raise ValueError(
            f"matmul_reduce_scatter: x has {x.shape[0]} rows, which must split into "
            f"{n} equal chunks (one per device along the axis). Fix: make dim 0 a "
            f"multiple of {n}.")
    return x.shape[0] // n


# -- all-gather matmul -----------------------------------------------------

def allgather_matmul(x, w, axis, *, overlap: str | None = None):
    """``all_gather(x) @ w`` for a column-sharded ``w``; call inside a body.

    Args:
      x: this device's rows of the left operand, ``[m, k]`` (rows sharded
        over ``axis``).
      w: this device's columns of the right operand, ``[k, c]``.
      axis: the mesh axis name, or a tuple of them.
      overlap: ``None`` for one ``all_gather`` then a matmul;
        ``"unidirectional"`` to pass ``x`` blocks round the ring (``n - 1``
        ppermutes) and multiply each as it arrives; ``"bidirectional"`` to
        send half of each block each way (``2 (n - 1)`` half-size ppermutes;
        ``m`` must be even).

    Returns:
      ``[n * m, c]``: every row of ``x @ w``, for this device's columns.

    Raises:
      ValueError: the blocks do not fit, ``overlap`` is unknown, or ``m`` is
        odd for the bidirectional version.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> x = np.arange(24.0).reshape(8, 3)
      >>> w = np.arange(12.0).reshape(3, 4)
      >>> body = functools.partial(cx.allgather_matmul, axis="i",
      ...                          overlap="bidirectional")
      >>> f = jax.shard_map(body, mesh=mesh, in_specs=(jax.P("i"), jax.P(None, "i")),
      ...                   out_specs=jax.P(None, "i"))
      >>> bool((np.asarray(jax.jit(f)(x, w)) == x @ w).all())
      True
    """
    _check_overlap(overlap)
    _check_operands(x, w, "allgather_matmul")
    body_axis_size(axis, "allgather_matmul")
    if overlap == "bidirectional":
        _halves(x.shape[0], "allgather_matmul", "x")
    return _ALLGATHER[overlap](x, w, axis)


def allgather_matmul_pmap(x, w, axis, *, overlap: str | None = None):
    """:func:`allgather_matmul` for the legacy pmap form (one axis per collective)."""
    return _ALLGATHER[overlap](x, w, axis, stepwise=True)


# -- matmul reduce-scatter -------------------------------------------------

def matmul_reduce_scatter(x, w, axis, *, overlap: str | None = None):
    """``psum_scatter(x @ w)`` over rows, for a split contraction; call inside a body.

    Args:
      x: this device's columns of the left operand, ``[M, k]`` (``M = n * m``).
      w: this device's rows of the right operand, ``[k, N]``.
      axis: the mesh axis name, or a tuple of them.
      overlap: ``None`` for a matmul then one ``psum_scatter``;
        ``"unidirectional"`` to pass partial sums round the ring (``n - 1``
        ppermutes), adding this device's term to each as it arrives;
        ``"bidirectional"`` to send half of each partial sum each way (``m``
        must be even).

    Returns:
      ``[m, N]``: this device's rows of the full ``x @ w`` (summed over
      devices).

    Raises:
      ValueError: the blocks do not fit, ``M`` does not split into ``n``
        chunks, ``overlap`` is unknown, or ``m`` is odd for the bidirectional
        version.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> x = np.arange(32.0).reshape(8, 4)
      >>> w = np.arange(12.0).reshape(4, 3)
      >>> body = functools.partial(cx.matmul_reduce_scatter, axis="i",
      ...                          overlap="unidirectional")
      >>> f = jax.shard_map(body, mesh=mesh, in_specs=(jax.P(None, "i"), jax.P("i")),
      ...                   out_specs=jax.P("i"))
      >>> bool((np.asarray(jax.jit(f)(x, w)) == x @ w).all())
      True
    """
    _check_overlap(overlap)
    _check_operands(x, w, "matmul_reduce_scatter")
    body_axis_size(axis, "matmul_reduce_scatter")
    m = _output_rows(x, lax.axis_size(axis))
    if overlap == "bidirectional":
        _halves(m, "matmul_reduce_scatter", "the output")
    return _SCATTER[overlap](x, w, axis)


def matmul_reduce_scatter_pmap(x, w, axis, *, overlap: str | None = None):
    """:func:`matmul_reduce_scatter` for the legacy pmap form."""
    return _SCATTER[overlap](x, w, axis, stepwise=True)


# -- recipes ---------------------------------------------------------------
# Global view: x [M, K], w [K, N], result x @ w. The jit form is the same
# global matmul for every variant: XLA picks the collective (on CPU it does
# not decompose it into permutes).

def _sizes(dims, even: bool) -> tuple[int, int, int]:
    """Rows per device, contraction per device and columns from ``dims``."""
    m, k, c = (tuple(dims) * 3)[:3]
    return (2 * m if even else m), k, c


def _allgather_specs(axes: Axes):
    return (P(axes.entry), P(None, axes.entry))


def _allgather_shapes(even: bool):
    def shapes(axes: Axes, dims):
        m, k, c = _sizes(dims, even)
        return ((axes.size * m, k), (k, axes.size * c))
    return shapes


def _scatter_specs(axes: Axes):
    return (P(None, axes.entry), P(axes.entry))


def _scatter_shapes(even: bool):
    def shapes(axes: Axes, dims):
        m, k, c = _sizes(dims, even)
        return ((axes.size * m, axes.size * k), (axes.size * k, c))
    return shapes


def _validate(name: str, scatter: bool, overlap: str | None):
    """Global ``x: [M, K]`` and ``w: [K, N]``: the checks the public utilities
    make on the blocks, that the specs cannot: matching ``K``, ``M`` split
    into one chunk of output rows per device (reduce-scatter: ``x``'s rows
    are not sharded), and even blocks for the bidirectional versions."""

    def validate(axes: Axes, args) -> None:
        x, w = args
        _check_operands(x, w, name, blocks=False)
        rows = np.shape(x)[0]
        if scatter and rows % axes.size:
            raise ValueError(
                f"{name}: x has {rows} rows, which must split into {axes.size} "
                f"equal chunks (one per device along the axis). Fix: make dim 0 "
                f"a multiple of {axes.size}.")
        if overlap == "bidirectional":
            _halves(rows // axes.size, name, "the output" if scatter else "x")

    return validate


_KINDS = frozenset({"float", "int", "complex"})


def _matmul_fact(kind: str, overlap: str | None):
    """shard_map: the one collective, or n-1 ring steps (twice as many, each
    half the size, bidirectional). jit: the global ``x @ w``, which XLA
    partitions with the plain collective (on CPU a sharded sum is an
    all-reduce), plus one permute into the output layout when the collective
    axes are not the mesh's first. explicit: the plain collective whatever
    the overlap (the types have no spelling for a ring schedule): the
    all-gather the reshard states, with no permute (the output is in its
    layout already); the reduce-scatter as jit compiles it."""

    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        if form in ("jit", "explicit"):
            op = kind
            if kind == "reduce-scatter" and compiled_for() == "cpu":
                op = "all-reduce"
            permutes = reshards_minor_axis(axes)
            if form == "explicit" and kind == "all-gather":
                permutes = 0
            return Expectation({op: 1, "collective-permute": permutes})
        if overlap is None:
            return Expectation({kind: 1})
        steps = (axes.size - 1) * (2 if overlap == "bidirectional" else 1)
        return Expectation({"collective-permute": steps})

    return fact


def _contraction(args, axes: Axes, scatter: bool) -> int:
    """``K``, the products each output element sums: ``x``'s columns (the
    example shapes' at the default dims where ``args`` is None)."""
    if args is None:
        _, k, _ = _sizes(DEFAULT_DIMS, even=False)
        return axes.size * k if scatter else k
    return int(np.shape(args[0])[1])


def _allgather_terms(axes: Axes, args=None) -> int:
    # each element sums K products: K roundings, and the product's own
    return _contraction(args, axes, scatter=False) + 1


def _scatter_terms(axes: Axes, args=None) -> int:
    # n partial sums of K / n products each (K / n + 1 roundings), then the
    # reduce-scatter adds the n partial sums
    return _contraction(args, axes, scatter=True) + axes.size


def _allgather_recipe(name: str, summary: str, overlap: str | None) -> Recipe:
    body = _ALLGATHER[overlap]
    return register(Recipe(
        name=name, summary=summary, body=body,
        pmap_body=functools.partial(body, stepwise=True),
        recipe_file="collective_matmul.py",
        cost_model=_matmul_fact("all-gather", overlap),
        program=on_axes(file.matmul_program), oracle=on_axes(file.matmul_numpy),
        explicit_program=on_axes(file.allgather_matmul_explicit_program),
        in_specs=_allgather_specs, out_specs=lambda axes: P(None, axes.entry),
        example_shapes=_allgather_shapes(even=overlap == "bidirectional"),
        validate=_validate(name, False, overlap),
        arg_names=("x", "w"), dtype_kinds=_KINDS,
        n_terms=_allgather_terms))


def _scatter_recipe(name: str, summary: str, overlap: str | None) -> Recipe:
    body = _SCATTER[overlap]
    return register(Recipe(
        name=name, summary=summary, body=body,
        pmap_body=functools.partial(body, stepwise=True),
        recipe_file="collective_matmul.py",
        cost_model=_matmul_fact("reduce-scatter", overlap),
        program=on_axes(file.matmul_program), oracle=on_axes(file.matmul_numpy),
        explicit_program=on_axes(file.matmul_reduce_scatter_explicit_program,
                                 lambda axes: axes.entry),
        in_specs=_scatter_specs, out_specs=lambda axes: P(axes.entry),
        example_shapes=_scatter_shapes(even=overlap == "bidirectional"),
        validate=_validate(name, True, overlap),
        arg_names=("x", "w"), dtype_kinds=_KINDS,
        n_terms=_scatter_terms))


allgather_matmul_recipe = _allgather_recipe(
    "allgather_matmul", "x rows-sharded @ w cols-sharded: all_gather(x), then matmul",
    None)
allgather_matmul_overlapped_recipe = _allgather_recipe(
    "allgather_matmul_overlapped",
    "all-gather matmul as n-1 ring ppermutes overlapped with the matmuls",
    "unidirectional")
allgather_matmul_bidirectional_recipe = _allgather_recipe(
    "allgather_matmul_bidirectional",
    "all-gather matmul, half of each x block sent each way round the ring",
    "bidirectional")
matmul_reduce_scatter_recipe = _scatter_recipe(
    "matmul_reduce_scatter",
    "x cols-sharded @ w rows-sharded: matmul, then psum_scatter of the rows", None)
matmul_reduce_scatter_overlapped_recipe = _scatter_recipe(
    "matmul_reduce_scatter_overlapped",
    "matmul reduce-scatter as n-1 ring ppermutes of partial sums, overlapped",
    "unidirectional")
matmul_reduce_scatter_bidirectional_recipe = _scatter_recipe(
    "matmul_reduce_scatter_bidirectional",
    "matmul reduce-scatter, half of each partial sum sent each way round the ring",
    "bidirectional")
