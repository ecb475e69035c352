"""assert_forms_agree, assert_replicated, assert_sharded_as and the tolerance
policy: they pass on right answers and fail on wrong ones with a message
that names the form or device, the index, the values and the tolerance."""

import dataclasses
import functools
import re

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.testing import assert_forms_agree
from collectives.testing import assert_replicated
from collectives.testing import assert_sharded_as
from collectives.testing import register_profiles
from collectives.testing import tolerance


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((8,), ("i",))


def worst_index(message, form):
    """The ``worst at index (...)`` that ``message`` reports for ``form``."""
    line = next(ln for ln in message.splitlines()
                if ln.strip().startswith(form + " vs"))
    return tuple(int(i) for i in re.search(r"index \(([\d, ]+)\)", line).group(1)
                 .replace(" ", "").rstrip(",").split(","))


# -- assert_forms_agree on deliberately wrong forms --------------------------

def test_a_psum_scaled_by_n_is_named_with_index_values_and_tolerance(mesh):
    psum = cx.RECIPES["psum"]
    # The sharp edge: psum of a value that is already the total scales it by n.
    wrong = dataclasses.replace(
        psum, body=lambda x, *, axis: lax.psum(lax.psum(x, axis), axis))
    x = psum.example_args(mesh, seed=3)[0]
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(wrong, x, mesh=mesh)
    message = str(info.value)
    assert message.startswith(
        "recipe 'psum': pmap, shard_map disagree with the reference; jit, explicit "
        "agree.")
    index = worst_index(message, "shard_map")
    got = np.asarray(wrong.shard_map(x, mesh=mesh))[index]
    want = psum.reference(x, mesh=mesh)[index]
    assert f"got {got!s}, want {want!s}" in message and np.isclose(got, 8 * want)
    assert "|diff|" in message and "> allowed" in message
    rtol = tolerance("float32", 8)[0]
    assert f"rtol={rtol:.3g}" in message and "tolerance(float32, n_terms=8)" in message
    assert "atol scaled by the largest |input|" in message
    assert "inputs: args[0]: float32[16, 3]" in message


def test_a_ppermute_in_the_wrong_direction_is_caught_exactly(mesh):
    ring = cx.RECIPES["ppermute_ring"]
    # The shard_map body shifts by -1 instead of +1 (the pmap body is separate).
    wrong = dataclasses.replace(
        ring, body=lambda x, *, axis: cx.ring_shift(x, axis, -1))
    x = ring.example_args(mesh, seed=0)[0]
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(wrong, x, mesh=mesh)
    message = str(info.value)
    assert message.startswith("recipe 'ppermute_ring': shard_map disagrees with the "
                              "reference; pmap, jit, explicit agree.")
    assert "shard_map vs reference, output: 48 of 48 elements differ" in message
    assert "pmap vs" not in message and "jit vs" not in message
    # Data movement is compared exactly: n_terms = 0.
    assert "tolerance: exact (float32); policy tolerance(float32, n_terms=0)" in message
    index = worst_index(message, "shard_map")
    got = np.asarray(wrong.shard_map(x, mesh=mesh))[index]
    want = ring.reference(x, mesh=mesh)[index]
    assert f"got {got!s}, want {want!s}" in message and got != want


def test_users_own_callables_wrong_shard_map_is_named(mesh):
    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P())
    def total(block):
        return lax.psum(block, "i") * 8  # the bug: scaled by the axis size

    def reference(x):
        return np.asarray(x).reshape(8, -1).sum(0)

    x = np.arange(16.0, dtype=np.float32)
    forms = {"shard_map": total, "jit": jax.jit(lambda x: x.reshape(8, -1).sum(0)),
             "reference": reference}
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, x)
    message = str(info.value)
    assert message.startswith("forms: shard_map disagrees with the reference; jit "
                              "agrees.")
    assert "shard_map vs reference, output: 2 of 2 elements differ" in message
    assert "got 512.0, want 64.0" in message
    # n_terms: the longest chain in the forms' jaxprs (NumPy cannot be traced)
    assert ("policy tolerance(float32, n_terms=9); n_terms=9 inferred from the "
            "shard_map form's jaxpr (longest chain of roundings: psum over 8 on "
            "axis i + mul); pass n_terms= to override") in message
    # Two forms are enough; the right pair passes and reports the tolerance used.
    report = assert_forms_agree({"jit": forms["jit"], "reference": reference}, x)
    assert report.forms == ("jit", "reference") and report.max_error["jit"] == 0.0
    assert report.rtol == tolerance("float32", 8)[0] and report.n_terms == 8


