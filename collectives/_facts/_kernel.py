"""How a kernel recipe is registered: the ``lax`` collective's recipe, with
the kernel as its body.

A kernel recipe takes the inputs, layouts and oracle of the core recipe it
implements (``native``), so ``check`` compares the kernel (the shard_map
form) with the global program XLA partitions into that collective (the jit
and explicit forms) and with the NumPy oracle, on the same inputs. What the
kernel moves, it moves by DMA inside one custom call: its compiled program
holds no XLA collective at all, and its cost model says so; the bytes and
steps it sends are :class:`DmaCost`, next to the collective's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from collectives import _kernels
from collectives._costs import GLOBAL_FORMS
from collectives._layout import Axes
from collectives._recipe import CostModel
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation

KERNEL_OF: dict[str, str] = {}
"""The kernel recipe that implements each core recipe, by name (``psum`` ->
``kernel_psum``): same arguments, layouts and oracle."""


@dataclasses.dataclass(frozen=True)
class DmaCost:
    """What one device's kernel sends: ``steps`` rounds of remote DMAs, each
    round ``bytes_per_step`` bytes, ``sent`` bytes in all."""

    steps: int
    bytes_per_step: float

    @property
    def sent(self) -> float:
        return self.steps * self.bytes_per_step


def _kernel_fact(native: Recipe) -> CostModel:
    def fact(axes: Axes, args: tuple[Any, ...], form: str) -> Expectation:
        if form in GLOBAL_FORMS:
            return native.cost_model(axes, args, form)
        return Expectation({})  # the kernel's DMAs are not XLA collectives

    return fact


def kernel_recipe(native: Recipe, *, name: str, summary: str,
                  body: Callable[..., Any], recipe_file: str,
                  explicit_program: Callable[..., Any],
                  program: Callable[..., Any] | None = None,
                  oracle: Callable[..., Any] | None = None,
                  **changes: Any) -> Recipe:
    """Register ``native`` with ``body`` (a Pallas kernel under shard_map) as
    the kernel recipe ``name``: one mesh axis, the kernel's results typed
    varying (hence no VMA check; the tests prove them equal on every
    device), no pmap form, not drawn, timed or planned, and no complex
    inputs (interpret mode fills memory with NaN first, and has no complex
    NaN: ``NotImplementedError: nan + complex64``). ``explicit_program`` is
    the kernel file's own (its explicit region), never ``native``'s."""
    KERNEL_OF.setdefault(native.name, name)
    return register(dataclasses.replace(
        native, name=name, summary=summary, body=body, family="kernel",
        recipe_file=recipe_file, pmap_body=None, check_vma=False,
        program=program or native.program, explicit_program=explicit_program,
        oracle=oracle or native.oracle,
        unsupported_reason=_kernels.one_axis, form_reason=_kernels.form_reason,
        cost_model=_kernel_fact(native), diagram=None, bench=None, plan=None,
        dtype_kinds=changes.pop("dtype_kinds", native.dtype_kinds - {"complex"}),
        **changes))
