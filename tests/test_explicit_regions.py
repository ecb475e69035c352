"""The code users copy for the explicit form is the code ``check`` runs.

Every recipe file's ``# [start:explicit]`` ... ``# [end:explicit]`` region
(the docs show it as the explicit form) is broken here in one generic way:
each ``return EXPR`` of the functions it defines, nested ones too, returns
``EXPR`` perturbed (floats scaled and shifted, so a loss's gradient changes
too; integers shifted; booleans negated; PRNG keys, Python values and
shardings left as they are). The mutated functions take the place of the
file's own (the function objects the registry holds get the mutated code),
and ``check`` must then report the explicit form of every recipe of that
file as disagreeing. The regions are read from the files, not listed here.
"""

import ast
import functools
import importlib
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import collectives as cx
from collectives._recipe import clear_caches
from helpers import RECIPE_FILES
from helpers import runnable_configs

START, END = "# [start:explicit]", "# [end:explicit]"
BROKEN = "_explicit_region_broken"


def explicit_regions(path):
    """``(first, last)`` line numbers (1-based) of each explicit region."""
    lines = path.read_text().splitlines()
    starts = [n for n, line in enumerate(lines, 1) if line.strip() == START]
    ends = [n for n, line in enumerate(lines, 1) if line.strip() == END]
    assert len(starts) == len(ends), f"{path.name}: unmatched {START}/{END}"
    return list(zip(starts, ends, strict=True))


FILES = [path for path in RECIPE_FILES if explicit_regions(path)]


def _perturbed(tree):
    """``tree`` with every array leaf changed (a broken explicit form)."""

    def leaf(x):
        dtype = getattr(x, "dtype", None)
        if dtype is None or not hasattr(x, "shape"):
            return x  # a Python value, a mesh, a sharding
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return x
        if jnp.issubdtype(dtype, jnp.bool_):
            return ~x
        if jnp.issubdtype(dtype, jnp.inexact):
            return x * 1.5 + 1  # scale and offset: a gradient changes too
        if jnp.issubdtype(dtype, jnp.integer):
            return x + 1
        return x

    return jax.tree_util.tree_map(leaf, tree)


class _BreakReturns(ast.NodeTransformer):
    def visit_Return(self, node):
        if node.value is None:
            return node
        call = ast.Call(ast.Name(BROKEN, ast.Load()), [node.value], [])
        return ast.copy_location(ast.Return(call), node)


def region_functions(path):
    """The top-level functions each explicit region of ``path`` defines."""
    tree = ast.parse(path.read_text())
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(first < node.lineno <= last
                    for first, last in explicit_regions(path))]


def _mutated_code(path, node):
    """The code object of ``node`` with every return broken."""
    broken = _BreakReturns().visit(ast.fix_missing_locations(node))
    module = ast.fix_missing_locations(ast.Module([broken], []))
    code = compile(module, str(path), "exec")
    (found,) = [c for c in code.co_consts
                if getattr(c, "co_name", None) == node.name]
    return found


def _explicit_and_reference(recipe, axes):
    return {form: fn for form, fn in recipe.bound_forms(axes).items()
            if form in ("explicit", "reference")}


def _config(recipe):
    mesh, axis = runnable_configs(recipe)[0]
    return tuple(mesh.shape.values()), tuple(mesh.axis_names), axis


def _dtype(recipe):
    return "float32" if "float" in recipe.dtype_kinds else "int32"


def test_every_registered_recipe_file_has_an_explicit_region():
    files = {recipe.recipe_file for recipe in cx.RECIPES.values()}
    assert files <= {path.name for path in FILES}, files - {p.name for p in FILES}


def _defined_at(fn):
    """``(file, first line)`` of the function ``fn`` adapts (through partials,
    wrappers and the training recipes' lazy ``__wrapped__``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn.__code__.co_filename, fn.__code__.co_firstlineno


@pytest.mark.parametrize("name", list(cx.RECIPES))
def test_every_explicit_program_is_defined_in_its_files_explicit_region(name):
    recipe = cx.RECIPES[name]
    assert recipe.explicit_program is not None, (
        f"{name}: explicit_program=None runs the jit form's program, outside the "
        f"explicit region of recipes/{recipe.recipe_file}. Fix: define "
        f"{name}_explicit_program there (it may call the jit program) and register it")
    filename, line = _defined_at(recipe.explicit_program)
    path = next(p for p in FILES if p.name == recipe.recipe_file)
    assert Path(filename).resolve() == path.resolve() and any(
        first < line <= last for first, last in explicit_regions(path)), (
        f"{name}: its explicit_program is defined at {filename}:{line}, not in "
        f"the explicit region of recipes/{recipe.recipe_file}")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_breaking_the_explicit_region_fails_the_explicit_form(path, monkeypatch):
    names = [name for name, recipe in cx.RECIPES.items()
             if recipe.recipe_file == path.name]
    assert names, f"recipes/{path.name} has an explicit region but no recipe"
    module = importlib.import_module(f"collectives.recipes.{path.stem}")
    functions = region_functions(path)
    assert functions, f"recipes/{path.name}: its explicit region defines no function"
    monkeypatch.setattr(module, BROKEN, _perturbed, raising=False)
    for node in functions:
        monkeypatch.setattr(getattr(module, node.name), "__code__",
                            _mutated_code(path, node))
    clear_caches()
    try:
        agreed, ran = [], 0
        for name in names:
            recipe = cx.RECIPES[name]
            (row,) = cx.check([name], configs=[_config(recipe)],
                              dtypes=[_dtype(recipe)], forms=_explicit_and_reference)
            if row.skipped or row.explicit.startswith("skipped"):
                continue  # no explicit form here (this JAX): nothing to break
            ran += 1
            if row.ok or row.explicit != "FAIL" or "explicit" not in row.detail:
                agreed.append(f"{name}: ok={row.ok} explicit={row.explicit} "
                              f"{row.detail[:200]}")
    finally:
        monkeypatch.undo()
        clear_caches()
    if not ran:
        pytest.skip(f"no recipe of recipes/{path.name} has an explicit form here")
    assert not agreed, (
        f"breaking the explicit region of recipes/{path.name} left these explicit "
        "forms agreeing: they run code outside the region (register the region's "
        "programs as explicit_program in the facts block): " + "; ".join(agreed))
