"""Which devices a compiled collective joins, and so which mesh axes it spans.

XLA prints a collective's groups in three ways: explicit device ids
(``replica_groups={{0,2},{1,3}}``, and a permute's
``source_target_pairs={{0,1},{1,0}}``), an iota
(``replica_groups=[4,2]<=[2,4]T(1,0)``: ``arange(8).reshape(2, 4)``
transposed, then cut into 4 groups of 2) and, on newer JAX, mesh axis names
(``replica_groups=mesh['i'=4,'j'=2]{'i'}``). Partition ``k`` of a program
compiled for a mesh is the mesh's ``k``-th device in row-major order, so
the axes along which a group's ids vary are the axes the collective runs over.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\][^{,]*\{([^}]*)\}")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


def parse_groups(attrs: str
                 ) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """``(groups, axis names)`` of one collective's attributes: the groups
    as device ids (a permute's source-target pairs), or, where XLA names the
    mesh axes, those names and no ids. ``((), ())``: every device."""
    match = _MESH.search(attrs)
    if match:
        return (), tuple(re.findall(r"'([^']+)'", match.group(2)))
    match = _IOTA.search(attrs)
    if match:
        count, size = int(match.group(1)), int(match.group(2))
        dims = [int(d) for d in match.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if match.group(4):
            ids = ids.transpose([int(p) for p in match.group(4).split(",")])
        groups = ids.reshape(count, size)
        return tuple(tuple(int(d) for d in row) for row in groups), ()
    start = attrs.find("source_target_pairs=")
    if start >= 0:
        end = attrs.find("}}", start)
        pairs = _PAIR.findall(attrs[start:end + 2])
        return tuple((int(a), int(b)) for a, b in pairs), ()
    start = attrs.find("replica_groups={")
    if start >= 0:
        end = attrs.find("}}", start)
        body = attrs[start + len("replica_groups={"):end + 1]
        groups = re.findall(r"\{([^}]*)\}", body)
        return tuple(tuple(int(d) for d in g.split(",") if d.strip())
                     for g in groups if g.strip()), ()
    return (), ()


def spanned_axes(groups: Sequence[Sequence[int]], axis_names: Sequence[str],
                 mesh_names: Sequence[str], mesh_shape: Sequence[int]
                 ) -> tuple[str, ...]:
    """The mesh axes, in mesh order, along which a collective's devices differ.

    Args:
      groups, axis_names: as :func:`parse_groups` returns them.
      mesh_names, mesh_shape: the mesh the program was compiled for.

    Examples:
      >>> from collectives._hlo_groups import spanned_axes
      >>> spanned_axes([(0, 2, 4, 6)], (), ("i", "j"), (4, 2))
      ('i',)
      >>> spanned_axes([(0, 1), (1, 0)], (), ("i", "j"), (4, 2))
      ('j',)
      >>> spanned_axes((), (), ("i", "j"), (4, 2))  # every device
      ('i', 'j')
    """
    if axis_names:
        return tuple(name for name in mesh_names if name in axis_names)
    if not groups:
        return tuple(name for name, size in zip(mesh_names, mesh_shape, strict=True)
                     if size > 1)
    varies = np.zeros(len(mesh_shape), bool)
    for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group), tuple(mesh_shape)))
        varies |= (coords != coords[:, :1]).any(axis=1)
    return tuple(name for name, v in zip(mesh_names, varies, strict=True) if v)
