"""Property: malformed input to the public API raises one of the package's
documented errors (ValueError or TypeError; RuntimeError only where documented)
before JAX sees it - never an internal XLA error, a hang or a wrong result.

Every drawn case is malformed by construction (a sharded dimension made
indivisible, a spec longer than the array, a dtype the recipe rejects, an
unknown axis, a repeated or out-of-range permutation, an impossible mesh...),
so "no error" is a failure too. Runs in the default suite (``ci`` profile);
the ``deep`` profile draws 500 cases.
"""

import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives._layout import spec_axes
from collectives._registry import core_names

CORE = core_names()
FORMS = ("pmap", "shard_map", "jit", "reference")
MESHES = {(8,): ("i",), (4, 2): ("i", "j"), (2, 2): ("i", "j"), (2,): ("i",)}
DOCUMENTED = (ValueError, TypeError)

_PROFILE = settings.get_current_profile_name()
EXAMPLES = 500 if _PROFILE == "deep" else max(settings().max_examples, 40)


@functools.cache
def _mesh(shape):
    return cx.make_mesh(shape, MESHES[shape])


@functools.cache
def _trace_mesh(n):
    return cx.make_mesh((n,), ("i",))


# -- malformed recipe calls ----------------------------------------------------------

def _sharded_dims(recipe, axes, x):
    spec = recipe.in_specs(axes)[0]
    names = spec_axes(spec, x.ndim) if isinstance(spec, P) else []
    return [(d, math.prod(axes.mesh.shape[n] for n in ns))
            for d, ns in enumerate(names) if ns and
            math.prod(axes.mesh.shape[n] for n in ns) > 1]


@st.composite
def bad_recipe_calls(draw):
    name = draw(st.sampled_from(CORE))
    recipe = cx.RECIPES[name]
    shape = draw(st.sampled_from(sorted(MESHES)))
    mesh = _mesh(shape)
    axis = draw(st.sampled_from([None, *mesh.axis_names]))
    axes = recipe.axes(mesh, axis)
    (x,) = recipe.example_args(mesh, axis, dims=(draw(st.integers(1, 2)), 2))
    kind = draw(st.sampled_from([
        "indivisible", "too_few_dims", "empty", "dtype", "arity", "unknown_axis",
        "repeated_axis", "not_a_mesh", "not_an_array", "wide_int"]))
    kwargs = dict(mesh=mesh, axis=axis)
    args = (x,)
    if kind == "indivisible":
        dims = _sharded_dims(recipe, axes, x)
        if not dims:
            kind = "too_few_dims"
        else:
            d, parts = draw(st.sampled_from(dims))
            size = x.shape[d] + draw(st.integers(1, parts - 1))
            new_shape = list(x.shape)
            new_shape[d] = size
            args = (np.ones(new_shape, x.dtype),)
    if kind == "too_few_dims":
        spec = recipe.in_specs(axes)[0]
        args = (np.ones(x.shape[:len(spec) - 1], x.dtype),)
    elif kind == "empty":
        d = draw(st.integers(0, x.ndim - 1))
        new_shape = list(x.shape)
        new_shape[d] = 0
        args = (np.ones(new_shape, x.dtype),)
    elif kind == "dtype":
        rejected = [d for d in ("bool", "complex64", "int32", "float32")
                    if cx._arrays.dtype_kind(d) not in recipe.dtype_kinds]
        dtype = draw(st.sampled_from(rejected or ["<U1"]))
        args = (x.astype(dtype),)
    elif kind == "arity":
        args = (x,) * draw(st.sampled_from([0, 2, 3]))
    elif kind == "unknown_axis":
        bad = draw(st.text("abkqxyz", min_size=1, max_size=3).filter(
            lambda s: s not in mesh.axis_names))
        kwargs["axis"] = draw(st.sampled_from([bad, (mesh.axis_names[0], bad), 7]))
    elif kind == "repeated_axis":
        kwargs["axis"] = (mesh.axis_names[0],) * 2
    elif kind == "not_a_mesh":
        kwargs["mesh"] = draw(st.sampled_from([shape, "i", 8, mesh.devices]))
    elif kind == "not_an_array":
        args = (draw(st.sampled_from([None, {"x": x}, [x, x], (x,), "x"])),)
    elif kind == "wide_int":
        if "int" not in recipe.dtype_kinds:
            args = (x.astype(bool),)
        else:
            args = (np.full(x.shape, 2**40, np.int64),)
    form = draw(st.sampled_from(FORMS))
    return f"{name}.{form}[{kind}]", lambda: getattr(recipe, form)(*args, **kwargs)


# -- malformed permutations, meshes, devices -------------------------------------------

