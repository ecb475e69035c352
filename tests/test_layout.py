"""Global view <-> pmap's stacked view, and the replication check."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _layout
from collectives.testing.strategies import meshes


@st.composite
def layouts(draw):
    mesh = draw(meshes())
    names = list(mesh.axis_names)
    ndim = draw(st.integers(1, 3))
    entries = [None] * ndim
    for name in draw(st.permutations(names)):
        if draw(st.booleans()):
            d = draw(st.integers(0, ndim - 1))
            entries[d] = (*(entries[d] or ()), name)
    spec = P(*entries)
    shape = []
    for names_d in _layout.spec_axes(spec, ndim):
        parts = int(np.prod([mesh.shape[n] for n in names_d]))
        shape.append(parts * draw(st.integers(1, 3)))
    return mesh, spec, np.arange(int(np.prod(shape))).reshape(shape)


@given(layouts())
def test_stacking_round_trips(case):
    mesh, spec, x = case
    stacked = _layout.to_stacked(x, mesh, spec)
    assert stacked.shape[: len(mesh.axis_names)] == tuple(mesh.devices.shape)
    back = _layout.from_stacked(stacked, mesh, spec, lambda: "x")
    np.testing.assert_array_equal(back, x)


def test_stacked_blocks_follow_device_coordinates():
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = np.arange(8 * 6).reshape(8, 6)
    stacked = _layout.to_stacked(x, mesh, P("i", "j"))
    assert stacked.shape == (4, 2, 2, 3)
    np.testing.assert_array_equal(stacked[1, 1], x[2:4, 3:6])
    # Mesh axes the spec leaves out are broadcast: each device gets a copy.
    rows = _layout.to_stacked(x, mesh, P("i"))
    np.testing.assert_array_equal(rows[3, 0], rows[3, 1])


def test_differing_copies_raise_with_the_place_and_values():
    mesh = cx.make_mesh((4,), ("i",))
    stacked = np.zeros((4, 2), np.float32)
    stacked[2, 1] = 5.0
    with pytest.raises(cx.ReplicationError) as info:
        _layout.from_stacked(stacked, mesh, P(), lambda: "output 0")
    message = str(info.value)
    assert "output 0 is declared replicated over mesh axis 'i'" in message
    assert "copy 2" in message and "(1,)" in message and "out_axes=None" in message


def test_pmap_form_checks_declared_replication():
    # A body whose result varies by device, wrongly declared replicated.
    wrong = cx.Recipe(
        name="wrongly_replicated", summary="x + axis_index, claimed replicated",
        body=lambda x, *, axis: x + cx.RECIPES["axis_index"].body(x * 0, axis=axis),
        program=lambda x, *, axes: x, oracle=lambda x, *, axes: x,
        in_specs=lambda axes: (P(axes.entry),), out_specs=lambda axes: P(),
        example_shapes=lambda axes, dims: ((axes.size,),))
    mesh = cx.make_mesh((8,), "i")
    x = np.zeros(8, np.float32)
    with pytest.raises(cx.ReplicationError, match="declared replicated"):
        wrong.pmap(x, mesh=mesh)
    # shard_map's static check catches the same mistake at trace time.
    with pytest.raises(ValueError, match=r"(?i)vary|replicat|vma"):
        wrong.shard_map(x, mesh=mesh)
