"""The library runs the recipe files.

Every registered recipe's per-device body, global program and NumPy oracle
are functions of its file in ``recipes/`` (imported as
``collectives.recipes``), and breaking the collectives in that file makes
``check`` report a disagreement for every recipe the file holds. No text
search stands in for these tests: they follow the functions the registry
holds to where they are defined, and run the mutated file.
"""

import functools
import inspect
from pathlib import Path

import jax.numpy as jnp
import pytest

import collectives as cx
from collectives._recipe import clear_caches
from helpers import RECIPE_FILES
from helpers import runnable_configs

NAMES = list(cx.RECIPES)
ROLES = ("body", "program", "oracle", "pmap_body")


def _defined_in(fn):
    """The module that defines ``fn``, through partials and wrappers."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.unwrap(fn).__module__


def _file_module(recipe):
    return f"collectives.recipes.{Path(recipe.recipe_file).stem}"


@pytest.mark.parametrize("name", NAMES)
def test_its_body_program_and_oracle_are_its_recipe_files(name):
    recipe = cx.RECIPES[name]
    assert recipe.recipe_file in {path.name for path in RECIPE_FILES}, (
        f"{name}: source={recipe.recipe_file!r} is not a file in recipes/")
    for role in ROLES:
        fn = getattr(recipe, role)
        if fn is None:
            continue
        assert _defined_in(fn) == _file_module(recipe), (
            f"{name}.{role} is defined in {_defined_in(fn)}, not in "
            f"recipes/{recipe.recipe_file}: write it there, and adapt it in the facts "
            "block with collectives._layout.by_axis_size or on_axes")


_COLLECTIVES = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter",
                "all_to_all", "ppermute", "pshuffle")


class _LaxWithoutCollectives:
    """``jax.lax`` whose collectives do nothing: each returns its input (a
    gather or a scatter then has the wrong shape), and every device is
    device 0."""

    def __init__(self, lax):
        self._lax = lax

    def __getattr__(self, name):
        if name in _COLLECTIVES:
            return lambda x, *args, **kwargs: x
        if name == "axis_index":
            return lambda axis_name: jnp.int32(0)
        return getattr(self._lax, name)


def _files():
    by_file = {}
    for name, recipe in cx.RECIPES.items():
        by_file.setdefault(_file_module(recipe), []).append(name)
    return by_file


@pytest.mark.parametrize("module_name", sorted(_files()))
def test_breaking_the_collectives_in_the_file_fails_check(module_name, monkeypatch):
    import importlib

    module = importlib.import_module(module_name)
    assert hasattr(module, "lax"), f"{module_name} calls no collective through lax"
    monkeypatch.setattr(module, "lax", _LaxWithoutCollectives(module.lax))
    clear_caches()
    try:
        for name in _files()[module_name]:
            mesh, axis = runnable_configs(cx.RECIPES[name])[0]
            config = (tuple(mesh.shape.values()), tuple(mesh.axis_names), axis)
            rows = cx.check([name], configs=[config],
                            forms=lambda recipe, axes: {
                                key: fn for key, fn in recipe.bound_forms(axes).items()
                                if key in ("shard_map", "reference")})
            assert rows and not any(row.ok for row in rows), (
                f"{name} still agrees with its collectives removed from "
                f"{module_name}: {[row.detail for row in rows]}")
    finally:
        monkeypatch.undo()
        clear_caches()
