"""Compile one unit of each strategy for a mesh, without allocating anything.

Runs in a process whose JAX backend has as many (simulated CPU) devices as
the mesh: the arguments are ``jax.ShapeDtypeStruct`` with the recipe's
shardings, so a layout of thousands of devices and billions of parameters
lowers and compiles on a laptop. What comes back is read from the compiled
program: its collectives (:mod:`collectives.hlo`, with the mesh axes each
runs over), the compiler's memory analysis, and whether the recipe's cost
model still holds at this size.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from collectives._arrays import is_shape
from collectives._costs import compiled_for
from collectives._costs import compiling_for
from collectives._layout import Axes
from collectives._memory import analysed_memory
from collectives._memory import sharded_bytes
from collectives._recipe import Recipe
from collectives._registry import RECIPES
from collectives._stacked import map_leaves
from collectives.hlo import matmul_flops
from collectives.hlo import parse_collectives
from collectives.hlo import scheduled_overlap


def planned_recipe(name: str, microbatches: int | None = None) -> Recipe:
    """The recipe a plan compiles for ``name``: the registered one, or its
    variant with ``microbatches`` (a pipeline's, ``plan --microbatches``)."""
    recipe = RECIPES[name]
    if microbatches and recipe.plan is not None and recipe.plan.variant:
        return recipe.plan.variant(microbatches)
    return recipe


def plan_axis(recipe: Recipe, mesh: jax.sharding.Mesh) -> Any:
    """The recipe's ``axis=`` on a plan's mesh: every axis (``None``), or the
    last, as its :class:`collectives.PlanSpec` says (every axis without one)."""
    if recipe.plan is None or recipe.plan.axis == "all":
        return None
    return mesh.axis_names[-1]


def unsupported(recipe: Recipe, mesh: jax.sharding.Mesh) -> str | None:
    """Why the recipe does not run on this mesh in a plan, or ``None``."""
    wanted = recipe.plan.mesh_axes if recipe.plan is not None else None
    if wanted is not None and len(mesh.axis_names) != wanted:
        return f"needs a mesh of {wanted} axes"
    return recipe.unsupported_reason(recipe.axes(mesh, plan_axis(recipe, mesh)))


def stand_ins(shapes: Any, dtype: Any) -> Any:
    """Shape-only arrays (broadcast zeros: no memory) for a tree of shapes."""
    zero = np.zeros((), jnp.dtype(dtype))
    return tuple(jax.tree_util.tree_map(lambda s: np.broadcast_to(zero, s), tree,
                                        is_leaf=is_shape) for tree in shapes)


def abstract(recipe: Recipe, axes: Axes, args: Sequence[Any]) -> tuple[Any, ...]:
    """``jax.ShapeDtypeStruct`` arguments with the recipe's input shardings."""
    mesh = axes.mesh

    def one(leaf, spec, _):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                    sharding=jax.sharding.NamedSharding(mesh, spec))

    return tuple(map_leaves(arg, spec, one, name) for arg, spec, name in
                 zip(args, recipe.in_specs(axes), recipe.arg_names, strict=True))