def test_without_a_reference_forms_compare_with_the_first(mesh):
    del mesh
    forms = {"pmap": lambda x: x + 1, "jit": lambda x: x + 2}
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, np.zeros(3, np.int32))
    message = str(info.value)
    assert "jit differs from pmap (no reference given)" in message
    assert "tolerance: exact (int32)" in message
    assert "forms compared with each other are allowed twice this" in message


def test_structure_dtype_and_stacked_pmap_output_are_reported():
    x = np.arange(8.0, dtype=np.float32)
    with pytest.raises(AssertionError, match="output structure"):
        assert_forms_agree({"jit": lambda x: (x, x), "reference": lambda x: x}, x)
    with pytest.raises(AssertionError, match="jit vs shard_map, output: dtype "
                                             "int32 != float32"):
        assert_forms_agree({"shard_map": lambda x: x, "jit": lambda x: x.astype(
            np.int32), "reference": lambda x: x}, x)
    with pytest.raises(AssertionError, match="must return the global view"):
        assert_forms_agree({"pmap": lambda x: x.reshape(4, 2),
                            "reference": lambda x: x}, x)
    with pytest.raises(AssertionError, match=r"output\['b'\]"):
        assert_forms_agree({"jit": lambda x: {"a": x, "b": x + 1},
                            "reference": lambda x: {"a": x, "b": x}}, x)


@pytest.mark.parametrize("got", [np.nan, np.inf])
def test_a_nan_or_infinity_where_a_number_is_wanted_is_an_infinite_error(got):
    # e.g. float16 Adam: eps rounds to 0 and a zero gradient gives 0 / 0
    x = np.zeros(1, np.float16)
    forms = {"jit": lambda x: x + np.float16(got), "reference": lambda x: x}
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, x)
    assert f"got {got}, want 0.0 (|diff| inf > allowed" in str(info.value)


def test_given_tolerances_are_used_and_said():
    x = np.ones(4, np.float32)
    forms = {"jit": lambda x: x + 1e-3, "reference": lambda x: x}
    report = assert_forms_agree(forms, x, atol=1e-2)
    assert report.atol == 1e-2
    with pytest.raises(AssertionError, match=r"rtol=0, atol=0.0001 .*atol given"):
        assert_forms_agree(forms, x, rtol=0, atol=1e-4)


def test_an_error_in_a_form_names_the_form():
    def broken(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as info:
        assert_forms_agree({"shard_map": broken, "reference": lambda x: x}, 1.0)
    assert "(raised by form 'shard_map' of forms)" in info.value.__notes__


@pytest.mark.parametrize(("forms", "kwargs", "error", "words"), [
    ({"jit": abs}, {}, ValueError, "at least two forms"),
    ({"jit": abs, "reference": 3}, {}, TypeError, r"recipe_or_forms\['reference'\]"),
    ([abs, abs], {}, TypeError, "a mapping of form names"),
    ({"jit": abs, "reference": abs}, {"axis": "i"}, TypeError, "bind their mesh"),
])
def test_bad_forms_arguments(forms, kwargs, error, words):
    with pytest.raises(error, match=words):
        assert_forms_agree(forms, 1.0, **kwargs)


# -- placement -----------------------------------------------------------------

def test_assert_replicated_passes_and_names_the_differing_device(mesh):
    assert_replicated(jax.device_put(np.arange(3.0), NamedSharding(mesh, P())))
    # Declared replicated with the VMA check off, but each device adds its index.
    bad = jax.jit(jax.shard_map(lambda b: b + lax.axis_index("i"), mesh=mesh,
                                in_specs=P(), out_specs=P(), check_vma=False))(
        np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(bad, 0)  # reading it back hides the problem
    with pytest.raises(AssertionError) as info:
        assert_replicated(bad, name="total")
    message = str(info.value)
    assert message.startswith("total: device copies of block total[:, :] differ at "
                              "index (0, 0): device 1 (")
    assert "mesh position {'i': 1} holds 1.0 where device 0" in message
    assert "holds 0.0" in message and "4 of 4 elements of the block differ" in message


def test_assert_replicated_compares_bits():
    mesh = cx.make_mesh((2,), ("i",))
    signs = jax.jit(jax.shard_map(lambda b: b * (1 - 2 * lax.axis_index("i")),
                                  mesh=mesh, in_specs=P(), out_specs=P(),
                                  check_vma=False))(np.zeros(1, np.float32))
    with pytest.raises(AssertionError, match=r"holds -0.0 where .* holds 0.0"):
        assert_replicated(signs)


def test_assert_replicated_rejects_sharded_and_host_arrays(mesh):
    x = jax.device_put(np.zeros((8, 2)), NamedSharding(mesh, P("i")))
    with pytest.raises(AssertionError, match=r"x is not replicated: .*block of shape "
                                             r"\(1, 2\) of the global \(8, 2\)"):
        assert_replicated(x)
    with pytest.raises(TypeError, match=r"expected a jax\.Array"):
        assert_replicated(np.zeros(3))


def test_assert_sharded_as_compares_placement_not_spelling():
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = jax.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh, P("i")))
    assert_sharded_as(x, mesh, P("i", None))
    with pytest.raises(AssertionError) as info:
        assert_sharded_as(x, mesh, P("i", "j"))
    message = str(info.value)
    assert message.startswith("x is not sharded as P('i', 'j') over mesh {'i': 4, "
                              "'j': 2}")
    assert "device 0 (" in message and "holds x[0:2, :] but" in message
    assert "puts x[0:2, 0:2] there (blocks of shape (2, 2))" in message


