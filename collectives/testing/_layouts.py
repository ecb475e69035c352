"""Strategies for layouts: meshes, collective axes, partition specs, shapes.

Public through :mod:`collectives.testing.strategies`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from collectives._devices import MESH_NAMES
from collectives._devices import make_mesh
from collectives._layout import spec_axes

MESH_SHAPES: tuple[tuple[int, ...], ...] = (
    (1,), (2,), (4,), (8,), (2, 2), (2, 4), (4, 2))
"""Mesh shapes drawn by default: 1-D up to 8 devices, and 2-D."""

MESH_SHAPES_3D: tuple[tuple[int, ...], ...] = ((2, 2, 2),)
"""Mesh shapes drawn for ``meshes(ndim=3)``."""



@functools.cache
def cached_mesh(shape: tuple[int, ...], names: tuple[str, ...] = MESH_NAMES) -> Mesh:
    return make_mesh(shape, names[: len(shape)])


def _check_names(names: Any) -> tuple[str, ...]:
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names: expected mesh axis names (strs), got {names!r}.")
    if len(set(names)) != len(names):
        raise ValueError(f"names={names}: mesh axis names must be distinct.")
    return names


def meshes(max_devices: int | None = None, ndim: int | None = None, *,
           names: str | Sequence[str] | None = None,
           shapes: Sequence[tuple[int, ...]] | None = None
           ) -> st.SearchStrategy[Mesh]:
    """Meshes that fit the devices, with ``Auto`` axes (see ``make_mesh``).

    Args:
      max_devices: the most devices a mesh may use (default: all devices).
      ndim: only meshes with this many axes (default: 1-D and 2-D, or
        ``len(names)``). ``ndim=3`` draws ``(2, 2, 2)``.
      names: the axis names, e.g. ``("data", "model")`` when the code under
        test names its axes (default ``i, j, k``).
      shapes: the mesh shapes to draw from (default :data:`MESH_SHAPES`, and
        :data:`MESH_SHAPES_3D` for 3-D).

    Returns:
      A strategy of ``jax.sharding.Mesh``.

    Raises:
      ValueError: (when drawing) no shape fits in ``max_devices`` and the
        devices JAX has; ``ndim`` and ``names`` disagree.

    Examples:
      >>> from hypothesis import given
      >>> from collectives.testing.strategies import meshes
      >>> @given(meshes(names=("data", "model")))
      ... def check(mesh):
      ...     assert mesh.axis_names == ("data", "model") and mesh.size <= 8
      >>> check()
    """
    if names is not None:
        names = _check_names(names)
        if ndim is not None and ndim != len(names):
            raise ValueError(f"meshes(ndim={ndim}, names={names}): ndim must equal "
                             f"len(names). Fix: pass one of them.")
        ndim = len(names)
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int)
                             or ndim < 1):
        raise ValueError(f"meshes(ndim={ndim!r}): expected a positive int.")
    if shapes is None:
        pool = MESH_SHAPES + MESH_SHAPES_3D if ndim is not None else MESH_SHAPES
    else:
        pool = tuple(tuple(s) for s in shapes)
    pool = tuple(s for s in pool if ndim is None or len(s) == ndim)
    axis_names = names if names is not None else MESH_NAMES
    if len(axis_names) < max(map(len, pool), default=0):
        raise ValueError(f"meshes(shapes={pool}): a shape has more axes than the "
                         f"{len(axis_names)} names {axis_names}.")

    @st.composite
    def draw_mesh(draw: st.DrawFn) -> Mesh:
        limit = jax.device_count() if max_devices is None else min(
            max_devices, jax.device_count())
        fits = [s for s in pool if int(np.prod(s)) <= limit]
        if not fits:
            raise ValueError(
                f"meshes(max_devices={max_devices}, ndim={ndim}): no mesh shape of "
                f"{pool} fits in {limit} device(s). Fix: simulate more devices "
                "(pytest --cpu-devices 8) or pass shapes= that fit.")
        return cached_mesh(draw(st.sampled_from(fits)), axis_names)

    return draw_mesh()


def axis_options(mesh: Mesh) -> list[Any]:
    names = tuple(mesh.axis_names)
    options: list[Any] = [None, *names]
    if len(names) > 1:
        options += [names, tuple(reversed(names))]
    return options


def collective_axes(mesh: Mesh) -> st.SearchStrategy[Any]:
    """An ``axis`` argument for ``mesh``: ``None`` (all axes), one axis name,
    or a tuple of axis names in either order."""
    return st.sampled_from(axis_options(mesh))


def _entry(names: Sequence[str]) -> str | tuple[str, ...] | None:
    if not names:
        return None
    return names[0] if len(names) == 1 else tuple(names)


@st.composite
def partition_specs(draw: st.DrawFn, mesh: Mesh, ndim: int) -> P:
    """``PartitionSpec`` s for an ``ndim``-dimensional array over ``mesh``.

    Each mesh axis shards at most one dimension (or none: the array is then
    replicated over it); a dimension may be sharded over several axes, in
    any order. Trailing ``None`` entries are sometimes dropped, as in
    ``P("i")`` for ``P("i", None)``.

    Args:
      mesh: the mesh whose axis names the specs use.
      ndim: the rank of the array the spec applies to (0 gives ``P()``).

    Returns:
      A strategy of ``jax.sharding.PartitionSpec``.

    Examples:
      >>> import collectives as cx
      >>> from hypothesis import given
      >>> from collectives.testing.strategies import partition_specs
      >>> mesh = cx.make_mesh((4, 2), ("i", "j"))
      >>> @given(partition_specs(mesh, 2))
      ... def check(spec):
      ...     used = [n for e in spec if e for n in ((e,) if isinstance(e, str) else e)]
      ...     assert len(spec) <= 2 and len(used) == len(set(used))
      >>> check()
    """
    if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0:
        raise ValueError(f"partition_specs(ndim={ndim!r}): expected an int >= 0.")
    entries: list[list[str]] = [[] for _ in range(ndim)]
    if ndim:
        for name in draw(st.permutations(tuple(mesh.axis_names))):
            dim = draw(st.integers(-1, ndim - 1))  # -1: replicated over `name`
            if dim >= 0:
                entries[dim].append(name)
    spec = [_entry(e) for e in entries]
    if draw(st.booleans()):
        while spec and spec[-1] is None:
            spec.pop()
    return P(*spec)


def checked_spec(mesh: Mesh, spec: Any, where: str) -> P:
    if not isinstance(spec, P):
        raise TypeError(f"{where}: expected a jax.sharding.PartitionSpec, got "
                        f"{spec!r}.")
    used = [n for names in spec_axes(spec, len(spec)) for n in names]
    for name in used:
        if name not in mesh.axis_names:
            raise ValueError(
                f"{where}: spec {spec} names axis {name!r}, which is not in the mesh "
                f"(axes {tuple(mesh.axis_names)}). Fix: draw meshes with "
                f"names=... that include {name!r}, or use the mesh's names.")
    if len(set(used)) != len(used):
        raise ValueError(f"{where}: spec {spec} uses a mesh axis twice.")
    return spec


def sharded_shapes(mesh: Mesh, spec: P, ndim: int | None = None, *,
                   min_block: int = 1, max_block: int = 3
                   ) -> st.SearchStrategy[tuple[int, ...]]:
    """Global shapes that ``spec`` shards evenly over ``mesh``.

    Dimension ``d`` is (the product of the sizes of the mesh axes that
    ``spec`` puts on ``d``) times a block size in ``[min_block, max_block]``,
    so every device holds a block of the same shape.

    Args:
      mesh: the mesh.
      spec: the partition spec; its axes must be in ``mesh``.
      ndim: the rank (default ``len(spec)``, at least 1); dimensions after
        the spec's entries are unsharded.
      min_block, max_block: bounds on each block dimension.

    Returns:
      A strategy of shapes (tuples of ints).

    Raises:
      TypeError, ValueError: ``spec`` does not fit ``mesh`` or ``ndim``, or
        the block bounds are not ``0 <= min_block <= max_block``.

    Examples:
      >>> import collectives as cx
      >>> from hypothesis import given
      >>> from jax.sharding import PartitionSpec as P
      >>> from collectives.testing.strategies import sharded_shapes
      >>> mesh = cx.make_mesh((4, 2), ("i", "j"))
      >>> @given(sharded_shapes(mesh, P(("i", "j"), None)))
      ... def check(shape):
      ...     assert len(shape) == 2 and shape[0] % 8 == 0
      >>> check()
    """
    spec = checked_spec(mesh, spec, "sharded_shapes")
    rank = max(len(spec), 1) if ndim is None else ndim
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < len(spec):
        raise ValueError(f"sharded_shapes(ndim={ndim!r}): expected an int >= "
                         f"len(spec) = {len(spec)} for spec {spec}.")
    if not 0 <= min_block <= max_block:
        raise ValueError(f"sharded_shapes(min_block={min_block}, max_block="
                         f"{max_block}): expected 0 <= min_block <= max_block.")
    parts = [int(np.prod([mesh.shape[n] for n in names]))
             for names in spec_axes(spec, rank)]
    return st.tuples(*(st.integers(min_block, max_block).map(lambda b, p=p: p * b)
                       for p in parts))
