"""Wrong use of the forms gives a clear error naming argument, value and fix."""

import re

import jax
import numpy as np
import pytest

import collectives as cx


@pytest.fixture(scope="module")
def mesh_2d():
    return cx.make_mesh((4, 2), ("i", "j"))


@pytest.mark.parametrize("form", [*cx.FORMS, "reference"])
def test_shape_not_divisible_by_the_mesh_axis(form):
    x = np.ones((12, 3), np.float32)
    with pytest.raises(ValueError) as info:
        getattr(cx.RECIPES["psum"], form)(x)
    message = str(info.value)
    assert "argument x" in message and "dimension 0 has size 12" in message
    assert "divisible by 8" in message and "multiple of 8" in message


@pytest.mark.parametrize("form", cx.FORMS)
def test_unknown_axis_lists_the_mesh_axes(form, mesh_2d):
    x = np.ones((8, 2), np.float32)
    with pytest.raises(ValueError) as info:
        getattr(cx.RECIPES["psum"], form)(x, mesh=mesh_2d, axis="k")
    message = str(info.value)
    assert "'k' is not an axis of the mesh" in message and "('i', 'j')" in message


def test_repeated_axis_is_rejected(mesh_2d):
    with pytest.raises(ValueError, match="appears twice"):
        cx.RECIPES["psum"].jit(np.ones((8, 2)), mesh=mesh_2d, axis=("i", "i"))


def test_wrong_number_of_arguments():
    with pytest.raises(TypeError, match=r"takes 1 argument\(s\) \(x\), got 2"):
        cx.RECIPES["psum"].shard_map(np.ones(8), np.ones(8))


def test_spec_longer_than_the_array(mesh_2d):
    # On a 2-D mesh psum shards dim 1 over the other axis: a 1-D x cannot fit.
    with pytest.raises(ValueError) as info:
        cx.RECIPES["psum"].shard_map(np.ones(8), mesh=mesh_2d, axis="i")
    assert "names 2 dimensions" in str(info.value)
    assert "shape (8,)" in str(info.value)


def test_bool_psum_suggests_a_cast():
    with pytest.raises(TypeError) as info:
        cx.RECIPES["psum"].shard_map(np.ones(8, bool))
    assert "dtype bool" in str(info.value) and "astype(jnp.int32)" in str(info.value)


def test_psum_scatter_block_must_split_again():
    with pytest.raises(ValueError, match=r"multiple of 8\*\*2 = 64"):
        cx.RECIPES["psum_scatter"].shard_map(np.ones((16, 2), np.float32))


def test_all_to_all_columns_must_split():
    with pytest.raises(ValueError, match="multiple of 8"):
        cx.RECIPES["all_to_all"].jit(np.ones((8, 3), np.float32))


def test_empty_arrays_are_rejected_in_every_form():
    for form in (*cx.FORMS, "reference"):
        with pytest.raises(ValueError, match="no elements"):
            getattr(cx.RECIPES["psum"], form)(np.ones((8, 0), np.float32))


def test_mesh_must_be_a_mesh():
    with pytest.raises(TypeError, match=r"jax\.sharding\.Mesh"):
        cx.RECIPES["psum"].jit(np.ones(8), mesh=(8,))


@pytest.mark.parametrize(
    ("perm", "error", "words"),
    [
        ([(0, 1), (1, 1)], ValueError, "destination 1 appears twice"),
        ([(0, 1), (0, 2)], ValueError, "source 0 appears twice"),
        ([(0, 8)], ValueError, "out of range"),
        ([(0, -1)], ValueError, "out of range"),
        ([(0,)], TypeError, "pair"),
        ([(0.5, 1)], TypeError, "ints"),
    ],
)
def test_bad_permutations(perm, error, words):
    with pytest.raises(error, match=words):
        cx.check_permutation(perm, 8)


@pytest.mark.parametrize("dtype,twin", [
    ("float64", "float32"), ("complex128", "complex64"), ("int64", "int32")])
