"""collectives._compat states the installed JAX's boundaries truly.

The matrix (tools/jax_matrix.py) checks the same boundaries on every release;
this checks them on the JAX the suite runs on, through the API itself.
"""

import warnings

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat

N = 8


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((N,), "i")


def test_version_flags_match_what_lax_has():
    with warnings.catch_warnings():  # pvary is deprecated from 0.8.2
        warnings.simplefilter("ignore", DeprecationWarning)
        assert hasattr(lax, "pvary") == _compat.HAS_PVARY
    assert hasattr(
        lax, "all_gather_invariant") == _compat.HAS_PUBLIC_ALL_GATHER_INVARIANT
    if not _compat.HAS_PCAST_VARYING:
        assert not hasattr(lax, "pcast")


def test_supported_jax_is_not_older_than_the_oldest():
    assert _compat.JAX_VERSION >= _compat.OLDEST_SUPPORTED_JAX


def test_pcast_to_varying_exists_from_0_8_2(mesh):
    if not _compat.HAS_PCAST_VARYING:
        pytest.skip("lax.pcast(..., to='varying') arrived in JAX 0.8.2")
    f = jax.shard_map(lambda x: lax.pcast(x, "i", to="varying") + 0.0, mesh=mesh,
                      in_specs=P(), out_specs=P("i"))
    np.testing.assert_array_equal(np.asarray(f(np.ones(2, np.float32))),
                                  np.ones(2 * N))


def test_pvary_makes_an_invariant_value_varying(mesh):
    def body(x):
        assert _compat.vma(x) == frozenset()
        y = _compat.pvary(x, "i")
        assert _compat.vma(y) == {"i"}
        return y * (lax.axis_index("i") + 1)

    f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("i"))
    got = np.asarray(f(np.ones(1, np.float32)))
    np.testing.assert_array_equal(got, np.arange(1, N + 1))


def test_all_gather_to_invarying_exists_from_0_10(mesh):
    def gather(x):
        return lax.all_gather(x, "i", tiled=True, to="invarying")

    f = jax.shard_map(gather, mesh=mesh, in_specs=P("i"), out_specs=P())
    x = np.arange(2.0 * N, dtype=np.float32)
    if _compat.HAS_ALL_GATHER_TO_INVARYING:
        np.testing.assert_array_equal(np.asarray(f(x)), x)
    else:  # 0.8.0-0.9.2 (0.8.0-0.8.1 lack the `to` argument altogether)
        with pytest.raises((ValueError, TypeError), match="to"):
            f(x)


def test_all_gather_invariant_is_typed_invariant(mesh):
    def body(x):
        out = _compat.all_gather_invariant(x, "i", tiled=True)
        assert _compat.vma(out) == frozenset()
        return out

    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P())
    x = np.arange(2.0 * N, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), x)


def test_make_mesh_default_axis_types():
    with warnings.catch_warnings():  # 0.8 warns that the default will change
        warnings.simplefilter("ignore", DeprecationWarning)
        default = jax.make_mesh((N,), ("i",))
    explicit = all(t == jax.sharding.AxisType.Explicit for t in default.axis_types)
    assert explicit == _compat.MAKE_MESH_DEFAULTS_TO_EXPLICIT


@pytest.mark.parametrize("probe", sorted(_compat.PROBE_BOUNDARIES))
def test_probe_boundaries_are_well_formed(probe):
    since, gone_in = _compat.PROBE_BOUNDARIES[probe]
    assert since >= _compat.OLDEST_SUPPORTED_JAX
    assert gone_in is None or gone_in > since
    for version in _compat.PROBE_EXCEPTIONS.get(probe, ()):
        assert version >= since and (gone_in is None or version < gone_in)
