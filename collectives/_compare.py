"""Assertions that compare the forms of a sharded computation with an oracle."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from collectives._arrays import dtype_kind
from collectives._layout import Axes
from collectives._layout import AxisArg
from collectives._recipe import FORMS
from collectives._recipe import Recipe
from collectives._rounding import infer_n_terms
from collectives._tolerance import can_fail
from collectives._tolerance import check_tolerances
from collectives._tolerance import describe_tolerance
from collectives._tolerance import tolerance

REFERENCE = "reference"


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What :func:`assert_forms_agree` found when every form agreed.

    Attributes:
      forms: the names of the forms that ran, reference last if present.
      max_error: per form, the largest absolute difference from the
        reference (or from the first form when there is no reference).
      rtol, atol: the tolerance used (``atol`` already scaled by the inputs;
        the largest one where it scales per element, see ``Recipe.magnitudes``).
      results: per form, what it returned.
      n_terms: the rounded operations per output element the policy
        tolerance was computed for: given, the recipe's, or inferred from a
        form's jaxpr (see ``n_terms_source``).
      n_terms_source: where ``n_terms`` came from: ``"given"``,
        ``"recipe"``, ``"inferred from the jit form's jaxpr (longest chain
        of roundings: dot_general over 128)"``, why it could not be
        inferred (``n_terms`` is then 1), or ``"default"`` (1, unused: the
        results are integers, or ``rtol`` and ``atol`` were both given).
    """

    forms: tuple[str, ...]
    max_error: dict[str, float]
    rtol: float
    atol: float
    results: dict[str, Any]
    n_terms: int = 1
    n_terms_source: str = "default"


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


def _scalar(value: Any) -> str:
    """A scalar for messages, at its dtype's precision: ``0.90347016``, not
    ``np.float32(0.90347016)``."""
    return str(np.asarray(value)[()])


def compare_arrays(got: Any, want: Any, *, rtol: float, atol: Any
                   ) -> tuple[float, str | None]:
    """Max abs difference, and a description of the worst element if too big.

    An element passes when ``|got - want| <= atol + rtol * |want|``. NaNs
    match NaNs and infinities must match exactly.

    Args:
      got, want: array-likes of the same shape.
      rtol, atol: the tolerance; ``0, 0`` compares exactly. ``atol`` may
        also be an array of ``want``'s shape (a tolerance per element).

    Returns:
      ``(max_abs_difference, None)`` when every element passes, else
      ``(max_abs_difference, description)`` naming how many elements differ,
      the worst index, both values, the difference and what was allowed.

    Raises:
      ValueError: ``rtol`` or ``atol`` is not a finite number >= 0 (or an
        array of them).

    Examples:
      >>> import numpy as np
      >>> from collectives.testing import compare_arrays
      >>> error, why = compare_arrays(np.array([1.0, 2.5]), np.array([1.0, 2.0]),
      ...                             rtol=0, atol=0)
      >>> error
      0.5
      >>> print(why)
      1 of 2 elements differ; worst at index (1,): got 2.5, want 2.0 (|diff| 0.5 ...
    """
    check_tolerances("compare_arrays", rtol=rtol, atol=atol)
    return _compare_arrays(got, want, rtol=rtol, atol=atol)


def _compare_arrays(got: Any, want: Any, *, rtol: float, atol: Any
                    ) -> tuple[float, str | None]:
    # compare_arrays on tolerances this package derived (an infinite input
    # scales a per-element atol to infinity, which must still compare)
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
        allowed = np.broadcast_to(atol + rtol * np.abs(ww).astype(np.float64),
                                  diff.shape)
    same = (gw == ww) | (_isnan(gw) & _isnan(ww))
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(diff <= allowed)
    finite = diff[np.isfinite(diff)]
    max_err = float(finite.max()) if finite.size else 0.0
    if bad.any():
        # a NaN where a number is wanted (or the reverse) is an infinite error
        wrong = np.where(bad, np.nan_to_num(diff, nan=np.inf, posinf=np.inf), -1.0)
        max_err = max(max_err, float(wrong.max()))
        worst = np.unravel_index(int(np.argmax(wrong)), diff.shape)
        index = tuple(int(i) for i in worst)
        return max_err, (
            f"{int(bad.sum())} of {bad.size} elements differ; worst at index "
            f"{index}: got {_scalar(g[index])}, want {_scalar(w[index])} (|diff| "
            f"{wrong[index]:.6g} > allowed {allowed[index]:.3g})")
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