def test_check_refuses_a_64_bit_dtype_jax_would_narrow(dtype, twin):
    # without jax_enable_x64 the row would say complex128 and run complex64
    import jax

    assert not jax.config.jax_enable_x64
    with pytest.raises(ValueError, match=f"'{dtype}' is computed as {twin}.*"
                                         "jax_enable_x64"):
        cx.check(["psum"], dtypes=[dtype], configs=[((8,), ("i",), None)])



def test_check_takes_one_dtype_by_name_and_refuses_bad_dims_before_any_row():
    one = [((8,), ("i",), None)]
    rows = cx.check("psum", dtypes="float32", configs=one)
    assert [(r.recipe, r.dtype, r.ok) for r in rows] == [("psum", "float32", True)]
    for dims, error, words in [
            ([0], ValueError, r"dims: 0 elements is no block size\. Fix: e\.g\. "
                              r"dims=\(256, 1024\)"),
            ([4, -1], ValueError, "dims: -1 elements is no block size"),
            ([2.5], TypeError, "dims: 2.5 is not a whole number of elements"),
            (256, TypeError, r"dims=256: expected a list of block sizes\. Fix:"),
            ((), ValueError, r"dims=\(\): no block size\. Fix:"),
            ([100000, 100000], ValueError, r"GiB.*Fix: smaller --dims")]:
        with pytest.raises(error, match=words):
            cx.check("psum", dims=dims, configs=one)


def test_tolerance_names_a_dtype_it_cannot_read():
    from collectives.testing import tolerance

    with pytest.raises(TypeError, match=r"dtype 'floaty': not a NumPy or JAX "
                                        r"dtype\. Fix:"):
        tolerance("floaty")

def test_a_check_row_of_an_error_without_a_message_says_where_it_was_raised():
    # A bare ``assert`` (JAX has some) reads "AssertionError: " and nothing
    # more; the row names the file, line and function instead.
    from collectives._check import error_detail

    def body():  # (pytest rewrites a bare assert here to carry a message)
        raise AssertionError

    try:
        body()
    except AssertionError as err:
        detail = error_detail(err)
    assert re.fullmatch(r"AssertionError with no message, raised at "
                        r"\S*test_errors\.py:\d+ in body", detail), detail
    assert error_detail(ValueError("x: 3 is odd")) == "ValueError: x: 3 is odd"
    try:
        jax.numpy.zeros(3).reshape(-1, -1)
    except Exception as err:  # JAX's own message is kept as it is
        detail = error_detail(err)
        assert detail.startswith(f"{type(err).__name__}: "), detail


def test_every_recipe_file_is_recorded_as_imported():
    from collectives import _registry

    for name, recipe in cx.RECIPES.items():
        path = _registry._file_of(recipe)
        if path is None:  # imported on first use: recorded when first asked
            assert recipe.recipe_file == "optax_training.py", name
            continue
        assert path.name == recipe.recipe_file, name
        assert _registry.file_changed(recipe) is None, name
        assert _registry._IMPORTED[path] == _registry._digest(path), name


def test_a_recipe_file_changed_since_import_fails_its_rows_naming_the_fix(monkeypatch):
    # a file edited (or replaced) after this process imported it: its rows
    # would report on the code imported then; other files' rows run as usual
    from collectives import _registry

    path = _registry._file_of(cx.RECIPES["psum"])
    monkeypatch.setitem(_registry._IMPORTED, path, "0" * 64)
    config = [((8,), ("i",), None)]
    [changed] = cx.check(["psum"], configs=config)
    assert not changed.ok and not changed.skipped and changed.forms == ()
    assert changed.detail.startswith(f"RecipeFileChanged: psum: {path} changed on "
                                     "disk since this process imported it")
    assert "sha256 000000000000 then" in changed.detail
    assert "Fix: run check in a new process" in changed.detail
    [other] = cx.check(["ppermute_ring"], configs=config)
    assert other.ok, other.detail
    monkeypatch.setattr(_registry, "_digest", lambda path: None)  # deleted
    [gone] = cx.check(["psum"], configs=config)
    assert f"{path} is gone since this process imported it" in gone.detail
