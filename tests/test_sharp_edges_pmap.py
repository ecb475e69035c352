"""The sharp edges of ``guides/sharp_edges_pmap.py`` (pmap(out_axes=None) does not
check replication; summing stacked copies): the wrong way fails as
docs/sharp_edges.md says (the real exception, or the exact wrong number) and the
fix agrees with NumPy. Where a pitfall behaves differently across JAX versions
the test branches on a named flag in collectives._compat and asserts what this
version does.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def pmap_edges():
    return load_recipe("sharp_edges_pmap")


X = np.arange(2.0 * N, dtype=np.float32)


def test_pitfall_6_out_axes_none_returns_device_0_unchecked(pmap_edges, mesh):
    sums = pmap_edges.block_sums_numpy(X, N)
    assert len(set(sums.tolist())) == N  # every device holds another value
    assert float(pmap_edges.block_sums_out_axes_none(X, N)) == sums[0] == 1.0
    with pytest.raises(ValueError, match="out_specs which require replication"):
        pmap_edges.block_sums_replicated(X, mesh)
    # The package's pmap form checks declared replication copy by copy.
    bad = cx.Recipe(
        name="block_sum_claimed_replicated", summary="", body=lambda b, *, axis: b,
        program=lambda x, *, axes: x, oracle=lambda x, *, axes: x,
        in_specs=lambda axes: (P(axes.entry),), out_specs=lambda axes: P(),
        example_shapes=lambda axes, dims: ((axes.size,),), check_vma=False)
    with pytest.raises(cx.ReplicationError, match="copy 1 along 'i'"):
        bad.pmap(X.reshape(N, -1)[:, 0], mesh=mesh)


def test_pitfall_7_sum_of_stacked_pmap_copies(pmap_edges, mesh):
    stacked = pmap_edges.total_pmap_stacked(X, N)
    want = pmap_edges.total_numpy(X)
    assert stacked.shape == (N,)
    assert stacked.sharding.spec == P("i")
    assert float(jnp.sum(stacked)) == N * want == 960.0
    # The migration guide's per-shard reduction does not reproduce here: jnp.sum
    # of the sharded output equals NumPy's sum of the materialised array.
    block_sums = jax.pmap(lambda b: b.sum(), axis_name="i")(X.reshape(N, -1))
    assert float(jnp.sum(block_sums)) == float(np.sum(np.asarray(block_sums))) == want
    mask = np.asarray(block_sums) > 10
    assert float(jnp.mean(block_sums, where=mask)) == float(
        np.mean(np.asarray(block_sums), where=mask))
    assert float(pmap_edges.total_pmap_checked(X, N)) == want
    assert float(pmap_edges.total_shard_map(X, mesh)) == want
    assert float(pmap_edges.total_jit(X, mesh)) == want
