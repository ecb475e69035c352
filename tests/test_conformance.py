"""The conformance suite: every registered recipe, every check, from the registry.

Each test is parametrised over ``collectives.RECIPES`` itself, so a recipe
registered anywhere gets every check with no other edit, and a recipe that
lacks a fact (its ``hlo`` cost model, its ``source`` file) fails a test that
names what is missing. The recipe-specific laws (gradients equal to a
single-device run, memory, stability...) live in each recipe's own test file.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives import _layout
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import recipe_cases
from helpers import runnable_configs

NAMES = list(cx.RECIPES)
FORMS = ("shard_map", "jit", "explicit")


def _first_config(recipe):
    """The first mesh configuration of ``check`` the recipe runs on."""
    return runnable_configs(recipe)[0]


def _example(recipe, dtype="float32", exact=True, config=None):
    mesh, axis = config if config is not None else _first_config(recipe)
    args = recipe.example_args(mesh, axis, dtype=dtype, exact=exact, seed=3)
    return mesh, axis, args


# -- values: every form against the NumPy oracle --------------------------------

@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=max(2, settings.default.max_examples // 8))
@given(data=st.data())
def test_drawn_exact_cases_match_the_oracle_bit_for_bit(name, data):
    # Small integers in every accepted dtype: sums stay exact, so every form
    # must equal the oracle exactly, unless the recipe's own arithmetic
    # rounds (a mean, a softmax): then the tolerance policy for its n_terms.
    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe, max_dim=2))
    exact = recipe.bitwise
    assert_forms_agree(recipe, *case.args, mesh=case.mesh, axis=case.axis,
                       **({"rtol": 0, "atol": 0} if exact else {}))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", ["first", "last"])
def test_gaussian_floats_match_the_oracle_within_policy(name, config):
    # Rounded data on the first and the last of check's mesh configurations
    # the recipe runs on (1-D and 2-D for most).
    recipe = cx.RECIPES[name]
    configs = runnable_configs(recipe)
    mesh, axis = configs[0 if config == "first" else -1]
    reason = recipe.unrunnable_form("shard_map", recipe.axes(mesh, axis))
    if reason:  # a kernel on a JAX without its interpret mode: the body is the recipe
        pytest.skip(reason)
    args = recipe.example_args(mesh, axis, seed=len(config))
    report = assert_forms_agree(recipe, *args, mesh=mesh, axis=axis)
    runs = set(recipe.forms(mesh, axis)) - {"reference"}
    legacy = set() if recipe.family == "kernel" else {"pmap"}  # kernels: shard_map only
    assert set(report.max_error) == runs and runs >= {"shard_map", "jit"} | legacy


# -- bad input: clear errors, never a hang or a wrong answer --------------------

@pytest.mark.parametrize("name", NAMES)
def test_rejects_a_wrong_argument_count(name):
    recipe = cx.RECIPES[name]
    mesh, axis, args = _example(recipe)
    for form in (*cx.FORMS, "reference"):
        with pytest.raises(TypeError, match=rf"{name}: takes {len(args)} argument"):
            getattr(recipe, form)(*args, args[-1], mesh=mesh, axis=axis)


def _first_sharded_leaf(recipe, axes, args):
    """(argument index, leaf path, dim) of the first dim sharded over the
    collective axes, for an input the specs can reject."""
    for index, (arg, spec) in enumerate(zip(args, recipe.in_specs(axes), strict=True)):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        specs = _layout.leaf_specs(spec, arg, "")
        for (path, leaf), leaf_spec in zip(leaves, specs, strict=True):
            for dim, entry in enumerate(leaf_spec):
                names = set(_layout.axis_tuple(entry)) if entry is not None else set()
                if names & set(axes.names):
                    return index, path, dim, np.shape(leaf)[dim]
    return None


def _with_leaf(args, index, path, fn):
    arg = jax.tree_util.tree_map_with_path(
        lambda p, leaf: fn(leaf) if p == path else leaf, args[index])
    return (*args[:index], arg, *args[index + 1:])


@pytest.mark.parametrize("name", NAMES)
def test_rejects_an_indivisible_shape(name):
    recipe = cx.RECIPES[name]
    mesh, axis, args = _example(recipe)
    axes = recipe.axes(mesh, axis)
    found = _first_sharded_leaf(recipe, axes, args)
    assert found is not None, f"{name}: no input dimension is sharded over {axes.names}"
    index, path, dim, size = found
    bad = _with_leaf(args, index, path,
                     lambda leaf: np.delete(leaf, 0, axis=dim))
    for form in (*cx.FORMS, "reference"):
        with pytest.raises(ValueError, match=rf"{size - 1}.*(divisible|multiple)"):
            getattr(recipe, form)(*bad, mesh=mesh, axis=axis)


@pytest.mark.parametrize("name", NAMES)
def test_rejects_an_unknown_axis(name):
    recipe = cx.RECIPES[name]
    mesh, _, args = _example(recipe)
    for form in (*cx.FORMS, "reference"):
        with pytest.raises(ValueError, match=r"'nope'.*(mesh|axis)"):
            getattr(recipe, form)(*args, mesh=mesh, axis="nope")


_SAMPLE_DTYPE = {"float": "float32", "int": "int32", "bool": "bool",
                 "complex": "complex64"}


@pytest.mark.parametrize("name", NAMES)
def test_rejects_unaccepted_dtypes(name):
    # (accepted dtypes are drawn by the exact-cases test above)
    recipe = cx.RECIPES[name]
    mesh, axis = _first_config(recipe)
    rejected = [kind for kind in _SAMPLE_DTYPE if kind not in recipe.dtype_kinds]
    if not rejected:
        pytest.skip(f"{name} accepts every dtype kind")
    for kind in rejected:
        dtype = _SAMPLE_DTYPE[kind]
        args = recipe.example_args(mesh, axis, dtype=dtype, exact=True)
        for form in (*cx.FORMS, "reference"):
            with pytest.raises(TypeError, match=rf"dtype {dtype}.*{name} does not"):
                getattr(recipe, form)(*args, mesh=mesh, axis=axis)


# -- the cost model: the compiled HLO -------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", FORMS)
def test_compiled_collectives_match_the_declared_cost_model(name, form):
    recipe = cx.RECIPES[name]
    assert recipe.cost_model is not None, (
        f"{name} declares no hlo fact: pass cost_model=... (what each compiled form "
        "contains) to its Recipe")
    configs = runnable_configs(recipe)
    for mesh, axis in {id(c): c for c in (configs[0], configs[-1])}.values():
        axes = recipe.axes(mesh, axis)
        reason = recipe.unrunnable_form(form, axes)
        if reason is not None:
            pytest.skip(reason)
        args = recipe.example_args(mesh, axis)
        stats = collective_stats(recipe.compiled(form, axes),
                                 *recipe.place(*args, axes=axes, form=form))
        problems = [e.mismatch(stats)
                    for e in recipe.expected_costs(form, axes, args)]
        assert None in problems, (
            f"{name} {form} on mesh {dict(mesh.shape)} axis={axis!r}: {problems}")


# -- no retrace, declared replication -------------------------------------------

def _traced_once(fn, role):
    """``fn`` under its own trace counter (chex keys counters by name)."""

    def run(*args, **kwargs):
        return fn(*args, **kwargs)

    run.__name__ = run.__qualname__ = role
    return chex.assert_max_traces(run, n=1)


@pytest.mark.parametrize("name", NAMES)
def test_a_repeated_call_with_the_same_shapes_does_not_retrace(name):
    # Fresh copies of the recipe, so the compile caches start empty; each
    # traced function may run once however often the form is called.
    recipe = cx.RECIPES[name]
    chex.clear_trace_counter()
    counted = dataclasses.replace(
        recipe, body=_traced_once(recipe.body, "body"),
        pmap_body=_traced_once(recipe.pmap_body or recipe.body, "pmap_body"),
        program=_traced_once(recipe.program, "program"),
        explicit_program=_traced_once(recipe.explicit_program or recipe.program,
                                      "explicit_program"))
    mesh, axis = _first_config(recipe)
    for seed in (1, 2):
        args = recipe.example_args(mesh, axis, seed=seed)
        for form in counted.forms(mesh, axis):
            getattr(counted, form)(*args, mesh=mesh, axis=axis)


def _replicated_over(axes, spec):
    """The mesh axes a leaf with ``spec`` is replicated over."""
    used = {name for entry in spec if entry is not None
            for name in _layout.axis_tuple(entry)}
    return [name for name in axes.mesh.axis_names if name not in used]


@pytest.mark.parametrize("name", [name for name in NAMES
                                  if cx.RECIPES[name].family != "kernel"])
def test_the_pmap_form_checks_declared_replication(name):  # kernels: no pmap form
    # A body whose replicated outputs differ from device to device (each adds
    # its index) must raise, never return copy 0.
    # (on the first of check's mesh configurations where an output is
    # replicated over some mesh axis)
    recipe = cx.RECIPES[name]
    for mesh, axis in runnable_configs(recipe):
        axes = recipe.axes(mesh, axis)
        args = recipe.example_args(mesh, axis, exact=True)
        out = recipe.reference(*args, mesh=mesh, axis=axis)
        specs = _layout.leaf_specs(recipe.out_specs(axes), out, name)
        if any(_replicated_over(axes, spec) for spec in specs):
            break
    else:
        pytest.skip(f"{name} declares no replicated output on check's meshes")
    body = recipe.pmap_body or recipe.body

    def skewed(*blocks, axis):
        outs, treedef = jax.tree_util.tree_flatten(body(*blocks, axis=axis))
        skews = [sum(lax.axis_index(n) for n in _replicated_over(axes, spec))
                 for spec in specs]
        # (a skew far outside any rounding tolerance, whatever the values)
        return treedef.unflatten([
            out + (jnp.abs(out) + 1) * jnp.asarray(skew).astype(out.dtype)
            for out, skew in zip(outs, skews, strict=True)])

    broken = dataclasses.replace(recipe, pmap_body=skewed)
    with pytest.raises(cx.ReplicationError, match="differ"):
        broken.pmap(*args, mesh=mesh, axis=axis)


# The recipe's file: tests/test_one_implementation.py follows each recipe's
# body, program and oracle to its file in recipes/ and breaks the file's
# collectives; tests/test_recipe_files.py runs every file standalone.
