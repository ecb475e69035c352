"""``kernel_all_gather``: the Pallas ring all-gather of
``recipes/kernel_all_gather.py`` against ``lax.all_gather`` (the
``all_gather`` recipe's shard_map form) and NumPy, bit for bit, with
interpret mode's race detector on in both DMA modes (every form against the
oracle: the registry-driven suites; the kernel family's rules:
tests/test_kernels.py).
"""

import functools

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.recipes import kernel_all_gather as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()


@over_kernel_meshes
def test_the_ring_matches_lax_all_gather_and_numpy_bit_for_bit(shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel, native = cx.RECIPES["kernel_all_gather"], cx.RECIPES["all_gather"]
    (x,) = kernel.example_args(mesh, axis, exact=True)
    want = file.all_gather_numpy(x)
    np.testing.assert_array_equal(
        np.asarray(native.shard_map(x, mesh=mesh, axis=axis)), want)
    axes = kernel.axes(mesh, axis)
    (in_spec,), out_spec = kernel.in_specs(axes), kernel.out_specs(axes)
    body = functools.partial(file.kernel_all_gather_body, axis=axis)
    for mode in KERNEL_MODES:
        got = run_kernel_detected(body, x, mesh, in_spec, out_spec, mode)
        np.testing.assert_array_equal(got, want, err_msg=f"dma_execution_mode={mode!r}")


@pytest.mark.parametrize("dtype, block", [(np.int32, (3, 5)), (np.float32, (1, 128))],
                         ids=["int32-3x5", "float32-1x128"])
def test_blocks_of_other_shapes_and_dtypes(dtype, block):
    # every device's block arrives once, in device order, untouched: values
    # that differ in every element and device
    mesh = cx.make_mesh((8,), ("i",))
    x = np.arange(8 * block[0] * block[1]).reshape(8 * block[0], block[1]).astype(dtype)
    body = functools.partial(file.kernel_all_gather_body, axis="i")
    np.testing.assert_array_equal(
        run_kernel_detected(body, x, mesh, P("i"), P(), "on_wait"), x)