@st.composite
def bad_permutations(draw):
    n = draw(st.integers(1, 8))
    ok = [(s, (s + 1) % n) for s in range(n)]
    kind = draw(st.sampled_from(["repeat_src", "repeat_dst", "range", "type",
                                 "pair", "container"]))
    perm = list(ok)
    if kind == "repeat_src" and n > 1:
        perm.append((0, draw(st.integers(0, n - 1))))
        perm = [(0, 0), (0, n - 1)] if n == 1 else perm
    elif kind == "repeat_dst" and n > 1:
        perm.append((draw(st.integers(0, n - 1)), 0))
    elif kind in ("repeat_src", "repeat_dst"):  # n == 1: only (0, 0) exists
        perm = [(0, 0), (0, 0)]
    elif kind == "range":
        bad = draw(st.one_of(st.integers(n, n + 8), st.integers(-8, -1)))
        perm[draw(st.integers(0, n - 1))] = draw(st.sampled_from([(bad, 0), (0, bad)]))
    elif kind == "type":
        bad = draw(st.sampled_from([0.5, "1", None, True]))
        perm[0] = (bad, 0)
    elif kind == "pair":
        perm[0] = draw(st.sampled_from([(0,), (0, 1, 2), 0, "01"]))
    else:
        perm = draw(st.sampled_from([None, 3, "0,1", {0: 1}]))
    return n, perm


def _permute_in_body(n, perm, utility):
    x = np.zeros(n, np.float32)
    body = (lambda b: cx.permute(b, "i", perm)) if utility == "permute" else (
        lambda b: cx.ring_shift(b, "i", perm))
    f = jax.shard_map(body, mesh=_trace_mesh(n), in_specs=P("i"), out_specs=P("i"))
    return jax.eval_shape(f, x)


@st.composite
def bad_meshes(draw):
    kind = draw(st.sampled_from(["size", "too_many", "lengths", "repeat", "types",
                                 "empty_name", "devices"]))
    if kind == "size":
        shape = (draw(st.integers(-3, 0)),)
        names = ("i",)
    elif kind == "too_many":
        shape = draw(st.sampled_from([(16,), (3, 3), (9,), (2, 2, 4)]))
        names = ("a", "b", "c")[:len(shape)]
    elif kind == "lengths":
        shape, names = (4, 2), draw(st.sampled_from([("i",), ("i", "j", "k")]))
    elif kind == "repeat":
        shape, names = (2, 2), ("i", "i")
    elif kind == "types":
        shape, names = draw(st.sampled_from(
            [((2.0,), ("i",)), ((2,), (3,)), (("2",), ("i",)), ((True,), ("i",))]))
    elif kind == "empty_name":
        shape, names = (2,), ("",)
    else:
        return "make_mesh[devices]", lambda: cx.make_mesh(
            2, "i", devices=draw(st.sampled_from([[0, 1], ["cpu:0", "cpu:1"]])))
    return f"make_mesh[{kind}]", lambda: cx.make_mesh(shape, names)


@st.composite
def bad_calls(draw):
    family = draw(st.sampled_from(["recipe", "recipe", "recipe", "perm", "mesh",
                                   "devices", "shift"]))
    if family == "recipe":
        return (*draw(bad_recipe_calls()), DOCUMENTED)
    if family == "perm":
        n, perm = draw(bad_permutations())
        where = draw(st.sampled_from(["check", "check", "check", "permute"]))
        if where == "check":
            thunk = lambda: cx.check_permutation(perm, n)
        else:
            thunk = lambda: _permute_in_body(n, perm, "permute")
        return f"{where}({perm!r}, n={n})", thunk, DOCUMENTED
    if family == "mesh":
        return (*draw(bad_meshes()), DOCUMENTED)
    if family == "shift":
        shift = draw(st.sampled_from([1.5, "1", None, True]))
        return f"ring_shift(shift={shift!r})", (
            lambda: _permute_in_body(4, shift, "ring_shift")), DOCUMENTED
    n = draw(st.sampled_from([0, -1, 4, 16, 8.0, "8", True]))
    # RuntimeError is documented for a count that differs once JAX started.
    return f"use_cpu_devices({n!r})", lambda: cx.use_cpu_devices(n), (
        *DOCUMENTED, RuntimeError)


@settings(max_examples=EXAMPLES)
@given(case=bad_calls())
def test_malformed_input_raises_a_documented_error(case):
    label, thunk, allowed = case
    with pytest.raises((*DOCUMENTED, RuntimeError)) as info:  # narrowed below
        thunk()
    err = info.value
    assert isinstance(err, allowed), f"{label}: {type(err).__name__}: {err}"
    assert type(err).__module__ in ("builtins", "collectives._layout"), label
    message = str(err)
    assert len(message) > 20, f"{label}: message too short: {message!r}"
    assert "Fix" in message or "expected" in message or "must" in message, (
        f"{label}: the message says neither what was expected nor the fix: "
        f"{message}")


def test_the_strategy_draws_as_many_distinct_bad_calls_as_asked():
    # The property above is only as strong as the cases it sees: count them
    # (building a case calls nothing, so this is cheap).
    seen = []

    @settings(max_examples=EXAMPLES, database=None)
    @given(case=bad_calls())
    def record(case):
        seen.append(case[0])

    record()
    assert len(seen) >= EXAMPLES // 2
    assert len(set(seen)) >= min(len(seen), 20) // 2, sorted(set(seen))
