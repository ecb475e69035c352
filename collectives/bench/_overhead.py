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
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from collectives._layout import Axes
from collectives._layout import to_stacked
from collectives._registry import RECIPES
from collectives.bench import _cases
from collectives.bench._progress import Progress
from collectives.bench._stats import Estimate
from collectives.bench._stats import Stopping
from collectives.bench._stats import median_ratio_interval
from collectives.bench._stats import verdict
from collectives.bench._timing import interleaved
from collectives.hlo import collective_stats

OVERHEAD_COLLECTIVES: tuple[str, ...] = tuple(
    name for name, recipe in RECIPES.items()
    if recipe.bench is not None and recipe.family == "core")
"""The recipes ``bench --overhead`` times: the core recipes with a ``bench``
fact, whose shard_map body is the bare primitive it is compared with, so
both compile to the same collectives. (The ring recipes, built from
``ppermute``, send other collectives than their native primitive: the
sweep compares them, ``--forms ring``.)"""

RECIPE_TARGET = 1.03
"""recipe shard_map / bare shard_map, for every core op: met when the whole 95 %
interval of the median ratio is at or below it."""
JIT_TARGET = 1.10
"""jit form / shard_map form, for the recipes whose ``bench`` fact sets
``jit_target``."""




@functools.cache
def _bare(name: str, axes: Axes) -> Callable[..., Any]:
    recipe = RECIPES[name]
    spec = RECIPES[name].bench
    body, check_vma = spec.bare, spec.bare_check_vma
    return jax.jit(jax.shard_map(
        functools.partial(body, axis=axes.axis, n=axes.size), mesh=axes.mesh,
        in_specs=recipe.in_specs(axes), out_specs=recipe.out_specs(axes),
        check_vma=check_vma))


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


RATIOS: tuple[tuple[str, str], ...] = (
    ("recipe shard_map", "bare shard_map"), ("jit", "recipe shard_map"),
    ("pmap host input", "pmap device input"))
"""The ratios measured per collective: (numerator, denominator)."""


def targets_for(name: str, recipe_target: float = RECIPE_TARGET,
                jit_target: float = JIT_TARGET) -> tuple[float | None, ...]:
    """The target of each ratio in :data:`RATIOS` for collective ``name``."""
    return (recipe_target, jit_target if RECIPES[name].bench.jit_target else None, None)


def ratio_row(name: str, numerator: str, denominator: str,
              times: Mapping[str, Sequence[float]], target: float | None,
              stopped: str = "precision") -> dict[str, Any]:
    """One overhead row: the median paired ratio, its interval and verdict."""
    est = median_ratio_interval(times[numerator], times[denominator])
    return {
        "name": f"{name}: {numerator} / {denominator}", "collective": name,
        "numerator": numerator, "denominator": denominator, "ratio": est.median,
        "ratio_ci": [est.low, est.high], "half_width": _finite(est.half_width),
        "target": target, "verdict": verdict(est, target),
        "samples": est.samples, "stopped": stopped,
    }


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def run_overhead(names: tuple[str, ...], axes: Axes, *, size: int, dtype: Any,
                 stopping: Stopping, min_time: float,
                 recipe_target: float = RECIPE_TARGET, jit_target: float = JIT_TARGET,
                 progress: Progress | None = None) -> list[dict[str, Any]]:
    """The overhead ratios of each collective in ``names`` (see module doc).

    Rounds are taken until every ratio's interval is within
    ``stopping.precision`` or the collective's time budget is spent;
    ``progress`` counts the ratios (rows) done.
    """
    rows = []
    for name in names:
        if name not in OVERHEAD_COLLECTIVES:
            why = ("it compiles to other collectives than its native primitive; "
                   "the sweep compares the two (bench -c NAME --forms ring)"
                   if name in RECIPES and RECIPES[name].bench is not None
                   else "no bare primitive is known for it")
            raise ValueError(
                f"--overhead: {name!r} cannot be timed against a bare primitive: "
                f"{why}. Fix: choose from {', '.join(OVERHEAD_COLLECTIVES)}.")
        if progress is not None:
            progress.begin(f"overhead: {name}")
        calls = checked_calls(name, axes, size, dtype)

        def ratios(got: Mapping[str, list[float]]) -> list[Estimate]:
            return [median_ratio_interval(got[a], got[b]) for a, b in RATIOS]

        times, stopped = interleaved(calls, stopping=stopping, min_time=min_time,
                                     estimates=ratios)
        for (numerator, denominator), target in zip(
                RATIOS, targets_for(name, recipe_target, jit_target), strict=True):
            rows.append(ratio_row(name, numerator, denominator, times, target,
                                  stopped))
        if progress is not None:
            progress.advance(len(RATIOS))
    return rows


def checked_calls(name: str, axes: Axes, size: int, dtype: Any
                  ) -> dict[str, Callable[[], Any]]:
    """The five variants of ``name`` as no-argument calls, each checked against
    the oracle, the recipe checked to compile to the bare primitive's
    collectives."""
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
    pmap = _cases.pmap_program(recipe, axes)
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
    return calls
