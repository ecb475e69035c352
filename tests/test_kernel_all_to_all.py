"""``kernel_all_to_all``: the Pallas kernel of ``recipes/kernel_all_to_all.py``
against ``lax.all_to_all`` (the ``all_to_all`` recipe's shard_map form) and
NumPy, bit for bit, with interpret mode's race detector on in both DMA modes
(every form against the oracle: the registry-driven suites)."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.recipes import kernel_all_to_all as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()




@over_kernel_meshes
def test_the_kernel_matches_lax_all_to_all_and_numpy_bit_for_bit(shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel, native = cx.RECIPES["kernel_all_to_all"], cx.RECIPES["all_to_all"]
    (x,) = native.example_args(mesh, axis, exact=True)  # small integers
    want = file.all_to_all_numpy(x)
    np.testing.assert_array_equal(np.asarray(native.shard_map(x, mesh=mesh, axis=axis)),
                                  want)
    axes = kernel.axes(mesh, axis)
    (in_spec,), out_spec = kernel.in_specs(axes), kernel.out_specs(axes)
    body = functools.partial(file.kernel_all_to_all_body, axis=axis)
    for mode in KERNEL_MODES:
        np.testing.assert_array_equal(
            run_kernel_detected(body, x, mesh, in_spec, out_spec, mode), want,
            err_msg=f"dma_execution_mode={mode!r}")


def test_a_64x128_float32_block_moves_bit_for_bit(mesh):
    # each device: a [64, 128] row block, 8 chunks of [64, 16]
    x = np.random.default_rng(0).standard_normal((8 * 64, 128)).astype(np.float32)
    body = functools.partial(file.kernel_all_to_all_body, axis="i")
    got = run_kernel_detected(body, x, mesh, P("i", None), P(None, "i"), "on_wait")
    np.testing.assert_array_equal(got, file.all_to_all_numpy(x))


def test_each_device_ends_with_its_column_block(mesh):
    x = np.arange(16 * 24, dtype=np.int32).reshape(16, 24)
    moved = cx.RECIPES["kernel_all_to_all"].shard_map(x, mesh=mesh, axis="i")
    assert moved.sharding.spec == P(None, "i"), moved.sharding
    for shard in moved.addressable_shards:
        d = shard.index[1].start // 3
        np.testing.assert_array_equal(np.asarray(shard.data), x[:, 3 * d:3 * d + 3])


def test_a_block_whose_columns_do_not_split_is_refused_by_name(mesh):
    f = jax.jit(jax.shard_map(file.kernel_all_to_all_body, mesh=mesh,
                              in_specs=P("i", None), out_specs=P(None, "i"),
                              check_vma=False))
    with pytest.raises(ValueError, match=r"x: a block of 12 columns does not split "
                                         r"into 8 equal chunks"):
        f(np.zeros((16, 12), np.float32))
