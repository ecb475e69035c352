"""The strategies draw only valid cases: meshes that fit, specs whose axes
exist once, shapes that divide, values the dtype holds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from collectives.testing import assert_sharded_as
from collectives.testing.strategies import DTYPES
from collectives.testing.strategies import arrays
from collectives.testing.strategies import meshes
from collectives.testing.strategies import partition_specs
from collectives.testing.strategies import sharded_arrays
from collectives.testing.strategies import sharded_shapes


def spec_names(spec):
    """Every mesh axis name a spec uses, with repeats."""
    return [n for entry in spec if entry is not None
            for n in ((entry,) if isinstance(entry, str) else entry)]


@given(st.data())
def test_meshes_fit_and_use_distinct_names(data):
    max_devices = data.draw(st.integers(1, 8))
    ndim = data.draw(st.sampled_from([None, 1, 2, 3]))
    names = data.draw(st.sampled_from([None, ("data", "model", "pipe")]))
    if names is not None:
        names = names[: ndim or 2]
    rank = len(names) if names else ndim
    fits = max_devices >= {None: 1, 1: 1, 2: 4, 3: 8}[rank]
    strategy = meshes(max_devices, None if names else ndim, names=names)
    if not fits:
        with pytest.raises(ValueError, match="no mesh shape"):
            data.draw(strategy)
        return
    mesh = data.draw(strategy)
    assert mesh.size <= min(max_devices, jax.device_count())
    assert len(set(mesh.axis_names)) == len(mesh.axis_names)
    if ndim is not None:
        assert len(mesh.axis_names) == ndim
    if names is not None:
        assert mesh.axis_names == names
    assert mesh.axis_types == _compat.auto_axis_types(len(mesh.axis_names))


@given(meshes(), st.integers(0, 3), st.data())
def test_partition_specs_name_each_mesh_axis_at_most_once(mesh, ndim, data):
    spec = data.draw(partition_specs(mesh, ndim))
    assert isinstance(spec, P) and len(spec) <= ndim
    used = spec_names(spec)
    assert len(used) == len(set(used)) and set(used) <= set(mesh.axis_names)
    for entry in spec:
        assert entry is None or isinstance(entry, str) or (
            isinstance(entry, tuple) and len(entry) > 1)


@given(meshes(), st.integers(1, 3), st.data())
def test_sharded_shapes_divide_evenly(mesh, ndim, data):
    spec = data.draw(partition_specs(mesh, ndim))
    shape = data.draw(sharded_shapes(mesh, spec, ndim, max_block=2))
    assert len(shape) == ndim
    block = NamedSharding(mesh, spec).shard_shape(shape)  # raises if indivisible
    for d, (size, part) in enumerate(zip(shape, block, strict=True)):
        entry = spec[d] if d < len(spec) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else entry
        assert size == part * int(np.prod([mesh.shape[n] for n in names]))
        assert 1 <= part <= 2


@given(st.sampled_from(["float32", "bfloat16", "float16", "int32", "int8",
                        "uint8", "bool", "complex64"]),
       st.booleans(), st.data())
def test_arrays_hold_finite_normal_values_in_bounds(dtype, exact, data):
    x = data.draw(arrays((3, 4), dtype, exact=exact))
    assert x.shape == (3, 4) and x.dtype == np.dtype(dtype)
    if dtype == "bool":
        return
    values = x.astype(np.complex128)
    parts = np.concatenate([values.real.ravel(), values.imag.ravel()])
    assert np.all(np.isfinite(parts))
    bound = 8 if exact else 100
    assert np.all(np.abs(parts) <= bound)
    if exact:
        assert np.array_equal(parts, np.round(parts))
    elif dtype in ("float32", "bfloat16", "float16", "complex64"):
        tiny = float(jnp.finfo(np.dtype(dtype)).smallest_normal)
        assert np.all((parts == 0) | (np.abs(parts) >= tiny))  # no subnormals


@given(arrays(st.tuples(st.integers(1, 3)), st.sampled_from(DTYPES),
              min_value=-0.1, max_value=0.3))
def test_arrays_respect_bounds_the_dtype_cannot_represent(x):
    assert np.all(x.astype(np.float64) >= -0.1) and np.all(x.astype(np.float64) <= 0.3)


def test_float64_is_float32_without_x64():
    @given(arrays(2, "float64"))
    def check(x):
        assert x.dtype == np.dtype(jax.dtypes.canonicalize_dtype(np.float64))

    check()


@given(sharded_arrays(dtype=st.sampled_from(DTYPES)))
def test_sharded_arrays_place_as_drawn(case):
    mesh, spec, x = case
    assert set(spec_names(spec)) <= set(mesh.axis_names)
    placed = case.put()
    assert placed.shape == x.shape and placed.dtype == x.dtype
    assert_sharded_as(placed, mesh, spec)
    np.testing.assert_array_equal(np.asarray(placed), x)


@given(sharded_arrays(mesh=meshes(names=("data",)), spec=P("data"), ndim=2,
                      exact=True, dtype="bfloat16"))
def test_sharded_arrays_with_a_fixed_spec(case):
    mesh, spec, x = case
    assert spec == P("data") and x.ndim == 2 and x.shape[0] % mesh.size == 0


@pytest.mark.parametrize(("make", "error", "words"), [
    (lambda: meshes(ndim=2, names=("a",)), ValueError, "ndim must equal"),
    (lambda: meshes(names=("a", "a")), ValueError, "distinct"),
    (lambda: meshes(shapes=[(2, 2, 1, 1, 2)]), ValueError, "more axes than"),
    (lambda: sharded_shapes(cx.make_mesh(2, "i"), P("x")), ValueError,
     "not in the mesh"),
    (lambda: sharded_shapes(cx.make_mesh(2, "i"), P("i", None), 1), ValueError,
     "len\\(spec\\)"),
    (lambda: sharded_shapes(cx.make_mesh(2, "i"), "i"), TypeError, "PartitionSpec"),
    (lambda: arrays(3, "bfloat16", exact=True, max_value=1000), ValueError,
     "holds exactly"),
    (lambda: arrays(3, "int8", min_value=-1000), ValueError, "range of int8"),
    (lambda: arrays(3, "not-a-dtype"), TypeError, "not a dtype"),
])
def test_bad_arguments_say_what_is_wrong(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_a_spec_the_drawn_mesh_lacks_names_the_fix():
    @given(sharded_arrays(mesh=meshes(ndim=1), spec=P("data")))
    def check(case):
        raise AssertionError("unreachable")

    with pytest.raises(ValueError, match=r"names=\.\.\. that include 'data'"):
        check()


def test_recipe_cases_draw_only_comparisons_that_can_fail():
    # ring_attention counts 32 to 128 rounded operations, by mesh: bfloat16 is
    # drawn only on meshes whose count keeps the policy's rtol below 1; with
    # moe_layer (64 on every mesh) none does, and the strategy says so.
    from hypothesis import settings

    from collectives.testing import can_fail
    from collectives.testing.strategies import recipe_cases

    recipe = cx.RECIPES["ring_attention"]
    drawn = []

    @settings(max_examples=30, database=None)
    @given(case=recipe_cases(recipe, dtypes=("bfloat16",), max_dim=1))
    def run(case):
        drawn.append(recipe.n_terms(recipe.axes(case.mesh, case.axis)))
        assert can_fail(case.dtype, drawn[-1])

    run()
    assert drawn and max(drawn) < 64

    @settings(max_examples=1, database=None)
    @given(case=recipe_cases(cx.RECIPES["moe_layer"], dtypes=("bfloat16",)))
    def moe(case):
        pass

    with pytest.raises(ValueError, match=r"moe_layer.* with a tolerance that can "
                                         r"fail\. Fix: a wider float dtype"):
        moe()
