"""``kernel_psum``: the Pallas kernel of ``recipes/kernel_psum.py`` (a ring
reduce-scatter, then a ring all-gather) against ``lax.psum`` (the ``psum``
recipe's shard_map form) and NumPy, bit for bit on small integers, with
interpret mode's race detector on in both DMA modes (every form against the
oracle: the registry-driven suites).

``psum``'s example blocks have 2 rows, fewer than the devices: the kernel
pads them with zero rows to ``n`` chunks, so the tests below run padded
blocks, blocks that split evenly, 1-D and 3-D blocks.
"""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives._facts import kernel_psum as facts
from collectives.recipes import kernel_psum as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()




def run_on_8(x, mesh, mode):
    body = functools.partial(file.kernel_psum_body, axis="i")
    return run_kernel_detected(body, x, mesh, P("i"), P(), mode)


@over_kernel_meshes
def test_the_kernel_matches_lax_psum_and_numpy_bit_for_bit(shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel, native = cx.RECIPES["kernel_psum"], cx.RECIPES["psum"]
    (x,) = native.example_args(mesh, axis, exact=True)  # small integers, 2-row blocks
    want = file.psum_numpy(x, mesh.shape[axis])
    np.testing.assert_array_equal(np.asarray(native.shard_map(x, mesh=mesh, axis=axis)),
                                  want)
    axes = kernel.axes(mesh, axis)
    (in_spec,), out_spec = kernel.in_specs(axes), kernel.out_specs(axes)
    body = functools.partial(file.kernel_psum_body, axis=axis)
    for mode in KERNEL_MODES:
        got = run_kernel_detected(body, x, mesh, in_spec, out_spec, mode)
        np.testing.assert_array_equal(got, want, err_msg=f"dma_execution_mode={mode!r}")


def test_a_64x128_float32_block_bit_for_bit(mesh):
    x = np.random.default_rng(0).integers(-8, 9, size=(8 * 64, 128)).astype(np.float32)
    np.testing.assert_array_equal(run_on_8(x, mesh, "on_wait"), file.psum_numpy(x, 8))


@pytest.mark.parametrize("shape", [(8 * 11,), (8 * 5, 2, 2)], ids=["1-D", "3-D"])
def test_padded_blocks_of_any_rank(shape, mesh):
    # 11 rows: padded to 16, chunks of 2 (one row of 2 columns, a 1-D
    # block's); [5, 2, 2]: padded to [8, 2, 2], chunks of one row of 4
    # columns. int32 near its maximum: the sums wrap around as lax's do.
    rng = np.random.default_rng(1)
    x = (np.iinfo(np.int32).max - rng.integers(0, 9, size=shape)).astype(np.int32)
    want = file.psum_numpy(x, 8)
    np.testing.assert_array_equal(np.asarray(cx.RECIPES["psum"].shard_map(
        x, mesh=mesh, axis="i")), want)
    np.testing.assert_array_equal(run_on_8(x, mesh, "eager"), want)


def test_a_scalar_block_is_refused_by_name(mesh):
    f = jax.jit(jax.shard_map(file.kernel_psum_body, mesh=mesh, in_specs=P(),
                              out_specs=P(), check_vma=False))
    with pytest.raises(ValueError, match=r"argument x is a scalar block.*Fix: "):
        f(np.float32(1))


def test_the_dma_cost_is_two_n_minus_one_chunks():
    recipe = cx.RECIPES["kernel_psum"]
    axes = recipe.axes(cx.make_mesh((8,), "i"), "i")
    x = np.zeros((8 * 256, 1024), np.float32)  # 1 MiB blocks, 128 KiB chunks
    cost = facts.dma_cost(axes, (x,))
    assert (cost.steps, cost.bytes_per_step) == (14, 2 ** 17)
    # [2, 3] blocks on 8 devices: padded to 8 rows, one 12-byte row a step
    assert facts.dma_cost(axes, (np.zeros((16, 3), np.float32),)).bytes_per_step == 12
