"""What a recipe's forms compile to: ``python -m collectives show NAME --hlo``
(``--target h100``, ``--target v5p``, ``--topology v5p:4x4x4``: the target's
own compiler, without the hardware).

For each placed form (shard_map, jit and explicit) on one mesh: the collectives XLA
emitted (kind, count, operand dtype, bytes each device sends, the mesh axes
each runs over), the recipe's cost model for that form, and whether the
compiled program meets it. This is what a new recipe's ``cost_model`` fact
must state; ``tests/test_conformance.py`` holds every recipe to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from collectives._devices import make_mesh
from collectives._recipe import PLACED_FORMS
from collectives._recipe import Recipe
from collectives.hlo import collective_stats


def compiled_view(recipe: Recipe, shape: Sequence[int], names: Sequence[str],
                  axis: Sequence[str] | None = None, *, hlo_text: bool = False
                  ) -> str:
    """The collectives each placed form of ``recipe`` compiles to on a mesh
    of ``shape`` (axes ``names``), with its cost model beside them.

    Args:
      recipe: the recipe.
      shape, names: the mesh.
      axis: the collective axes (default: every mesh axis).
      hlo_text: also print each collective's HLO instruction line.

    Returns:
      The report, one block per form.

    Examples:
      >>> import collectives as cx
      >>> from collectives._compiled_view import compiled_view
      >>> print(compiled_view(cx.RECIPES["psum"], (8,), ("i",)))
      ... # doctest: +ELLIPSIS
      psum on mesh {'i': 8}, axis i, inputs float32[16, 3]
      <BLANKLINE>
      shard_map form: meets its cost model
        all-reduce over i: f32 operand of 24 bytes, group of 8, 42 bytes sent per device
        cost model: {'all-reduce': 1}, all-reduce: 42 bytes sent per device
      ...
    """
    mesh = make_mesh(tuple(shape), tuple(names))
    axes = recipe.axes(mesh, tuple(axis) if axis else None)
    reason = recipe.unsupported_reason(axes)
    if reason:
        return f"{recipe.name}: not on this mesh ({reason})"
    args = recipe.example_args(mesh, axes.names)
    shapes = ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}"
                       for a in jax.tree_util.tree_leaves(args))
    lines = [f"{recipe.name} on mesh {dict(mesh.shape)}, axis "
             f"{','.join(axes.names)}, inputs {shapes}"]
    for form in PLACED_FORMS:
        reason = recipe.unrunnable_form(form, axes)
        if reason:
            lines += ["", f"{form} form: skipped ({reason})"]
            continue
        placed = recipe.place(*args, axes=axes, form=form)
        stats = collective_stats(recipe.compiled(form, axes), *placed)
        expected = recipe.expected_costs(form, axes, args)
        problems = [e.mismatch(stats) for e in expected]
        verdict = ("meets its cost model" if None in problems
                   else "DIFFERS from its cost model: " + "; ".join(
                       p for p in problems if p))
        lines += ["", f"{form} form: {verdict}"]
        if not stats.ops:
            lines.append("  no collectives")
        for op in stats.ops:
            over = ",".join(op.mesh_axes(mesh)) or "-"
            lines.append(f"  {op.kind} over {over}: {op.dtype} operand of "
                         f"{op.operand_bytes:,} bytes, group of {op.group_size}, "
                         f"{op.bytes:,.0f} bytes sent per device")
            if hlo_text:
                lines.append(f"    {_instruction(stats.text, op.name)}")
        for e in expected:
            sent = "".join(f", {kind}: {b:,.0f} bytes sent per device"
                           for kind, b in e.bytes.items())
            lines.append(f"  cost model: {dict(e.counts)}{sent}")
    return "\n".join(lines)


def target_view(recipe: Recipe, shape: Sequence[int], names: Sequence[str],
                axis: Sequence[str] | None = None, *, target: str | None = None,
                topology: str | None = None) -> str:
    """What the shard_map and jit forms of ``recipe`` compile to with the
    target's own compiler (``target``: a key of
    :data:`collectives.plan.TARGETS`, or a TPU ``topology``), without the
    hardware: each collective's kind, axes, dtype, group and bytes each
    device sends as that program holds them (an op that stands for another,
    such as TPU's zero-padded all-reduce for a gather, counted as what it
    moves), with the compiler's memory analysis; in a child process (the
    target extra's compilers, one at a time).

    Raises:
      ValueError: the compiler is not installed, or refuses the mesh (one
        line that names the fix).
    """
    from collectives.plan._plan import compile_units

    doc = compile_units(names, shape, recipes=[recipe.name], forms=("shard_map", "jit"),
                        target=target, topology=topology, axis=axis)
    mesh = dict(zip(names, shape, strict=True))
    lines = [f"{recipe.name} on mesh {mesh}, compiled by {doc['compiler']}"]
    for unit in doc["units"]:
        form = unit["form"]
        if "skipped" in unit:
            lines += ["", f"{form} form: skipped ({unit['skipped']})"]
            continue
        over = ",".join(unit["axis"]) if isinstance(unit["axis"], list) else (
            unit["axis"] or ",".join(names))
        verdict = ("meets its cost model" if unit["cost_model"] is None
                   else f"DIFFERS from its cost model: {unit['cost_model']}")
        lines += ["", f"{form} form, axis {over}: {verdict}"]
        if not unit["ops"]:
            lines.append("  no collectives")
        for op in unit["ops"]:
            stands = f" (compiled as {op['written']})" if op.get("written") else ""
            overlap = op.get("overlap_flops")
            runs = ("" if overlap is None else
                    f"; asynchronous, {overlap:,.0f} FLOPs of matmuls run meanwhile")
            lines.append(f"  {op['kind']} over {','.join(op['axes']) or '-'}{stands}: "
                         f"{op['dtype']}, group of {op['group']}, "
                         f"{op['bytes']:,.0f} bytes sent per device{runs}")
        memory = unit["memory"]
        if memory.get("temp") is not None:
            lines.append(
                f"  memory per device (the compiler's analysis): arguments "
                f"{memory['arguments']:,} B, outputs {memory['outputs']:,} B, "
                f"temporaries {memory['temp']:,} B")
    return "\n".join(lines)


def _instruction(text: str, name: str) -> str:
    for line in text.splitlines():
        if f"%{name} =" in line or line.strip().startswith(f"{name} ="):
            return line.strip()
    return f"(instruction {name} not found)"
