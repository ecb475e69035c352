"""``check`` and ``run``: every recipe, every form, against the oracle."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import time
import traceback
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from collectives import _args
from collectives._arrays import dtype_kind
from collectives._arrays import narrowed
from collectives._compare import Agreement
from collectives._compare import forms_agree
from collectives._devices import MESH_NAMES
from collectives._devices import make_mesh
from collectives._kernel_runs import StrictKernelForm
from collectives._kernel_runs import kinds_named
from collectives._kernels import KernelTimeout
from collectives._kernels import wedged
from collectives._layout import Axes
from collectives._recipe import FAMILIES
from collectives._recipe import Recipe
from collectives._recipe import RecipeUnavailable
from collectives._recipe import UnsupportedDtypeError
from collectives._registry import RECIPES
from collectives._registry import file_changed
from collectives._registry import no_recipe
from collectives._tolerance import can_fail
from collectives._tolerance import tolerance

MeshConfig = tuple[tuple[int, ...], tuple[str, ...], Any]
FormsFor = Callable[[Any, Axes], Mapping[str, Callable[..., Any]]]
"""``forms(recipe, axes)``: the callables ``check`` compares for one row, given
axes that the row's arguments were validated for."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One line of the ``check`` table.

    Attributes:
      recipe: the recipe name.
      mesh: the mesh shape, e.g. ``"8"`` or ``"4x2"``.
      axis: the collective axes, e.g. ``"i"`` or ``"i,j"``.
      dtype: the dtype of the inputs.
      forms: the forms that ran.
      max_error: the largest absolute difference from the oracle.
      ok: whether every form agreed with the oracle.
      detail: the failure message, empty when ``ok``.
      seconds: wall time, compilation included.
      skipped: not a failure: the recipe needs an optional package that is
        not installed, refuses the dtype, or (with ``exact``) does not keep
        small integers of the dtype exact; ``detail`` says which and the fix.
      explicit: the explicit form's part: ``"ok"`` (it ran and agreed),
        ``"skipped: why"`` (the recipe has no explicit form on these axes on
        this JAX), ``"FAIL"`` or ``"-"`` (not compared).
    """

    recipe: str
    mesh: str
    axis: str
    dtype: str
    forms: tuple[str, ...]
    max_error: float
    ok: bool
    detail: str
    seconds: float
    skipped: bool = False
    explicit: str = "-"


def standard_configs(n_devices: int | None = None) -> list[MeshConfig]:
    """A 1-D mesh over every device, and a 2-D ``(n/2, 2)`` mesh over both axes
    and each axis alone (when there are at least 4 devices)."""
    n = jax.device_count() if n_devices is None else n_devices
    configs: list[MeshConfig] = [((n,), ("i",), None)]
    if n >= 4 and n % 2 == 0:
        shape = (n // 2, 2)
        names = ("i", "j")
        configs += [(shape, names, None), (shape, names, "i"), (shape, names, "j")]
    return configs


def check(
    names: Iterable[str] | None = None,
    *,
    dtypes: Sequence[str] = ("float32",),
    configs: Sequence[MeshConfig] | None = None,
    seed: int = 0,
    exact: bool = False,
    dims: Sequence[int] | None = None,
    forms: FormsFor | None = None,
    on_report: Callable[[CheckResult, tuple[Any, ...], Any], None] | None = None,
    progress: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run recipes in every form against the NumPy oracle.

    Args:
      names: recipe names, or one name (default: all of :data:`RECIPES`).
      dtypes: input dtypes to try, or one dtype; recipes skip dtypes they do
        not accept.
      configs: ``(mesh_shape, mesh_names, axis)`` triples; default
        :func:`standard_configs`.
      seed: seed for the random inputs.
      dims: the sizes of the example inputs' per-device blocks (each
        recipe's ``example_shapes``; default ``(2, 3)``), e.g. ``(256, 1024)``
        for 1 MiB float32 blocks of most recipes.
      exact: small-integer inputs. Every recipe declared exact
        (:attr:`Recipe.bitwise`) must then match the oracle bit for bit in the
        dtypes it keeps exact (:meth:`Recipe.draws_exact`); the others, whose
        own arithmetic rounds (a mean, a softmax), keep the tolerance policy.
      forms: ``forms(recipe, axes)`` gives the callables to compare for one
        row, whose arguments were validated once for ``axes`` (default:
        ``recipe.bound_forms(axes)``); the multi-process launcher passes
        forms that feed each process its own part of the data. A hook of
        another signature, such as the older ``forms(recipe, mesh, axis)``,
        is refused before any row runs (see Raises).
      on_report: called with each passing row, its inputs and the
        :class:`~collectives.testing.Agreement` (e.g. to save the results).
      progress: called with each result as soon as it is known.

    Returns:
      One :class:`CheckResult` per recipe, mesh, axis and dtype. A row is
      about the recipe's file: where that file changed on disk after this
      process imported it (edited in a notebook's session, swapped by a
      checkout), its rows fail with ``RecipeFileChanged`` and the fix
      instead of reporting on the code imported before.

    Raises:
      KeyError: a name is not a registered recipe.
      ValueError: a 64-bit dtype while ``jax_enable_x64`` is off (JAX would
        compute in its 32-bit twin); ``dims`` below 1 or whose inputs cannot
        fit this machine's memory.
      TypeError: ``dims`` is not a list of whole numbers.
      TypeError: ``forms`` does not take ``(recipe, axes)``; the message
        names the hook and the fix (read ``axes.mesh`` and ``axes.axis``).
      KernelTimeout: a kernel was stopped but still holds XLA:CPU's threads
        (too few for the simulated devices): nothing more can run in this
        process. The rows before it were passed to ``progress``.

    Examples:
      >>> import collectives as cx
      >>> rows = cx.check(["psum"], configs=[((8,), ("i",), None)])
      >>> [(r.recipe, r.mesh, r.ok) for r in rows]
      [('psum', '8', True)]
    """
    if isinstance(names, str):  # one recipe's name
        names = [names]
    chosen = list(RECIPES) if names is None else list(names)
    for name in chosen:
        if name not in RECIPES:
            raise KeyError(
                no_recipe(name))
    if isinstance(dtypes, str):  # one dtype's name
        dtypes = [dtypes]
    for dtype in dtypes:
        twin = narrowed(dtype)
        if twin:
            raise ValueError(
                f"check(dtypes=...): {dtype!r} is computed as {twin} while 64-bit "
                "types are off, and its rows would say otherwise. Fix: call "
                "jax.config.update('jax_enable_x64', True) before any JAX "
                f"operation (or set JAX_ENABLE_X64=1), or pass {twin!r}.")
    if dims is not None:
        dims = _args.counts(dims, label="dims", unit="elements",
                            each="block size", fix="Fix: e.g. dims=(256, 1024) "
                            "(--dims 256 1024 on the command line).")
        _fits_in_memory(dims, dtypes, configs or standard_configs())
    forms_for = _forms_hook(forms)
    rows = []
    for name in chosen:
        recipe = RECIPES[name]
        for shape, mesh_names, axis in configs or standard_configs():
            mesh = make_mesh(shape, mesh_names)
            if recipe.unsupported_reason(recipe.axes(mesh, axis)) is not None:
                continue
            for dtype in dtypes:
                if dtype_kind(dtype) not in recipe.dtype_kinds:
                    continue
                row, args, report = _check_row(recipe, shape, mesh, axis, dtype,
                                               seed=seed, exact=exact, dims=dims,
                                               forms_for=forms_for)
                rows.append(row)
                if report is not None and on_report is not None:
                    on_report(row, args, report)
                if progress is not None:
                    progress(row)
                if wedged() is not None:  # nothing more can run here
                    raise wedged()
    return rows


