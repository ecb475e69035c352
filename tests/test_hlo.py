"""collectives.hlo: the exact collectives each core recipe compiles to, and the
HLO text reader and cost model behind the counts.

The structural expectations hold on every supported JAX (checked on 0.8, 0.10
and 0.12): the same kinds, counts, group sizes and bytes in every form.
"""

import math

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _layout
from collectives import _recipe
from collectives._registry import core_names
from collectives.hlo import KINDS
from collectives.hlo import bus_factor
from collectives.hlo import bytes_moved
from collectives.hlo import collective_stats
from collectives.hlo import parse_collectives
from collectives.hlo import shape_bytes

CONFIGS = [((8,), ("i",), None), ((8,), ("i",), "i"),
           ((4, 2), ("i", "j"), None), ((4, 2), ("i", "j"), "i"),
           ((4, 2), ("i", "j"), "j")]
CONFIG_IDS = ["8-all", "8-i", "4x2-all", "4x2-i", "4x2-j"]

CORE = core_names()


def _kinds(recipe, form, axes, args) -> set[str | None]:
    """The one collective kind (``None``: none) that the recipe's declared cost
    model accepts for ``form`` (on CPU the jit psum_scatter is an all-reduce:
    XLA's CPU pipeline does not fuse all-reduce + dynamic-slice into a
    reduce-scatter)."""
    found = set()
    for expected in recipe.expected_costs(form, axes, args):
        assert len(expected.counts) <= 1, expected
        found.add(next(iter(expected.counts), None))
    return found


def _setup(name, shape, names, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=(2, 3))
    return recipe, axes, args


def _block_bytes(args, axes) -> int:
    # Every core recipe shards its one argument over all mesh axes.
    (x,) = args
    return x.nbytes // (axes.size * axes.others_size)


def _expected_bytes(kind: str, block: int, n: int) -> float:
    """The cost model's bytes per device for a collective on one block."""
    if kind in ("all-gather", "all-to-all"):
        return bytes_moved(kind, n * block, n)
    if kind == "collective-permute":
        return float(block)
    return bytes_moved(kind, block, n)


