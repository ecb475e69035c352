"""Assertions about where a ``jax.Array`` lives: its sharding, and whether the
device copies of each block really hold the same bits.

A value that every device computes differently but that is declared
replicated (``out_specs=P()`` with ``check_vma=False``, ``pmap(out_axes=None)``)
reads back as device 0's copy without a word; these assertions look at every
device's buffer instead.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives._arrays import bitwise_differs
from collectives._layout import check_against_spec


def _require_array(x: Any, where: str) -> jax.Array:
    if not isinstance(x, jax.Array):
        raise TypeError(
            f"{where}: expected a jax.Array (the result of a jitted, shard_map or "
            f"pmap computation, or of jax.device_put), got {type(x).__name__}. A "
            "NumPy array has no devices to check.")
    return x


def _describe_device(device: Any, sharding: Any) -> str:
    where = f"device {device.id} ({device})"
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        for coords, d in np.ndenumerate(mesh.devices):
            if d == device:
                position = ", ".join(f"{n!r}: {c}" for n, c in
                                     zip(mesh.axis_names, coords, strict=True))
                return f"{where}, mesh position {{{position}}}"
    return where


def _spec(spec: P) -> str:
    """``P('i', None)`` on every JAX version (older ones print PartitionSpec),
    with its ``unreduced``/``reduced`` axes where it has any (JAX refuses to
    unpack such a spec: its entries are ``spec.partitions`` there)."""
    entries = [repr(entry) for entry in getattr(spec, "partitions", spec)]
    for state in ("unreduced", "reduced"):
        axes = getattr(spec, state, None)
        if axes:
            entries.append(f"{state}={set(axes)!r}")
    return f"P({', '.join(entries)})"


def _fmt(value: np.ndarray) -> str:
    """A scalar for messages, at its dtype's precision: ``1.0``, not
    ``np.float32(1.0)``."""
    return str(np.asarray(value)[()])


def _bits(value: np.ndarray) -> str:
    return "0x" + value.tobytes()[::-1].hex()


def _slices(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    parts = []
    for s, n in zip(index, shape, strict=True):
        start, stop, _ = s.indices(n)
        parts.append(":" if (start, stop) == (0, n) else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


def _assert_copies_agree(x: jax.Array, name: str) -> None:
    """Every addressable shard with the same index holds the same bytes."""
    groups: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for shard in x.addressable_shards:
        key = tuple(s.indices(n)[:2] for s, n in zip(shard.index, x.shape, strict=True))
        groups.setdefault(key, []).append(shard)
    for shards in groups.values():
        shards = sorted(shards, key=lambda s: s.replica_id)
        first = np.asarray(shards[0].data)
        for shard in shards[1:]:
            other = np.asarray(shard.data)
            differs = bitwise_differs(other, first)
            if not differs.any():
                continue
            where = tuple(int(i) for i in np.argwhere(differs)[0])
            offset = tuple(s.indices(n)[0] for s, n in
                           zip(shard.index, x.shape, strict=True))
            global_index = tuple(w + o for w, o in zip(where, offset, strict=True))
            got, want = other[where], first[where]
            reference = _describe_device(shards[0].device, x.sharding)
            values = f"{_fmt(got)} where {reference} holds {_fmt(want)}"
            if _fmt(got) == _fmt(want):
                values += f" (bits {_bits(got)} vs {_bits(want)})"
            block = _slices(shard.index, x.shape)
            raise AssertionError(
                f"{name}: device copies of block {name}{block} differ at index "
                f"{global_index}: {_describe_device(shard.device, x.sharding)} holds "
                f"{values} ({int(differs.sum())} of {differs.size} elements of the "
                "block differ, compared bitwise). Reading the array returns one "
                "copy and hides the others. Fix: make the value truly replicated "
                "(psum/pmean/all_gather over the axis) or declare it sharded; keep "
                "check_vma=True in shard_map so the mistake fails at trace time.")


def assert_replicated(x: Any, *, name: str = "x") -> None:
    """Assert that every device holds the whole of ``x``, and the same bits.

    Checks the sharding (fully replicated) and then every device's buffer,
    bitwise (so ``0.0`` and ``-0.0`` differ, and NaNs must match bit for bit).
    In a multi-process run only this process's devices are checked.

    Args:
      x: a ``jax.Array``.
      name: what to call ``x`` in the message.

    Raises:
      TypeError: ``x`` is not a ``jax.Array``.
      AssertionError: ``x`` is sharded or unreduced (each device a partial
        sum: Explicit mode's ``unreduced`` state), or a device's copy
        differs; the message names the device, its mesh position, the index
        and both values.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> from collectives.testing import assert_replicated
      >>> mesh = cx.make_mesh((8,), "i")
      >>> assert_replicated(jax.device_put(np.ones(3), NamedSharding(mesh, P())))
      >>> bad = jax.jit(jax.shard_map(lambda b: b + jax.lax.axis_index("i"),
      ...     mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))(np.zeros(3))
      >>> assert_replicated(bad)
      Traceback (most recent call last):
      ...
      AssertionError: x: device copies of block x[:] differ at index (0,): device 1 ...
    """
    x = _require_array(x, "assert_replicated")
    spec = getattr(x.sharding, "spec", None)
    pending = set(getattr(spec, "unreduced", None) or ())
    if pending:
        raise AssertionError(
            f"{name} is unreduced over {sorted(pending)} (spec {_spec(spec)}): each "
            "device holds a partial sum, not the value. Fix: sum it inside jit, "
            "jax.sharding.reshard(x, P(...)) without unreduced=, before it is "
            "returned.")
    if not x.sharding.is_fully_replicated:
        spec = getattr(x.sharding, "spec", None)
        spelled = f" (spec {_spec(spec)})" if spec is not None else ""
        raise AssertionError(
            f"{name} is not replicated: its sharding {x.sharding} gives each device a "
            f"block of shape {x.sharding.shard_shape(x.shape)} of the global "
            f"{x.shape}{spelled}. Fix: gather it (all_gather, or out_specs=P() "
            "after a reduction) or check it with assert_sharded_as.")
    _assert_copies_agree(x, name)


def assert_sharded_as(x: Any, mesh: Mesh, spec: P, *, name: str = "x",
                      check_copies: bool = True) -> None:
    """Assert that ``x`` is laid out as ``NamedSharding(mesh, spec)``.

    Layouts are compared by which block of ``x`` each device holds, so any
    sharding type with the same placement passes. With ``check_copies``,
    devices that hold the same block (mesh axes ``spec`` leaves out) must
    also hold the same bits, as in :func:`assert_replicated`.

    Args:
      x: a ``jax.Array``.
      mesh: the mesh ``spec`` refers to.
      spec: the expected ``PartitionSpec``.
      name: what to call ``x`` in the message.
      check_copies: also compare the device copies of each block bitwise.

    Raises:
      TypeError: ``x`` is not a ``jax.Array``, or ``mesh``/``spec`` have the
        wrong type.
      ValueError: ``spec`` cannot shard an array of ``x``'s shape over
        ``mesh`` (unknown axis, too many entries, indivisible dimension).
      AssertionError: ``x`` is laid out differently (the message names the
        first device whose block differs) or its copies differ.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> from collectives.testing import assert_sharded_as
      >>> mesh = cx.make_mesh((4, 2), ("i", "j"))
      >>> x = jax.device_put(np.zeros((8, 4)), NamedSharding(mesh, P("i")))
      >>> assert_sharded_as(x, mesh, P("i", None))
      >>> assert_sharded_as(x, mesh, P("i", "j"))
      Traceback (most recent call last):
      ...
      AssertionError: x is not sharded as P('i', 'j') ...
    """
    x = _require_array(x, "assert_sharded_as")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"assert_sharded_as(mesh=...): expected a jax.sharding.Mesh, "
                        f"got {type(mesh).__name__}.")
    if not isinstance(spec, P):
        raise TypeError(f"assert_sharded_as(spec=...): expected a PartitionSpec, got "
                        f"{spec!r}.")
    check_against_spec(f"assert_sharded_as: {name}", x, spec, mesh)
    want = NamedSharding(mesh, spec)
    if not x.sharding.is_equivalent_to(want, x.ndim):
        raise AssertionError(f"{name} is not sharded as {_spec(spec)} over mesh "
                             f"{dict(mesh.shape)}: " + _first_misplaced(x, want, name))
    if check_copies:
        _assert_copies_agree(x, name)


def _first_misplaced(x: jax.Array, want: NamedSharding, name: str) -> str:
    have = x.sharding
    have_map = have.devices_indices_map(x.shape)
    want_map = want.devices_indices_map(x.shape)
    actual = f"it has {have}, blocks of shape {have.shard_shape(x.shape)}"
    if set(have_map) != set(want_map):
        ids = sorted(d.id for d in have_map)
        mesh_ids = sorted(d.id for d in want_map)
        return (f"{actual}, on devices {ids}, but the mesh has devices {mesh_ids}. "
                "Fix: place it on the mesh's devices.")
    for device, index in want_map.items():
        if _slices(have_map[device], x.shape) != _slices(index, x.shape):
            holds = _slices(have_map[device], x.shape)
            return (
                f"{actual}; {_describe_device(device, want)} holds {name}{holds} but "
                f"{_spec(want.spec)} puts {name}{_slices(index, x.shape)} there "
                f"(blocks of shape {want.shard_shape(x.shape)}).")
    return f"{actual} (same blocks, in a different memory kind or device order)."