def _bind_forms(recipe_or_forms: Any, args: Sequence[Any], mesh: Any, axis: Any
                ) -> tuple[dict[str, Callable[..., Any]], Recipe | None, Axes | None]:
    """The forms to run, and the recipe and the axes its arguments were
    validated for (once, here), if there is a recipe."""
    if isinstance(recipe_or_forms, Recipe):
        recipe = recipe_or_forms
        axes = recipe.validated_axes(args, mesh, axis)
        return recipe.bound_forms(axes), recipe, axes
    if not isinstance(recipe_or_forms, Mapping):
        raise TypeError(
            "recipe_or_forms: expected a collectives.Recipe or a mapping of form "
            f"names to callables, got {type(recipe_or_forms).__name__}. Fix: pass "
            "e.g. {'shard_map': f, 'jit': g, 'reference': numpy_f}.")
    forms = dict(recipe_or_forms)
    if len(forms) < 2:
        raise ValueError(
            f"recipe_or_forms: need at least two forms to compare, got "
            f"{list(forms)}. Fix: pass e.g. {{'shard_map': f, 'reference': ref}}.")
    for name, fn in forms.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"recipe_or_forms[{name!r}]: expected a str name and a "
                            f"callable, got {fn!r}.")
    if mesh is not None or axis is not None:
        raise TypeError(
            "assert_forms_agree: mesh= and axis= configure a Recipe's forms; your "
            "own callables must bind their mesh themselves. Fix: drop mesh=/axis=, "
            "or pass e.g. functools.partial(f, mesh=mesh).")
    return forms, None, None


