"""``kernel_allgather_matmul``: the Pallas kernel of
``recipes/kernel_allgather_matmul.py`` (each block multiplied while it
travels on round the ring) against ``lax.all_gather`` then a matmul and
NumPy, with interpret mode's race detector on in both DMA modes (every form
against the oracle: the registry-driven suites; the kernel family's rules:
tests/test_kernels.py).

On small integers the products and their sums are exact in float32, so the
kernel is compared bit for bit, at the example's K and at K = 1024.
"""

import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.recipes import kernel_allgather_matmul as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()


@over_kernel_meshes
def test_the_kernel_matches_the_gather_then_matmul_and_numpy(shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel = cx.RECIPES["kernel_allgather_matmul"]
    x, w = kernel.example_args(mesh, axis, exact=True)
    want = file.matmul_numpy(x, w)
    axes = kernel.axes(mesh, axis)
    in_specs, out_spec = tuple(kernel.in_specs(axes)), kernel.out_specs(axes)
    lax_form = jax.jit(jax.shard_map(
        lambda x, w: jax.lax.all_gather(x, axis, tiled=True) @ w,
        mesh=mesh, in_specs=in_specs, out_specs=out_spec))
    np.testing.assert_array_equal(np.asarray(lax_form(x, w)), want)
    body = functools.partial(file.kernel_allgather_matmul_body, axis=axis)
    for mode in KERNEL_MODES:
        got = run_kernel_detected(body, (x, w), mesh, in_specs, out_spec, mode)
        np.testing.assert_array_equal(got, want, err_msg=f"dma_execution_mode={mode!r}")


def test_a_long_contraction_bit_for_bit():
    # K = 1024 (check's --dims 256 1024 size): integers in [-4, 4], every
    # partial sum below 2**24, exact in float32 in any order
    mesh = cx.make_mesh((8,), ("i",))
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, size=(8 * 4, 1024)).astype(np.float32)
    w = rng.integers(-4, 5, size=(1024, 8 * 2)).astype(np.float32)
    body = functools.partial(file.kernel_allgather_matmul_body, axis="i")
    got = run_kernel_detected(body, (x, w), mesh, (P("i"), P(None, "i")),
                              P(None, "i"), "on_wait")
    np.testing.assert_array_equal(got, file.matmul_numpy(x, w))
