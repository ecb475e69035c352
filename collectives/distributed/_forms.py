"""Recipe forms across processes: process-local data in, gathered results out.

In a multi-process JAX program each process feeds only the devices it owns.
Here every form of a recipe runs on a mesh that spans all processes:

* shard_map and jit: each process hands JAX the blocks of its own devices
  (:func:`place`, through ``jax.make_array_from_callback``), which assemble
  the global ``jax.Array`` whatever the sharding;
* pmap: each process passes the stacked rows of its own devices; the
  collectives still span every device of every process;
* results come back to every process with ``multihost_utils.process_allgather``
  (:func:`gather`), so they compare with the NumPy oracle as in one process.

With one process all of this reduces to the single-process forms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _arrays
from collectives import _layout
from collectives import _recipe
from collectives import _stacked
from collectives._layout import Axes
from collectives._layout import AxisArg
from collectives._recipe import FORMS
from collectives._recipe import PLACED_FORMS
from collectives._recipe import Recipe
from collectives._recipe import form_mesh
from collectives._tolerance import tolerance


def process_slice(sharding: jax.sharding.Sharding,
                  global_shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of a global array that this process's devices hold.

    This is what a process loads (or generates) itself before
    ``jax.make_array_from_process_local_data(sharding, local, global_shape)``.

    Args:
      sharding: how the global array is laid out over a mesh that may span
        several processes.
      global_shape: the shape of the global array.

    Returns:
      One ``slice`` per dimension; ``global_array[slices]`` is this process's
      data.

    Raises:
      ValueError: this process's devices hold no box-shaped part of the array
        (its blocks are not contiguous), or no part at all.

    Examples:
      >>> import jax
      >>> import collectives as cx
      >>> from collectives import distributed
      >>> mesh = cx.make_mesh((8,), "i")
      >>> rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("i"))
      >>> distributed.process_slice(rows, (16, 3))  # one process holds it all
      (slice(0, 16, None), slice(0, 3, None))
    """
    shape = tuple(int(n) for n in global_shape)
    indices = sharding.addressable_devices_indices_map(shape).values()
    blocks = {tuple(_bounds(index, shape)) for index in indices}
    if not blocks:
        raise ValueError(
            f"process {jax.process_index()} owns no device of sharding {sharding}, "
            "so it holds no part of the array. Fix: build the mesh from every "
            "process's devices (e.g. collectives.make_mesh over jax.devices()).")
    box = [(min(b[d][0] for b in blocks), max(b[d][1] for b in blocks))
           for d in range(len(shape))]
    covered = sum(math.prod(hi - lo for lo, hi in block) for block in blocks)
    if covered != math.prod(hi - lo for lo, hi in box):
        raise ValueError(
            f"process {jax.process_index()}'s devices hold blocks {sorted(blocks)} "
            f"of an array of shape {shape}, which do not form one box, so the "
            "process cannot load one contiguous slice. Fix: load each device's "
            "block (sharding.addressable_devices_indices_map(shape)) and build "
            "the array with jax.make_array_from_callback, as "
            "collectives.distributed.place does.")
    return tuple(slice(lo, hi) for lo, hi in box)


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
    return [s.indices(n)[:2] for s, n in zip(index, shape, strict=True)]


