"""vmap batching: named ``vmap`` axes take part in collectives like mesh axes.

``jax.vmap(f, axis_name="b")`` gives the mapped axis a name that ``lax.psum``,
``lax.axis_index`` and friends accept, so the same body runs

* on one device, every mesh axis a named ``vmap`` (:func:`vmap_axes`,
  :func:`vmap_form`): a device-free twin of pmap and shard_map;
* as ``pmap(vmap(f))``, the legacy spelling of a 2-D mesh;
* inside a shard_map body over a per-device batch, where one collective can
  reduce over a mesh axis and the vmapped axis at once (``vmap_psum``,
  ``vmap_center``).

A sharp edge: with ``check_vma=True`` (the default) shard_map rejects any
collective over a vmapped axis in its body (JAX 0.8 to 0.12 raise a
``ValueError`` or an ``AssertionError`` from the varying-axes check), so the
two recipes here run with ``check_vma=False``. Collectives over mesh axes
inside a ``vmap`` in the body are fine either way.

The bodies, global programs and NumPy oracles, and the nested ``vmap`` of
:func:`vmap_axes`, are ``recipes/vmap_batching.py``'s; this module adds the
facts the library needs about them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from collectives import _stacked
from collectives._costs import fixed
from collectives._layout import Axes
from collectives._layout import AxisArg
from collectives._layout import axis_tuple
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import vmap_batching as file

EXAMPLE_AXIS = file.EXAMPLE
"""The name the batching recipes give their per-device ``vmap`` axis."""


def vmap_axes(fn: Callable[..., Any], axis_names: str | Sequence[str], *,
              in_axes: Any = 0, out_axes: Any = 0) -> Callable[..., Any]:
    """``fn`` mapped with one named ``jax.vmap`` per axis, the first outermost.

    The result takes arrays stacked as ``[size_0, size_1, ..., *block]`` and
    runs ``fn`` on every block with ``lax`` collectives over the names
    working as over mesh axes: ``vmap_axes(body, ("i", "j"))`` on one device
    computes what ``jax.pmap(jax.vmap(body, axis_name="j"), axis_name="i")``
    computes on ``size_i`` devices.

    Args:
      fn: the per-block function.
      axis_names: one axis name or a sequence of them (outermost first).
      in_axes, out_axes: as for ``jax.vmap``, the same at every level.

    Returns:
      The mapped function.

    Raises:
      ValueError: ``axis_names`` is empty or names an axis twice.

    Examples:
      >>> import numpy as np
      >>> from jax import lax
      >>> import collectives as cx
      >>> f = cx.vmap_axes(lambda x: lax.psum(x, ("i", "j")), ("i", "j"))
      >>> np.asarray(f(np.arange(6.0).reshape(2, 3))).tolist()
      [[15.0, 15.0, 15.0], [15.0, 15.0, 15.0]]
      >>> g = cx.vmap_axes(lambda x: lax.axis_index(("i", "j")), ("i", "j"))
      >>> np.asarray(g(np.zeros((2, 3)))).tolist()
      [[0, 1, 2], [3, 4, 5]]
    """
    names = axis_tuple(axis_names)
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"axis_names: expected distinct axis names, got {axis_names!r}. Fix: "
            "name each mapped axis once, e.g. ('i', 'j').")
    return file.vmap_axes(fn, names, in_axes=in_axes, out_axes=out_axes)


def vmap_form(recipe: Recipe, *args: Any, mesh: jax.sharding.Mesh | None = None,
              axis: AxisArg = None) -> Any:
    """Run a recipe's body on ONE device, every mesh axis a named ``vmap``.

    A fourth form besides pmap, shard_map and jit: global view in and out,
    outputs declared replicated are checked copy by copy (as in the pmap
    form), and everything runs on the default device; the mesh only gives
    the axis names and sizes. It runs the recipe's pmap body, which is
    written for vmapped mesh axes.

    Args:
      recipe: the recipe whose body to run.
      *args: its global-view arguments.
      mesh, axis: as for the other forms.

    Returns:
      The outputs, global view, as the other forms return them.

    Raises:
      ReplicationError: an output declared replicated differs between copies.

    Examples:
      >>> import numpy as np
      >>> import collectives as cx
      >>> x = np.arange(16.0).reshape(8, 2)
      >>> r = cx.RECIPES["psum"]
      >>> got = cx.vmap_form(r, x, mesh=cx.make_mesh((4, 2), ("i", "j")))
      >>> bool(np.array_equal(got, r.reference(x)))
      True
    """
    axes = recipe.validated_axes(args, mesh, axis)
    out = _vmap_callable(recipe, axes)(*_stacked.stack_args(recipe, axes, args))
    return jax.tree_util.tree_map(
        jnp.asarray, _stacked.unstack_outputs(recipe, axes, out, "vmap"))


@functools.cache
def _vmap_callable(recipe: Recipe, axes: Axes) -> Callable[..., Any]:
    body = functools.partial(recipe.pmap_body or recipe.body, axis=axes.axis)
    return jax.jit(vmap_axes(body, tuple(axes.mesh.axis_names),
                             in_axes=_stacked.stacked_in_axes(recipe, axes)))


def _unsupported_reason(axes: Axes) -> str | None:
    if EXAMPLE_AXIS in axes.mesh.axis_names:
        return (f"the recipe names its vmap axis {EXAMPLE_AXIS!r}, which the mesh "
                "already uses; rename the mesh axis")
    return None


def _rows_terms(axes: Axes) -> int:
    # One rounding per row added: n devices times k rows, k <= 4 in the
    # example shapes; pass n_terms= to assert_forms_agree for taller blocks.
    return 4 * axes.size + 2


_COMMON = dict(
    in_specs=one_input(rows_on_axes),
    example_shapes=one_grid, n_terms=_rows_terms,
    unsupported_reason=_unsupported_reason,
    # Collectives over a vmapped axis fail shard_map's varying-axes check on
    # JAX 0.8-0.12 (see the module docstring); the pmap form checks the
    # replicated outputs copy by copy instead.
    check_vma=False)

vmap_psum = register(Recipe(
    name="vmap_psum",
    recipe_file="vmap_batching.py", cost_model=fixed({"all-reduce": 1}),
    summary="one psum over the device axes and a vmapped batch axis at once",
    # x: [k, m] on each device -> [m], the sum of every row of every device
    body=file.vmap_psum_body, program=on_axes(file.vmap_psum_program),
    explicit_program=on_axes(file.vmap_psum_explicit_program),
    oracle=on_axes(file.vmap_psum_numpy),
    out_specs=lambda axes: make_spec(axes.others_entry),
    dtype_kinds=frozenset({"float", "int"}), **_COMMON))

vmap_center = register(Recipe(
    name="vmap_center",
    recipe_file="vmap_batching.py", cost_model=fixed({"all-reduce": 1}),
    summary="each row minus the mean row over devices and a vmapped batch axis",
    # x: [k, m] on each device -> [k, m], each row minus the global mean row
    body=file.vmap_center_body, program=on_axes(file.vmap_center_program),
    explicit_program=on_axes(file.vmap_center_explicit_program),
    oracle=on_axes(file.vmap_center_numpy),
    out_specs=rows_on_axes,
    dtype_kinds=frozenset({"float"}), **_COMMON))