def _describe_tolerance(dtype: np.dtype, rtol: float, atol: float, *,
                        given: tuple[bool, bool], n_terms: int, scale: float,
                        pairwise: bool, per_element: bool = False,
                        inferred: tuple[str, str] | None = None) -> str:
    parts = [describe_tolerance(dtype, rtol, atol)]
    if not all(given):
        parts.append(f"policy tolerance({dtype.name}, n_terms={n_terms})")
        if inferred is not None:  # (where it came from, how to set it)
            parts.append(f"n_terms={n_terms} {inferred[0]}; {inferred[1]}")
        if per_element and atol:
            parts.append("atol scaled per element by the root-sum-square of its "
                         "terms (the recipe's magnitudes; at least the largest "
                         f"|input| {scale:g}), up to {atol:.3g}")
        elif not given[1] and atol:
            parts.append(f"atol scaled by the largest |input| {scale:g}")
    if any(given):
        names = [n for n, g in zip(("rtol", "atol"), given, strict=True) if g]
        parts.append(f"{' and '.join(names)} given")
    if pairwise:
        parts.append("forms compared with each other are allowed twice this")
    return "; ".join(parts)


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

    With a ``"reference"`` (a recipe always has one: its NumPy oracle), each
    form is compared with it; without one, each form is compared with the
    first, at twice the tolerance. Forms must also agree on output structure,
    shapes and dtypes.

    Args:
      recipe_or_forms: a :class:`~collectives.Recipe`, or a mapping from form
        name to a callable taking ``*args`` and returning global-view arrays,
        e.g. ``{"shard_map": f, "jit": g, "reference": numpy_f}``: any two or
        more of ``pmap``, ``shard_map``, ``jit``, ``reference`` (other names
        are forms too). ``"reference"``, the oracle, is compared with every
        form.
      *args: the global-view arguments.
      mesh, axis: passed to the recipe's forms (a TypeError for callables,
        which bind their own mesh).
      rtol, atol: override the tolerance policy (``atol`` is then absolute);
        by default ``tolerance(dtype, n_terms)`` with ``atol`` scaled by the
        largest input magnitude, or per element by the root-sum-square of
        its terms where the recipe declares ``magnitudes``.
      n_terms: rounded operations per output element, for the default
        tolerance. A recipe knows its own. For callables it is inferred:
        every form that ``jax.make_jaxpr`` can trace (a NumPy reference
        cannot) is called once more, traced, and the longest chain of
        roundings behind an output element in any of their jaxprs counts
        (a ``dot_general`` over 128 counts 128, a ``psum`` over 8 devices
        8; see docs/testing.md). If no form can be counted it is 1, and a
        failure says why.

    Returns:
      An :class:`Agreement` with the per-form errors and results.

    Raises:
      AssertionError: a form differs from the reference (or from the first
        form) in structure, shape, dtype or value. The message first names
        the forms that disagree and those that agree, then one line per
        output: the worst index, both values, the difference and what was
        allowed; then the tolerance used and the inputs.
      TypeError, ValueError: ``recipe_or_forms`` is neither a recipe nor a
        mapping of at least two callables; ``rtol`` or ``atol`` is not a
        finite number >= 0, or ``n_terms`` not a count; or the inferred
        ``n_terms`` is so large for the dtype (64 in bfloat16) that the
        comparison could not fail.
      RuntimeError: ``n_terms`` is to be inferred but a form's jaxpr holds
        an equation that this package cannot read on the running JAX (the
        message names the version and the equation); pass ``n_terms=``.

    A failure with an inferred ``n_terms`` says so in its tolerance line:
    ``n_terms=128 inferred from the jit form's jaxpr (longest chain of
    roundings: dot_general over 128); pass n_terms= to override``.

    Examples:
      >>> import numpy as np
      >>> import collectives as cx
      >>> from collectives.testing import assert_forms_agree
      >>> x = np.arange(16.0).reshape(8, 2)
      >>> report = assert_forms_agree(cx.RECIPES["psum"], x)
      >>> report.forms
      ('pmap', 'shard_map', 'jit', 'explicit', 'reference')
      >>> assert_forms_agree({"jit": lambda x: x.sum(0) * 2,
      ...                     "reference": lambda x: x.sum(0)}, x)
      Traceback (most recent call last):
      ...
      AssertionError: forms: jit disagrees with the reference.
        jit vs reference, output: 2 of 2 elements differ; worst at index (1,): ...
    """
    check_tolerances("assert_forms_agree", rtol=rtol, atol=atol)
    if n_terms is not None:
        tolerance("float32", n_terms)  # refuses a count that is not one
    forms, recipe, axes = _bind_forms(recipe_or_forms, args, mesh, axis)
    return forms_agree(forms, args, recipe=recipe, axes=axes,
                       rtol=rtol, atol=atol, n_terms=n_terms)


def forms_agree(forms: Mapping[str, Callable[..., Any]], args: Sequence[Any], *,
                recipe: Recipe | None, axes: Axes | None = None,
                rtol: float | None = None, atol: float | None = None,
                n_terms: int | None = None) -> Agreement:
    """:func:`assert_forms_agree` on bound ``forms``: those of ``recipe``
    itself, or others computing it (the multi-process launcher's), compared
    under the recipe's tolerance facts. With a ``recipe``, ``axes`` are those
    :meth:`Recipe.validated_axes` returned for ``args``."""
    label = "forms" if recipe is None else f"recipe {recipe.name!r}"
    if recipe is not None and axes is None:
        raise ValueError(
            f"forms_agree: recipe {recipe.name!r} needs the axes its arguments "
            "were validated for. Fix: pass axes=recipe.validated_axes(args, "
            "mesh, axis).")
    source = "given" if n_terms is not None else "default"
    if recipe is not None and n_terms is None:
        n_terms, source = recipe.n_terms(axes, args), "recipe"
    results = _run_forms(forms, args, label)
    dtype = _result_dtype(results)
    given = (rtol is not None, atol is not None)
    inferred = None
    if n_terms is None and not all(given) and tolerance(dtype)[0]:
        n_terms, inferred = _infer_n_terms(forms, list(results), args, dtype, label)
        source = inferred[0]
    n_terms = 1 if n_terms is None else n_terms
    default_rtol, unit_atol = tolerance(dtype, n_terms)
    scale = _input_scale(args)
    rtol = default_rtol if rtol is None else float(rtol)
    has_reference = REFERENCE in results
    terms = None
    if atol is None and recipe is not None and has_reference:
        terms = recipe.run("magnitudes", args, axes)
    atol = _atol(atol, terms, unit_atol, scale)
    max_error, wrong, problems = _compare_forms(results, rtol, atol)
    if problems:
        tol = _describe_tolerance(dtype, rtol, _largest(atol), given=given,
                                  n_terms=n_terms, scale=scale,
                                  pairwise=not has_reference,
                                  per_element=terms is not None,
                                  inferred=inferred)
        raise AssertionError(
            f"{label}: {_disagreement(list(results), wrong)}.\n  "
            + "\n  ".join(problems)
            + f"\n  tolerance: {tol}\n  inputs: {_describe_args(args)}")
    return Agreement(forms=tuple(results), max_error=max_error, rtol=rtol,
                     atol=_largest(atol), results=results, n_terms=n_terms,
                     n_terms_source=source)


def _run_forms(forms: Mapping[str, Callable[..., Any]], args: Sequence[Any],
               label: str) -> dict[str, Any]:
    """Each form's result, in the order of :data:`FORMS`, then the others in
    the given order, the reference last."""
    order = [n for n in (*FORMS, *forms) if n in forms and n != REFERENCE]
    order = list(dict.fromkeys(order)) + ([REFERENCE] if REFERENCE in forms else [])
    results: dict[str, Any] = {}
    for name in order:
        try:
            results[name] = forms[name](*args)
        except Exception as err:
            err.add_note(f"(raised by form {name!r} of {label})")
            raise
    return results


def _infer_n_terms(forms: Mapping[str, Callable[..., Any]], order: list[str],
                   args: Sequence[Any], dtype: np.dtype, label: str
                   ) -> tuple[int | None, tuple[str, str]]:
    """``n_terms`` from the forms' jaxprs, and (where it came from, how to set it).

    Raises:
      RuntimeError: a form's jaxpr cannot be walked.
      ValueError: the inferred ``n_terms`` lets the comparison not fail.
    """
    # a tie names the reference, else the global program (jit)
    candidates = [n for n in dict.fromkeys([REFERENCE, "jit", *order]) if n in forms]
    inference = infer_n_terms([(n, forms[n]) for n in candidates], args)
    if inference.unreadable:
        form, why = inference.unreadable[0]
        raise RuntimeError(
            f"{label}: n_terms cannot be inferred: the {form} form's jaxpr "
            f"could not be walked ({why}). Guessing would let the tolerance "
            "fail a correct program. Fix: pass n_terms= (the rounded "
            "operations behind one output element) or rtol= and atol=.")
    n_terms, inferred = inference.n_terms, inference.describe(REFERENCE)
    if n_terms is not None and not can_fail(dtype, n_terms):
        raise ValueError(
            f"n_terms: {n_terms} {inferred[0]}; the policy then allows a relative "
            f"error of {tolerance(dtype, n_terms)[0]:.3g} in {dtype.name}, so "
            "the comparison could not fail. Fix: pass n_terms= (e.g. 1 where "
            "a matmul accumulates in float32 and rounds once at the end, as "
            "XLA does on CPU) or rtol= and atol=.")
    return n_terms, inferred


def _atol(atol: float | None, terms: Any, unit_atol: float, scale: float) -> Any:
    """The absolute tolerance: as given, else the policy's scaled by the
    largest input, or per element by the size of its ``terms``."""
    if atol is not None:
        return float(atol)
    if terms is None:
        return unit_atol * scale
    # per element: the size of its terms, at least the inputs'
    return jax.tree_util.tree_map(
        lambda m: unit_atol * np.maximum(np.asarray(m, np.float64), scale), terms)


def _compare_forms(results: Mapping[str, Any], rtol: float, atol: Any
                   ) -> tuple[dict[str, float], list[str], list[str]]:
    """Each form's result against the reference's (without one: the first
    form's, at twice the tolerance): per form the largest error, the forms
    that disagree, and every problem found."""
    computed = [n for n in results if n != REFERENCE]
    has_reference = REFERENCE in results
    against = _baseline(list(results))
    factor = 1 if has_reference else 2
    problems: list[str] = []
    wrong: list[str] = []
    max_error: dict[str, float] = {} if has_reference else {against: 0.0}
    for name in computed:
        if name == against:
            continue
        error, found = _compare_results(name, results[name], against,
                                        results[against], factor * rtol,
                                        atol if factor == 1 else factor * atol)
        max_error[name] = error
        if found:
            wrong.append(name)
            problems += found
    problems += _dtype_problems(computed, results)
    return max_error, wrong, problems


def _baseline(order: list[str]) -> str:
    """What every form is compared with: the reference, else the first form
    (the reference comes last in ``order``)."""
    return REFERENCE if REFERENCE in order else order[0]


def _disagreement(order: list[str], wrong: list[str]) -> str:
    """Which forms disagree, with what, and which agree."""
    computed = [n for n in order if n != REFERENCE]
    against = _baseline(order)
    agree = [n for n in computed if n not in wrong and n != against]
    one = len(wrong) == 1
    if not wrong:
        head = "forms differ in dtype"
    elif against == REFERENCE:
        head = (f"{', '.join(wrong)} {'disagrees' if one else 'disagree'} with "
                "the reference")
    else:
        head = (f"{', '.join(wrong)} {'differs' if one else 'differ'} from "
                f"{against} (no reference given)")
    if agree:
        head += f"; {', '.join(agree)} {'agrees' if len(agree) == 1 else 'agree'}"
    return head


def _largest(atol: Any) -> float:
    """``atol``, or the largest of a per-element tree of them."""
    if isinstance(atol, float):
        return atol
    return max((float(np.max(a)) for a in jax.tree_util.tree_leaves(atol)
                if np.size(a)), default=0.0)


def _dtype_problems(computed: list[str], results: Mapping[str, Any]) -> list[str]:
    """Forms must return the same dtypes (the reference may compute wider)."""
    problems = []
    first = computed[0]
    first_leaves = jax.tree_util.tree_flatten_with_path(results[first])[0]
    for name in computed[1:]:
        leaves = jax.tree_util.tree_flatten_with_path(results[name])[0]
        if len(leaves) != len(first_leaves):
            continue  # reported as a structure difference
        for (path, a), (_, b) in zip(leaves, first_leaves, strict=True):
            if np.dtype(a.dtype) != np.dtype(b.dtype):
                problems.append(
                    f"{name} vs {first}, {_output(path)}: dtype "
                    f"{np.dtype(a.dtype).name} != {np.dtype(b.dtype).name}")
    return problems


def _output(path: Any) -> str:
    """``output`` for a single array, ``output['loss']`` inside a pytree."""
    return "output" + jax.tree_util.keystr(path)


def _compare_results(name: str, result: Any, other: str, other_result: Any,
                     rtol: float, atol: Any) -> tuple[float, list[str]]:
    """The worst difference between two results and every problem found."""
    tree = jax.tree_util.tree_structure(result)
    other_tree = jax.tree_util.tree_structure(other_result)
    if tree != other_tree:
        return float("inf"), [f"{name}: output structure {tree} != {other}'s "
                              f"{other_tree}"]
    leaves = jax.tree_util.tree_flatten_with_path(result)[0]
    other_leaves = jax.tree_util.tree_flatten_with_path(other_result)[0]
    atols = ([atol] * len(leaves) if isinstance(atol, float)
             else jax.tree_util.tree_leaves(atol))
    worst = 0.0
    problems = []
    for (path, a), (_, b), leaf_atol in zip(leaves, other_leaves, atols, strict=True):
        err, why = _compare_arrays(a, b, rtol=rtol, atol=leaf_atol)
        worst = max(worst, err)
        if why:
            reshaped = np.size(a) == np.size(b) and np.shape(a) != np.shape(b)
            if "pmap" in (name, other) and reshaped:
                why += ("; a pmap form must return the global view: reshape pmap's "
                        "(devices, *block) output to the global shape")
            problems.append(f"{name} vs {other}, {_output(path)}: {why}")
    return worst, problems
