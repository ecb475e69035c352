"""pmap's view of a recipe's arguments and outputs.

``jax.pmap`` maps over a leading device axis: a global array sharded by a
``PartitionSpec`` becomes ``(*mesh.shape, *block)`` stacked blocks, and its
outputs come back the same way. These helpers convert a recipe's global-view
arguments to that stacked view (fully replicated leaves stay as they are,
for ``in_axes=None``) and its outputs back, checking that outputs declared
replicated really are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives import _layout
from collectives._arrays import canonical
from collectives._layout import Axes

if TYPE_CHECKING:
    from collectives._recipe import Recipe


def map_leaves(arg: Any, spec: Any, fn: Callable[[Any, P, str], Any],
               what: str) -> Any:
    """``fn(leaf, leaf_spec, where)`` over one argument's leaves, tree kept."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(arg)
    specs = _layout.leaf_specs(spec, arg, what)
    return treedef.unflatten([
        fn(leaf, leaf_spec, what + jax.tree_util.keystr(path))
        for (path, leaf), leaf_spec in zip(pairs, specs, strict=True)])


def stack_args(recipe: Recipe, axes: Axes, args: Sequence[Any],
               stack_leaf: Callable[[Any, P], Any] | None = None) -> list[Any]:
    """The arguments in pmap's stacked view (``(*mesh.shape, *block)`` leaves,
    fully replicated leaves as they are, for ``in_axes=None``)."""
    if stack_leaf is None:
        stack_leaf = functools.partial(_stack_leaf, mesh=axes.mesh)
    return [map_leaves(arg, spec, lambda leaf, s, _: stack_leaf(leaf, s),
                        f"{recipe.name}: argument {name}")
            for arg, spec, name in zip(args, recipe.in_specs(axes), recipe.arg_names,
                                       strict=True)]


def unstack_outputs(recipe: Recipe, axes: Axes, out: Any, label: str,
                    host: Callable[[Any, P], np.ndarray] | None = None) -> Any:
    """Stacked outputs back to the global view, checking declared replication.

    ``host(leaf, spec)`` brings a leaf to the host as the full stacked array
    (default ``np.asarray``); ``label`` names the form in error messages.
    """
    leaves, treedef = jax.tree_util.tree_flatten(out)
    specs = _layout.leaf_specs(recipe.out_specs(axes), out, f"{recipe.name} outputs")
    results = []
    for index, (leaf, spec) in enumerate(zip(leaves, specs, strict=True)):
        describe = functools.partial("{}: {} output {} of {}".format, recipe.name,
                                     label, index, len(leaves))
        stacked = np.asarray(leaf) if host is None else host(leaf, spec)
        results.append(_layout.from_stacked(stacked, axes.mesh, spec, describe))
    return treedef.unflatten(results)


def _replicated(spec: P) -> bool:
    return all(entry is None for entry in spec)


def _stack_leaf(leaf: Any, spec: P, mesh: jax.sharding.Mesh) -> np.ndarray:
    """pmap's view of one input: stacked, or as is when fully replicated."""
    host = canonical(leaf)
    return host if _replicated(spec) else _layout.to_stacked(host, mesh, spec)


def stacked_in_axes(recipe: Recipe, axes: Axes) -> tuple[Any, ...]:
    """``in_axes`` for :func:`stack_args`'s output: 0, or None where replicated."""
    return tuple(
        jax.tree_util.tree_map(lambda s: None if _replicated(s) else 0, spec,
                               is_leaf=lambda s: isinstance(s, P))
        for spec in recipe.in_specs(axes))
