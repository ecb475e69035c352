"""Pictures of what a collective does to the shards, made by running it.

:func:`diagram` runs a registered recipe's shard_map form on small labelled
data over a 1-D mesh and reads back what every device holds before and
after. Each input element is ``10 * device + position`` (position counted
row-major inside the device's block), so a copied element still says where
it came from; elements that combine several devices' values (a sum, a mean)
are marked as such. The result prints as a text grid (``python -m
collectives show NAME``) or draws with matplotlib (the docs' diagrams).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from typing import Any

import jax
import numpy as np

from collectives import _devices
from collectives import _diagram_plot
from collectives import _figure
from collectives._registry import RECIPES


def diagram_names() -> tuple[str, ...]:
    """The recipes :func:`diagram` draws: those that declare a ``diagram``."""
    return tuple(name for name, recipe in RECIPES.items()
                 if recipe.diagram is not None)


COMBINED = -1
"""Source of an output element computed from several devices' elements."""

_MAX_LABELLED = 10  # labels are 10 * device + position: one decimal digit each


@dataclasses.dataclass(frozen=True)
class Diagram:
    """What every device holds before and after one collective.

    Blocks are 2-D NumPy arrays, one per device in axis order (a 1-D block
    is one column; a block of higher rank keeps its first dimension as rows
    and merges the others).

    Attributes:
      name: the recipe name, e.g. ``"psum"``.
      summary: the recipe's one-line summary.
      axis: the mesh axis the collective runs over.
      before: each device's input block; element ``p`` (row-major) of device
        ``d`` is ``10 * d + p``.
      after: each device's output block.
      before_source: the device each input element lives on.
      after_source: for each output element, the device whose input element
        it copies (or, for ``axis_index``, the device that computed it), or
        ``COMBINED`` (-1) where it combines every device's elements.
    """

    name: str
    summary: str
    axis: str
    before: tuple[np.ndarray, ...]
    after: tuple[np.ndarray, ...]
    before_source: tuple[np.ndarray, ...]
    after_source: tuple[np.ndarray, ...]

    @property
    def n_devices(self) -> int:
        """How many devices (columns) the diagram has."""
        return len(self.before)

    def text(self) -> str:
        """The before and after grids as text: one column per device.

        A ``*`` marks an element combined from every device.
        """
        header = (f"{self.name} over {self.n_devices} devices (axis "
                  f"{self.axis!r}): {self.summary}")
        legend = ("each input element is 10 * device + position in its block"
                  + ("; * = combined from every device"
                     if any((s == COMBINED).any() for s in self.after_source)
                     else ""))
        before = [[_cell(v, s) for v, s in zip(b.ravel(), src.ravel(), strict=True)]
                  for b, src in zip(self.before, self.before_source, strict=True)]
        after = [[_cell(v, s) for v, s in zip(b.ravel(), src.ravel(), strict=True)]
                 for b, src in zip(self.after, self.after_source, strict=True)]
        width = max(len(c) for cells in before + after for c in cells)
        panels_before = [_panel(cells, b.shape, width)
                         for cells, b in zip(before, self.before, strict=True)]
        panels_after = [_panel(cells, b.shape, width)
                        for cells, b in zip(after, self.after, strict=True)]
        column = max(len(line) for panel in panels_before + panels_after
                     for line in panel)
        column = max(column, len(f"device {self.n_devices - 1}"))
        # the prose wrapped to a terminal's 79 columns (and a page's code box)
        lines = [*textwrap.wrap(header, 79), *textwrap.wrap(legend, 79), ""]
        lines.append(" " * 8 + "  ".join(
            f"device {d}".rjust(column) for d in range(self.n_devices)))
        for label, panels in (("before", panels_before), ("after", panels_after)):
            rows = max(len(panel) for panel in panels)
            for r in range(rows):
                cells = [(panel[r] if r < len(panel) else "").rjust(column)
                         for panel in panels]
                lines.append((label if r == 0 else "").ljust(8) + "  ".join(cells))
        return "\n".join(line.rstrip() for line in lines)

    def figure(self, width: str = "wide") -> Any:
        """The diagram as a matplotlib ``Figure`` (needs matplotlib), laid
        out for a desktop's content column (``"wide"``) or a phone's
        (``"narrow"``).

        Devices are columns, before on the left and after on the right; each
        element is coloured by the device it came from, grey and hatched
        where it combines every device.

        Raises:
          ImportError: matplotlib is not installed (``pip install
            matplotlib``, or the ``docs`` extra).
        """
        return _diagram_plot.figure(self, width)

    def save(self, path: str, width: str = "wide") -> None:
        """Write :meth:`figure` to ``path`` (``.svg``, or ``.png`` at 110
        dpi), with the record of its text sizes the docs check."""
        _figure.save(self.figure(width), path,
                     dpi=None if str(path).endswith(".svg") else 110,
                     bbox_inches="tight")