def error_detail(err: BaseException) -> str:
    """``Type: message``; for an error without a message (a bare ``assert``),
    where it was raised: the file (from ``jax/`` or the package where it is
    one of theirs), the line and the function."""
    if str(err).strip():
        return f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return f"{type(err).__name__} with no message"
    last = frames[-1]
    parts = Path(last.filename).parts
    anchor = max((i for i, part in enumerate(parts)
                  if part in ("jax", "jaxlib", "collectives", "recipes")), default=None)
    where = "/".join(parts[anchor:]) if anchor is not None else last.filename
    in_jax = anchor is not None and parts[anchor].startswith("jax")
    inside = " (inside JAX)" if in_jax else ""
    return (f"{type(err).__name__} with no message, raised at {where}:{last.lineno} "
            f"in {last.name}{inside}")


def _check_row(recipe: Recipe, shape: tuple[int, ...], mesh: Any, axis: Any,
               dtype: Any, *, seed: int, exact: bool, forms_for: FormsFor,
               dims: Sequence[int] | None = None
               ) -> tuple[CheckResult, Any, Agreement | None]:
    """One row of ``check``, its inputs, and what the forms agreed on (None
    where they did not run or did not agree: the row says why)."""
    start = time.perf_counter()
    args, report, skipped = None, None, False
    try:
        args, report = _agreement(recipe, mesh, axis, dtype, seed=seed,
                                  exact=exact, forms_for=forms_for, dims=dims)
        ok, detail = True, ""
        done, error = report.forms, max(report.max_error.values())
    except (ImportError, UnsupportedDtypeError, RecipeUnavailable) as err:
        # an optional dependency (optax), a dtype it refuses (for any input,
        # or for small integers), or a body this JAX or process cannot run
        ok, detail, done, error = True, str(err), (), float("nan")
        skipped = True
    except Exception as err:  # reported in the table, not raised
        ok, detail = False, error_detail(err)
        done, error = (), float("nan")
    row = CheckResult(
        recipe=recipe.name, mesh="x".join(map(str, shape)),
        axis=",".join(recipe.axes(mesh, axis).names), dtype=str(dtype),
        forms=done, max_error=error, ok=ok, detail=detail,
        seconds=time.perf_counter() - start, skipped=skipped,
        explicit=_explicit_status(
            recipe, mesh, axis, done, ok, skipped,
            alone=lambda: _explicit_alone(recipe, mesh, axis, dtype, seed=seed,
                                          exact=exact, forms_for=forms_for,
                                          dims=dims)))
    return row, args, report