def test_assert_sharded_as_checks_the_copies_of_each_block():
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    bad = jax.jit(jax.shard_map(lambda b: b + lax.axis_index("j"), mesh=mesh,
                                in_specs=P("i"), out_specs=P("i"), check_vma=False))(
        np.zeros((8, 3), np.float32))
    with pytest.raises(AssertionError, match=r"block x\[0:2, :\] differ .*mesh "
                                             r"position \{'i': 0, 'j': 1\} holds 1.0"):
        assert_sharded_as(bad, mesh, P("i"))
    assert_sharded_as(bad, mesh, P("i"), check_copies=False)


@pytest.mark.parametrize(("spec", "error", "words"), [
    (P("k"), ValueError, "not in the mesh"),
    (P(None, None, "i"), ValueError, "names 3 dimensions"),
    ("i", TypeError, "PartitionSpec"),
])
def test_assert_sharded_as_bad_arguments(mesh, spec, error, words):
    x = jax.device_put(np.zeros((8, 2)), NamedSharding(mesh, P("i")))
    with pytest.raises(error, match=words):
        assert_sharded_as(x, mesh, spec)


# -- tolerance policy and profiles ----------------------------------------------

def test_tolerance_policy():
    assert tolerance("int32", 8) == (0.0, 0.0)
    assert tolerance("bool", 8) == (0.0, 0.0)
    assert tolerance("bfloat16", 0) == (0.0, 0.0)  # data movement: exact
    one = tolerance("float32", 1)[0]
    assert tolerance("float32", 8) == (8 * one, 8 * one)
    assert tolerance("float16", 1)[0] == 2 * 2.0 ** -10
    assert tolerance("bfloat16", 1)[0] == 2 * 2.0 ** -7
    with pytest.raises(ValueError, match="n_terms"):
        tolerance("float32", -1)
    with pytest.raises(TypeError, match="n_terms"):
        tolerance("float32", 1.5)


def test_an_unknown_profile_is_a_clear_error(monkeypatch):
    from hypothesis import settings

    before = settings.get_current_profile_name()
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly-typo")
    with pytest.raises(ValueError, match=r"\$HYPOTHESIS_PROFILE names .*'nightly-typo'"
                                         r".*\['ci', 'deep', 'dev'\]"):
        register_profiles()
    assert settings.get_current_profile_name() == before  # left as it was


def test_an_unreduced_array_is_named_as_a_partial_sum_not_unpacked():
    # Explicit mode's unreduced state: each device holds its partial sum of
    # x.T @ x; assert_replicated says so (JAX refuses to unpack such a spec)
    import jax.numpy as jnp

    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        x = jax.device_put(np.arange(16.0, dtype=np.float32).reshape(8, 2), P("i"))
        partial = jax.jit(lambda x: jnp.einsum(
            "bd,bk->dk", x, x, out_sharding=P(unreduced={"i"})))(x)
        summed = jax.jit(lambda x: jnp.einsum("bd,bk->dk", x, x, out_sharding=P()))(x)
    with pytest.raises(AssertionError, match=r"y is unreduced over \['i'\] "
                       r"\(spec P\(None, None, unreduced=\{'i'\}\)\): each device "
                       r"holds a partial sum.*jax.sharding.reshard"):
        assert_replicated(partial, name="y")
    assert_replicated(summed, name="y")
    np.testing.assert_array_equal(np.asarray(summed),
                                  np.arange(16.0).reshape(8, 2).T
                                  @ np.arange(16.0).reshape(8, 2))
