"""``kernel_allgather_matmul``: ``all_gather(x) @ w`` as one Pallas kernel,
the ring's remote DMAs overlapped with the matmuls.

The kernel, programs and oracle are ``recipes/kernel_allgather_matmul.py``'s;
the recipe mirrors ``allgather_matmul``'s layouts, shapes and tolerance
(``_kernel.kernel_recipe``). Each device sends ``n - 1`` blocks of x, one per
step, as ``lax.all_gather`` does on a ring, and multiplies ``n`` blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives._facts import collective_matmul as _collective_matmul
from collectives._facts._kernel import DmaCost
from collectives._facts._kernel import kernel_recipe
from collectives._layout import Axes
from collectives._layout import on_axes
from collectives.recipes import kernel_allgather_matmul as file


def dma_cost(axes: Axes, args: tuple[Any, ...]) -> DmaCost:
    """``n - 1`` steps, one block of x's rows each."""
    x, _ = args
    return DmaCost(steps=axes.size - 1,
                   bytes_per_step=int(np.asarray(x).nbytes) // axes.size)


kernel_allgather_matmul = kernel_recipe(
    _collective_matmul.allgather_matmul_recipe,
    name="kernel_allgather_matmul",
    summary="all_gather(x) @ w as a Pallas kernel: each ring DMA beside a matmul",
    body=file.kernel_allgather_matmul_body, recipe_file="kernel_allgather_matmul.py",
    program=on_axes(file.matmul_program), oracle=on_axes(file.matmul_numpy),
    explicit_program=on_axes(file.allgather_matmul_explicit_program))
