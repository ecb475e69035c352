"""Testing your own shard_map code with collectives.testing: a worked example.

Two functions stand in for "your code": ``shift_blocks`` passes each
device's block of rows to the next device (a ring, with ``lax.ppermute``)
and ``sum_of_squares`` reduces over every device (``lax.psum``). Each is
tested against a global-view ``jit`` program and a NumPy reference, on
meshes, specs and arrays drawn by hypothesis, and the results' placement is
checked too.

Run it with simulated devices (the plugin ships with collectives)::

    pytest --cpu-devices 8 test_my_shard_map.py

or put ``cpu_devices = 8`` and ``hypothesis_profile = ci`` in your pytest ini.
Only public names of ``collectives`` are used.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax import lax
from jax.sharding import PartitionSpec as P

from collectives.testing import assert_forms_agree
from collectives.testing import assert_replicated
from collectives.testing import assert_sharded_as
from collectives.testing.strategies import meshes
from collectives.testing.strategies import sharded_arrays

# -- the code under test ---------------------------------------------------


# [start:code]
@functools.partial(jax.jit, static_argnames=("mesh", "shift"))
def shift_blocks(x, mesh, shift=1):
    """Device d's rows go to device d + shift along the first mesh axis."""
    axis = mesh.axis_names[0]
    n = mesh.shape[axis]
    perm = [(d, (d + shift) % n) for d in range(n)]

    def body(block):
        # block: [rows / n, ...] on each device -> the same shape, moved
        return lax.ppermute(block, axis, perm)

    return jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis))(x)


@functools.partial(jax.jit, static_argnames="mesh")
def shift_blocks_jit(x, mesh):
    """The same, as a global-view program: XLA inserts the collective."""
    n = mesh.shape[mesh.axis_names[0]]
    return jnp.roll(x.reshape(n, -1, *x.shape[1:]), 1, axis=0).reshape(x.shape)
# [end:code]


@functools.partial(jax.jit, static_argnames="mesh")
def sum_of_squares(x, mesh):
    """Column sums of x**2; rows are split over every mesh axis."""
    axes = tuple(mesh.axis_names)

    def body(block):
        # block: [rows / devices, cols] -> [cols], the same on every device
        return lax.psum(jnp.sum(block * block, axis=0), axes)

    return jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P())(x)


# -- the tests ---------------------------------------------------------------

DTYPES = st.sampled_from(["float32", "bfloat16", "float16", "int32"])


def first_axis(mesh):
    return P(mesh.axis_names[0])


def roll_blocks(x, n):
    """NumPy reference for shift_blocks: the n row blocks move one place on."""
    x = np.asarray(x)
    return np.roll(x.reshape(n, -1, *x.shape[1:]), 1, axis=0).reshape(x.shape)


# [start:property]
@settings(deadline=None)  # the first call of every new shape compiles
@given(sharded_arrays(spec=first_axis, dtype=DTYPES))
def test_shift_blocks_matches_numpy(case):
    mesh, spec, _ = case
    report = assert_forms_agree(
        {
            "shard_map": lambda x: shift_blocks(x, mesh),
            "jit": lambda x: shift_blocks_jit(x, mesh),
            "reference": lambda x: roll_blocks(x, mesh.shape[mesh.axis_names[0]]),
        },
        case.put(),
        n_terms=0,  # pure data movement: the tolerance policy compares exactly
    )
    assert_sharded_as(report.results["shard_map"], mesh, spec)
# [end:property]


@settings(deadline=None)
@given(sharded_arrays(spec=lambda mesh: P(tuple(mesh.axis_names)), ndim=2,
                      dtype=DTYPES, min_value=-10, max_value=10))
def test_sum_of_squares_matches_numpy(case):
    mesh, _, x = case
    report = assert_forms_agree(
        {
            "shard_map": lambda x: sum_of_squares(x, mesh),
            "jit": jax.jit(lambda x: jnp.sum(x * x, axis=0)),
            "reference": lambda x: (np.asarray(x).astype(np.float64) ** 2).sum(0),
        },
        case.put(),
        n_terms=x.shape[0] + 1,  # each output element rounds once per row, +1 square
    )
    assert_replicated(report.results["shard_map"])


# [start:fixtures]
@pytest.mark.devices(8)
def test_sum_of_squares_on_a_2d_mesh(mesh_2d):
    x = np.arange(16 * 3, dtype=np.int32).reshape(16, 3) - 20
    got = sum_of_squares(x, mesh_2d)
    np.testing.assert_array_equal(got, (x.astype(np.int64) ** 2).sum(0))
    assert_replicated(got)


@pytest.mark.devices(4)
def test_a_shift_in_the_wrong_direction_is_caught(mesh_1d):
    x = np.arange(8.0 * mesh_1d.size).reshape(-1, 2).astype(np.float32)
    forms = {
        "shard_map": lambda x: shift_blocks(x, mesh_1d, shift=-1),  # the bug
        "reference": lambda x: roll_blocks(x, mesh_1d.size),
    }
    with pytest.raises(AssertionError, match="shard_map disagrees with the reference"):
        assert_forms_agree(forms, x, n_terms=0)
# [end:fixtures]


@given(meshes(names=("data",)))
def test_meshes_use_your_axis_names(mesh):
    assert mesh.axis_names == ("data",)
