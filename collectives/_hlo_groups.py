"""Which devices a compiled collective joins, and so which mesh axes it spans.

XLA prints a collective's groups in one of four ways, each read here into
the groups' device ids (partition numbers). Which release prints which, for
the programs of ``tools/hlo_samples.py`` (``tests/data/hlo`` holds them):

* explicit ids, ``replica_groups={{0,2,4,6},{1,3,5,7}}`` (``{}``: one group
  of every device): ``shard_map`` collectives on JAX 0.8.0 to 0.10.2;
* a permute's pairs, ``source_target_pairs={{0,2},{2,4},...}``: every
  ``ppermute``, on every release;
* an iota, ``replica_groups=[4,2]<=[2,4]T(1,0)``: ``arange(8)`` reshaped to
  ``(2, 4)``, transposed, then cut into 4 groups of 2: ``jit`` programs
  (Auto or Explicit axes) on 0.8.0 to 0.9.2;
* a mesh: the printed mesh's axes, its device order where that is not
  row-major, and the axes a group spans in braces. ``jit`` programs on
  0.10.0 to 0.11.1 print XLA's own mesh,
  ``replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4],
  device_ids=([4,2]T(1,0)) {'axis_0'}`` (a sum over the second axis of a
  ``(4, 2)`` mesh); ``shard_map`` from 0.11.0 and ``jit`` from 0.11.2 print
  the program's, ``replica_groups=mesh['data'=4,'model'=2] {'data'}``.

XLA's own mesh names its axes ``axis_0``, ``axis_1``... whatever the program
calls them, splits and merges them and adds size-1 axes, so the printed
names are never matched against the mesh's: the device array of the printed
mesh (``arange``, or the order ``device_ids=`` gives, as an iota or a list)
is cut into groups along the braced axes (``{}``: groups of one device;
``'a':(2)2``: the sub-axis of size 2 after the leading 2 of axis ``a``),
and those groups are compared with the program's mesh. Partition ``k`` of a
program compiled for a mesh is the mesh's ``k``-th device in row-major
order (whatever the device ids), so the axes along which a group's ids vary
are the axes the collective runs over.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

import numpy as np

_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]"
                   r"(?:\s*,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}")
_MESH_AXIS = re.compile(r"'?([^'=,\s]+)'?\s*=\s*(\d+)")
_GROUP_AXIS = re.compile(r"'?([^':,\s]+)'?(?:\s*:\s*\((\d+)\)\s*(\d+))?")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_IOTA_IDS = re.compile(r"^\s*(?:\[[\d,]+\]<=)?\[([\d,]+)\](?:T\(([\d,]+)\))?\s*$")
_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")

Groups = tuple[tuple[int, ...], ...]


def parse_groups(attrs: str) -> tuple[Groups, tuple[str, ...]]:
    """The device groups of one collective, from its HLO attributes.

    Args:
      attrs: the instruction's text after its operands (or the whole line).

    Returns:
      ``(groups, names)``: ``groups`` the device ids of each replica group
      (a permute's source-target pairs), ``()`` where the group is every
      device; ``names`` is always ``()``: the mesh form's axis names are
      XLA's own, read only to find the braced axes in the printed mesh.

    Raises:
      ValueError: a mesh form that does not describe a mesh (an axis in the
        braces that the mesh lacks, device ids that are not a permutation).

    Examples:
      >>> from collectives._hlo_groups import parse_groups
      >>> parse_groups("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}")[0]
      ((0, 4), (1, 5), (2, 6), (3, 7))
      >>> parse_groups("replica_groups=mesh['axis_0'=2,'axis_1'=4], "
      ...              "device_ids=([4,2]T(1,0)) {'axis_0'}, to_apply=%add")[0]
      ((0, 1), (2, 3), (4, 5), (6, 7))
      >>> parse_groups("replica_groups=mesh['X'=4,'Y'=2] {'X'}")
      (((0, 2, 4, 6), (1, 3, 5, 7)), ())
      >>> parse_groups("source_target_pairs={{0,1},{1,0}}")
      (((0, 1), (1, 0)), ())
      >>> parse_groups("replica_groups={}, to_apply=%add")  # every device
      ((), ())
    """
    match = _MESH.search(attrs)
    if match:
        return _mesh_groups(*match.groups()), ()
    match = _IOTA.search(attrs)
    if match:
        count, size = int(match.group(1)), int(match.group(2))
        ids = _iota(_ints(match.group(3)), _ints(match.group(4)))
        return _rows(ids.reshape(count, size)), ()
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


def _ints(text: str | None) -> list[int]:
    return [int(d) for d in text.split(",") if d.strip()] if text else []


def _iota(dims: Sequence[int], perm: Sequence[int]) -> np.ndarray:
    """``arange`` reshaped to ``dims``, transposed by ``perm`` if given."""
    ids = np.arange(math.prod(dims)).reshape(dims)
    return ids.transpose(perm) if perm else ids


def _rows(ids: np.ndarray) -> Groups:
    return tuple(tuple(int(d) for d in row) for row in ids)


def _mesh_groups(mesh: str, device_ids: str | None, braced: str) -> Groups:
    """The groups of ``mesh[<mesh>], device_ids=(<device_ids>) {<braced>}``."""
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(mesh)]
    names = [name for name, _ in axes]
    shape = [size for _, size in axes]
    count = math.prod(shape)
    ids = _device_ids(device_ids, count).reshape(shape)
    refs = []  # (mesh axis, first and last boundary of the sub-axis)
    for name, pre, size in _GROUP_AXIS.findall(braced):
        if name not in names:
            raise ValueError(f"replica_groups=mesh[{mesh}] {{{braced}}}: the "
                             f"axis {name!r} is not one of the mesh's {names}.")
        dim = names.index(name)
        low = int(pre) if pre else 1
        refs.append((dim, low, low * int(size) if pre else shape[dim]))
    # Split each mesh axis at every sub-axis boundary (major to minor), so
    # that each braced axis is a run of whole dimensions of the split array.
    split, grouped = [], []
    for dim, size in enumerate(shape):
        cuts = sorted({1, size} | {b for d, lo, hi in refs if d == dim
                                   for b in (lo, hi)})
        first = len(split)
        split += [hi // lo for lo, hi in itertools.pairwise(cuts)]
        for d, lo, hi in refs:
            if d == dim:
                grouped += [first + i for i in range(cuts.index(lo), cuts.index(hi))]
    ids = ids.reshape(split or [1])
    rest = [d for d in range(ids.ndim) if d not in grouped]
    size = math.prod(ids.shape[d] for d in grouped)
    return _rows(ids.transpose(rest + grouped).reshape(count // size, size))


def _device_ids(text: str | None, count: int) -> np.ndarray:
    """The mesh's devices in row-major order: ``arange(count)`` without
    ``device_ids=``, else the iota (``[4,2]T(1,0)``) or list it gives."""
    if text is None:
        return np.arange(count)
    match = _IOTA_IDS.match(text)
    if match:
        ids = _iota(_ints(match.group(1)), _ints(match.group(2))).reshape(-1)
    else:
        listed = re.sub(r"^\s*\[[\d,]*\]", "", text)  # the shape, if printed
        ids = np.array([int(d) for d in re.findall(r"\d+", listed)], dtype=int)
    if sorted(ids.tolist()) != list(range(count)):
        raise ValueError(f"device_ids=({text}): expected a permutation of "
                         f"0..{count - 1}, the devices of the printed mesh.")
    return ids


def spanned_axes(groups: Sequence[Sequence[int]], axis_names: Sequence[str],
                 mesh_names: Sequence[str], mesh_shape: Sequence[int]
                 ) -> tuple[str, ...]:
    """The mesh axes, in mesh order, along which a collective's devices differ.

    Args:
      groups: as :func:`parse_groups` returns them: device ids per group,
        ``()`` for one group of every device.
      axis_names: axes a caller knows the collective runs over, used only
        where there are no groups (:func:`parse_groups` gives none).
      mesh_names, mesh_shape: the mesh the program was compiled for.

    Examples:
      >>> from collectives._hlo_groups import spanned_axes
      >>> spanned_axes([(0, 2, 4, 6)], (), ("i", "j"), (4, 2))
      ('i',)
      >>> spanned_axes([(0, 1), (1, 0)], (), ("i", "j"), (4, 2))
      ('j',)
      >>> spanned_axes([(0,), (1,)], (), ("i", "j"), (4, 2))  # groups of one
      ()
      >>> spanned_axes((), (), ("i", "j"), (4, 2))  # every device
      ('i', 'j')
    """
    if not groups and axis_names:
        return tuple(name for name in mesh_names if name in axis_names)
    if not groups:
        return tuple(name for name, size in zip(mesh_names, mesh_shape, strict=True)
                     if size > 1)
    varies = np.zeros(len(mesh_shape), bool)
    for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group), tuple(mesh_shape)))
        varies |= (coords != coords[:, :1]).any(axis=1)
    return tuple(name for name, v in zip(mesh_names, varies, strict=True) if v)
