"""``check``: every recipe, every form, against the oracle, on standard meshes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import jax

from collectives._devices import make_mesh
from collectives._registry import RECIPES

MeshConfig = tuple[tuple[int, ...], tuple[str, ...], Any]


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
    progress: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run recipes in every form against the NumPy oracle.

    Args:
      names: recipe names (default: all of :data:`RECIPES`).
      dtypes: input dtypes to try; recipes skip dtypes they do not accept.
      configs: ``(mesh_shape, mesh_names, axis)`` triples; default
        :func:`standard_configs`.
      seed: seed for the random inputs.
      progress: called with each result as soon as it is known.

    Returns:
      One :class:`CheckResult` per recipe, mesh, axis and dtype.

    Raises:
      KeyError: a name is not a registered recipe.

    Examples:
      >>> import collectives as cx
      >>> rows = cx.check(["psum"], configs=[((8,), ("i",), None)])
      >>> [(r.recipe, r.mesh, r.ok) for r in rows]
      [('psum', '8', True)]
    """
    # Local import: the assertions live with the test toolkit.
    from collectives._forms import dtype_kind
    from collectives.testing import assert_forms_agree

    chosen = list(RECIPES) if names is None else list(names)
    for name in chosen:
        if name not in RECIPES:
            raise KeyError(
                f"no recipe named {name!r}; known recipes: {', '.join(RECIPES)}.")
    rows = []
    for name in chosen:
        recipe = RECIPES[name]
        for shape, mesh_names, axis in configs or standard_configs():
            mesh = make_mesh(shape, mesh_names)
            axes = recipe.axes(mesh, axis)
            if recipe.axes_check(axes) is not None:
                continue
            for dtype in dtypes:
                if dtype_kind(dtype) not in recipe.kinds:
                    continue
                start = time.perf_counter()
                try:
                    args = recipe.example_args(mesh, axis, dtype=dtype, seed=seed)
                    report = assert_forms_agree(recipe, *args, mesh=mesh, axis=axis)
                    ok, detail = True, ""
                    forms, error = report.forms, max(report.max_error.values())
                except Exception as err:  # reported in the table, not raised
                    ok, detail = False, f"{type(err).__name__}: {err}"
                    forms, error = (), float("nan")
                row = CheckResult(
                    recipe=name, mesh="x".join(map(str, shape)),
                    axis=",".join(axes.names), dtype=str(dtype), forms=forms,
                    max_error=error, ok=ok, detail=detail,
                    seconds=time.perf_counter() - start)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows
