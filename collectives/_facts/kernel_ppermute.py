"""``kernel_ppermute``: ``lax.ppermute`` as one step of remote DMAs.

The kernel, programs and oracle are ``recipes/kernel_ppermute.py``'s; the
recipe mirrors ``ppermute_ring``'s layouts and oracle
(``_kernel.kernel_recipe``): the ring shift by +1. The file's kernel takes
any static permutation; each source sends its block to its destination with
one remote DMA, in one step: what ``lax.ppermute`` sends.
"""

from __future__ import annotations

from typing import Any

from collectives._costs import block_bytes
from collectives._facts import ppermute as _ppermute
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import by_axis_size
from collectives.recipes import kernel_ppermute as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """One step: every device sends its one block (the ring sends n blocks)."""
    (x,) = args
    return DmaCost(steps=1, bytes_per_step=block_bytes(axes, x))


kernel_ppermute = kernel_recipe(
    _ppermute.ppermute_ring, name="kernel_ppermute",
    summary="ppermute (ring +1) as a Pallas kernel: one remote DMA per device",
    body=file.kernel_ppermute_body, recipe_file="kernel_ppermute.py",
    program=by_axis_size(file.ppermute_ring_program),
    explicit_program=by_axis_size(file.ppermute_ring_explicit_program),
    oracle=by_axis_size(file.ppermute_ring_numpy))
