"""What the benchmark runs: sizes, inputs, one program per form, the checks.

Sizes follow nccl-tests (``doc/PERFORMANCE.md``): the size ``S`` of a row is
the buffer each device holds for all-reduce, all-to-all and permute, the
whole gathered output for all-gather and the whole unscattered input for
reduce-scatter. ``count`` is ``S`` in elements.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _compat
from collectives import _layout
from collectives._arrays import dtype_kind
from collectives._facts._kernel import KERNEL_OF
from collectives._facts.ring_algorithms import RING_OF
from collectives._layout import Axes
from collectives._recipe import Recipe
from collectives._registry import RECIPES
from collectives._tolerance import tolerance
from collectives.bench._memory import memory_per_device
from collectives.bench._timing import looped

KIND: dict[str, str] = {
    name: recipe.bench.kind for name, recipe in RECIPES.items()
    if recipe.bench is not None and recipe.bench.kind is not None}
"""The collectives the sweep knows, by recipe name, and the HLO kind each is
(from each recipe's ``bench`` fact)."""

BENCH_FORMS: tuple[str, ...] = ("pmap", "shard_map", "jit", "ring")
"""The forms ``bench`` times by default (``--forms``); ``ring`` is the
collective built from ``ppermute`` steps (``collectives.ring_all_reduce`` etc.)."""

KNOWN_FORMS: tuple[str, ...] = (*BENCH_FORMS, "kernel")
"""Every form ``--forms`` takes: ``kernel`` is the collective as a Pallas
remote-DMA kernel (``kernel_psum`` etc.), timed on a TPU only; elsewhere it
runs in interpret mode, a simulator whose time is not the kernel's, and
``bench`` says so instead of timing it."""
DEFAULT_COLLECTIVES: tuple[str, ...] = tuple(
    name for name, recipe in RECIPES.items()
    if recipe.bench is not None and recipe.bench.default)
"""The collectives ``bench`` times by default (``-c/--collectives``). The
rings built from ppermute are not among them: each is timed as the ``ring``
form of the collective it mirrors."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One (collective, form, size): the recipe to run and its input shape.

    Attributes:
      collective: the collective's recipe name (``psum``...).
      kind: its HLO kind, which fixes the size convention and bus factor.
      form: ``pmap``, ``shard_map``, ``jit`` or ``ring``.
      recipe: the recipe run (the ring recipe for form ``ring``).
      axes: a 1-D mesh over the benchmark's devices.
      shape: the global input shape.
      dtype: the element type's name.
      size: ``S`` in bytes, by the nccl-tests convention.
      count: ``S`` in elements.
    """

    collective: str
    kind: str
    form: str
    recipe: Recipe
    axes: Axes
    shape: tuple[int, ...]
    dtype: str
    size: int
    count: int


def recipe_for(collective: str, form: str) -> Recipe | str:
    """The recipe a form runs, or a sentence saying why there is none."""
    if collective not in KIND:
        return (f"unknown collective {collective!r}; the benchmark runs "
                f"{', '.join(KIND)}")
    if form == "kernel":
        return _kernel_recipe(collective)
    if form != "ring":
        return RECIPES[collective]
    name = RING_OF.get(collective)
    if name is None:
        return f"no ring-from-ppermute variant of {collective}"
    if name not in RECIPES:
        return f"the {name} recipe is not registered"
    return RECIPES[name]


def _kernel_recipe(collective: str) -> Recipe | str:
    name = KERNEL_OF.get(collective)
    if name is None:
        return f"no Pallas kernel recipe implements {collective}"
    if jax.default_backend() != "tpu":
        return (f"{name} runs in Pallas's TPU interpret mode on "
                f"{jax.default_backend()} devices, a simulator whose time is not "
                "the kernel's: not timed here (on a TPU it is). Its result is "
                f"checked by `python -m collectives check {name}`")
    return RECIPES[name]


def plan(collective: str, form: str, axes: Axes, target: int, dtype: Any
         ) -> Case | str:
    """The case nearest ``target`` bytes (at least one element per device)."""
    recipe = recipe_for(collective, form)
    if isinstance(recipe, str):
        return recipe
    kind = dtype_kind(dtype)
    if kind not in recipe.dtype_kinds:
        return f"{recipe.name} does not take {np.dtype(dtype).name} arrays"
    if len(recipe.arg_names) != 1:
        return f"{recipe.name} takes {len(recipe.arg_names)} arguments, not one"
    item = np.dtype(dtype).itemsize
    n = axes.size
    (spec,) = recipe.in_specs(axes)

    def at(columns: int) -> tuple[tuple[int, ...], int]:
        (shape,) = recipe.example_shapes(axes, (1, columns))
        block = NamedSharding(axes.mesh, spec).shard_shape(tuple(shape))
        size = math.prod(block) * item * (n if KIND[collective] == "all-gather" else 1)
        return tuple(shape), size

    _, unit = at(1)
    shape, size = at(max(1, target // unit))
    return Case(collective=collective, kind=KIND[collective], form=form,
                recipe=recipe, axes=axes, shape=shape,
                dtype=np.dtype(dtype).name, size=size,
                count=size // item)


def make_input(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Small integers in ``dtype``: exact in every float type, so sums over a
    few devices are exact and the check can be exact too."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-8, 9, size=shape, dtype=np.int8)
    if dtype_kind(dtype) == "bool":
        return values > 0
    return values.astype(jax.dtypes.canonicalize_dtype(dtype))


@functools.cache
def _iters_array(mesh: jax.sharding.Mesh, iters: int) -> jax.Array:
    return jax.device_put(np.int32(iters), NamedSharding(mesh, P()))


@functools.cache
def _pmap_identity(devices: tuple[Any, ...]) -> Callable[[Any], Any]:
    return _compat.on_mesh(jax.pmap(lambda a: a, devices=list(devices)), None)


def pmap_devices(axes: Axes) -> tuple[Any, ...]:
    return tuple(axes.mesh.devices.flat)


@functools.cache
def pmap_program(recipe: Recipe, axes: Axes) -> Callable[..., Any]:
    """The recipe's pmap form on pmap's stacked input (one collective a call)."""
    body = functools.partial(recipe.pmap_body or recipe.body, axis=axes.axis)
    return _compat.on_mesh(jax.pmap(body, axis_name=axes.names[0],
                                   devices=list(pmap_devices(axes))), None)


def to_device_stacked(x: np.ndarray, axes: Axes, spec: P) -> jax.Array:
    """pmap's stacked input, resident on the devices as pmap lays it out."""
    stacked = _layout.to_stacked(x, axes.mesh, spec)
    return _pmap_identity(pmap_devices(axes))(np.ascontiguousarray(stacked))


@functools.cache
def _program(form: str, recipe: Recipe, axes: Axes) -> Callable[..., Any]:
    """The form's timed program, run with its own mesh in scope (none for
    pmap), whatever mesh the caller set with ``jax.set_mesh``."""
    return _compat.on_mesh(_unscoped_program(form, recipe, axes),
                          None if form == "pmap" else axes.mesh)


def _unscoped_program(form: str, recipe: Recipe, axes: Axes) -> Callable[..., Any]:
    (spec,) = recipe.in_specs(axes)
    out_specs = recipe.out_specs(axes)
    if form in ("shard_map", "ring", "kernel"):
        body = functools.partial(recipe.body, axis=axes.axis)
        return jax.jit(jax.shard_map(
            looped(body), mesh=axes.mesh, in_specs=(spec, P()),
            out_specs=out_specs, check_vma=recipe.check_vma))
    if form == "jit":
        in_sharding = NamedSharding(axes.mesh, spec)
        out_shardings = _layout.shardings(axes.mesh, out_specs)

        def program(x):
            return jax.lax.with_sharding_constraint(
                recipe.program(x, axes=axes), out_shardings)

        # Pin both layouts inside the loop; otherwise the partitioner may carry
        # the data in the output layout and move it once, outside the loop.
        return jax.jit(
            looped(program, lambda x: jax.lax.with_sharding_constraint(x, in_sharding)),
            in_shardings=(in_sharding, NamedSharding(axes.mesh, P())),
            out_shardings=out_shardings)
    if form == "pmap":
        body = functools.partial(recipe.pmap_body or recipe.body, axis=axes.axis)
        return jax.pmap(looped(body), axis_name=axes.names[0], in_axes=(0, None),
                        devices=list(pmap_devices(axes)))
    raise ValueError(f"form: expected one of {', '.join(KNOWN_FORMS)}, got {form!r}.")


def bind(case: Case, x: np.ndarray) -> tuple[Callable[[int], Any], np.ndarray]:
    """``call(iters)`` running the case on ``x``, and the expected output.

    The expected output is the NumPy oracle's, in the layout the form returns
    (pmap's stacked layout for ``pmap``, the global view otherwise).
    """
    recipe, axes = case.recipe, case.axes
    (spec,) = recipe.in_specs(axes)
    fn = _program(case.form, recipe, axes)
    expected = np.asarray(recipe.reference(x, mesh=axes.mesh, axis=axes.axis))
    if case.form == "pmap":
        placed = to_device_stacked(x, axes, spec)
        expected = _layout.to_stacked(expected, axes.mesh, recipe.out_specs(axes))
        return (lambda iters: fn(placed, np.int32(iters))), expected
    (placed,) = recipe.place(x, axes=axes)
    return (lambda iters: fn(placed, _iters_array(axes.mesh, iters))), expected


def memory(case: Case, x: np.ndarray) -> dict[str, int] | None:
    """Per-device memory of the case's form running one collective on ``x``
    (the recipe as a user calls it, not the timed loop), or None."""
    recipe, axes = case.recipe, case.axes
    if case.form == "pmap":
        (spec,) = recipe.in_specs(axes)
        return memory_per_device(pmap_program(recipe, axes),
                                 to_device_stacked(x, axes, spec))
    form = "jit" if case.form == "jit" else "shard_map"
    return memory_per_device(recipe.compiled(form, axes), *recipe.place(x, axes=axes))


def count_wrong(out: jax.Array, expected: np.ndarray, rtol: float, atol: float
                ) -> int:
    """Elements that differ from ``expected``, counted on every device's copy.

    A replicated output is checked copy by copy, as nccl-tests checks every
    rank's buffer, so one device with a wrong copy is caught.
    """
    wrong = 0
    for shard in out.addressable_shards:
        got = np.asarray(shard.data)
        want = expected[shard.index]
        if got.shape != want.shape and got.size == want.size:
            got = got.reshape(want.shape)  # pmap shards may drop the unit dim
        if got.shape != want.shape:
            wrong += max(got.size, want.size)
            continue
        if rtol == 0 and atol == 0:
            wrong += int(np.count_nonzero(got != want))
        else:  # complex values differ by the modulus: real and imaginary parts
            wide = (np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want)
                    else np.float64)
            ok = np.abs(got.astype(wide) - want) <= atol + rtol * np.abs(want)
            wrong += int(np.count_nonzero(~ok))
    return wrong


def check(case: Case, call: Callable[[int], Any], expected: np.ndarray,
          x: np.ndarray) -> int:
    """#wrong of one call running the collective once, against the oracle."""
    rtol, atol = tolerance(expected.dtype, case.recipe.n_terms(case.axes))
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    return count_wrong(call(1), expected, rtol, atol * scale)


# -- the copy that sets the practical limit ----------------------------------

@functools.cache
def _copy_program(axes: Axes) -> Callable[..., Any]:
    def run(x, zero, iters):
        # x + a runtime zero: a read and a write of every byte that the
        # compiler cannot prove away (a bare copy would be elided).
        return looped(lambda v: v + zero)(x, iters)

    return _compat.on_mesh(jax.jit(jax.shard_map(
        run, mesh=axes.mesh, in_specs=(P(axes.entry), P(), P()),
        out_specs=P(axes.entry))), axes.mesh)


def bind_copy(axes: Axes, size: int, dtype: Any
              ) -> tuple[Callable[[int], Any], np.ndarray, int]:
    """``call(iters)`` copying ``size`` bytes on every device, its input, #bytes."""
    count = max(1, size // np.dtype(dtype).itemsize)
    x = make_input((axes.size, count), dtype, seed=1)
    placed = jax.device_put(x, NamedSharding(axes.mesh, P(axes.entry)))
    zero = jax.device_put(np.zeros((), x.dtype), NamedSharding(axes.mesh, P()))
    fn = _copy_program(axes)
    return ((lambda iters: fn(placed, zero, _iters_array(axes.mesh, iters))), x,
            count * x.dtype.itemsize)