def _explicit_status(recipe: Recipe, mesh: Any, axis: Any, done: Sequence[str],
                     ok: bool, skipped: bool, alone: Callable[[], str]) -> str:
    """The row's ``explicit`` column, the explicit form's own result: ``ok``
    (it ran and agreed), ``FAIL`` (it disagreed or raised), ``skipped: why``,
    or ``-`` (the row was skipped, or the forms compared were chosen without
    it). Where the row failed before the explicit form's result was known (an
    earlier form raised or disagreed), ``alone()`` compares it by itself."""
    if "explicit" in done:
        return "ok"
    reason = recipe.unrunnable_form("explicit", recipe.axes(mesh, axis))
    if reason:
        return f"skipped: {reason}"
    if ok or skipped or wedged() is not None:  # nothing more can run here
        return "-"
    return alone()


def _explicit_alone(recipe: Recipe, mesh: Any, axis: Any, dtype: Any, *,
                    seed: int, exact: bool, forms_for: FormsFor,
                    dims: Sequence[int] | None) -> str:
    """The explicit form of a failed row compared with the oracle by itself:
    ``ok``, ``FAIL``, or ``-`` where the row's forms do not include it."""
    chosen: list[str] = []

    def explicit_only(recipe: Recipe, axes: Axes) -> dict[str, Callable[..., Any]]:
        forms = {form: fn for form, fn in forms_for(recipe, axes).items()
                 if form in ("explicit", "reference")}
        chosen.extend(forms)
        if "explicit" not in forms:
            raise LookupError("no explicit form among the row's forms")
        return forms

    try:
        _agreement(recipe, mesh, axis, dtype, seed=seed, exact=exact,
                   forms_for=explicit_only, dims=dims)
    except Exception:  # the row says why; the column says whose result
        return "FAIL" if "explicit" in chosen or not chosen else "-"
    return "ok"


