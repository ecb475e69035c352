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
import importlib.metadata
import math
import os

import jax
import numpy as np
import pytest
from jax.experimental import topologies
from jax.sharding import NamedSharding

import collectives as cx
from collectives._layout import spec_axes
from collectives.hlo import parse_collectives

# libtpu locks /tmp/libtpu_lockfile for the TPU it would drive; compiling
# drives none, and pytest-xdist's workers each load libtpu (else all but one
# fail: "Internal error when accessing libtpu multi-process lockfile").
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
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
# A block is each device's input: one shape per argument of the recipe.
BLOCKS = {"f32[8,128]": (((8, 128),), "float32"),
          "f32[512,1024]": (((512, 1024),), "float32"),
          "bf16[16,128]": (((16, 128),), "bfloat16")}
"""Blocks the kernels compile for: (8, 128) tiles of float32, (16, 128) of
bfloat16 ..."""
BLOCKS_OF = {
    # each device's chunk of columns is a multiple of 128 on 8 devices
    "kernel_all_to_all": {"f32[8,1024]": (((8, 1024),), "float32"),
                          "f32[512,1024]": (((512, 1024),), "float32"),
                          "bf16[16,1024]": (((16, 1024),), "bfloat16")},
    # x's row block and w's column block; float32 only (the matmul
    # accumulates in x's dtype, and Mosaic accumulates in 32 bits)
    "kernel_allgather_matmul": {
        "f32[8,128]@[128,128]": (((8, 128), (128, 128)), "float32"),
        "f32[512,1024]@[1024,256]": (((512, 1024), (1024, 256)), "float32")},
    # each half of a chunk's columns is 512 bytes or a multiple
    "kernel_psum_scatter_bidirectional": {
        "f32[8,256]": (((8, 256),), "float32"),
        "f32[512,1024]": (((512, 1024),), "float32"),
        "bf16[16,512]": (((16, 512),), "bfloat16")},
}
"""... unless a kernel's limits (``LIMITS``) rule them out: its own blocks."""


def blocks_of(name):
    return BLOCKS_OF.get(name, BLOCKS)


def kernel_blocks():
    return [pytest.param(name, block, id=f"{name}-{block}")
            for name in KERNELS for block in blocks_of(name)]


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


def compile_kernel(name, topology, mesh, blocks, dtype):
    """Compile ``name``'s shard_map form (the kernel) for ``topology`` with
    ``blocks`` (one shape per argument) of ``dtype`` on each device; return
    the recipe, the axes, the abstract inputs and the compiled HLO text."""
    recipe = cx.RECIPES[name]
    _, _, axis = MESHES[mesh]
    axes = recipe.axes(topology_mesh(topology, mesh), axis)
    args = []
    for block, spec in zip(blocks, recipe.in_specs(axes), strict=True):
        # a layout with a dim for the other mesh axes (all_to_all's on a 2-D
        # mesh: [k, n*c, m], m split over them) gets m = 128 on each device
        block = (*block, *(128,) * (len(spec) - len(block)))
        shape = tuple(size * math.prod(axes.mesh.shape[a] for a in sharded)
                      for size, sharded in zip(block, spec_axes(spec, len(block)),
                                               strict=True))
        args.append(jax.ShapeDtypeStruct(shape, np.dtype(dtype),
                                         sharding=NamedSharding(axes.mesh, spec)))
    text = recipe.compiled("shard_map", axes).lower(*args).compile().as_text()
    return recipe, axes, tuple(args), text


def test_every_kernel_the_tables_name_is_a_kernel_recipe():
    """Every kernel recipe is compiled (``KERNELS`` is the registry's); a
    table naming one that is not (renamed, removed) would test nothing."""
    assert "kernel_all_gather" in KERNELS
    named = {*BLOCKS_OF, *(limit[0] for limit in LIMITS)}
    assert named <= set(KERNELS), f"not kernel recipes: {sorted(named - set(KERNELS))}"


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize(("name", "block"), kernel_blocks())
def test_the_kernel_compiles_for_a_tpu_topology(on_tpu, name, block, topology, mesh):
    recipe, axes, args, text = compile_kernel(name, topology, mesh,
                                              *blocks_of(name)[block])
    assert MOSAIC_CALL in text, f"{name}: no Mosaic kernel in the compiled program"
    stats = parse_collectives(text)
    assert any(want.mismatch(stats) is None
               for want in recipe.expected_costs("shard_map", axes, args)), (
        f"{name}: the TPU program holds XLA collectives: {stats.nonzero()}")


