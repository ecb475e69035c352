"""Assertions that compare the forms of a sharded computation with an oracle."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from collectives._forms import FORMS
from collectives._forms import Recipe
from collectives._forms import dtype_kind
from collectives._layout import AxisArg
from collectives.testing._tolerance import describe_tolerance
from collectives.testing._tolerance import tolerance

REFERENCE = "reference"


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What :func:`assert_forms_agree` found when every form agreed.

    Attributes:
      forms: the names of the forms that ran, reference last if present.
      max_error: per form, the largest absolute difference from the
        reference (or from the first form when there is no reference).
      rtol, atol: the tolerance used (``atol`` already scaled by the inputs).
      results: per form, what it returned.
    """

    forms: tuple[str, ...]
    max_error: dict[str, float]
    rtol: float
    atol: float
    results: dict[str, Any]


def _wide(x: np.ndarray) -> np.ndarray:
    kind = dtype_kind(x.dtype)
    if kind == "float":
        return x.astype(np.float64)
    if kind == "complex":
        return x.astype(np.complex128)
    if kind == "int":
        return x.astype(np.int64)
    return x


def _input_scale(args: Any) -> float:
    """The largest finite absolute input value, at least 1."""
    scale = 1.0
    for leaf in jax.tree_util.tree_leaves(args):
        arr = np.asarray(leaf)
        if arr.size and dtype_kind(arr.dtype) in ("float", "complex", "int"):
            mags = np.abs(_wide(arr))
            mags = mags[np.isfinite(mags)]
            if mags.size:
                scale = max(scale, float(mags.max()))
    return scale


def compare_arrays(got: Any, want: Any, *, rtol: float, atol: float
                   ) -> tuple[float, str | None]:
    """Max abs difference, and a description of the worst element if too big.

    NaNs match NaNs and infinities must match exactly.
    """
    g = np.asarray(got)
    w = np.asarray(want)
    if g.shape != w.shape:
        return float("inf"), f"shape {g.shape} != expected shape {w.shape}"
    if g.size == 0:
        return 0.0, None
    gw, ww = _wide(g), _wide(w)
    if dtype_kind(g.dtype) == "bool" or dtype_kind(w.dtype) == "bool":
        diff = (gw != ww).astype(np.float64)
        allowed = np.zeros(diff.shape)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(gw - ww).astype(np.float64)
        allowed = atol + rtol * np.abs(ww).astype(np.float64)
    same = (gw == ww) | (_isnan(gw) & _isnan(ww))
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(diff <= allowed)
    finite = diff[np.isfinite(diff)]
    max_err = float(finite.max()) if finite.size else 0.0
    if bad.any():
        max_err = max(max_err, float(np.nanmax(np.where(bad, diff, 0.0))))
        worst = np.unravel_index(
            int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0))),
            diff.shape)
        index = tuple(int(i) for i in worst)
        return max_err, (
            f"{int(bad.sum())} of {bad.size} elements differ; worst at index "
            f"{index}: got {g[index]!r}, want {w[index]!r} (|diff| "
            f"{diff[index]:.6g} > allowed {allowed[index]:.3g})")
    return max_err, None


def _isnan(x: np.ndarray) -> np.ndarray:
    if dtype_kind(x.dtype) in ("float", "complex"):
        return np.isnan(x)
    return np.zeros(x.shape, bool)


def _describe_args(args: Any) -> str:
    parts = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        shape = tuple(np.shape(leaf))
        dtype = getattr(leaf, "dtype", np.asarray(leaf).dtype)
        parts.append(f"args{jax.tree_util.keystr(path)}: {np.dtype(dtype).name}"
                     f"{list(shape)}")
    return ", ".join(parts)


def _result_dtype(results: Mapping[str, Any]) -> np.dtype:
    for name, result in results.items():
        if name != REFERENCE:
            leaves = jax.tree_util.tree_leaves(result)
            if leaves:
                return np.dtype(leaves[0].dtype)
    leaves = jax.tree_util.tree_leaves(results[REFERENCE])
    return np.asarray(leaves[0]).dtype