def _agreement(recipe: Recipe, mesh: Any, axis: Any, dtype: Any, *, seed: int,
               exact: bool, forms_for: FormsFor, dims: Sequence[int] | None = None
               ) -> tuple[Any, Agreement]:
    """``recipe``'s example inputs, and its forms compared with its oracle.

    Raises:
      UnsupportedDtypeError: ``exact`` inputs leave the range ``dtype`` keeps
        exact, or the tolerance for ``dtype`` could not fail.
      RecipeFileChanged: the recipe's file is not what this process imported.
      Exception: whatever the recipe or the comparison raises.
    """
    changed = file_changed(recipe)
    if changed is not None:  # a row is about the file: not about an old import
        raise changed
    bitwise = exact and recipe.bitwise
    body_reason = recipe.unrunnable_form("shard_map", recipe.axes(mesh, axis))
    if body_reason is not None:  # the body is the recipe: nothing to compare
        raise RecipeUnavailable(f"{recipe.name}: {body_reason}")
    if exact and not recipe.draws_exact(dtype):
        raise UnsupportedDtypeError(_inexact_dtype(recipe, dtype))
    args = recipe.example_args(mesh, axis, dtype=dtype, seed=seed, exact=exact,
                               **({} if dims is None else {"dims": tuple(dims)}))
    # its own refusals first; the one validation of this row
    axes = recipe.validated_axes(args, mesh, axis)
    n_terms = recipe.n_terms(axes, args)
    if not bitwise and not can_fail(dtype, n_terms):
        raise UnsupportedDtypeError(_cannot_fail(recipe, n_terms, dtype))
    tol = {"rtol": 0, "atol": 0} if bitwise else {}
    report = forms_agree(_strict_kernel(recipe, forms_for(recipe, axes)), args,
                         recipe=recipe, axes=axes, n_terms=n_terms, **tol)
    return args, report


def _strict_kernel(recipe: Recipe, forms: Mapping[str, Callable[..., Any]]
                   ) -> Mapping[str, Callable[..., Any]]:
    """``forms``, a kernel recipe's kernel form run in every DMA mode with
    interpret mode's detectors on: a race, a semaphore left non-zero (a DMA
    in flight at the kernel's end), NaN where the oracle holds a number, or
    modes that disagree fail the row, named (as ``check_kernel`` does)."""
    if recipe.family != "kernel" or "shard_map" not in forms:
        return forms
    return {**forms, "shard_map": StrictKernelForm(
        forms["shard_map"], recipe.name, expected=forms.get("reference"))}


def _forms_hook(forms: Callable[..., Any] | None) -> FormsFor:
    """``check``'s ``forms`` argument as ``forms(recipe, axes)``."""
    if forms is None:
        return lambda recipe, axes: recipe.bound_forms(axes)
    try:
        inspect.signature(forms).bind(None, None)
    except TypeError:
        raise TypeError(
            f"check(forms=...): expected forms(recipe, axes), got {forms!r}, which "
            "does not take two arguments. Fix: take (recipe, axes) (axes.mesh, "
            "axes.axis) and return recipe.bound_forms(axes) or your own "
            "callables.") from None
    return forms


def _inexact_dtype(recipe: Recipe, dtype: Any) -> str:
    """Why ``check(exact=True)`` skips ``dtype`` for ``recipe``."""
    wide = ", ".join(sorted(recipe.exact_dtypes or ()))
    return (f"{recipe.name}: small integers in {dtype} leave the range its "
            f"products stay exact in (exact_dtypes: {wide}). Fix: check {dtype} "
            f"without --exact, or exact inputs in {wide}.")


def _cannot_fail(recipe: Recipe, n_terms: int, dtype: Any) -> str:
    """Why ``check`` skips ``dtype`` for ``recipe`` where it counts ``n_terms``."""
    rtol, _ = tolerance(dtype, n_terms)
    return (f"{recipe.name}: the tolerance policy for {n_terms} rounded operations "
            f"in {dtype} allows rtol={rtol:.3g}, so a result of zeros would pass: "
            "the comparison cannot fail. Fix: check it in a wider float dtype.")


# -- the command line: shared by ``check`` and ``launch ... -- check`` --------

def parse_mesh(text: str) -> tuple[int, ...]:
    """``--mesh 4x2`` -> ``(4, 2)``."""
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mesh {text!r}: expected sizes joined by 'x', e.g. 8 or 4x2") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--mesh {text!r}: sizes must be >= 1")
    if len(shape) > len(MESH_NAMES):
        raise argparse.ArgumentTypeError(
            f"--mesh {text!r}: at most {len(MESH_NAMES)} axes")
    return shape


