"""The point-to-point recipe ``ppermute_ring``, and the body utilities
:func:`permute` and :func:`ring_shift`.

``lax.ppermute`` sends each device's block to one other device. Two rules
users trip on: a device that no pair sends to receives zeros, and a
permutation may not repeat a source or a destination.

The bodies, global programs, NumPy oracles and the permutation logic of
:func:`permute` and :func:`ring_shift` are ``recipes/ppermute.py``'s; this
module adds the argument checks of the public utilities and the facts the
library needs about the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np
from jax import lax

from collectives._costs import one_collective
from collectives._layout import body_axis_size
from collectives._layout import by_axis_size
from collectives._layout import one_grid
from collectives._layout import one_input
from collectives._layout import rows_on_axes
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import ppermute as file


def check_permutation(perm: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Validate ``(source, destination)`` pairs for a ``ppermute`` over ``n`` devices.

    Args:
      perm: pairs of device indices along the axis.
      n: the axis size.

    Returns:
      The pairs as a list of int tuples.

    Raises:
      TypeError: ``perm`` is not a sequence of pairs of ints, or ``n`` is not
        an int.
      ValueError: an index is out of ``range(n)``, a source or a
        destination appears twice, or ``n`` is smaller than 1.

    Examples:
      >>> from collectives import check_permutation
      >>> check_permutation([(0, 1), (1, 0)], 2)
      [(0, 1), (1, 0)]
      >>> check_permutation([(0, 1), (1, 1)], 2)
      Traceback (most recent call last):
      ...
      ValueError: perm: destination 1 appears twice in [(0, 1), (1, 1)]; ...
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(
            f"n: the axis size must be an int, got {n!r} of type "
            f"{type(n).__name__}. Fix: pass lax.axis_size(axis) or the mesh axis "
            "size.")
    if n < 1:
        raise ValueError(
            f"n: the axis size must be at least 1, got {n}. Fix: pass "
            "lax.axis_size(axis) or the mesh axis size.")
    if isinstance(perm, (str, bytes, Mapping)) or not isinstance(
            perm, (Sequence, np.ndarray)):
        raise TypeError(
            f"perm: expected a sequence of (source, destination) pairs, got "
            f"{perm!r} of type {type(perm).__name__}. Fix: pass e.g. "
            f"[(0, 1), (1, 0)].")
    pairs = []
    for pair in perm:
        try:
            src, dst = pair
        except (TypeError, ValueError):
            raise TypeError(
                f"perm: every entry must be a (source, destination) pair, got "
                f"{pair!r} in {list(perm)!r}.") from None
        for value in (src, dst):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(
                    f"perm: device indices must be ints, got {value!r} in {pair!r}.")
            if not 0 <= value < n:
                raise ValueError(
                    f"perm: index {value} in {tuple(pair)!r} is out of range for an "
                    f"axis of {n} devices. Fix: use indices 0..{n - 1}.")
        pairs.append((int(src), int(dst)))
    for position, role in ((0, "source"), (1, "destination")):
        seen: set[int] = set()
        for pair in pairs:
            if pair[position] in seen:
                raise ValueError(
                    f"perm: {role} {pair[position]} appears twice in {pairs}; "
                    "ppermute sends each block to one device and each device "
                    "receives at most one block. Fix: list every device at most "
                    f"once as a {role}.")
            seen.add(pair[position])
    return pairs


def permute(x, axis, perm: Sequence[tuple[int, int]]):
    """``lax.ppermute`` with the permutation checked first; call inside a body.

    Devices that no pair sends to receive zeros, as in ``lax.ppermute``.

    Args:
      x: the block on this device (any pytree of arrays).
      axis: the mesh axis name, or a tuple of them; indices then run over the
        axes together, the first one major, as ``lax.axis_index(axis)`` counts
        (whatever the mesh's own axis order).
      perm: ``(source, destination)`` pairs of indices along ``axis``.

    Returns:
      The block received from the device whose pair names this one.

    Raises:
      ValueError: see :func:`check_permutation`; or ``axis`` is not bound
        (not an axis of the enclosing shard_map/pmap, or called outside one).
      TypeError: see :func:`check_permutation`.
    """
    pairs = check_permutation(perm, body_axis_size(axis, "permute"))
    return file.permute(x, axis, pairs)


def ring_shift(x, axis, shift: int = 1):
    """Send each block ``shift`` places along a ring; call inside a body.

    Device ``d`` receives the block of device ``(d - shift) % n``, so
    ``ring_shift(ring_shift(x, a, k), a, -k) == x``.

    Args:
      x: the block on this device (any pytree of arrays).
      axis: the mesh axis name, or a tuple of them.
      shift: how many places to move, negative for the other direction.

    Returns:
      The block from ``shift`` places back along the ring.

    Raises:
      TypeError: ``shift`` is not an int.
      ValueError: ``axis`` is not bound (not an axis of the enclosing
        shard_map/pmap, or called outside one).

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((8,), "i")
      >>> f = jax.shard_map(lambda x: cx.ring_shift(x, "i", 1), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P("i"))
      >>> np.asarray(f(np.arange(8))).tolist()
      [7, 0, 1, 2, 3, 4, 5, 6]
    """
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
        raise TypeError(f"shift: expected an int, got {shift!r}. Fix: pass a "
                        "whole number of places, e.g. 1 or -1.")
    body_axis_size(axis, "ring_shift")  # a clear error unless `axis` is bound
    return file.ring_shift(x, axis, int(shift))


ppermute_ring = register(Recipe(
    name="ppermute_ring", family="core", recipe_file="ppermute.py",
    bench=BenchSpec(
        lambda x, axis, n: lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)]),
        "collective-permute", default=True),
    diagram=DiagramSpec(),
    cost_model=one_collective("collective-permute"),
    summary="each device sends its block to the next (+1)",
    body=file.ppermute_ring_body,
    program=by_axis_size(file.ppermute_ring_program),
    oracle=by_axis_size(file.ppermute_ring_numpy), in_specs=one_input(rows_on_axes),
    out_specs=rows_on_axes, example_shapes=one_grid,
    pmap_body=file.ppermute_ring_pmap_body))