def diagram(name: str, *, n_devices: int = 4) -> Diagram:
    """Run collective ``name`` on labelled blocks and record what moved where.

    The recipe's shard_map form runs on a 1-D mesh of the first
    ``n_devices`` devices (axis ``"i"``); the blocks are read back from the
    devices' buffers, so the picture is what the collective really did.

    Args:
      name: a core collective: ``psum``, ``pmean``, ``pmax``, ``pmin``,
        ``all_gather``, ``all_gather_stacked``, ``psum_scatter``,
        ``all_to_all``, ``ppermute_ring`` or ``axis_index``.
      n_devices: devices along the axis, 2 to 10.

    Returns:
      A :class:`Diagram`; ``print(d.text())`` shows it.

    Raises:
      ValueError: ``name`` has no diagram, ``n_devices`` is out of range, or
        there are fewer devices.

    Examples:
      >>> import collectives as cx
      >>> d = cx.diagram("psum")
      >>> [b.ravel().tolist() for b in d.before]
      [[0, 1], [10, 11], [20, 21], [30, 31]]
      >>> [b.ravel().tolist() for b in d.after]
      [[60, 64], [60, 64], [60, 64], [60, 64]]
      >>> [s.ravel().tolist() for s in cx.diagram("ppermute_ring").after_source]
      [[3, 3], [0, 0], [1, 1], [2, 2]]
    """
    if name not in diagram_names():
        raise ValueError(
            f"name: no diagram for {name!r}; diagrams exist for "
            f"{', '.join(diagram_names())}. Fix: pass one of those.")
    if (isinstance(n_devices, bool) or not isinstance(n_devices, (int, np.integer))
            or not 2 <= n_devices <= _MAX_LABELLED):
        raise ValueError(
            f"n_devices: expected an int from 2 to {_MAX_LABELLED} (labels give "
            f"the device one decimal digit), got {n_devices!r}. Fix: pass e.g. 4.")
    _devices.require_devices(n_devices)
    recipe = RECIPES[name]
    mesh = _devices.make_mesh((n_devices,), "i")
    axes = recipe.axes(mesh, "i")
    (shape,) = recipe.example_shapes(axes, recipe.diagram.dims)
    (spec,) = recipe.in_specs(axes)
    x = _labelled(shape, jax.sharding.NamedSharding(mesh, spec), mesh)
    (placed,) = recipe.place(x, axes=axes)
    out = recipe.shard_map(x, mesh=mesh, axis="i")
    before = _blocks(placed, mesh)
    after = _blocks(out, mesh)
    before_source = tuple(np.full(b.shape, d) for d, b in enumerate(before))
    after_source = tuple(_sources(name, before, b, d) for d, b in enumerate(after))
    return Diagram(name=name, summary=recipe.summary, axis="i", before=before,
                   after=after, before_source=before_source,
                   after_source=after_source)


def _labelled(shape: tuple[int, ...], sharding: Any, mesh: Any) -> np.ndarray:
    """A global int32 array whose block on device ``d`` is ``10 * d + arange``."""
    x = np.full(shape, -1, np.int32)
    position = {dev: d for d, dev in enumerate(mesh.devices.flat)}
    for device, index in sharding.devices_indices_map(shape).items():
        block = x[index]
        if block.size > _MAX_LABELLED or (block != -1).any():
            raise ValueError(
                f"diagram: blocks of shape {block.shape} cannot be labelled with "
                "one digit per position, or the input is not sharded.")
        x[index] = 10 * position[device] + np.arange(block.size).reshape(block.shape)
    return x


def _blocks(array: jax.Array, mesh: Any) -> tuple[np.ndarray, ...]:
    """Each device's buffer of ``array``, in mesh order, as a 2-D NumPy array."""
    by_device = {shard.device: np.asarray(shard.data)
                 for shard in array.addressable_shards}
    blocks = []
    for device in mesh.devices.flat:
        # [k] -> [k, 1]; [k, m] as is; [n, k, m] -> [n, k * m]: one row per
        # stacked entry
        block = by_device[device]
        rows = block.shape[0] if block.ndim else 1
        blocks.append(block.reshape(rows, math.prod(block.shape) // rows))
    return tuple(blocks)


def _sources(name: str, before: tuple[np.ndarray, ...], block: np.ndarray,
             device: int) -> np.ndarray:
    relation = RECIPES[name].diagram.relation
    if relation == "combine":
        return np.full(block.shape, COMBINED)
    if relation == "local":
        return np.full(block.shape, device)
    owner = {int(v): d for d, b in enumerate(before) for v in b.ravel()}
    sources = np.empty(block.shape, int)
    for index, value in np.ndenumerate(block):
        if float(value) not in owner:
            raise AssertionError(
                f"diagram: {name} output {value} on device {device} is not a "
                "copy of any input element.")
        sources[index] = owner[int(value)]
    return sources


def _cell(value: Any, source: int) -> str:
    text = f"{value:g}" if isinstance(value, (float, np.floating)) else str(value)
    return ("*" + text) if source == COMBINED else text


def _panel(cells: list[str], shape: tuple[int, ...], width: int) -> list[str]:
    rows, cols = shape
    return [" ".join(cells[r * cols + c].rjust(width) for c in range(cols))
            for r in range(rows)]