@pytest.mark.parametrize(("shape", "names", "axis"), CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("form", ["shard_map", "jit"])
@pytest.mark.parametrize("name", CORE)
def test_placed_forms_emit_exactly_one_expected_collective(name, form, shape,
                                                           names, axis):
    recipe, axes, args = _setup(name, shape, names, axis)
    stats = collective_stats(recipe.compiled(form, axes),
                             *recipe.place(*args, axes=axes))
    kinds = _kinds(recipe, form, axes, args)
    if kinds == {None}:
        # axis_index is arithmetic on the partition id: no communication.
        assert stats.nonzero() == {} and stats.count() == 0
        return
    (op,) = stats.ops
    assert op.kind in kinds
    assert stats.nonzero() == {op.kind: 1}
    assert sum(stats.counts().values()) == 1
    block = _block_bytes(args, axes)
    if op.kind == "collective-permute":
        # one source-target pair per device, every ring of the axes together
        assert op.group_size == axes.size * axes.others_size
    else:
        assert op.group_size == axes.size
    if name == "psum_scatter":
        # the input block is the unscattered array: V is the whole block
        expected = bytes_moved(op.kind, block, axes.size)
    else:
        expected = _expected_bytes(op.kind, block, axes.size)
    assert stats.bytes(op.kind) == pytest.approx(expected)
    assert stats.bytes() == pytest.approx(expected)


def _pmap_stats(recipe, axes, args):
    fn = _recipe.pmap_callable(recipe, axes)
    (spec,) = recipe.in_specs(axes)
    stacked = _layout.to_stacked(np.asarray(args[0]), axes.mesh, spec)
    return collective_stats(fn, stacked)


@pytest.mark.parametrize(("shape", "names", "axis"), CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("name", CORE)
def test_pmap_form_communicates_only_over_the_pmapped_axis(name, shape, names,
                                                            axis):
    # pmap maps the first mesh axis over devices and vmaps the others on each
    # device: collectives over vmapped axes become local ops, so only the
    # first axis (when it is a collective axis) shows up as a collective.
    recipe, axes, args = _setup(name, shape, names, axis)
    stats = _pmap_stats(recipe, axes, args)
    first = names[0]
    (kind,) = _kinds(recipe, "shard_map", axes, args)
    if kind is None or first not in axes.names:
        assert stats.nonzero() == {}
        return
    (op,) = stats.ops
    assert stats.nonzero() == {kind: 1}
    n = shape[0]
    assert op.group_size == n  # devices, or source-target pairs of the ring
    if len(shape) == 1:
        block = _block_bytes(args, axes)
        if name == "psum_scatter":
            expected = bytes_moved(op.kind, block, n)
        else:
            expected = _expected_bytes(op.kind, block, n)
        assert op.bytes == pytest.approx(expected)


# -- the text reader -----------------------------------------------------------

GPU_LIKE = """\
HloModule jit_f, is_scheduled=true, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%async_computation (p: f32[64,4]) -> f32[8,4] {
  %p = f32[64,4]{1,0} parameter(0)
  ROOT %reduce-scatter.1 = f32[8,4]{1,0} reduce-scatter(%p), channel_id=3, \
replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
}

ENTRY %main (x: f32[64,4], y: bf16[16]) -> f32[64,4] {
  %x = f32[64,4]{1,0} parameter(0)
  %y = bf16[16]{0} parameter(1)
  %all-reduce-start = f32[64,4]{1,0} all-reduce-start(%x), channel_id=1, \
replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %all-reduce-done = f32[64,4]{1,0} all-reduce-done(%all-reduce-start)
  %all-gather-start = (bf16[16]{0}, bf16[128]{0}) all-gather-start(%y), \
channel_id=2, replica_groups={}, dimensions={0}
  %all-gather-done = bf16[128]{0} all-gather-done(%all-gather-start)
  %rs-start = ((f32[64,4]{1,0}), f32[8,4]{1,0}) async-start(%x), \
calls=%async_computation
  %rs-done = f32[8,4]{1,0} async-done(%rs-start)
  %cp-start = (f32[64,4]{1,0}, f32[64,4]{1,0}, u32[], u32[]) \
collective-permute-start(%all-reduce-done), channel_id=4, \
source_target_pairs={{0,1},{1,0}}
  ROOT %cp-done = f32[64,4]{1,0} collective-permute-done(%cp-start)
}
"""


def test_async_pairs_count_once_with_bytes_from_the_operands():
    stats = parse_collectives(GPU_LIKE)
    assert stats.counts() == {"all-reduce": 1, "all-gather": 1, "reduce-scatter": 1,
                              "all-to-all": 0, "collective-permute": 1}
    by_kind = {op.kind: op for op in stats.ops}
    assert by_kind["all-reduce"].group_size == 4
    assert by_kind["all-reduce"].bytes == pytest.approx(2 * 3 / 4 * 1024)
    # replica_groups={} spans every partition; bf16[16] gathered 8 ways
    assert by_kind["all-gather"].group_size == 8
    assert by_kind["all-gather"].size == 8 * 32
    assert by_kind["all-gather"].bytes == pytest.approx(7 * 32)
    assert by_kind["reduce-scatter"].group_size == 8
    assert by_kind["reduce-scatter"].bytes == pytest.approx(7 / 8 * 1024)
    assert by_kind["collective-permute"].group_size == 2
    assert by_kind["collective-permute"].bytes == 1024
    assert stats.bytes() == pytest.approx(sum(op.bytes for op in stats.ops))


def test_older_text_with_inline_operand_shapes_and_mesh_groups():
    text = """HloModule m, num_partitions=8
ENTRY %e (p: s32[6,2]) -> s32[6,2] {
  %p = s32[6,2]{1,0} parameter(0)
  %t = (s32[3,2]{1,0}, s32[3,2]{1,0}) all-to-all(s32[3,2]{1,0} %p.a, \
s32[3,2]{1,0} %p.b), channel_id=1, replica_groups=mesh['i'=4,'j'=2] {'j'}
  ROOT %r = s32[6,2]{1,0} all-reduce(s32[6,2]{1,0} %p), channel_id=2, \
replica_groups=mesh['a'=2,'b'=1,'c'=4], device_ids=([4,2]T(1,0)) {'a','c'}, \
to_apply=%add, metadata={op_name="all-gather(fake)"}
}
"""
    stats = parse_collectives(text)
    assert stats.nonzero() == {"all-to-all": 1, "all-reduce": 1}
    a2a, ar = stats.ops
    assert (a2a.group_size, a2a.operand_bytes) == (2, 48)
    assert a2a.bytes == pytest.approx(bytes_moved("all-to-all", 96, 2)) == 24
    assert (ar.group_size, ar.operand_bytes) == (8, 48)


def test_absent_kinds_are_zero_and_unknown_kinds_are_refused():
    stats = parse_collectives("HloModule empty\nENTRY %e () -> f32[] {\n}\n")
    assert stats.counts() == dict.fromkeys(KINDS, 0)
    assert stats.bytes() == 0.0 and stats.bytes("all-gather") == 0.0
    with pytest.raises(ValueError, match=r"kind: expected one of .*'allreduce'"):
        stats.count("allreduce")
    assert "all-reduce" in str(stats)


@pytest.mark.parametrize(("shape", "expected"), [
    ("f32[8,3]{1,0}", 96), ("(bf16[4]{0}, /*index=1*/s8[2,2])", 12),
    ("pred[]", 1), ("f32[<=8]", 32), ("c64[2]", 16), ("token[]", 0)])
def test_shape_bytes(shape, expected):
    assert shape_bytes(shape) == expected


# -- the cost model ------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 8, 256])
def test_cost_model_identities(n):
    size = 3 * 2**20
    reduce = bytes_moved("all-reduce", size, n)
    # a ring all-reduce is a reduce-scatter followed by an all-gather
    assert reduce == pytest.approx(bytes_moved("reduce-scatter", size, n)
                                   + bytes_moved("all-gather", size, n))
    # all-to-all: each device keeps 1/n of its buffer (V/n) and sends the rest
    assert bytes_moved("all-to-all", size, n) == pytest.approx(
        (size / n) * (n - 1) / n)
    assert bytes_moved("collective-permute", size, n) == size
    assert bus_factor("all-reduce", n) == pytest.approx(2 * (n - 1) / n)
    if n == 1:
        assert reduce == 0


def test_cost_model_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kind: expected one of"):
        bus_factor("psum", 8)
    with pytest.raises(ValueError, match="n: expected at least 1"):
        bytes_moved("all-reduce", 8, 0)


def test_collective_stats_wraps_plain_callables_and_refuses_others():
    mesh = cx.make_mesh((8,), "i")
    sharding = jax.sharding.NamedSharding(mesh, jax.P("i"))
    x = jax.device_put(np.ones((8, 4), np.float32), sharding)
    stats = collective_stats(lambda v: v.sum(0), x)  # wrapped in jax.jit
    assert stats.nonzero() == {"all-reduce": 1}
    assert stats.ops[0].group_size == math.prod(mesh.shape.values())
    with pytest.raises(TypeError, match="fn: expected a callable"):
        collective_stats(3, x)


SCHEDULED = """HloModule m, is_scheduled=true, num_partitions=4
%fused_dot (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %d = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}
}
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
%wrapped_rs (w: f32[16]) -> f32[4] {
  %w = f32[16]{0} parameter(0)
  ROOT %rs = f32[4]{0} reduce-scatter(%w), replica_groups={{0,1,2,3}}, to_apply=%add
}
ENTRY %main (a: f32[8,16], b: f32[16,4], g: f32[16]) -> f32[4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %g = f32[16]{0} parameter(2)
  %ag = f32[64]{0} all-gather-start(%g), replica_groups={{0,1,2,3}}, dimensions={0}
  %f1 = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %f2 = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %agd = f32[64]{0} all-gather-done(%ag)
  %ar = f32[16]{0} all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%add
  %rss = ((f32[16]{0}), f32[4]{0}) async-start(%ar), calls=%wrapped_rs
  ROOT %rsd = f32[4]{0} async-done(%rss)
}
"""


def test_the_schedule_says_what_each_async_collective_runs_beside():
    from collectives.hlo import scheduled_overlap

    # the gather's start and done hold two fused matmuls of 2*8*4*16 FLOPs
    # each; the wrapped reduce-scatter (named as its op is) has nothing
    # between; the synchronous all-reduce has no start and done
    found = scheduled_overlap(SCHEDULED)
    assert found == {"ag": 2 * 2 * 8 * 4 * 16, "rs": 0.0}
    names = {op.name for op in parse_collectives(SCHEDULED).ops}
    assert set(found) <= names and "ar" in names


def test_each_collective_names_the_pass_of_a_step_that_runs_it():
    """JAX names a VJP's transposed ops ``transpose(jvp(...))``: a gather in
    the forward pass, its transpose (a reduce-scatter) in the backward."""
    mesh = cx.make_mesh((8,), "i")

    def loss(w):
        gathered = jax.lax.all_gather(w, "i", tiled=True)
        return jax.lax.psum((gathered ** 2).sum(), "i")

    step = jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=jax.P("i"),
                                 out_specs=jax.P("i")))
    w = jax.device_put(np.ones(16, np.float32),
                       jax.sharding.NamedSharding(mesh, jax.P("i")))
    phases = {op.kind: op.phase for op in collective_stats(step, w).ops}
    assert phases["all-gather"] == "forward"
    assert phases["reduce-scatter"] == "backward"
    # a program that names no op: no pass
    assert {op.phase for op in parse_collectives(GPU_LIKE).ops} == {""}
