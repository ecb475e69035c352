"""The package's own inputs: each misuse is a ValueError/TypeError that names the
argument, the value, what was expected and the fix; NaN and inf propagate the
same way in every form; repeated runs are bitwise identical.

tests/test_errors.py covers the basics (indivisible dims, unknown axes, bool
psum, empty arrays for psum, bad permutation pairs); this file covers the rest.
"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives._registry import core_names

CORE = core_names()
JAX_FORMS = ("pmap", "shard_map", "jit")


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((4, 2), ("i", "j"))


def _shard_map_trace(body, mesh, x):
    """Trace (not compile) a shard_map of ``body`` over a 1-D mesh."""
    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.eval_shape(f, x)


# -- recipe arguments ------------------------------------------------------------

@pytest.mark.parametrize("form", [*JAX_FORMS, "reference"])
@pytest.mark.parametrize("bad", [None, {"x": np.ones(8)}, (np.ones(8), np.ones(8)),
                                 [[1.0, 2.0]] * 8])
def test_an_array_argument_must_be_one_array(form, bad):
    with pytest.raises(TypeError) as info:
        getattr(cx.RECIPES["psum"], form)(bad)
    message = str(info.value)
    assert "argument x must be one array" in message
    assert "np.asarray(x)" in message


@pytest.mark.parametrize("name", CORE)
def test_empty_arrays_are_rejected_by_every_core_recipe(name, mesh):
    recipe = cx.RECIPES[name]
    (x,) = recipe.example_args(mesh, "i")
    empty = np.zeros((x.shape[0], 0, *x.shape[2:]), x.dtype)
    for form in (*JAX_FORMS, "reference"):
        with pytest.raises(ValueError, match="no elements"):
            getattr(recipe, form)(empty, mesh=mesh, axis="i")


def test_int64_values_that_would_wrap_are_rejected():
    x = np.full(8, 2**40, np.int64)
    with pytest.raises(ValueError) as info:
        cx.RECIPES["psum"].jit(x)
    message = str(info.value)
    assert "int64" in message and "int32" in message and "jax_enable_x64" in message
    # In range: converted and summed exactly.
    small = np.arange(8, dtype=np.int64)
    assert np.asarray(cx.RECIPES["psum"].jit(small)).tolist() == [28]


def test_place_checks_like_the_forms():
    recipe = cx.RECIPES["psum"]
    axes = recipe.axes()
    with pytest.raises(TypeError, match=r"takes 1 argument\(s\)"):
        recipe.place(np.ones(8), np.ones(8), axes=axes)
    with pytest.raises(ValueError, match="must be divisible by 8"):
        recipe.place(np.ones(7), axes=axes)


def test_forms_resolve_the_axis_at_once(mesh):
    with pytest.raises(ValueError, match=r"'k' is not an axis of the mesh.*'i', 'j'"):
        cx.RECIPES["psum"].forms(mesh, "k")


@pytest.mark.parametrize(("dims", "words"), [((0, 2), "positive int"),
                                             ((-1, 2), "positive int"),
                                             ((2.5, 2), "positive int"),
                                             (3, "sequence of positive ints")])
def test_example_args_dims(dims, words):
    with pytest.raises((ValueError, TypeError), match=words):
        cx.RECIPES["psum"].example_args(dims=dims)


def test_mismatched_spec_tree_names_both_structures():
    # A recipe whose one argument is a (weights, bias) pair with its own specs.
    recipe = cx.Recipe(
        name="pair_sum", summary="", body=lambda wb, *, axis: wb,
        program=lambda wb, *, axes: wb, oracle=lambda wb, *, axes: wb,
        in_specs=lambda axes: ((P(axes.entry), P()),),
        out_specs=lambda axes: (P(axes.entry), P()),
        example_shapes=lambda axes, dims: (((axes.size,), (1,)),))
    with pytest.raises(ValueError) as info:
        recipe.jit({"w": np.ones(8), "b": np.ones(1)})
    message = str(info.value)
    assert "pytree structure" in message and "does not match the specs" in message


# -- devices and meshes ----------------------------------------------------------

def test_more_devices_than_exist_says_how_to_get_more():
    with pytest.raises(ValueError) as info:
        cx.make_mesh((4, 4), ("i", "j"))
    message = str(info.value)
    assert "needs 16 devices" in message and "use_cpu_devices(16)" in message
    assert "JAX_NUM_CPU_DEVICES=16" in message and "before" in message


def test_make_mesh_devices_must_be_devices():
    with pytest.raises(TypeError, match=r"must be a jax\.Device, got 1"):
        cx.make_mesh(2, "i", devices=[1, 2])


def test_make_mesh_names_must_be_non_empty():
    with pytest.raises(ValueError, match="non-empty"):
        cx.make_mesh(8, "")


# -- permutations and body utilities -------------------------------------------

@pytest.mark.parametrize(("perm", "n", "error", "words"), [
    (3, 8, TypeError, "expected a sequence of"),
    (None, 8, TypeError, "expected a sequence of"),
    ("01", 8, TypeError, "expected a sequence of"),
    ({0: 1}, 8, TypeError, "expected a sequence of"),
    ([(0, 1)], 0, ValueError, "at least 1"),
    ([(0, 1)], "8", TypeError, "must be an int"),
])
def test_check_permutation_rejects_non_permutations(perm, n, error, words):
    with pytest.raises(error, match=words):
        cx.check_permutation(perm, n)


def test_check_permutation_accepts_numpy_pairs():
    assert cx.check_permutation(np.array([[0, 1], [1, 0]]), 2) == [(0, 1), (1, 0)]


def test_body_utilities_name_the_axes_in_scope():
    mesh = cx.make_mesh(8, "i")
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError) as info:
        _shard_map_trace(lambda b: cx.ring_shift(b, "k", 1), mesh, x)
    message = str(info.value)
    assert "ring_shift: axis 'k' is not bound" in message and "('i',)" in message
    with pytest.raises(ValueError, match="permute: axis 'k' is not bound"):
        _shard_map_trace(lambda b: cx.permute(b, "k", [(0, 1)]), mesh, x)
    with pytest.raises(ValueError, match="inside a shard_map or pmap body"):
        cx.ring_shift(x, "i", 1)
    with pytest.raises(TypeError, match="axis must be a mesh axis name"):
        _shard_map_trace(lambda b: cx.ring_shift(b, 0, 1), mesh, x)
    with pytest.raises(ValueError, match=r"index 8 in \(0, 8\) is out of range"):
        _shard_map_trace(lambda b: cx.permute(b, "i", [(0, 8)]), mesh, x)
    with pytest.raises(ValueError, match="destination 1 appears twice"):
        _shard_map_trace(lambda b: cx.permute(b, "i", [(0, 1), (2, 1)]), mesh, x)


@pytest.mark.parametrize("name", ["ring_all_reduce", "ring_all_gather",
                                  "ring_reduce_scatter", "halo_exchange"])
def test_ring_utilities_name_the_axes_in_scope(name):
    mesh = cx.make_mesh(8, "i")
    with pytest.raises(ValueError) as info:
        _shard_map_trace(lambda b: getattr(cx, name)(b, "k"), mesh,
                         np.zeros((64, 2), np.float32))
    assert f"{name}: axis 'k' is not bound" in str(info.value)
    assert "('i',)" in str(info.value)


@pytest.mark.parametrize("name", ["allgather_matmul", "matmul_reduce_scatter"])
def test_matmul_utilities_name_the_axes_in_scope(name):
    mesh = cx.make_mesh(8, "i")
    with pytest.raises(ValueError, match=f"{name}: axis 'k' is not bound"):
        _shard_map_trace(lambda b: getattr(cx, name)(b, b.T, "k"), mesh,
                         np.zeros((64, 8), np.float32))


@pytest.mark.parametrize("name", ["ring_all_reduce", "ring_reduce_scatter"])
def test_ring_sums_reject_bool_like_psum(name):
    mesh = cx.make_mesh(8, "i")
    with pytest.raises(TypeError, match=rf"{name}: x has dtype bool.*astype"):
        _shard_map_trace(lambda b: getattr(cx, name)(b > 0, "i"), mesh,
                         np.zeros((64, 2), np.float32))


# -- NaN and inf ------------------------------------------------------------------

def _with_specials(x):
    x = x.astype(np.float32).copy()
    flat = x.reshape(-1)
    flat[0], flat[1], flat[2], flat[-1] = np.nan, np.inf, -np.inf, np.nan
    return x


def _fmax_blocks(x, n, fn):
    # the NaN-ignoring reduction the JAX forms compute (see pitfall 11)
    return fn.reduce(x.reshape(n, -1, *x.shape[1:]), axis=0)


@pytest.mark.parametrize("name", CORE)
def test_nan_and_inf_propagate_the_same_way_in_every_form(name, mesh):
    recipe = cx.RECIPES[name]
    (x,) = recipe.example_args(mesh, "i", exact=True)
    x = _with_specials(x)
    results = {form: np.asarray(getattr(recipe, form)(x, mesh=mesh, axis="i"))
               for form in JAX_FORMS}
    for form in JAX_FORMS[1:]:  # the three JAX forms agree bit for bit
        np.testing.assert_array_equal(results[form], results["pmap"], err_msg=form)
    got = results["pmap"]
    want = np.asarray(recipe.reference(x, mesh=mesh, axis="i"))
    assert np.isnan(want).any() or np.isinf(want).any()
    if name in ("pmax", "pmin"):
        # Pitfall 11: the cross-device max/min drops NaN (NumPy keeps it).
        fn = np.fmax if name == "pmax" else np.fmin
        np.testing.assert_array_equal(got, _fmax_blocks(x, 4, fn))
        assert np.isnan(want).any() and not np.isnan(got).any()
    else:
        np.testing.assert_array_equal(got, want)  # NaN where NumPy has NaN


@pytest.mark.parametrize(("name", "start"), [("pmax", -np.inf), ("pmin", np.inf)])
def test_nan_on_every_device_gives_the_start_value(name, start, mesh):
    # Pitfall 11: not even an all-NaN column survives the cross-device max.
    x = np.full((8, 2), np.nan, np.float32)
    assert np.isnan(cx.RECIPES[name].reference(x, mesh=mesh, axis="i")).all()
    for form in JAX_FORMS:
        got = np.asarray(getattr(cx.RECIPES[name], form)(x, mesh=mesh, axis="i"))
        assert (got == start).all(), form


# -- repeated runs -------------------------------------------------------------------

@pytest.mark.parametrize("name", CORE)
def test_repeated_runs_are_bitwise_identical(name, mesh):
    recipe = cx.RECIPES[name]
    (x,) = recipe.example_args(mesh, None, seed=3)  # random normals, not exact
    for form in (*JAX_FORMS, "reference"):
        run = getattr(recipe, form)
        first = np.asarray(run(x, mesh=mesh))
        for _ in range(2):
            again = np.asarray(run(x, mesh=mesh))
            assert again.dtype == first.dtype
            assert again.tobytes() == first.tobytes(), (name, form)


# -- body utilities and helpers added beside the core ---------------------------

@pytest.mark.parametrize(("name", "call"), [
    ("halo_exchange", lambda f, b: f(b, "i", -1)),
    ("halo_exchange", lambda f, b: f(b, "i", 1.5)),
    ("ring_reduce_scatter", lambda f, b: f(b[0, 0], "i")),
    ("ring_all_gather", lambda f, b: f(b[0, 0], "i")),
    ("allgather_matmul", lambda f, b: f(b, np.zeros((5, 8), np.float32), "i")),
    ("allgather_matmul", lambda f, b: f(b, np.zeros((4, 8), np.float32), "i",
                                        overlap="sideways")),
    ("matmul_reduce_scatter", lambda f, b: f(b, np.zeros((5, 8), np.float32), "i")),
])
def test_body_helpers_reject_bad_arguments(name, call):
    fn = getattr(cx, name)
    mesh = cx.make_mesh(8, "i")
    x = np.zeros((16, 4), np.float32)
    with pytest.raises((ValueError, TypeError)) as info:
        _shard_map_trace(lambda b: call(fn, b), mesh, x)
    assert type(info.value).__module__ == "builtins"
    assert "expected" in str(info.value) or "Fix" in str(info.value)


@pytest.mark.parametrize("sizes", [(4,), (4, -2, 3, 3, 1), ("a", "b")])
def test_init_mlp_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError, match="sizes: expected five positive ints"):
        cx.init_mlp(sizes)


# -- the test toolkit's own arguments ----------------------------------------------

@pytest.mark.parametrize("given", [{"rtol": -1}, {"atol": float("nan")},
                                   {"rtol": "tight"}, {"atol": True},
                                   {"atol": np.array([1e-6, -1.0])}])
def test_a_tolerance_must_be_a_finite_number_at_least_zero(given):
    from collectives.testing import assert_forms_agree

    (name,) = given
    with pytest.raises(ValueError, match=rf"assert_forms_agree\({name}=.*>= 0.*Fix:"):
        assert_forms_agree({"jit": np.sum, "reference": np.sum}, np.ones(8), **given)


def test_n_terms_must_be_a_count():
    from collectives.testing import assert_forms_agree

    with pytest.raises(ValueError, match="n_terms: expected a count"):
        assert_forms_agree({"jit": np.sum, "reference": np.sum}, np.ones(8),
                           n_terms=-2)


def test_check_kernel_names_a_kernel_that_is_not_a_function():
    from collectives.testing import check_kernel

    with pytest.raises(TypeError, match=r"check_kernel\(fn=None\): expected the "
                                        r"function.*Fix:"):
        check_kernel(None, np.ones(8))
    with pytest.raises(ValueError, match=r"check_kernel\(rtol=-0.5\)"):
        check_kernel(np.sum, np.ones(8), rtol=-0.5)
    for limit in (-1, 0, float("inf"), float("nan"), "60", True):
        with pytest.raises(ValueError, match=r"check_kernel\(limit_s=.*\): expected "
                                             r"seconds.*Fix: pass e\.g\. limit_s=60"):
            check_kernel(np.sum, np.ones(8), limit_s=limit)


def test_compare_arrays_refuses_a_tolerance_that_is_no_tolerance():
    from collectives.testing import compare_arrays

    for given in ({"rtol": -1, "atol": 0}, {"rtol": 0, "atol": float("nan")},
                  {"rtol": 0, "atol": np.array([0.0, -1.0])}):
        with pytest.raises(ValueError, match=r"compare_arrays\((rtol|atol)=.*>= 0"):
            compare_arrays(np.ones(2), np.ones(2), **given)
    assert compare_arrays(np.ones(2), np.ones(2), rtol=0,
                          atol=np.array([0.0, 1.0])) == (0.0, None)


def test_check_takes_one_recipe_name_as_a_string():
    rows = cx.check("psum", configs=[((8,), ("i",), None)])
    assert [row.recipe for row in rows] == ["psum"] and rows[0].ok


def test_an_unknown_dtype_is_named_with_the_fix(mesh):
    for call in (lambda: cx.check(["psum"], dtypes=["float99"],
                                  configs=[((8,), ("i",), None)]),
                 lambda: cx.RECIPES["psum"].example_args(mesh, dtype="float99")):
        with pytest.raises(TypeError, match=r"dtype 'float99': not a NumPy or JAX "
                                            r"dtype\. Fix: .*bfloat16"):
            call()
