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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from collectives._costs import reshards_minor_axis
from collectives._facts.permute import body_axis_size
from collectives._facts.permute import ring_shift
from collectives._facts.ring import Shift
from collectives._facts.ring import stepwise_shift
from collectives._layout import Axes
from collectives._layout import axis_tuple
from collectives._numpy import widen
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation

OVERLAPS = (None, "unidirectional", "bidirectional")
"""The ``overlap`` choices: the plain collective, or a ring one or both ways."""


def _check_overlap(overlap) -> None:
    if overlap not in OVERLAPS:
        raise ValueError(
            f"overlap: expected one of {OVERLAPS}, got {overlap!r}. Fix: None for "
            "the plain collective, 'unidirectional' or 'bidirectional' for the "
            "ring versions.")


def _check_operands(x, w, what: str) -> None:
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"{what}: expected blocks x: [m, k] and w: [k, c] with matching k, got "
            f"x {x.shape} and w {w.shape}. Fix: pass 2-D blocks whose inner "
            "dimensions agree.")


def _halves(rows: int, what: str, arg: str) -> int:
    if rows % 2:
        raise ValueError(
            f"{what}: overlap='bidirectional' sends half of each block each way, "
            f"so the block of {arg} needs an even number of rows, got {rows}. Fix: "
            "use an even block size or overlap='unidirectional'.")
    return rows // 2


# -- all-gather matmul -----------------------------------------------------

def _allgather_matmul_ring(x, w, axis, shift: Shift, bidirectional: bool):
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    m = x.shape[0]
    # out: [n*m, c]; the rows of device j's x block land in rows j*m:(j+1)*m
    out = jnp.zeros((n * m, w.shape[1]), jnp.result_type(x, w))

    def put(out, rows, row):
        return lax.dynamic_update_slice_in_dim(out, rows @ w, row, axis=0)

    if not bidirectional:
        block = x
        for step in range(n):
            # start sending the block on before multiplying it (overlap)
            incoming = shift(block, axis, 1) if step < n - 1 else None
            out = put(out, block, ((me - step) % n) * m)  # block of device me-step
            block = incoming
        return out
    half = _halves(m, "allgather_matmul", "x")
    up, down = x[:half], x[half:]  # up travels +1, down travels -1
    for step in range(n):
        if step < n - 1:
            next_up, next_down = shift(up, axis, 1), shift(down, axis, -1)
        out = put(out, up, ((me - step) % n) * m)
        out = put(out, down, ((me + step) % n) * m + half)
        if step < n - 1:
            up, down = next_up, next_down
    return out


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
    if overlap is None:
        return lax.all_gather(x, axis, tiled=True) @ w
    return _allgather_matmul_ring(x, w, axis, ring_shift, overlap == "bidirectional")


def allgather_matmul_pmap(x, w, axis, *, overlap: str | None = None):
    """:func:`allgather_matmul` for the legacy pmap form (one axis per collective)."""
    if overlap is None:
        for name in reversed(axis_tuple(axis)):
            x = lax.all_gather(x, name, tiled=True)
        return x @ w
    return _allgather_matmul_ring(x, w, axis, stepwise_shift,
                                  overlap == "bidirectional")


# -- matmul reduce-scatter -------------------------------------------------

def _output_rows(x, n: int) -> int:
    if x.shape[0] % n:
        raise ValueError(
            f"matmul_reduce_scatter: x has {x.shape[0]} rows, which must split into "
            f"{n} equal chunks (one per device along the axis). Fix: make dim 0 a "
            f"multiple of {n}.")
    return x.shape[0] // n


def _matmul_reduce_scatter_ring(x, w, axis, shift: Shift, bidirectional: bool):
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    m = _output_rows(x, n)

    def partial(row, size):
        # this device's share of output rows row:row+size: [size, N]
        return lax.dynamic_slice_in_dim(x, row, size, axis=0) @ w

    if not bidirectional:
        # The partial sum of chunk j starts on device j + 1 and collects a
        # term on every device as it travels forward; it ends on device j.
        acc = partial(((me - 1) % n) * m, m)
        for step in range(1, n):
            acc = shift(acc, axis, 1) + partial(((me - 1 - step) % n) * m, m)
        return acc
    half = _halves(m, "matmul_reduce_scatter", "the output")
    # First halves of the chunks travel +1, second halves -1.
    up = partial(((me - 1) % n) * m, half)
    down = partial(((me + 1) % n) * m + half, half)
    for step in range(1, n):
        up = shift(up, axis, 1) + partial(((me - 1 - step) % n) * m, half)
        down = shift(down, axis, -1) + partial(((me + 1 + step) % n) * m + half, half)
    return jnp.concatenate([up, down], axis=0)


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
    if overlap is None:
        _output_rows(x, lax.axis_size(axis))
        return lax.psum_scatter(x @ w, axis, scatter_dimension=0, tiled=True)
    return _matmul_reduce_scatter_ring(x, w, axis, ring_shift,
                                       overlap == "bidirectional")


