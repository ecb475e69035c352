"""``kernel_psum_scatter`` and ``kernel_psum_scatter_bidirectional``: the
Pallas kernels of ``recipes/kernel_psum_scatter.py`` against
``lax.psum_scatter`` (the ``psum_scatter`` recipe's shard_map form) and
NumPy, bit for bit on small integers, with interpret mode's race detector on
in both DMA modes (every form against the oracle: the registry-driven
suites).

The bidirectional kernel splits each chunk's columns between two rings: an
odd column count and a 1-D block (chunks of one element: one ring only) are
checked here too.
"""

import functools

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives._facts import kernel_psum_scatter as facts
from collectives.recipes import kernel_psum_scatter as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()
KERNELS = {
    "kernel_psum_scatter": file.kernel_psum_scatter_body,
    "kernel_psum_scatter_bidirectional": file.kernel_psum_scatter_bidirectional_body,
}


def run_detected(body, x, mesh, spec, mode):
    """``body`` with ``spec`` in and out (helpers.run_kernel_detected)."""
    return run_kernel_detected(body, x, mesh, spec, spec, mode)


@pytest.mark.parametrize("name", KERNELS)
@over_kernel_meshes
def test_the_kernel_matches_lax_psum_scatter_and_numpy_bit_for_bit(
        name, shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel, native = cx.RECIPES[name], cx.RECIPES["psum_scatter"]
    (x,) = native.example_args(mesh, axis, exact=True)  # small integers
    want = file.psum_scatter_numpy(x, mesh.shape[axis])
    np.testing.assert_array_equal(np.asarray(native.shard_map(x, mesh=mesh, axis=axis)),
                                  want)
    (spec,) = kernel.in_specs(kernel.axes(mesh, axis))
    body = functools.partial(KERNELS[name], axis=axis)
    for mode in KERNEL_MODES:
        np.testing.assert_array_equal(run_detected(body, x, mesh, spec, mode), want,
                                      err_msg=f"dma_execution_mode={mode!r}")


@pytest.mark.parametrize("name", KERNELS)
def test_a_64x128_float32_block_bit_for_bit(name, mesh):
    x = np.random.default_rng(0).integers(-8, 9, size=(8 * 64, 128)).astype(np.float32)
    body = functools.partial(KERNELS[name], axis="i")
    np.testing.assert_array_equal(run_detected(body, x, mesh, P("i"), "on_wait"),
                                  file.psum_scatter_numpy(x, 8))


@pytest.mark.parametrize("shape", [(8 * 16, 5), (8 * 8,)], ids=["odd-columns", "1-D"])
def test_the_two_rings_split_any_chunk(shape, mesh):
    # [16, 5] blocks: chunks of [2, 5], 3 columns go right and 2 left, in
    # int32 near its maximum (the sums wrap around as lax's do); a 1-D
    # block: chunks of one element, which take one ring.
    rng = np.random.default_rng(1)
    x = (np.iinfo(np.int32).max - rng.integers(0, 9, size=shape)).astype(np.int32)
    body = functools.partial(file.kernel_psum_scatter_bidirectional_body, axis="i")
    want = file.psum_scatter_numpy(x, 8)
    np.testing.assert_array_equal(np.asarray(cx.RECIPES["psum_scatter"].shard_map(
        x, mesh=mesh, axis="i")), want)
    np.testing.assert_array_equal(run_detected(body, x, mesh, P("i"), "eager"), want)


def test_the_dma_cost_is_n_minus_one_chunks():
    recipe = cx.RECIPES["kernel_psum_scatter"]
    axes = recipe.axes(cx.make_mesh((8,), "i"), "i")
    x = np.zeros((8 * 256, 1024), np.float32)  # 1 MiB blocks, 128 KiB chunks
    cost = facts.dma_cost(axes, (x,))
    assert (cost.steps, cost.bytes_per_step, cost.sent) == (7, 2 ** 17, 7 * 2 ** 17)
