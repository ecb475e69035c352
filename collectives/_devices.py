"""Simulated CPU devices and meshes with the same axis types on every JAX."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax

from collectives import _compat
from collectives import _kernels

DEFAULT_AXIS_NAME = "i"
"""The axis name of the 1-D mesh used when a form is called with ``mesh=None``."""


MESH_NAMES: tuple[str, ...] = ("i", "j", "k", "l")
"""Mesh axis names ``check``, ``run`` and the strategies give meshes they
make, in order: ``i`` for a 1-D mesh, ``i, j`` for 2-D..."""


def _how_to_get_devices(n: int) -> str:
    return (
        f"On CPU, simulate {n} devices with collectives.use_cpu_devices({n}) "
        f"right after `import jax` (or set JAX_NUM_CPU_DEVICES={n} before Python "
        "starts); the count is fixed once JAX has run its first operation."
    )


def use_cpu_devices(n: int) -> None:
    """Simulate ``n`` CPU devices; call it before JAX runs any operation.

    JAX fixes its device list when its backends start (the first array, jit
    call or ``jax.devices()``). This sets ``jax_num_cpu_devices`` before that
    happens. Calling it again with the count already in force is a no-op, so
    tests and scripts can both call it.

    Args:
      n: how many CPU devices to simulate, at least 1.

    Raises:
      TypeError: ``n`` is not an int.
      ValueError: ``n`` is smaller than 1.
      RuntimeError: JAX's backends already started with a different number
        of CPU devices.

    Examples:
      >>> import collectives as cx
      >>> cx.use_cpu_devices(8)  # the doctests run on 8 simulated devices
      >>> import jax
      >>> len(jax.devices("cpu"))
      8
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(
            f"use_cpu_devices(n): n must be an int, got {n!r} of type "
            f"{type(n).__name__}. Fix: pass a whole number such as 8."
        )
    if n < 1:
        raise ValueError(
            f"use_cpu_devices(n): n must be at least 1, got {n}. "
            "Fix: pass the number of devices to simulate, such as 8."
        )
    if _compat.backends_initialized():
        have = len(jax.devices("cpu"))
        if have == n:
            return
        raise RuntimeError(
            f"use_cpu_devices({n}) came too late: JAX's backends already started "
            f"with {have} CPU device(s), and the count cannot change afterwards. "
            f"Fix: call collectives.use_cpu_devices({n}) right after `import jax`, "
            f"before any JAX operation, or set JAX_NUM_CPU_DEVICES={n} in the "
            "environment before Python starts."
        )
    # Pallas's interpret mode (the kernel recipes) holds one XLA:CPU thread per
    # simulated device while it waits: give the pool room before it starts.
    _kernels.cpu_threads_for(n)
    jax.config.update("jax_num_cpu_devices", n)


def _as_tuple(value: Any, what: str, kind: type) -> tuple[Any, ...]:
    if isinstance(value, kind):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(
            f"make_mesh({what}): expected a {kind.__name__} or a sequence of them, "
            f"got {value!r}."
        ) from None
    for item in items:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise TypeError(
                f"make_mesh({what}={value!r}): every entry must be a "
                f"{kind.__name__}, got {item!r} of type {type(item).__name__}."
            )
    return items


def make_mesh(
    shape: int | Sequence[int],
    names: str | Sequence[str],
    *,
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
    """A device mesh whose axes are ``Auto`` on every supported JAX version.

    ``jax.make_mesh`` gives ``Explicit`` axes from JAX 0.9 on, and shard_map
    then refuses inputs whose sharding differs from ``in_specs``. Meshes made
    here behave the same on every version: jit places inputs as asked.

    Args:
      shape: the size of each mesh axis, e.g. ``(4, 2)``; an int for 1-D.
      names: one name per axis, e.g. ``("data", "model")``; a str for 1-D.
      devices: the devices to lay out, in order; default ``jax.devices()``.
        The first ``prod(shape)`` of them are used.

    Returns:
      A ``jax.sharding.Mesh`` with ``Auto`` axis types.

    Raises:
      TypeError: ``shape``, ``names`` or ``devices`` has entries of the
        wrong type.
      ValueError: sizes are not positive, names are empty or repeat, the two
        lengths differ, or more devices are asked for than exist.

    Examples:
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4, 2), ("i", "j"))
      >>> dict(mesh.shape)
      {'i': 4, 'j': 2}
      >>> [t.name for t in mesh.axis_types]
      ['Auto', 'Auto']
    """
    sizes = _as_tuple(shape, "shape", int)
    axis_names = _as_tuple(names, "names", str)
    if not sizes:
        raise ValueError("make_mesh(shape=()): a mesh needs at least one axis. "
                         "Fix: pass e.g. shape=(8,), names=('i',).")
    if len(sizes) != len(axis_names):
        raise ValueError(
            f"make_mesh(shape={sizes}, names={axis_names}): {len(sizes)} sizes but "
            f"{len(axis_names)} names. Fix: give exactly one name per mesh axis."
        )
    bad = [s for s in sizes if s < 1]
    if bad:
        raise ValueError(
            f"make_mesh(shape={sizes}): every axis size must be at least 1, got "
            f"{bad[0]}. Fix: use positive sizes."
        )
    if any(not name for name in axis_names):
        raise ValueError(
            f"make_mesh(names={axis_names}): axis names must be non-empty strings. "
            "Fix: name every axis, e.g. ('data', 'model').")
    if len(set(axis_names)) != len(axis_names):
        raise ValueError(
            f"make_mesh(names={axis_names}): axis names must be distinct. "
            "Fix: give every mesh axis its own name."
        )
    pool = list(jax.devices() if devices is None else devices)
    for device in pool:
        if not isinstance(device, jax.Device):
            raise TypeError(
                f"make_mesh(devices=...): every entry must be a jax.Device, got "
                f"{device!r} of type {type(device).__name__}. Fix: pass devices "
                "from jax.devices(), e.g. devices=jax.devices()[:4].")
    need = math.prod(sizes)
    if need > len(pool):
        kind = pool[0].platform if pool else "any"
        raise ValueError(
            f"make_mesh(shape={sizes}) needs {need} devices, but only {len(pool)} "
            f"{kind} device(s) are available. Fix: use a smaller mesh. "
            + _how_to_get_devices(need)
        )
    return _compat.make_jax_mesh(
        sizes, axis_names, pool[:need], _compat.auto_axis_types(len(sizes))
    )


def default_mesh() -> jax.sharding.Mesh:
    """The 1-D mesh over every device, with the axis named ``"i"``."""
    return make_mesh((jax.device_count(),), (DEFAULT_AXIS_NAME,))


def mesh_size(mesh: jax.sharding.Mesh, names: Sequence[str]) -> int:
    """The number of devices along the mesh axes ``names`` together."""
    return math.prod(mesh.shape[name] for name in names)


def require_devices(n: int) -> None:
    """Raise a ValueError that says how to get ``n`` devices if there are fewer."""
    have = jax.device_count()
    if have < n:
        raise ValueError(
            f"this needs {n} devices, but JAX has {have}. " + _how_to_get_devices(n)
        )
