"""Where the data lives: collective axes, partition specs, pmap's stacked layout.

All three forms take and return global-view arrays. This module validates
global arrays against their ``PartitionSpec`` and converts between the global
view and pmap's stacked view ``(*mesh.shape, *block)``; converting back checks
that outputs declared replicated really hold one value on every device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _compat
from collectives._arrays import bitwise_differs

AxisArg = str | Sequence[str] | None


class ReplicationError(ValueError):
    """An output declared replicated differs between device copies."""


def spec_entry(names: Sequence[str]) -> str | tuple[str, ...] | None:
    """The ``PartitionSpec`` entry that shards one dimension over ``names``."""
    names = tuple(names)
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def spec_axes(spec: P, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes that shard each of ``ndim`` dimensions under ``spec``."""
    out: list[tuple[str, ...]] = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        else:
            out.append(tuple(entry))
    return out


@dataclasses.dataclass(frozen=True)
class Axes:
    """The mesh axes a recipe's collectives act on, and the rest of the mesh.

    Attributes:
      mesh: the device mesh.
      names: the collective axes, in the order given (it fixes the order of
        gathered blocks when there are several).
      others: the other mesh axes, in mesh order; recipes shard a
        batch-like dimension over them, so every device holds a different
        block.

    ``entry`` and ``others_entry`` are the ``PartitionSpec`` entries of a
    dimension sharded over ``names`` and over ``others``:
    ``P(axes.entry, axes.others_entry)`` splits rows over the collective axes
    and columns over the rest of the mesh (``rows_on_axes`` in this module).
    """

    mesh: Mesh
    names: tuple[str, ...]
    others: tuple[str, ...]

    @property
    def axis(self) -> str | tuple[str, ...]:
        """The ``axis_name`` argument for ``lax`` collectives."""
        return self.names[0] if len(self.names) == 1 else self.names

    @property
    def size(self) -> int:
        """How many devices the collective spans (``lax.axis_size(axis)``)."""
        return math.prod(self.mesh.shape[n] for n in self.names)

    @property
    def others_size(self) -> int:
        """How many devices the other mesh axes span together."""
        return math.prod(self.mesh.shape[n] for n in self.others)

    @property
    def entry(self) -> str | tuple[str, ...] | None:
        """Spec entry for a dimension sharded over the collective axes."""
        return spec_entry(self.names)

    @property
    def others_entry(self) -> str | tuple[str, ...] | None:
        """Spec entry for a dimension sharded over the other mesh axes."""
        return spec_entry(self.others)