def place(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from the part of ``value`` this process's devices hold.

    ``value`` is the whole array (every process can build it, e.g. from one
    seed); JAX is handed only the blocks of this process's devices, one per
    device (``jax.make_array_from_callback``), as a process that loaded its
    own part would. Any sharding works, including those whose blocks on one
    process do not form one box (FSDP x TP over ``("i", "j")``, meshes whose
    process order differs from the axis order), where
    :func:`process_slice` has no answer.

    Args:
      value: the whole array, the same on every process.
      sharding: how the global array is laid out over a mesh that may span
        several processes.

    Returns:
      The global ``jax.Array``.

    Examples:
      >>> import jax
      >>> import numpy as np
      >>> import collectives as cx
      >>> from collectives import distributed
      >>> mesh = cx.make_mesh((4, 2), ("i", "j"))
      >>> grid = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("j", "i"))
      >>> x = distributed.place(np.arange(16.0).reshape(4, 4), grid)
      >>> x.addressable_shards[0].data.shape, float(x.sum())
      ((2, 1), 120.0)
    """
    host = _arrays.canonical(value)
    return jax.make_array_from_callback(host.shape, sharding,
                                        lambda index: host[index])


def gather(tree: Any) -> Any:
    """Every array of ``tree`` as a NumPy array on every process.

    A global array (one spanning processes) comes back whole; a process-local
    array (e.g. a pmap output) is concatenated along dim 0 in process order.
    This is ``multihost_utils.process_allgather(tree, tiled=True)``.

    Args:
      tree: a pytree of arrays.

    Returns:
      The same pytree of NumPy arrays, identical on every process.

    Examples:
      >>> import jax.numpy as jnp
      >>> from collectives import distributed
      >>> distributed.gather({"x": jnp.arange(3)})  # one process: as is
      {'x': array([0, 1, 2], dtype=int32)}
    """
    return jax.tree_util.tree_map(
        lambda leaf: np.asarray(multihost_utils.process_allgather(leaf, tiled=True)),
        tree)


def process_forms(recipe: Recipe, mesh: jax.sharding.Mesh | None = None,
                  axis: AxisArg = None) -> dict[str, Callable[..., Any]]:
    """The forms of ``recipe`` on a mesh spanning processes, and its oracle.

    Each callable takes the global NumPy arguments (the same on every
    process), hands JAX only this process's part of them, and returns global
    NumPy results on every process, like :meth:`Recipe.forms` does in one
    process. With one process they compute what :meth:`Recipe.forms` does.

    Args:
      recipe: a registered or custom :class:`~collectives.Recipe`.
      mesh: a mesh over the devices of every process (default: 1-D over
        ``jax.devices()``).
      axis: the collective axes (default: every mesh axis).

    Returns:
      ``{"pmap": f, "shard_map": f, "jit": f, "explicit": f, "reference":
      oracle}`` (``explicit`` where the recipe has that form on this mesh).

    Examples:
      >>> import numpy as np
      >>> import collectives as cx
      >>> from collectives import distributed
      >>> forms = distributed.process_forms(cx.RECIPES["psum"])
      >>> x = np.arange(16.0).reshape(8, 2)
      >>> forms["shard_map"](x)
      array([[56., 64.]], dtype=float32)
      >>> bool(np.array_equal(forms["pmap"](x), forms["reference"](x)))
      True
    """
    axes = recipe.axes(mesh, axis)  # a bad mesh or axis fails here, not at the call

    def validating(form: str) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            axes = recipe.validated_axes(args, mesh, axis)
            return bound_process_forms(recipe, axes)[form](*args)
        return run
    return {form: validating(form) for form in (*FORMS, "reference")
            if recipe.unrunnable_form(form, axes) is None}


def bound_process_forms(recipe: Recipe, axes: Axes) -> dict[str, Callable[..., Any]]:
    """:func:`process_forms` for arguments already validated for ``axes``
    (:meth:`Recipe.validated_axes`): the hook ``check`` runs across processes,
    one validation per row."""
    forms = {"pmap": functools.partial(_pmap_form, recipe, axes)}
    for form in PLACED_FORMS:
        if recipe.unrunnable_form(form, axes) is None:
            forms[form] = functools.partial(_compiled_form, recipe, form, axes)
    forms["reference"] = functools.partial(_reference, recipe, axes)
    return forms


def _reference(recipe: Recipe, axes: Axes, *args: Any) -> Any:
    return recipe.run("reference", args, axes)


def _compiled_form(recipe: Recipe, form: str, axes: Axes, *args: Any) -> Any:
    mesh = form_mesh(form, axes.mesh)  # Auto axes for jit, Explicit for explicit
    placed = tuple(
        _stacked.map_leaves(arg, spec,
                           lambda leaf, s, _: place(leaf, NamedSharding(mesh, s)),
                           f"{recipe.name}: argument {name}")
        for arg, spec, name in zip(args, recipe.in_specs(axes), recipe.arg_names,
                                   strict=True))
    return gather(recipe.compiled(form, axes)(*placed))


def _pmap_rows(mesh: jax.sharding.Mesh) -> slice:
    """The rows of pmap's device axis (the first mesh axis) this process feeds."""
    first_column = mesh.devices[(slice(None),) + (0,) * (mesh.devices.ndim - 1)]
    owners = [d.process_index for d in first_column]
    mine = [row for row, owner in enumerate(owners) if owner == jax.process_index()]
    if owners != sorted(owners) or not mine:
        raise ValueError(
            f"the pmap form across processes maps the first mesh axis "
            f"{mesh.axis_names[0]!r}, whose devices belong to processes {owners}; "
            "every process needs at least one of them, in process order. Fix: "
            "build the mesh from jax.devices() in order (collectives.make_mesh does) "
            "with the first axis spanning the processes.")
    return slice(mine[0], mine[-1] + 1)


def _pmap_form(recipe: Recipe, axes: Axes, *args: Any) -> Any:
    rows = _pmap_rows(axes.mesh)

    def local_stack(leaf: Any, spec: P) -> np.ndarray:
        # leaf: the global array -> this process's rows of pmap's stacked view
        host = _arrays.canonical(leaf)
        if all(entry is None for entry in spec):
            return host  # replicated: pmap's in_axes=None
        return _layout.to_stacked(host, axes.mesh, spec)[rows]

    def gathered(leaf: Any, spec: P) -> np.ndarray:
        # leaf: [rows on this process, ...] -> [every row, ...]
        return _align_copies(gather(leaf), axes.mesh, spec, recipe.n_terms(axes))

    stacked = _stacked.stack_args(recipe, axes, args, local_stack)
    out = _recipe.pmap_callable(recipe, axes)(*stacked)
    return _stacked.unstack_outputs(recipe, axes, out, "pmap", host=gathered)


def _align_copies(y: np.ndarray, mesh: jax.sharding.Mesh, spec: P,
                  n_terms: int) -> np.ndarray:
    """Copy 0 along each mesh axis ``spec`` replicates over, where the copies
    agree within the tolerance; as is where they do not.

    gloo's all-reduce sums different chunks of one buffer in different orders,
    so copies of a replicated float that pmap computes in different ``vmap``
    lanes may differ in the last bits across processes. Copies that really
    differ stay, and ``from_stacked`` reports them.
    """
    k = len(mesh.axis_names)
    used = {n for names in _layout.spec_axes(spec, y.ndim - k) for n in names}
    rtol, atol = tolerance(y.dtype, n_terms)
    if rtol == 0 and atol == 0:
        return y  # exact: the bitwise check applies as in one process
    finite = np.abs(y[np.isfinite(y)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    for pos, name in enumerate(mesh.axis_names):
        if name in used:
            continue
        first = np.take(y, [0], axis=pos)
        if np.isclose(y, first, rtol=rtol, atol=atol * scale, equal_nan=True).all():
            y = np.broadcast_to(first, y.shape)
    return y