# -- what a TPU does not compile ---------------------------------------------
# Blocks and dtypes the recipes accept (interpret mode runs them) and the TPU
# compiler refuses, each with the message it gives. The exception's class varies
# (XLA's JaxRuntimeError; Pallas's MosaicError where it can point at the
# kernel's line; a NotImplementedError while lowering): the
# message is what is pinned.

LIBTPU = tuple(int(part) for part in
               importlib.metadata.version("libtpu").split(".")[:3] if part.isdigit())
NEWEST_LIBTPU = (0, 0, 50)  # jax[tpu]==0.12.0.1's


def message(newest, *older):
    """The compiler's message: ``newest``, libtpu 0.0.50's (JAX 0.12), on it
    and after; on an older libtpu, that or one of ``older`` (libtpu 0.0.42's,
    JAX 0.10.2, said the same limits in other words)."""
    return newest if LIBTPU >= NEWEST_LIBTPU else "|".join(
        f"(?:{text})" for text in (newest, *older))


FLOAT16 = ("(?s)Mosaic failed to compile TPU kernel.*Only arguments with "
           r".*bfloat16 or 32-bit element types are supported")
"""Mosaic takes kernel arguments of 32-bit types, bfloat16 and 8- and 4-bit
floats (in HBM, 8- and 16-bit ints too): not float16."""
SCOPED_VMEM = (r"(?s)CompileTimeScopedVmemOom:\s+Ran out of memory in memory space "
               r"vmem.*Scoped allocation with size {size} and limit {limit} "
               r"exceeded scoped vmem limit")
"""A kernel's VMEM (its default BlockSpecs' whole arrays and its scratch)
over the scoped limit: 16 MiB on v5e, 32 MiB on v6e."""

