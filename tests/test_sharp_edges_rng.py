"""The sharp edges of ``guides/sharp_edges_rng.py`` (sharded random numbers: the
partitionable threefry stream): the wrong way fails as docs/sharp_edges.md says
(the real exception, or the exact wrong number) and the fix agrees with NumPy.
Where a pitfall behaves differently across JAX versions the test branches on a
named flag in collectives._compat and asserts what this version does.
"""


import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def rng():
    return load_recipe("sharp_edges_rng")


def _noise_program(mesh):
    rows = jax.sharding.NamedSharding(mesh, P("i"))
    x = jax.device_put(np.arange(24, dtype=np.float32), rows)
    fn = jax.jit(lambda key, x: x + jax.random.uniform(key, x.shape),
                 out_shardings=rows)
    return fn, x


def test_pitfall_8_only_the_old_threefry_communicates(mesh):
    hlo = pytest.importorskip("collectives.hlo")
    fn, x = _noise_program(mesh)
    key = jax.random.key(0)
    counts = {}
    for flag in (True, False):
        with jax.threefry_partitionable(flag):
            counts[flag] = hlo.collective_stats(fn, key, x).count(
                "collective-permute")
    assert counts[True] == 0
    assert counts[False] > 0
    assert jax.config.jax_threefry_partitionable  # the context restored it


def test_pitfall_8_the_two_streams_differ(rng, mesh):
    key = jax.random.key(0)
    x = np.arange(24, dtype=np.float32)
    new, new_permutes = rng.noise_jit(key, x, mesh, partitionable=True)
    old, old_permutes = rng.noise_jit(key, x, mesh, partitionable=False)
    assert new_permutes == 0 < old_permutes
    np.testing.assert_array_equal(new, rng.noise_numpy(key, x, True))
    np.testing.assert_array_equal(old, rng.noise_numpy(key, x, False))
    assert not np.isclose(new, old).any()
    np.testing.assert_allclose(new[:3] - x[:3], [0.9477, 0.9786, 0.3323], atol=1e-4)
    np.testing.assert_allclose(old[:3] - x[:3], [0.6434, 0.1819, 0.0224], atol=1e-4)
    assert jax.config.jax_threefry_partitionable
