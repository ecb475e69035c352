"""``kernel_ppermute``: the Pallas kernel of ``recipes/kernel_ppermute.py``
against ``lax.ppermute`` and NumPy, bit for bit, with interpret mode's race
detector on in both DMA modes (every form against the oracle: the
registry-driven suites).

The recipe's body is the ring shift by +1; the file's ``kernel_permute``
takes any static permutation, checked here against ``lax.ppermute`` on
permutations that swap, keep blocks in place, leave devices without a
source (they get zeros) or move nothing at all.
"""

import functools

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.recipes import kernel_ppermute as file
from helpers import KERNEL_MODES
from helpers import kernel_module_marks
from helpers import over_kernel_meshes
from helpers import run_kernel_detected

pytestmark = kernel_module_marks()


def run_detected(body, x, mesh, spec, mode):
    """``body`` with ``spec`` in and out (helpers.run_kernel_detected)."""
    return run_kernel_detected(body, x, mesh, spec, spec, mode)


@over_kernel_meshes
def test_the_ring_shift_matches_lax_ppermute_and_numpy_bit_for_bit(shape, names, axis):
    mesh = cx.make_mesh(shape, names)
    kernel, native = cx.RECIPES["kernel_ppermute"], cx.RECIPES["ppermute_ring"]
    (x,) = native.example_args(mesh, axis, exact=True)  # small integers
    want = file.ppermute_ring_numpy(x, mesh.shape[axis])
    np.testing.assert_array_equal(np.asarray(native.shard_map(x, mesh=mesh, axis=axis)),
                                  want)
    (spec,) = kernel.in_specs(kernel.axes(mesh, axis))
    body = functools.partial(file.kernel_ppermute_body, axis=axis)
    for mode in KERNEL_MODES:
        np.testing.assert_array_equal(run_detected(body, x, mesh, spec, mode), want,
                                      err_msg=f"dma_execution_mode={mode!r}")


PERMS = {
    "reversal": [(s, 7 - s) for s in range(8)],  # four swaps
    "some-kept-some-zeros": [(0, 1), (1, 0), (2, 2), (5, 3)],
    "nothing-moves": [],
}


@pytest.mark.parametrize("perm", PERMS.values(), ids=PERMS.keys())
def test_any_static_permutation_matches_lax_ppermute(perm, mesh):
    x = np.arange(8 * 2 * 3, dtype=np.float32).reshape(16, 3) + 1  # no zeros
    want = file.permute_numpy(x, 8, perm)
    lax_form = jax.jit(jax.shard_map(lambda b: lax.ppermute(b, "i", perm), mesh=mesh,
                                     in_specs=P("i"), out_specs=P("i")))
    np.testing.assert_array_equal(np.asarray(lax_form(x)), want)
    for mode in KERNEL_MODES:
        got = run_detected(lambda b: file.kernel_permute(b, "i", perm), x, mesh,
                           P("i"), mode)
        np.testing.assert_array_equal(got, want, err_msg=f"dma_execution_mode={mode!r}")


def test_a_64x128_float32_block_moves_bit_for_bit(mesh):
    x = np.random.default_rng(0).standard_normal((8 * 64, 128)).astype(np.float32)
    want = file.ppermute_ring_numpy(x, 8)
    body = functools.partial(file.kernel_ppermute_body, axis="i")
    np.testing.assert_array_equal(run_detected(body, x, mesh, P("i"), "on_wait"), want)


@pytest.mark.parametrize("perm, words", [
    ([(0, 1), (2, 1)], "destination 1 appears twice"),
    ([(0, 1), (0, 2)], "source 0 appears twice"),
    ([(0, 8)], "outside range(8)"),
])
def test_a_bad_permutation_is_refused_by_name(perm, words, mesh):
    f = jax.jit(jax.shard_map(lambda b: file.kernel_permute(b, "i", perm), mesh=mesh,
                              in_specs=P("i"), out_specs=P("i"), check_vma=False))
    with pytest.raises(ValueError, match=r"perm: .*" + words.replace("(", r"\(")
                       .replace(")", r"\)")):
        f(np.zeros((16, 3), np.float32))
