"""The kernel recipes compiled by the TPU compiler for real TPU topologies.

Interpret mode (every other kernel test) runs a kernel's Python on the CPU;
it never asks Mosaic, the compiler of Pallas TPU kernels, whether it can
compile it. Here every recipe with ``family == "kernel"`` is compiled, not
run, for named TPU topologies (``jax.experimental.topologies``: the TPU
compiler from ``jax[tpu]``, no TPU needed) under its own shard_map form, with
the recipe file's ``interpret_mode()`` replaced by ``False`` as on a TPU.
Each compiled program must hold the Mosaic kernel (``tpu_custom_call``) and
no XLA collective (the kernel's cost model).

The limits found below are Mosaic's and the TPU compiler's, pinned with the
messages they give: blocks and dtypes the recipes accept that a TPU does not
compile.
"""

import functools
import importlib
import math

import jax
import numpy as np
import pytest
from jax.experimental import topologies
from jax.sharding import NamedSharding

import collectives as cx
from collectives._layout import spec_axes
from collectives.hlo import parse_collectives

pytest.importorskip(
    "libtpu", reason="needs the TPU compiler: pip install 'jax[tpu]' (no TPU)")

KERNELS = sorted(name for name, recipe in cx.RECIPES.items()
                 if recipe.family == "kernel")
TOPOLOGIES = ("v5e:2x4", "v6e:2x4")
# (mesh shape, mesh axis names, the axis the kernel runs along)
MESHES = {
    "8": ((8,), ("i",), "i"),
    "4x2 along i": ((4, 2), ("i", "j"), "i"),
    "4x2 along j": ((4, 2), ("i", "j"), "j"),
}
BLOCKS = {"f32[8,128]": ((8, 128), "float32"),
          "f32[512,1024]": ((512, 1024), "float32"),
          "bf16[16,128]": ((16, 128), "bfloat16")}
"""Blocks (each device's input) the kernels compile for: (8, 128) tiles of
float32, (16, 128) of bfloat16 ..."""
BLOCKS_OF: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
"""... unless a kernel's limits (``LIMITS``) rule them out: its own blocks."""


def kernel_blocks():
    return [pytest.param(name, block, id=f"{name}-{block}")
            for name in KERNELS for block in BLOCKS_OF.get(name, BLOCKS)]


MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'


@functools.cache
def topology_mesh(topology, mesh):
    shape, names, _ = MESHES[mesh]
    topo = topologies.get_topology_desc(topology, platform="tpu")
    return topologies.make_mesh(topo, shape, names)


@pytest.fixture
def on_tpu(monkeypatch):
    """Every kernel recipe's ``interpret_mode()`` says False, as on a TPU:
    pallas_call hands the kernel to Mosaic."""
    for name in KERNELS:
        recipe_file = cx.RECIPES[name].recipe_file.removesuffix(".py")
        module = importlib.import_module(f"collectives.recipes.{recipe_file}")
        monkeypatch.setattr(module, "interpret_mode", lambda: False)


def compile_kernel(name, topology, mesh, block, dtype):
    """Compile ``name``'s shard_map form (the kernel) for ``topology`` with a
    ``block`` of ``dtype`` on each device; return the recipe, the axes, the
    abstract input and the compiled program's HLO text."""
    recipe = cx.RECIPES[name]
    _, _, axis = MESHES[mesh]
    axes = recipe.axes(topology_mesh(topology, mesh), axis)
    (spec,) = recipe.in_specs(axes)
    shape = tuple(size * math.prod(axes.mesh.shape[a] for a in sharded)
                  for size, sharded in zip(block, spec_axes(spec, len(block)),
                                           strict=True))
    x = jax.ShapeDtypeStruct(shape, np.dtype(dtype),
                             sharding=NamedSharding(axes.mesh, spec))
    text = recipe.compiled("shard_map", axes).lower(x).compile().as_text()
    return recipe, axes, x, text


def test_every_kernel_recipe_is_compiled_here():
    assert "kernel_all_gather" in KERNELS


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize(("name", "block"), kernel_blocks())
def test_the_kernel_compiles_for_a_tpu_topology(on_tpu, name, block, topology, mesh):
    blocks = BLOCKS_OF.get(name, BLOCKS)
    recipe, axes, x, text = compile_kernel(name, topology, mesh, *blocks[block])
    assert MOSAIC_CALL in text, f"{name}: no Mosaic kernel in the compiled program"
    stats = parse_collectives(text)
    assert any(want.mismatch(stats) is None
               for want in recipe.expected_costs("shard_map", axes, (x,))), (
        f"{name}: the TPU program holds XLA collectives: {stats.nonzero()}")


# -- what a TPU does not compile ---------------------------------------------
# The recipes accept every float and complex dtype. Interpret mode runs
# float16 (and fails on complex64 itself: it fills unwritten memory with NaN,
# "NotImplementedError: nan + complex64"); Mosaic, or the TPU compiler around
# it, refuses both.

DTYPE_LIMITS = {
    # Mosaic takes kernel arguments of 32-bit, bfloat16 and 8/4-bit floats
    # (and, in these kernels' HBM refs, 8- and 16-bit ints), not float16
    "float16": ("Mosaic failed to compile TPU kernel.*Only arguments with "
                r".*bfloat16 or 32-bit element types are supported"),
    # the TPU compiler splits complex numbers into real pairs, which it cannot
    # do across a custom call
    "complex64": (r"While rewriting computation to not contain X\{64\|128\} "
                  "element types, XLA encountered an HLO for which this "
                  r"rewriting is not implemented: .*tpu_custom_call"),
}


@pytest.mark.parametrize("dtype", DTYPE_LIMITS)
@pytest.mark.parametrize("name", KERNELS)
def test_a_dtype_the_tpu_compiler_refuses(on_tpu, name, dtype):
    with pytest.raises(jax.errors.JaxRuntimeError, match=DTYPE_LIMITS[dtype]):
        compile_kernel(name, "v5e:2x4", "8", (16, 128), dtype)


LIMITS = [
    # (kernel, what fails, topology, block, dtype, the compiler's message)
    # 1 GiB blocks: the gathered 8 GiB and its copy out of the kernel's buffer
    # exceed v5e's 16 GiB of HBM (lax.all_gather's program needs the same)
    ("kernel_all_gather", "HBM", "v5e:2x4", (32768, 8192), "float32",
     r"CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
     r"for HLO temporaries \(17.00G\) exceeds available HBM \(15.75G\)"),
]
"""Blocks a kernel recipe accepts and a TPU does not compile, with why."""


@pytest.mark.parametrize(
    ("name", "topology", "block", "dtype", "match"),
    [pytest.param(name, topology, block, dtype, match, id=f"{name}-{what}",
                  marks=pytest.mark.skipif(
                      name not in KERNELS,
                      reason=f"{name} is not a registered kernel recipe here"))
     for name, what, topology, block, dtype, match in LIMITS])
def test_a_block_the_tpu_compiler_refuses(on_tpu, name, topology, block, dtype,
                                          match):
    with pytest.raises(jax.errors.JaxRuntimeError, match=match):
        compile_kernel(name, topology, "8", block, dtype)
