"""Overhead ratios: what a form costs on top of the primitive it wraps.

Three ratios per collective, of the time of one call as a user makes it
(dispatch included), measured side by side with the calls interleaved:

* recipe shard_map form / bare ``jax.jit(jax.shard_map(lax.<op>))``;
* jit form / shard_map form;
* pmap with the input on the host (NumPy) / pmap with the input already on
  the devices: the per-call transfer legacy pmap code often pays.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

from collectives._layout import Axes
from collectives._layout import to_stacked
from collectives._registry import RECIPES
from collectives.bench import _cases
from collectives.bench._timing import interleaved
from collectives.bench._timing import relative_iqr
from collectives.hlo import collective_stats

OVERHEAD_COLLECTIVES: tuple[str, ...] = (
    "psum", "pmean", "pmax", "pmin", "all_gather", "all_gather_stacked",
    "psum_scatter", "all_to_all", "ppermute_ring", "axis_index")

RECIPE_TARGET = 1.03
"""recipe shard_map / bare shard_map, at the median, for every core op."""
JIT_TARGET = 1.10
"""jit form / shard_map form, for the collectives in :data:`JIT_TARGETED`."""
JIT_TARGETED = frozenset({"psum", "all_gather", "psum_scatter"})


def _ring_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


# name -> (bare body(x, axis, n), check_vma). The gathers use the plain
# lax.all_gather, whose result is typed varying, so their out_specs=P() needs
# check_vma=False: the way such code was written before the invariant gather.
BARE: dict[str, tuple[Callable[..., Any], bool]] = {
    "psum": (lambda x, axis, n: lax.psum(x, axis), True),
    "pmean": (lambda x, axis, n: lax.pmean(x, axis), True),
    "pmax": (lambda x, axis, n: lax.pmax(x, axis), True),
    "pmin": (lambda x, axis, n: lax.pmin(x, axis), True),
    "all_gather": (lambda x, axis, n: lax.all_gather(x, axis, tiled=True), False),
    "all_gather_stacked": (lambda x, axis, n: lax.all_gather(x, axis), False),
    "psum_scatter": (lambda x, axis, n: lax.psum_scatter(
        x, axis, scatter_dimension=0, tiled=True), True),
    "all_to_all": (lambda x, axis, n: lax.all_to_all(
        x, axis, split_axis=1, concat_axis=0, tiled=True), True),
    "ppermute_ring": (lambda x, axis, n: lax.ppermute(x, axis, _ring_pairs(n)), True),
    "axis_index": (lambda x, axis, n: x + lax.axis_index(axis).astype(x.dtype), True),
}


@functools.cache
def _bare(name: str, axes: Axes) -> Callable[..., Any]:
    recipe = RECIPES[name]
    body, check_vma = BARE[name]
    return jax.jit(jax.shard_map(
        functools.partial(body, axis=axes.axis, n=axes.size), mesh=axes.mesh,
        in_specs=recipe.in_specs(axes), out_specs=recipe.out_specs(axes),
        check_vma=check_vma))


@functools.cache
def _pmap(name: str, axes: Axes) -> Callable[..., Any]:
    recipe = RECIPES[name]
    body = functools.partial(recipe.pmap_body or recipe.body, axis=axes.axis)
    return jax.pmap(body, axis_name=axes.names[0],
                    devices=list(_cases.pmap_devices(axes)))


def _shape(name: str, axes: Axes, size: int, dtype: Any) -> tuple[int, ...]:
    recipe = RECIPES[name]
    (spec,) = recipe.in_specs(axes)
    sharding = jax.sharding.NamedSharding(axes.mesh, spec)
    (unit,) = recipe.example_shapes(axes, (1, 1))
    per_column = np.prod(sharding.shard_shape(tuple(unit))) * np.dtype(dtype).itemsize
    (shape,) = recipe.example_shapes(axes, (1, max(1, size // int(per_column))))
    return tuple(shape)


def _verify(name: str, outputs: dict[str, Any], expected: np.ndarray,
            stacked: np.ndarray) -> None:
    for variant, out in outputs.items():
        want = stacked if variant.startswith("pmap") else expected
        if not np.array_equal(np.asarray(out).reshape(want.shape), want):
            raise AssertionError(
                f"overhead benchmark: {name} {variant} disagrees with the NumPy "
                "oracle; timing a wrong program would mean nothing.")


def ratio_row(name: str, numerator: str, denominator: str,
              times: dict[str, tuple[float, ...]], target: float | None
              ) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(times[numerator], times[denominator], strict=True)]
    ratio = float(np.median(ratios))
    return {
        "name": f"{name}: {numerator} / {denominator}", "collective": name,
        "numerator": numerator, "denominator": denominator, "ratio": ratio,
        "spread": relative_iqr(ratios), "target": target,
        "met": None if target is None else bool(ratio <= target),
        "samples": len(ratios),
    }


def run_overhead(names: tuple[str, ...], axes: Axes, *, size: int, dtype: Any,
                 samples: int, min_time: float,
                 progress: Callable[[str], None] | None = None
                 ) -> list[dict[str, Any]]:
    """The overhead ratios of each collective in ``names`` (see module doc)."""
    rows = []
    for name in names:
        if name not in BARE:
            raise ValueError(
                f"--overhead: no bare primitive known for {name!r}; choose from "
                f"{', '.join(BARE)}.")
        recipe = RECIPES[name]
        shape = _shape(name, axes, size, dtype)
        x = _cases.make_input(shape, dtype)
        expected = np.asarray(recipe.reference(x, mesh=axes.mesh, axis=axes.axis))
        (placed,) = recipe.place(x, axes=axes)
        (spec,) = recipe.in_specs(axes)
        host = np.ascontiguousarray(to_stacked(x, axes.mesh, spec))
        device = _cases.to_device_stacked(x, axes, spec)
        fns = {"recipe shard_map": recipe.compiled("shard_map", axes),
               "bare shard_map": _bare(name, axes),
               "jit": recipe.compiled("jit", axes)}
        pmap = _pmap(name, axes)
        calls = {label: functools.partial(fn, placed) for label, fn in fns.items()}
        calls["pmap host input"] = functools.partial(pmap, host)
        calls["pmap device input"] = functools.partial(pmap, device)
        _verify(name, {label: call() for label, call in calls.items()}, expected,
                to_stacked(expected, axes.mesh, recipe.out_specs(axes)))
        same = (collective_stats(fns["recipe shard_map"], placed).counts()
                == collective_stats(fns["bare shard_map"], placed).counts())
        if not same:
            raise AssertionError(
                f"overhead benchmark: {name}'s recipe compiles to other collectives "
                "than the bare primitive; see collectives.hlo.collective_stats.")
        times = interleaved(calls, samples=samples, min_time=min_time)
        rows.append(ratio_row(name, "recipe shard_map", "bare shard_map", times,
                              RECIPE_TARGET))
        rows.append(ratio_row(name, "jit", "recipe shard_map", times,
                              JIT_TARGET if name in JIT_TARGETED else None))
        rows.append(ratio_row(name, "pmap host input", "pmap device input", times,
                              None))
        if progress is not None:
            progress(f"overhead: {name} done")
    return rows
