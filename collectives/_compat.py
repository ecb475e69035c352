"""The one place that knows how JAX versions differ.

Supported span: JAX 0.8.0 to the newest release. Every other module asks this
one instead of testing ``hasattr(jax, ...)`` or comparing versions itself.

What differs across that span, and what each name here papers over:

* ``jax.make_mesh`` creates ``Auto`` axes up to 0.8 and ``Explicit`` axes from
    0.9; :func:`auto_axis_types` gives the ``axis_types`` argument that yields
    ``Auto`` on every version.
* Marking a value as varying over an axis: ``lax.pvary`` on 0.8,
    ``lax.pcast(x, axis, to="varying")`` from 0.10 (:func:`pvary`).
* The invariant all-gather: ``lax.all_gather_invariant`` on 0.8,
    ``lax.all_gather(..., to="invarying")`` from 0.10
    (:func:`all_gather_invariant`).
* Whether JAX's backends have started (:func:`backends_initialized`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
from jax import lax
from jax._src import xla_bridge as _xla_bridge


def _parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
    return tuple(parts)


JAX_VERSION: tuple[int, ...] = _parse_version(jax.__version__)
"""The running JAX version as a tuple of ints, e.g. ``(0, 10, 2)``."""

OLDEST_SUPPORTED_JAX = (0, 8, 0)

MAKE_MESH_DEFAULTS_TO_EXPLICIT = JAX_VERSION >= (0, 9, 0)
"""``jax.make_mesh`` without ``axis_types`` gives Explicit axes from JAX 0.9."""

NESTED_PMAP_SUPPORTED = False
"""Nested ``jax.pmap`` raises on every supported JAX (pmap runs on shard_map
since 0.8: "The context mesh ... should match the mesh passed to shard_map")."""

_HAS_PCAST = hasattr(lax, "pcast")  # from 0.9
_HAS_ALL_GATHER_INVARIANT = hasattr(lax, "all_gather_invariant")  # up to 0.9


def auto_axis_types(ndim: int) -> tuple[Any, ...]:
    """The ``axis_types`` argument that makes every mesh axis ``Auto``."""
    return (jax.sharding.AxisType.Auto,) * ndim


def explicit_axis_types(ndim: int) -> tuple[Any, ...]:
    """The ``axis_types`` argument that makes every mesh axis ``Explicit``."""
    return (jax.sharding.AxisType.Explicit,) * ndim


def pvary(x: Any, axis_name: str | tuple[str, ...]) -> Any:
    """Mark ``x`` (an invariant value) as varying over ``axis_name``."""
    if _HAS_PCAST:
        return lax.pcast(x, axis_name, to="varying")
    return lax.pvary(x, axis_name)  # JAX 0.8


def all_gather_invariant(
        x: Any, axis_name: str | tuple[str, ...], *, axis: int = 0, tiled: bool = False
) -> Any:
    """All-gather whose result is typed invariant over ``axis_name``."""
    if _HAS_ALL_GATHER_INVARIANT:
        return lax.all_gather_invariant(x, axis_name, axis=axis, tiled=tiled)
    return lax.all_gather(x, axis_name, axis=axis, tiled=tiled, to="invarying")


def backends_initialized() -> bool:
    """Whether JAX has already started its backends (devices are fixed then)."""
    return bool(_xla_bridge.backends_are_initialized())


def vma(x: Any) -> frozenset[str]:
    """The set of mesh axes a value inside shard_map varies over."""
    return frozenset(getattr(jax.typeof(x), "vma", frozenset()))


def make_jax_mesh(
        shape: Sequence[int], names: Sequence[str], devices: Sequence[Any],
        axis_types: tuple[Any, ...],
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` with explicit devices and axis types on every version."""
    return jax.make_mesh(tuple(shape), tuple(names), axis_types=axis_types,
                       devices=list(devices))


def context_mesh_axis_names() -> tuple[str, ...]:
    """Axis names of the mesh in scope (inside shard_map or pmap), in mesh order."""
    return tuple(jax.sharding.get_abstract_mesh().axis_names)