def assert_forms_agree(
    recipe_or_forms: Recipe | Mapping[str, Callable[..., Any]],
    *args: Any,
    mesh: jax.sharding.Mesh | None = None,
    axis: AxisArg = None,
    rtol: float | None = None,
    atol: float | None = None,
    n_terms: int | None = None,
) -> Agreement:
    """Run every form on ``args`` and assert they agree with the oracle and each other.

    Args:
      recipe_or_forms: a :class:`~collectives.Recipe`, or a mapping from form
        name to a callable taking ``*args`` and returning global-view arrays,
        e.g. ``{"shard_map": f, "jit": g, "reference": numpy_f}``. At least two
        entries; ``"reference"`` (the oracle) is compared with every form.
      *args: the global-view arguments.
      mesh, axis: passed to the recipe's forms (ignored for callables).
      rtol, atol: override the tolerance policy (``atol`` is then absolute);
        by default ``tolerance(dtype, n_terms)`` with ``atol`` scaled by the
        largest input magnitude.
      n_terms: rounded operations per output element, for the default
        tolerance; a recipe knows its own, callables default to 1.

    Returns:
      An :class:`Agreement` with the per-form errors and results.

    Raises:
      AssertionError: a form differs from the reference or from another form
        in structure, shape, dtype or value; the message names the form, the
        output, the worst index, both values and the tolerance.

    Examples:
      >>> import numpy as np
      >>> import collectives as cx
      >>> from collectives.testing import assert_forms_agree
      >>> x = np.arange(16.0).reshape(8, 2)
      >>> report = assert_forms_agree(cx.RECIPES["psum"], x)
      >>> report.forms
      ('pmap', 'shard_map', 'jit', 'reference')
    """
    if isinstance(recipe_or_forms, Recipe):
        recipe = recipe_or_forms
        forms: Mapping[str, Callable[..., Any]] = recipe.forms(mesh=mesh, axis=axis)
        if n_terms is None:
            n_terms = recipe.n_terms(recipe.axes(mesh, axis))
        label = f"recipe {recipe.name!r}"
    elif isinstance(recipe_or_forms, Mapping):
        forms = dict(recipe_or_forms)
        if len(forms) < 2:
            raise ValueError(
                f"recipe_or_forms: need at least two forms to compare, got "
                f"{list(forms)}. Fix: pass e.g. {{'shard_map': f, 'reference': ref}}.")
        for name, fn in forms.items():
            if not callable(fn):
                raise TypeError(f"recipe_or_forms[{name!r}]: expected a callable, got "
                                f"{fn!r}.")
        label = "forms"
    else:
        raise TypeError(
            "recipe_or_forms: expected a collectives.Recipe or a mapping of form "
            f"names to callables, got {type(recipe_or_forms).__name__}.")
    order = [n for n in (*FORMS, *forms) if n in forms and n != REFERENCE]
    order = list(dict.fromkeys(order)) + ([REFERENCE] if REFERENCE in forms else [])
    results: dict[str, Any] = {}
    for name in order:
        try:
            results[name] = forms[name](*args)
        except Exception as err:
            err.add_note(f"(raised by form {name!r} of {label})")
            raise
    dtype = _result_dtype(results)
    default_rtol, unit_atol = tolerance(dtype, 1 if n_terms is None else n_terms)
    rtol = default_rtol if rtol is None else float(rtol)
    atol = unit_atol * _input_scale(args) if atol is None else float(atol)
    problems: list[str] = []
    max_error: dict[str, float] = {}
    computed = [n for n in order if n != REFERENCE]
    first = computed[0] if computed else None
    for name in computed[1:]:
        errors, found = _compare_results(name, results[name], first, results[first],
                                         2 * rtol, 2 * atol, check_dtype=True)
        problems += found
        max_error[name] = errors
    if REFERENCE in results:
        for name in computed:
            errors, found = _compare_results(name, results[name], REFERENCE,
                                             results[REFERENCE], rtol, atol,
                                             check_dtype=False)
            problems += found
            max_error[name] = errors
    elif first is not None:
        max_error[first] = 0.0
    if problems:
        raise AssertionError(
            f"{label}: forms disagree ({describe_tolerance(dtype, rtol, atol)}; "
            f"inputs {_describe_args(args)}):\n  " + "\n  ".join(problems))
    return Agreement(forms=tuple(order), max_error=max_error, rtol=rtol, atol=atol,
                     results=results)


def _compare_results(name: str, result: Any, other: str, other_result: Any,
                     rtol: float, atol: float, *, check_dtype: bool
                     ) -> tuple[float, list[str]]:
    """The worst difference between two results and every problem found."""
    leaves, tree = jax.tree_util.tree_flatten(result)
    other_leaves, other_tree = jax.tree_util.tree_flatten(other_result)
    if tree != other_tree:
        return float("inf"), [f"{name}: output structure {tree} != {other}'s "
                              f"{other_tree}"]
    worst = 0.0
    problems = []
    for index, (a, b) in enumerate(zip(leaves, other_leaves, strict=True)):
        if check_dtype and np.dtype(a.dtype) != np.dtype(b.dtype):
            problems.append(f"{name} vs {other}, output {index}: dtype "
                            f"{np.dtype(a.dtype).name} != {np.dtype(b.dtype).name}")
            continue
        err, why = compare_arrays(a, b, rtol=rtol, atol=atol)
        worst = max(worst, err)
        if why:
            problems.append(f"{name} vs {other}, output {index}: {why}")
    return worst, problems
