"""The library runs the recipe files.

Every registered recipe's per-device body, global program and NumPy oracle
are functions of its file in ``recipes/`` (imported as
``collectives.recipes``), and breaking the collectives in that file makes
``check`` report a disagreement for every recipe the file holds. No text
search stands in for these tests: they follow the functions the registry
holds to where they are defined, and run the mutated file.
"""

import ast
import functools
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import collectives as cx
from collectives import _compat
from collectives._recipe import clear_caches
from helpers import RECIPE_FILES
from helpers import RECIPES_DIR
from helpers import STANDALONE_FILES
from helpers import load_recipe
from helpers import runnable_configs
from helpers import standalone_file

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


# A kernel file's collectives are its remote DMAs and semaphores, not lax's:
# tests/test_kernel_bugs.py plants a bug in each, one at a time.
LAX_FILES = sorted(module for module, names in _files().items()
                   if cx.RECIPES[names[0]].family != "kernel")


@pytest.mark.parametrize("module_name", LAX_FILES)
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


# -- helpers a recipe file carries so that it stands alone ----------------------
# Each copy is the reference's text, and the reference behaves as the library's
# own (the public body utility, or _compat's version switch).

COPIES = {  # tagged region -> the file holding the reference
    "microbatches": "dp_tp_mlp.py",
    "ring_shift": "ring_algorithms.py",
}


def _region(path, tag):
    text = path.read_text()
    start, end = f"# [start:{tag}]\n", f"# [end:{tag}]"
    if start not in text:
        return None
    return text[text.index(start):text.index(end)]


@pytest.mark.parametrize("tag", sorted(COPIES))
def test_every_copy_of_a_helper_is_the_reference(tag):
    reference = _region(RECIPES_DIR / COPIES[tag], tag)
    copies = {f"{path.parent.name}/{path.name}": _region(path, tag)
              for path in STANDALONE_FILES}
    copies = {name: text for name, text in copies.items() if text is not None}
    assert len(copies) >= 2, copies.keys()
    for name, text in copies.items():
        assert text == reference, (
            f"{name}'s [start:{tag}] region differs from "
            f"recipes/{COPIES[tag]}'s: fix both the same way")
    for path in STANDALONE_FILES:  # an untagged copy would escape this test
        shown = f"{path.parent.name}/{path.name}"
        defines = f"\ndef {tag}(" in path.read_text()
        assert not defines or shown in copies or shown == "recipes/ppermute.py", (
            f"{shown} defines {tag} outside a [start:{tag}] region")


@pytest.mark.parametrize("axis", ["i", "j", ("i", "j"), ("j", "i")])
@pytest.mark.parametrize("shift", [1, -1, 3])
def test_the_ring_shift_copy_moves_blocks_as_the_public_utility(axis, shift):
    copy = load_recipe("ring_algorithms")
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)

    def run(fn):
        return np.asarray(jax.jit(jax.shard_map(
            lambda b: fn(b, axis, shift), mesh=mesh, in_specs=jax.P(("i", "j")),
            out_specs=jax.P(("i", "j"))))(x))

    np.testing.assert_array_equal(run(copy.ring_shift), run(cx.ring_shift))
    if abs(shift) == 1:
        np.testing.assert_array_equal(run(copy.stepwise_shift), run(cx.ring_shift))


@pytest.mark.parametrize("stem", ["all_gather", "sharp_edges_sharding"])
def test_the_invariant_gather_in_recipe_files_follows_compat(stem):
    source = standalone_file(stem).read_text()
    (fn,) = [node for node in ast.parse(source).body
             if isinstance(node, ast.FunctionDef)
             and node.name == "all_gather_invariant"]
    text = ast.get_source_segment(source, fn)
    # the version switch is _compat's: the same attribute and the same release
    assert 'hasattr(lax, "all_gather_invariant")' in text
    since = ".".join(map(str, _compat.ALL_GATHER_TO_INVARYING_SINCE))
    assert f"< {_compat.ALL_GATHER_TO_INVARYING_SINCE}" in text, (since, text)
    module = load_recipe(stem)
    assert hasattr(module.lax, "all_gather_invariant") == (
        _compat.HAS_PUBLIC_ALL_GATHER_INVARIANT)
    mesh = cx.make_mesh((8,), "i")
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)

    def run(gather):
        return np.asarray(jax.jit(jax.shard_map(
            lambda b: gather(b, "i", tiled=True), mesh=mesh, in_specs=jax.P("i"),
            out_specs=jax.P()))(x))

    np.testing.assert_array_equal(run(module.all_gather_invariant),
                                  run(_compat.all_gather_invariant))
