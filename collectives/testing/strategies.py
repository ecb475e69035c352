"""Hypothesis strategies that draw only valid sharded test cases.

Every strategy here draws meshes that fit the available devices, axis names
that exist in the mesh and shapes that divide evenly, so a failing example is
a real bug, never a malformed input.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from collectives._devices import make_mesh
from collectives._forms import Recipe
from collectives._forms import dtype_kind
from collectives._forms import is_shape

MESH_SHAPES: tuple[tuple[int, ...], ...] = (
    (1,), (2,), (4,), (8,), (2, 2), (2, 4), (4, 2))
"""Mesh shapes drawn by default: 1-D up to 8 devices, and 2-D."""

MESH_NAMES = ("i", "j", "k")

DTYPES: tuple[str, ...] = ("float32", "int32", "float16", "bfloat16")
"""Dtypes drawn by default (float64 needs x64; test it separately)."""


@functools.cache
def _mesh(shape: tuple[int, ...]) -> jax.sharding.Mesh:
    return make_mesh(shape, MESH_NAMES[: len(shape)])


@st.composite
def meshes(draw: st.DrawFn, max_devices: int | None = None,
           ndim: int | None = None) -> jax.sharding.Mesh:
    """Meshes from :data:`MESH_SHAPES` that fit the devices, axes ``i, j``.

    Args:
      max_devices: the most devices a mesh may use (default: all devices).
      ndim: only meshes with this many axes (default: any).
    """
    limit = jax.device_count() if max_devices is None else max_devices
    shapes = [s for s in MESH_SHAPES
              if int(np.prod(s)) <= limit and (ndim is None or len(s) == ndim)]
    if not shapes:
        raise ValueError(
            f"meshes(max_devices={limit}, ndim={ndim}): no mesh shape fits; "
            f"shapes known: {MESH_SHAPES}.")
    return _mesh(draw(st.sampled_from(shapes)))


def _axis_options(mesh: jax.sharding.Mesh) -> list[Any]:
    names = tuple(mesh.axis_names)
    options: list[Any] = [None, *names]
    if len(names) > 1:
        options += [names, tuple(reversed(names))]
    return options


def collective_axes(mesh: jax.sharding.Mesh) -> st.SearchStrategy[Any]:
    """An ``axis`` argument for ``mesh``: ``None`` (all axes), one axis name,
    or a tuple of axis names in either order."""
    return st.sampled_from(_axis_options(mesh))


def exact_values(draw: st.DrawFn, shape: tuple[int, ...], dtype: Any
                 ) -> np.ndarray:
    """Small integers in ``[-8, 8]`` as ``dtype``: exact in every float dtype."""
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    low = 0 if dtype_kind(dtype) == "bool" else -8
    high = 1 if dtype_kind(dtype) == "bool" else 8
    values = draw(hnp.arrays(np.int8, shape, elements=st.integers(low, high)))
    return values.astype(dtype)


@dataclasses.dataclass(frozen=True)
class RecipeCase:
    """A drawn case: run ``recipe`` on ``args`` over ``mesh`` and ``axis``."""

    mesh: jax.sharding.Mesh
    axis: Any
    dtype: str
    args: tuple[Any, ...]


@st.composite
def recipe_cases(draw: st.DrawFn, recipe: Recipe, *,
                 dtypes: Sequence[str] = DTYPES, max_devices: int | None = None,
                 max_dim: int = 3, ndim: Sequence[int] = (1, 2, 3)) -> RecipeCase:
    """Valid inputs for ``recipe``: mesh, axis, dtype and exact-valued arrays.

    Args:
      recipe: the recipe to feed.
      dtypes: dtypes to draw from; those the recipe rejects are skipped.
      max_devices: the most devices a mesh may use.
      max_dim: the largest free size per dimension (before the recipe
        multiplies by mesh axis sizes).
      ndim: how many free sizes to draw (the recipe decides the rank).
    """
    usable = [d for d in dtypes if dtype_kind(d) in recipe.kinds]
    if not usable:
        raise ValueError(f"recipe {recipe.name!r} accepts none of dtypes {dtypes}.")
    limit = jax.device_count() if max_devices is None else max_devices
    candidates = [
        (mesh, axis)
        for shape in MESH_SHAPES if int(np.prod(shape)) <= limit
        for mesh in [_mesh(shape)]
        for axis in _axis_options(mesh)
        if recipe.axes_check(recipe.axes(mesh, axis)) is None]
    if not candidates:
        raise ValueError(f"recipe {recipe.name!r} runs on none of the meshes "
                         f"{MESH_SHAPES} within {limit} devices.")
    mesh, axis = draw(st.sampled_from(candidates))
    dtype = draw(st.sampled_from(usable))
    count = draw(st.sampled_from(list(ndim)))
    dims = tuple(draw(st.integers(1, max_dim)) for _ in range(max(count, 1)))
    axes = recipe.axes(mesh, axis)
    shapes = recipe.example_shapes(axes, dims)
    args = tuple(jax.tree_util.tree_map(
        lambda shape: exact_values(draw, shape, dtype), tree, is_leaf=is_shape)
        for tree in shapes)
    return RecipeCase(mesh=mesh, axis=axis, dtype=dtype, args=args)