LIMITS = [
    # (kernel, what fails, topology, blocks, dtype, the compiler's message)
    # -- remote DMAs between HBM buffers: no layout limit (odd shapes such as
    #    [3,100] compile); dtypes only
    *[(name, dtype, "v5e:2x4", block, dtype, match)
      for name, block in (("kernel_all_gather", ((16, 128),)),
                          ("kernel_ppermute", ((16, 128),)),
                          ("kernel_all_to_all", ((16, 1024),)))
      for dtype, match in (("float16", FLOAT16),)],
    # 1 GiB blocks: the gathered 8 GiB and its copy out of the kernel's buffer
    # exceed v5e's 16 GiB of HBM (lax.all_gather's program needs the same)
    ("kernel_all_gather", "HBM", "v5e:2x4", ((32768, 8192),), "float32",
     message(r"CompileTimeHbmOom: Ran out of memory on HBM, the total memory "
             r"required for HLO temporaries \(17.00G\) exceeds available HBM "
             r"\(15.75G\)",
             r"RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
             r"required for HLO temporaries \(17.00G\) exceeds available HBM "
             r"\(15.75G\)")),
    # -- all_to_all on one mesh axis: each device's chunk of columns (dim 1 /
    #    n, the block's last dim) is a DMA window into the block: a multiple
    #    of 128 columns (for 8-, 16- and 32-bit dtypes alike). On a 2-D mesh
    #    the block is [k, n*c, m] and any c compiles.
    ("kernel_all_to_all", "16-column chunks", "v5e:2x4", ((8, 128),), "float32",
     "Could not determine that the dynamic offset times the element size is a "
     r"multiple of the word size \(4096 bits\)"),
    ("kernel_all_to_all", "192-column chunks", "v5e:2x4", ((8, 1536),),
     "float32", "Offsets along tiled dimensions must be aligned to tiles. "
     "Failed to verify that the index at dimension 1 is divisible by the tile "
     "dimension 128"),
    # -- allgather_matmul: the matmul on the MXU, x's block tile in VMEM
    ("kernel_allgather_matmul", "bfloat16", "v5e:2x4", ((16, 128), (128, 128)),
     "bfloat16", "'tpu.matmul' op Expected matmul acc to be 32-bit"),
    ("kernel_allgather_matmul", "int8", "v5e:2x4", ((32, 128), (128, 128)),
     "int8", "'tpu.matmul' op Expected matmul acc to be 32-bit"),
    ("kernel_allgather_matmul", "int32", "v5e:2x4", ((8, 128), (128, 128)),
     "int32", r"Bad lhs/rhs type: 'vector<8x128xi32>' 'vector<128x128xi32>'"),
    ("kernel_allgather_matmul", "float16", "v5e:2x4", ((8, 128), (128, 128)),
     "float16", r"^float16\b"),  # Pallas: no float16 zero to accumulate from
    ("kernel_allgather_matmul", "VMEM", "v5e:2x4", ((4096, 1024), (1024, 128)),
     "float32", SCOPED_VMEM.format(size=r"16.50M", limit=r"16.00M")),
    # -- the reductions: the whole block, its chunks' receive slots and the
    #    result in VMEM (default BlockSpecs), the adds on the vector unit.
    #    Odd blocks ([3,100], 1-D) compile: Mosaic pads whole arrays.
    *[(name, what, "v5e:2x4", block, dtype, match)
      for name in ("kernel_psum_scatter", "kernel_psum_scatter_bidirectional",
                   "kernel_psum")
      for what, block, dtype, match in (
          # no float16 vector loads; no 8-bit integer adds
          ("float16", ((16, 512),), "float16", "Invalid vector type for load"),
          ("int8", ((32, 512),), "int8", "Not implemented: Only vector<i16> and "
           "vector<i32> are supported, but got 'i8'. Please cast your input."),
          # a 16 MiB block: about 30 MiB of VMEM, over v5e's 16
          ("VMEM", ((4096, 1024),), "float32",
           SCOPED_VMEM.format(size=r"30.00M", limit=r"16.00M")))],
    # -- the bidirectional reduce-scatter: each half of a chunk's columns is a
    #    DMA window, a multiple of 128 columns, 512 bytes or more
    ("kernel_psum_scatter_bidirectional", "64-column halves", "v5e:2x4",
     ((8, 128),), "float32",
     message("The contiguous inner slice in the DMA transfer must be divisible "
             "by 512 bytes",
             "Source and target leading tiles have different trailing "
             "dimensions")),
    ("kernel_psum_scatter_bidirectional", "64-column halves of bfloat16",
     "v5e:2x4", ((16, 128),), "bfloat16",
     message("The contiguous inner slice in the DMA transfer must be divisible "
             "by 512 bytes",
             "Slice sizes along tiled dimensions must be aligned to tiles. "
             "Failed to verify that the size at dimension 1 is divisible by the "
             "tile dimension 128")),
    ("kernel_psum_scatter_bidirectional", "192-column halves", "v5e:2x4",
     ((64, 384),), "float32",
     "Slice sizes along tiled dimensions must be aligned to tiles. Failed to "
     "verify that the size at dimension 1 is divisible by the tile dimension 128"),
]
"""Blocks a kernel recipe accepts and a TPU does not compile, with why."""


@pytest.mark.parametrize(
    ("name", "topology", "blocks", "dtype", "match"),
    [pytest.param(name, topology, blocks, dtype, match, id=f"{name}-{what}")
     for name, what, topology, blocks, dtype, match in LIMITS])
def test_what_the_tpu_compiler_refuses(on_tpu, name, topology, blocks, dtype,
                                       match):
    with pytest.raises(Exception, match=match):
        compile_kernel(name, topology, "8", blocks, dtype)