def resolve_axes(mesh: Mesh, axis: AxisArg) -> Axes:
    """Check ``axis`` against ``mesh``; ``None`` means every mesh axis."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh: expected a jax.sharding.Mesh (e.g. collectives.make_mesh((8,), "
            f"'i')), got {mesh!r} of type {type(mesh).__name__}."
        )
    mesh_names = tuple(mesh.axis_names)
    if axis is None:
        names = mesh_names
    elif isinstance(axis, str):
        names = (axis,)
    else:
        try:
            names = tuple(axis)
        except TypeError:
            raise TypeError(
                f"axis: expected a mesh axis name or a tuple of them, got {axis!r}."
            ) from None
    if not names:
        raise ValueError(
            "axis=(): a collective needs at least one mesh axis. Fix: pass one of "
            f"the mesh's axis names {mesh_names}, or None for all of them."
        )
    for name in names:
        if not isinstance(name, str) or name not in mesh_names:
            raise ValueError(
                f"axis: {name!r} is not an axis of the mesh; its axes are "
                f"{mesh_names}. Fix: pass one of those names (or a tuple of them)."
            )
    if len(set(names)) != len(names):
        raise ValueError(
            f"axis={names}: an axis name appears twice. Fix: name each mesh axis "
            "once."
        )
    rest = tuple(n for n in mesh_names if n not in names)
    return Axes(mesh=mesh, names=names, others=rest)


def shape_dtype(x: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of an array-like without moving device data to host."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return tuple(x.shape), np.dtype(x.dtype)
    arr = np.asarray(x)
    return arr.shape, arr.dtype


def check_against_spec(what: str, x: Any, spec: P, mesh: Mesh) -> None:
    """Raise a clear error unless ``spec`` can shard ``x`` over ``mesh``."""
    shape, dtype = shape_dtype(x)
    if dtype == np.dtype(object):
        raise TypeError(
            f"{what}: expected a numeric array, got {type(x).__name__} with dtype "
            "object. Fix: pass a NumPy or JAX array."
        )
    if len(spec) > len(shape):
        raise ValueError(
            f"{what}: its PartitionSpec {spec} names {len(spec)} dimensions, but the "
            f"array has shape {shape} ({len(shape)} dimensions). Fix: give the "
            f"array at least {len(spec)} dimensions or shorten the spec."
        )
    mesh_names = tuple(mesh.axis_names)
    for d, names in enumerate(spec_axes(spec, len(shape))):
        for name in names:
            if name not in mesh_names:
                raise ValueError(
                    f"{what}: PartitionSpec {spec} names axis {name!r}, which is "
                    f"not in the mesh; its axes are {mesh_names}."
                )
        parts = math.prod(mesh.shape[n] for n in names)
        if shape[d] % parts:
            multiple = max(parts, shape[d] // parts * parts)
            raise ValueError(
                f"{what}: dimension {d} has size {shape[d]}, which must be divisible "
                f"by {parts} (the size of mesh axes {names}) to shard it as "
                f"{spec}. Fix: pad or trim dimension {d} to a multiple of {parts} "
                f"(e.g. {multiple})."
            )


def leaf_specs(specs: Any, tree: Any, what: str) -> list[P]:
    """One spec per leaf of ``tree``; ``specs`` is a tree prefix of it."""
    is_spec = lambda s: isinstance(s, P)
    try:
        full = jax.tree_util.tree_map(
            lambda spec, sub: jax.tree_util.tree_map(lambda _: spec, sub),
            specs, tree, is_leaf=is_spec)
    except (ValueError, TypeError) as err:
        structure = jax.tree_util.tree_structure(specs, is_leaf=is_spec)
        raise ValueError(
            f"{what}: the arguments' pytree structure "
            f"{jax.tree_util.tree_structure(tree)} does not match the specs "
            f"{structure}. Fix: pass arguments shaped like the specs (the specs "
            f"may be a prefix of the arguments). ({err})"
        ) from None
    return jax.tree_util.tree_leaves(full, is_leaf=is_spec)


def shardings(mesh: Mesh, specs: Any) -> Any:
    """The ``NamedSharding`` tree for a tree of specs."""
    return jax.tree_util.tree_map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


def to_stacked(x: np.ndarray, mesh: Mesh, spec: P) -> np.ndarray:
    """Global array -> pmap's stacked layout ``(*mesh.shape, *block)``.

    Mesh axes that ``spec`` does not name are broadcast: every device along
    them gets a copy of the same block.
    """
    mesh_names = tuple(mesh.axis_names)
    dims = spec_axes(spec, x.ndim)
    split_shape: list[int] = []
    labels: list[Any] = []
    for d, names in enumerate(dims):
        parts = math.prod(mesh.shape[n] for n in names)
        split_shape += [mesh.shape[n] for n in names] + [x.shape[d] // parts]
        labels += [*names, ("block", d)]
    y = x.reshape(split_shape)
    present = [n for n in mesh_names if n in labels]
    perm = [labels.index(n) for n in present]
    perm += [i for i, label in enumerate(labels) if isinstance(label, tuple)]
    y = y.transpose(perm)
    for pos, name in enumerate(mesh_names):
        if name not in present:
            y = np.expand_dims(y, pos)
    mesh_shape = tuple(mesh.shape[n] for n in mesh_names)
    return np.broadcast_to(y, mesh_shape + y.shape[len(mesh_names):])


def _first_difference(y: np.ndarray, pos: int) -> tuple[int, tuple[int, ...]] | None:
    """(copy, index) of the first copy along ``pos`` that differs bitwise."""
    differs = bitwise_differs(y, np.take(y, [0], axis=pos))
    if not differs.any():
        return None
    where = tuple(int(i) for i in np.argwhere(differs)[0])
    return where[pos], where


def from_stacked(
    y: np.ndarray, mesh: Mesh, spec: P, describe: Callable[[], str]
) -> np.ndarray:
    """pmap's stacked layout -> global array, checking declared replication.

    Every mesh axis that ``spec`` does not name must hold bitwise-identical
    copies; ``describe()`` names the output for the error message.

    Raises:
      ReplicationError: copies along a replicated mesh axis differ.
    """
    mesh_names = tuple(mesh.axis_names)
    k = len(mesh_names)
    block_ndim = y.ndim - k
    dims = spec_axes(spec, block_ndim)
    used = {n for names in dims for n in names}
    for pos in reversed(range(k)):
        name = mesh_names[pos]
        if name in used:
            continue
        diff = _first_difference(y, pos)
        if diff is not None:
            copy, where = diff
            block_index = where[k:]
            first = y[(*where[:pos], 0, *where[pos + 1:])]
            raise ReplicationError(
                f"{describe()} is declared replicated over mesh axis {name!r} (out "
                f"spec {spec}), but device copies differ: copy {copy} along "
                f"{name!r} holds {y[where]!r} at block index {block_index}, copy 0 "
                f"holds {first!r}. pmap(out_axes=None) would have returned copy 0 "
                "without a word. Fix: reduce over the axis (psum/pmean) or declare "
                "the output sharded over it."
            )
        y = np.take(y, 0, axis=pos)
    present = [n for n in mesh_names if n in used]
    labels_now = present + [("block", d) for d in range(block_ndim)]
    target: list[Any] = []
    global_shape = []
    for d, names in enumerate(dims):
        target += [*names, ("block", d)]
        global_shape.append(
            y.shape[len(present) + d] * math.prod(mesh.shape[n] for n in names))
    perm = [labels_now.index(t) for t in target]
    return y.transpose(perm).reshape(global_shape)


def make_spec(*entries: Any) -> P:
    """``PartitionSpec(*entries)`` without trailing ``None`` entries.

    ``P("i", None)`` and ``P("i")`` shard the same way, but only the short form
    also fits 1-D arrays.
    """
    entries_list = list(entries)
    while entries_list and entries_list[-1] is None:
        entries_list.pop()
    return P(*entries_list)


def grid_shape(axes: Axes, dims: Sequence[int], lead: int = 1) -> tuple[int, ...]:
    """A global shape whose dim 0 splits over ``axes.names`` and dim 1 over the rest.

    Dim 0 is ``axes.size * lead * dims[0]`` (``lead`` makes each block
    divisible again, as scatters need); dim 1 is ``axes.others_size * dims[1]``;
    further ``dims`` are appended unsharded. With one entry in ``dims`` and no
    other mesh axes the shape is 1-D.
    """
    dims = tuple(dims)
    if not dims:
        raise ValueError("dims: need at least one size, got ().")
    first = axes.size * lead * dims[0]
    if len(dims) == 1:
        return (first,) if not axes.others else (first, axes.others_size)
    return (first, axes.others_size * dims[1], *dims[2:])


# -- the layouts recipes share, named once -----------------------------------
# A facts module says which one each input and output has
# (``in_specs=one_input(rows_on_axes), out_specs=rows_replicated``).


def rows_on_axes(axes: Axes) -> P:
    """Rows (dim 0) split over the collective axes, columns (dim 1) over the
    rest of the mesh: every device holds a different block."""
    return make_spec(axes.entry, axes.others_entry)


def rows_replicated(axes: Axes) -> P:
    """Whole rows on every device along the collective axes (a reduction's or
    a gather's result), columns split over the rest of the mesh."""
    return make_spec(None, axes.others_entry)


def replicated(axes: Axes) -> P:
    """The same whole array on every device."""
    return make_spec()


def one_input(layout: Callable[[Axes], P]) -> Callable[[Axes], tuple[P]]:
    """``in_specs`` of a recipe with one input laid out as ``layout``."""
    return lambda axes: (layout(axes),)


def one_grid(axes: Axes, dims: Sequence[int]) -> tuple[tuple[int, ...]]:
    """``example_shapes`` of a recipe with one :func:`grid_shape` input."""
    return (grid_shape(axes, dims),)


def one_scatter_grid(axes: Axes, dims: Sequence[int]) -> tuple[tuple[int, ...]]:
    """``example_shapes`` of a recipe with one input whose blocks split again
    into ``axes.size`` chunks (scatters, all-to-alls)."""
    return (grid_shape(axes, dims, lead=axes.size),)


def body_axis_size(axis: Any, fn: str) -> int:
    """``lax.axis_size(axis)`` inside a body, or an error naming the axes in
    scope; ``fn`` is the public function to name in the message."""
    names = axis if isinstance(axis, tuple) else (axis,)
    if not names or not all(isinstance(name, str) for name in names):
        raise TypeError(
            f"{fn}: axis must be a mesh axis name or a tuple of them, got "
            f"{axis!r}.")
    try:
        return jax.lax.axis_size(axis)
    except NameError:
        try:
            in_scope = _compat.context_mesh_axis_names()
        except Exception:  # no mesh in scope at all
            in_scope = ()
        raise ValueError(
            f"{fn}: axis {axis!r} is not bound here (mesh axes in scope: "
            f"{in_scope}). Fix: call {fn} inside a shard_map or pmap body, with "
            "axis names of its mesh (or pmap's axis_name).") from None


def axis_tuple(axis: str | Sequence[str]) -> tuple[str, ...]:
    """A collective's ``axis_name`` argument as a tuple of names."""
    return (axis,) if isinstance(axis, str) else tuple(axis)


def on_axes(fn: Callable[..., Any], *from_axes: Callable[[Axes], Any],
            **options: Any) -> Callable[..., Any]:
    """A recipe file's function as a recipe's ``program``, ``oracle`` or
    ``magnitudes``, ``fn(*arrays, axes=...)``.

    The file's functions take plain parameters; this passes them: first the
    arrays, then one positional value per ``from_axes`` getter (computed
    from the :class:`Axes`), then ``options`` and any keywords of the call.
    The result keeps ``fn`` as its ``__wrapped__``, so ``python -m
    collectives show`` and the tests find the file's function.

    Examples:
      >>> import numpy as np
      >>> import collectives as cx
      >>> from collectives._layout import on_axes
      >>> def total(x, n, scale=1):  # a recipe file's global program
      ...     return scale * x.reshape(n, -1).sum(0)
      >>> program = on_axes(total, lambda axes: axes.size, scale=2)
      >>> axes = cx.RECIPES["psum"].axes(cx.make_mesh((8,), "i"))
      >>> program(np.arange(16), axes=axes).tolist()
      [112, 128]
    """
    @functools.wraps(fn)
    def adapted(*arrays: Any, axes: Axes, **more: Any) -> Any:
        return fn(*arrays, *(get(axes) for get in from_axes), **options, **more)
    return adapted


def by_axis_size(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``on_axes(fn, ...)`` passing ``n``, how many devices the collective
    axes span (``axes.size``): for a file's ``fn(*arrays, n)``."""
    return on_axes(fn, _axis_size, **options)


def on_mesh(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``on_axes(fn, ...)`` passing the mesh and the spec entry of the
    collective axes: for a file's ``fn(*arrays, mesh, axis)``."""
    return on_axes(fn, _mesh_of, _entry_of, **options)


def with_options(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``fn`` with keyword options fixed (a body's ``causal=True``), still
    ``fn`` to ``inspect.unwrap``."""
    @functools.wraps(fn)
    def bound(*args: Any, **more: Any) -> Any:
        return fn(*args, **options, **more)
    return bound


def _axis_size(axes: Axes) -> int:
    return axes.size


def _mesh_of(axes: Axes) -> Mesh:
    return axes.mesh


def _entry_of(axes: Axes) -> str | tuple[str, ...] | None:
    return axes.entry
