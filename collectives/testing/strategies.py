"""Hypothesis strategies that draw only valid sharded test cases.

Every strategy here draws meshes that fit the available devices, partition
specs whose axes exist in the mesh (each mesh axis used at most once), global
shapes that divide evenly by the mesh axes that shard them, and array values
that the dtype holds, so a failing example is a real bug, never a malformed
input. The strategies are small ``@composite`` functions; combine them
freely::

    @given(sharded_arrays(mesh=meshes(names=("data",)), spec=P("data")))
    def test_my_function(case):
        mesh, spec, x = case          # x: a NumPy array whose dim 0 splits over "data"
        ...

Requires ``hypothesis`` (in the ``test`` extra). Device counts are looked up
when a strategy draws, not when it is built, so building strategies at import
time never starts JAX's backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import numpy as np
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives._arrays import is_shape
from collectives._recipe import Recipe
from collectives._tolerance import can_fail
from collectives.testing._layouts import MESH_NAMES
from collectives.testing._layouts import MESH_SHAPES
from collectives.testing._layouts import MESH_SHAPES_3D
from collectives.testing._layouts import axis_options
from collectives.testing._layouts import cached_mesh
from collectives.testing._layouts import checked_spec
from collectives.testing._layouts import collective_axes
from collectives.testing._layouts import meshes
from collectives.testing._layouts import partition_specs
from collectives.testing._layouts import sharded_shapes
from collectives.testing._values import arrays
from collectives.testing._values import exact_values

__all__ = [
    "DTYPES",
    "MESH_NAMES",
    "MESH_SHAPES",
    "MESH_SHAPES_3D",
    "RecipeCase",
    "ShardedCase",
    "arrays",
    "collective_axes",
    "exact_values",
    "meshes",
    "partition_specs",
    "recipe_cases",
    "sharded_arrays",
    "sharded_shapes",
]

DTYPES: tuple[str, ...] = ("float32", "int32", "float16", "bfloat16")
"""Dtypes drawn by default (float64 needs x64; test it separately)."""


class ShardedCase(NamedTuple):
    """A drawn ``(mesh, spec, array)``: ``array`` is global and shards evenly.

    Unpacks as ``mesh, spec, x = case``.
    """

    mesh: Mesh
    spec: P
    array: np.ndarray

    @property
    def sharding(self) -> NamedSharding:
        """``NamedSharding(mesh, spec)``."""
        return NamedSharding(self.mesh, self.spec)

    def put(self) -> jax.Array:
        """The array placed on the mesh: ``jax.device_put(array, sharding)``."""
        return jax.device_put(self.array, self.sharding)


SpecArg = P | Callable[[Mesh], P] | st.SearchStrategy[P] | None


@st.composite
def sharded_arrays(draw: st.DrawFn, *,
                   mesh: Mesh | st.SearchStrategy[Mesh] | None = None,
                   spec: SpecArg = None, ndim: int | None = None,
                   dtype: Any = "float32", exact: bool = False,
                   max_devices: int | None = None, min_block: int = 1,
                   max_block: int = 3, min_value: float | None = None,
                   max_value: float | None = None) -> ShardedCase:
    """A mesh, a partition spec and a global array that the spec shards evenly.

    Args:
      mesh: a fixed mesh or a strategy of meshes (default ``meshes(max_devices)``).
      spec: a fixed spec, ``spec(mesh)`` giving one, a strategy of specs, or
        ``None`` to draw any valid spec (``partition_specs``).
      ndim: the array rank (default: ``len(spec)`` for a fixed spec, else
        drawn from 1 to 3).
      dtype: a dtype or a strategy of dtypes (see :func:`arrays`).
      exact: small integer values only (see :func:`arrays`).
      max_devices: the most devices a drawn mesh may use.
      min_block, max_block: bounds on each block dimension.
      min_value, max_value: bounds on the values (see :func:`arrays`).

    Returns:
      A strategy of :class:`ShardedCase`.

    Raises:
      ValueError: (when drawing) a given spec names an axis the mesh lacks.

    Examples:
      >>> import jax
      >>> from hypothesis import given
      >>> from collectives.testing.strategies import sharded_arrays
      >>> @given(sharded_arrays(dtype="bfloat16", exact=True))
      ... def check(case):
      ...     mesh, spec, x = case
      ...     assert jax.device_put(x, case.sharding).shape == x.shape
      >>> check()
    """
    if mesh is None:
        mesh = meshes(max_devices)
    if isinstance(mesh, st.SearchStrategy):
        mesh = draw(mesh)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"sharded_arrays(mesh=...): expected a Mesh or a strategy of "
                        f"meshes, got {mesh!r}.")
    if spec is None:
        rank = draw(st.integers(1, 3)) if ndim is None else ndim
        spec = draw(partition_specs(mesh, rank))
    else:
        if isinstance(spec, st.SearchStrategy):
            spec = draw(spec)
        elif callable(spec) and not isinstance(spec, P):
            spec = spec(mesh)
        spec = checked_spec(mesh, spec, "sharded_arrays(spec=...)")
        rank = max(len(spec), 1) if ndim is None else ndim
    shape = draw(sharded_shapes(mesh, spec, rank, min_block=min_block,
                                max_block=max_block))
    array = draw(arrays(shape, dtype, exact=exact, min_value=min_value,
                        max_value=max_value))
    return ShardedCase(mesh, spec, array)


# -- recipes -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RecipeCase:
    """A drawn case: run ``recipe`` on ``args`` over ``mesh`` and ``axis``."""

    mesh: Mesh
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
      dtypes: dtypes to draw from; those the recipe rejects, or whose
        exact values it would take out of range (``Recipe.exact_dtypes``),
        are skipped, and so, for a recipe whose own arithmetic rounds
        (``Recipe.bitwise`` false), are those in which a comparison under the
        tolerance policy cannot fail on the drawn mesh
        (:func:`~collectives.testing.can_fail`).
      max_devices: the most devices a mesh may use.
      max_dim: the largest free size per dimension (before the recipe
        multiplies by mesh axis sizes).
      ndim: how many free sizes to draw (the recipe decides the rank).
    """
    usable = [d for d in dtypes if recipe.draws_exact(d)]
    if not usable:
        raise ValueError(
            f"recipe {recipe.name!r}: dtypes={tuple(dtypes)} holds none it accepts "
            f"with exact values (dtype_kinds={sorted(recipe.dtype_kinds)}, "
            f"exact_dtypes={recipe.exact_dtypes and sorted(recipe.exact_dtypes)}). "
            "Fix: pass one of those.")
    limit = jax.device_count() if max_devices is None else max_devices
    candidates = [
        (mesh, axis, dtype)
        for shape in MESH_SHAPES if int(np.prod(shape)) <= limit
        for mesh in [cached_mesh(shape)]
        for axis in axis_options(mesh)
        for axes in [recipe.axes(mesh, axis)]
        if recipe.unsupported_reason(axes) is None
        for dtype in usable
        if recipe.bitwise or can_fail(dtype, recipe.n_terms(axes))]
    if not candidates:
        raise ValueError(
            f"recipe {recipe.name!r} runs on none of the meshes {MESH_SHAPES} "
            f"within {limit} devices in dtypes={tuple(usable)} with a tolerance "
            "that can fail. Fix: a wider float dtype, or more devices.")
    mesh, axis, dtype = draw(st.sampled_from(candidates))
    count = draw(st.sampled_from(list(ndim)))
    dims = tuple(draw(st.integers(1, max_dim)) for _ in range(max(count, 1)))
    axes = recipe.axes(mesh, axis)
    shapes = recipe.example_shapes(axes, dims)
    args = tuple(jax.tree_util.tree_map(
        lambda shape: exact_values(draw, shape, dtype), tree, is_leaf=is_shape)
        for tree in shapes)
    return RecipeCase(mesh=mesh, axis=axis, dtype=dtype, args=args)