def matmul_reduce_scatter_pmap(x, w, axis, *, overlap: str | None = None):
    """:func:`matmul_reduce_scatter` for the legacy pmap form."""
    if overlap is None:
        out = x @ w
        for name in axis_tuple(axis):
            out = lax.psum_scatter(out, name, scatter_dimension=0, tiled=True)
        return out
    return _matmul_reduce_scatter_ring(x, w, axis, stepwise_shift,
                                       overlap == "bidirectional")



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


def matmul_program(x, w, *, axes: Axes):
    # x: [M, K] @ w: [K, N]; the shardings make jit gather or scatter
    del axes
    return x @ w


def matmul_oracle(x, w, *, axes: Axes):
    del axes
    return (widen(x) @ widen(w)).astype(jnp.result_type(x.dtype, w.dtype))


_KINDS = frozenset({"float", "int", "complex"})


def _matmul_fact(kind: str, overlap: str | None):
    """shard_map: the one collective, or n-1 ring steps (twice as many, each
    half the size, bidirectional). jit: the global ``x @ w``, which XLA
    partitions with the plain collective (on CPU a sharded sum is an
    all-reduce), plus one permute into the output layout when the collective
    axes are not the mesh's first."""

    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        if form == "jit":
            op = kind
            if kind == "reduce-scatter" and jax.default_backend() == "cpu":
                op = "all-reduce"
            return Expectation({op: 1, "collective-permute": reshards_minor_axis(axes)})
        if overlap is None:
            return Expectation({kind: 1})
        steps = (axes.size - 1) * (2 if overlap == "bidirectional" else 1)
        return Expectation({"collective-permute": steps})

    return fact


def _allgather_recipe(name: str, summary: str, overlap: str | None) -> Recipe:
    def body(x, w, *, axis):
        # x: [m, K] rows, w: [K, c] columns on each device -> [n*m, c]
        return allgather_matmul(x, w, axis, overlap=overlap)

    def pmap_body(x, w, *, axis):
        return allgather_matmul_pmap(x, w, axis, overlap=overlap)

    return register(Recipe(
        name=name, summary=summary, body=body, pmap_body=pmap_body,
        source="collective_matmul.py", hlo=_matmul_fact("all-gather", overlap),
        program=matmul_program, oracle=matmul_oracle, in_specs=_allgather_specs,
        out_specs=lambda axes: P(None, axes.entry),
        example_shapes=_allgather_shapes(even=overlap == "bidirectional"),
        arg_names=("x", "w"), dtype_kinds=_KINDS,
        # each element sums K <= 3 products in the example shapes
        count_terms=lambda axes: 4))


def _scatter_recipe(name: str, summary: str, overlap: str | None) -> Recipe:
    def body(x, w, *, axis):
        # x: [M, k] columns, w: [k, N] rows on each device -> [M/n, N]
        return matmul_reduce_scatter(x, w, axis, overlap=overlap)

    def pmap_body(x, w, *, axis):
        return matmul_reduce_scatter_pmap(x, w, axis, overlap=overlap)

    return register(Recipe(
        name=name, summary=summary, body=body, pmap_body=pmap_body,
        source="collective_matmul.py", hlo=_matmul_fact("reduce-scatter", overlap),
        program=matmul_program, oracle=matmul_oracle, in_specs=_scatter_specs,
        out_specs=lambda axes: P(axes.entry),
        example_shapes=_scatter_shapes(even=overlap == "bidirectional"),
        arg_names=("x", "w"), dtype_kinds=_KINDS,
        # n partial sums of k <= 3 products each
        count_terms=lambda axes: 4 * axes.size))


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