def add_mesh_arguments(parser: argparse.ArgumentParser) -> None:
    """``--mesh`` and ``--axis``."""
    parser.add_argument("--mesh", type=parse_mesh,
                        help="mesh shape, e.g. 8 or 4x2 (axes named i, j, ...)")
    parser.add_argument("--axis", help="collective axes, e.g. i or i,j "
                                       "(default: every mesh axis)")


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``check``."""
    parser.add_argument("names", nargs="*", help="recipes to check (default: all)")
    parser.add_argument("--family", choices=FAMILIES, action="append",
                        help="check the recipes of this family (repeat for more; "
                             "with names, those too)")
    parser.add_argument("--dtype", nargs="+", default=["float32"], type=_args.dtype,
                        help="input dtypes (default: float32)")
    add_mesh_arguments(parser)
    parser.add_argument("--exact", action="store_true",
                        help="small-integer inputs: recipes declared exact must match "
                             "the oracle bit for bit")
    parser.add_argument("--seed", type=_args.seed, default=0,
                        help="seed of the inputs (default: %(default)s)")
    parser.add_argument("--dims", type=_positive_int, nargs="+", metavar="N",
                        help="sizes of each device's block of the example inputs "
                             "(default: 2 3; 256 1024 is 1 MiB of float32 for most "
                             "recipes)")


COPIES = 4
"""Arrays of a row's input size held at once, at least: the input, a form's
result, the oracle's and the comparison's."""


def _fits_in_memory(dims: Sequence[int] | None, dtypes: Sequence[str],
                    configs: Sequence[MeshConfig]) -> None:
    """Refuse ``--dims`` whose inputs cannot fit this machine's memory.

    Raises:
      ValueError: naming the dims, the bytes and the fix.
    """
    if not dims:
        return
    devices = max(math.prod(shape) for shape, _, _ in configs)
    itemsize = max(np.dtype(dtype).itemsize for dtype in dtypes)
    need = math.prod(dims) * devices * itemsize * COPIES
    have = _args.memory_bytes()
    if need > have:
        raise ValueError(
            f"--dims {' '.join(map(str, dims))}: {math.prod(dims):,} elements a "
            f"device over {devices} devices, at {itemsize} bytes each and "
            f"{COPIES} copies, need {need / 2**30:,.0f} GiB; this machine has "
            f"{have / 2**30:,.0f} GiB. Fix: smaller --dims (256 1024 is 1 MiB of "
            "float32 a device).")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number, got {text!r}; e.g. --dims 256 1024")
    return value


def write_check_json(rows: Sequence[CheckResult], path: str) -> None:
    """The ``check`` rows as JSON: ``{"jax": version, "rows": [row, ...]}``.

    A row's ``max_error`` is ``null`` where it is NaN (the form failed)."""

    def plain(row: CheckResult) -> dict[str, Any]:
        out = dataclasses.asdict(row)
        out["max_error"] = None if np.isnan(row.max_error) else row.max_error
        return out

    _args.write_text_atomic(path, json.dumps(
        {"jax": jax.__version__, "rows": [plain(r) for r in rows]}, indent=1))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``run``."""
    parser.add_argument("name")
    add_mesh_arguments(parser)
    parser.add_argument("--dtype", default="int32", type=_args.dtype,
                        help="input dtype (default: %(default)s; patterns with "
                             "gradients need a float, e.g. float32)")


def chosen_names(args: argparse.Namespace) -> list[str]:
    """The recipes ``check`` names on its command line: the names given, then
    every recipe of each ``--family`` (in registry order); empty for all."""
    names = list(args.names)
    for family in getattr(args, "family", None) or ():
        names += [name for name, recipe in RECIPES.items()
                  if recipe.family == family and name not in names]
    return names


def axis_from_args(args: argparse.Namespace) -> tuple[str, ...] | None:
    return tuple(args.axis.split(",")) if args.axis else None


def configs_from_args(args: argparse.Namespace) -> list[MeshConfig]:
    """``--mesh``/``--axis`` as one config, else the standard set."""
    if not args.mesh:
        if args.axis:
            raise ValueError("--axis needs --mesh (the standard set of meshes "
                             "fixes its own axes). Fix: add e.g. --mesh 4x2.")
        return standard_configs()
    return [(args.mesh, MESH_NAMES[: len(args.mesh)], axis_from_args(args))]


def check_arguments(args: argparse.Namespace) -> list[MeshConfig]:
    """``check``'s command line checked before any work: the meshes (its
    configs, returned), the recipe names and whether ``--dims`` fits.

    Raises:
      KeyError: an unknown recipe name.
      ValueError: ``--axis`` without ``--mesh``; ``--dims`` beyond memory.
    """
    configs = configs_from_args(args)
    _fits_in_memory(getattr(args, "dims", None), args.dtype, configs)
    for name in chosen_names(args):
        if name not in RECIPES:
            raise KeyError(no_recipe(name))
    return configs


def print_check(args: argparse.Namespace, *, forms: FormsFor | None = None,
                on_report: Callable[..., None] | None = None
                ) -> list[CheckResult]:
    """Run ``check`` from parsed arguments, printing the table as it goes.

    Raises:
      KeyError: an unknown recipe name.
      ValueError: ``--axis`` without ``--mesh``.
    """
    configs = check_arguments(args)
    names = chosen_names(args)
    width = max(len("recipe"), *map(len, names or RECIPES))
    header = (f"{'recipe':<{width}} {'mesh':<5} {'axis':<5} {'dtype':<10} "
              f"{'forms':<18} {'explicit':<8} {'max error':>10}  status")
    print(header)
    print("-" * len(header))

    def show(row: CheckResult) -> None:
        done = "+".join(f for f in row.forms
                        if f not in ("reference", "explicit")) or "-"
        explicit, _, why = row.explicit.partition(": ")
        status = _status(row) + (f" (explicit skipped: {why})" if why else "")
        print(f"{row.recipe:<{width}} {row.mesh:<5} {row.axis:<5} {row.dtype:<10} "
              f"{done:<18} {explicit:<8} {row.max_error:>10.3g}  {status}",
              flush=True)

    rows = check(names or None, dtypes=args.dtype, seed=args.seed,
                 exact=args.exact, dims=getattr(args, "dims", None),
                 configs=configs, forms=forms, on_report=on_report, progress=show)
    failed = [row for row in rows if not row.ok]
    print("-" * len(header))
    print(f"{summarize(rows)} (each form vs the NumPy oracle)")
    for row in failed:
        print(f"\nFAIL {row.recipe} mesh={row.mesh} axis={row.axis} "
              f"dtype={row.dtype}:\n{row.detail}")
    return rows


def _status(row: CheckResult) -> str:
    if row.skipped:
        return f"skipped ({row.detail})"
    if row.ok:
        return "ok"
    if row.detail.startswith(f"{KernelTimeout.__name__}: "):
        return "FAIL (kernel: hang)"
    kinds = kinds_named(row.detail)
    return f"FAIL (kernel: {kinds})" if kinds else "FAIL"


def summarize(rows: Sequence[CheckResult]) -> str:
    failed = sum(not row.ok for row in rows)
    skipped = sum(row.skipped for row in rows)
    text = f"{len(rows) - failed - skipped} agree, {failed} disagree"
    return text + (f", {skipped} skipped" if skipped else "")


def print_run(args: argparse.Namespace, *, forms: FormsFor | None = None) -> None:
    """Run one recipe in every form on small integer data and print it all."""
    if args.name not in RECIPES:
        raise KeyError(no_recipe(args.name))
    recipe = RECIPES[args.name]
    shape = args.mesh or (jax.device_count(),)
    mesh = make_mesh(shape, MESH_NAMES[: len(shape)])
    axis = axis_from_args(args)
    inputs = recipe.example_args(mesh, axis, dtype=args.dtype, exact=True)
    bound = _forms_hook(forms)(recipe, recipe.validated_axes(inputs, mesh, axis))
    np.set_printoptions(linewidth=100, threshold=200)
    for name, value in zip(recipe.arg_names, inputs, strict=True):
        print(f"{name} =\n{value}\n")
    for form, fn in bound.items():
        print(f"{form}:\n{jax.tree_util.tree_map(np.asarray, fn(*inputs))}\n",
              flush=True)