def compile_unit(recipe: Recipe, mesh: jax.sharding.Mesh, form: str, *,
                 model: Any = None, dims: Sequence[int] = (2, 3),
                 dtype: Any = "float32", axis: Any = None) -> dict[str, Any]:
    """Compile one unit of ``recipe`` on ``mesh`` and read what it sends.

    Args:
      recipe: a recipe; with ``model``, one with a ``plan``
        (:class:`collectives.PlanSpec`).
      mesh: the mesh (as many devices as this process has, or fewer).
      form: ``"shard_map"`` or ``"jit"``.
      model: a :class:`collectives.plan.Model` to size the unit by; ``None``:
        the recipe's ``example_shapes`` for ``dims`` (what the conformance
        suite checks, at this mesh's size).
      axis: the collective axes (default: the plan's, :func:`plan_axis`).
      dtype: the arguments' dtype. XLA:CPU runs 16-bit float collectives in
        float32 (it widens them), so a plan compiles in float32 and counts
        float collectives at the model's dtype afterwards.

    Returns:
      A JSON-ready dict: ``ops`` (one per compiled collective: ``kind``,
      ``axes``, ``bytes``, ``group``, ``phase``: the pass that runs it,
      :attr:`collectives.hlo.Collective.phase`), ``memory`` (the compiler's argument,
      output and temp bytes per device; ``params``: the parameters' shards),
      ``overlap_flops``: the matmul FLOPs the compiled schedule runs between
      an asynchronous op's start and done, ``None`` for a synchronous one),
      ``cost_model`` (``None`` when the recipe's cost model holds, else what
      differs), ``target`` (on XLA:CPU: the cost model as written, what a GPU
      or TPU compiler keeps: ``counts`` and ``bytes`` per kind; ``None`` when
      compiled for the target itself), ``flops`` (the device program's, or
      ``None``), ``flops_source`` (``"compiled"``: the compiler's cost
      analysis; ``"matmuls"``: the compiled program's matmuls, where the
      compiler gives no analysis) and ``compile_s``.

    Raises:
      ValueError: the model does not fit the mesh (a dimension that does
        not split evenly), with the recipe's message.
    """
    axis = plan_axis(recipe, mesh) if axis is None else axis
    axes = recipe.axes(mesh, axis)
    shapes = (recipe.example_shapes(axes, dims) if model is None
              else recipe.plan.shapes(axes, model))
    args = stand_ins(shapes, dtype)
    recipe.validated_axes(args, mesh, axis)
    placed = abstract(recipe, axes, args)
    start = time.perf_counter()
    compiled = recipe.compiled(form, axes).lower(*placed).compile()
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    stats = parse_collectives(text)
    overlap = scheduled_overlap(text)
    problems = [e.mismatch(stats) for e in recipe.expected_costs(form, axes, args)]
    target = None
    if compiled_for() == "cpu":
        # what a GPU or TPU compiler keeps: the cost model as written (the
        # first expectation), which XLA:CPU may merge or rewrite
        with compiling_for("target"):
            written = recipe.expected_costs(form, axes, args)[0]
        target = {"counts": dict(written.counts), "bytes": dict(written.bytes)}
    analysed = analysed_memory(compiled) or {}
    params = [placed[i] for i in (recipe.plan.params if recipe.plan else ())]
    memory = {
        "params": sharded_bytes(params, jax.tree_util.tree_map(
            lambda leaf: leaf.sharding, params)),
        "arguments": analysed.get("arguments"),
        "outputs": analysed.get("outputs"),
        "temp": analysed.get("temporaries"),
    }
    return {
        "recipe": recipe.name, "form": form, "axis": axis,
        "dtype": jnp.dtype(dtype).name,
        "ops": [{"kind": op.kind, "axes": list(op.mesh_axes(mesh)),
                 "bytes": op.bytes, "group": op.group_size, "dtype": op.dtype,
                 "phase": op.phase, "overlap_flops": overlap.get(op.name),
                 **({"written": op.written} if op.written else {})}
                for op in stats.ops],
        "memory": memory,
        "cost_model": None if None in problems else "; ".join(problems),
        "target": target,
        **_flops(compiled, text),
        "compile_s": seconds,
    }


def _flops(compiled: Any, text: str) -> dict[str, Any]:
    """``flops`` of one device's program and where they come from
    (``flops_source``): the compiler's cost analysis, else (XLA:GPU
    compiling without a GPU gives none) the compiled program's matmuls."""
    flops = compiled_flops(compiled)
    if flops is not None:
        return {"flops": flops, "flops_source": "compiled"}
    flops = matmul_flops(text)
    return {"flops": flops, "flops_source": None if flops is None else "matmuls"}


def compiled_flops(compiled: Any) -> float | None:
    """The FLOPs of one device's compiled program (XLA's cost analysis: a
    matmul of ``[m, k] x [k, n]`` counts ``2 m k n``; a loop its body times
    its trips), or ``None`` where the compiler gives none."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # a compiler without a cost analysis
        return None
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else {}
    flops = (analysis or {}).get("flops")
    return float(flops) if flops is not None and flops >= 0 else None
