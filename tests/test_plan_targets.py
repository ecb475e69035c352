"""plan --target: the target's own compiler, without the hardware.

The first tests need no compiler: the targets' topologies, XLA:GPU's target
config, and how the HLO reader counts what the TPU compiler writes (a gather
as an all-reduce of a zero-padded buffer, a reduce-scatter as an all-reduce
then a slice). The last compile FSDP and DP for H100s (XLA:GPU, the CUDA
plugin) and TPU v5p (libtpu) at 64 and 2048 devices and count their bytes
against an independent count of the parameters; they run where the
``target`` extra is installed (CI: after the suite on the newest JAX).
"""

from __future__ import annotations

import importlib.util

import pytest

from collectives import _cli
from collectives.hlo import bytes_moved
from collectives.hlo import matmul_flops
from collectives.hlo import parse_collectives
from collectives.plan import TARGETS
from collectives.plan import Model
from collectives.plan._plan import resolve_target


def test_each_target_names_its_topology_for_a_device_count():
    assert TARGETS["h100"].topology(2048) == "1x256x8"
    assert TARGETS["h100"].topology(64) == "1x8x8"
    assert TARGETS["v5p"].topology(2048) == "v5p:8x16x16"
    assert TARGETS["v5p"].topology(64) == "v5p:4x4x4"
    assert TARGETS["v5e"].topology(256) == "v5e:16x16"
    assert TARGETS["v6e"].topology(8) == "v6e:2x4"


@pytest.mark.parametrize(("target", "devices", "match"), [
    ("h100", 12, "not whole nodes of 8 GPUs"),
    ("v5p", 96, "make no TPU v5p slice"),
    ("v5e", 512, "at most 256"),
])
def test_a_count_a_target_has_no_topology_of_is_refused_with_the_fix(
        target, devices, match):
    with pytest.raises(ValueError, match=match) as err:
        TARGETS[target].topology(devices)
    assert "Fix:" in str(err.value)


def test_the_h100_target_config_describes_an_h100():
    config = TARGETS["h100"].config()
    assert "core_count: 132" in config
    assert "cuda_compute_capability { major: 9 minor: 0 }" in config
    assert 'platform_name: "CUDA"' in config
    assert "device_memory_size: 84978434048" in config


def test_a_target_and_a_topology_resolve_to_one_compiler():
    assert resolve_target(None, None, 64) == (None, None)
    assert resolve_target("v5p", None, 64) == ("v5p", "v5p:4x4x4")
    assert resolve_target(None, "v5e:4x4", 16) == ("v5e", "v5e:4x4")
    assert resolve_target("h100", "1x2x8", 16) == ("h100", "1x2x8")
    with pytest.raises(ValueError, match="not a TPU v5p topology"):
        resolve_target("v5p", "v5e:4x4", 16)
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        resolve_target("tpu", None, 16)


# What the TPU compiler writes on large slices, in miniature: four devices,
# a gather as an all-reduce of a zero-padded buffer (one moved to another
# memory first, two combined into one op), a reduce-scatter as an all-reduce
# whose parts are only sliced (a scalar loss summed along with them).
TPU_HLO = """HloModule m, num_partitions=4
  %zero = bf16[] constant(0)
  %one = bf16[] constant(1)
  %block = bf16[256]{0} parameter(0)
  %grad = bf16[1024]{0} parameter(1)
  %loss = bf16[] parameter(2)
  %i = s32[] parameter(3)
  %zeros = bf16[1024]{0} broadcast(%zero), dimensions={}
  %ones = bf16[1024]{0} broadcast(%one), dimensions={}
  %padded = bf16[1024]{0} dynamic-update-slice(%zeros, %block, %i)
  %padded.2 = bf16[1024]{0} dynamic-update-slice(%zeros, %block, %i)
  %moved = (bf16[1024]{0}, bf16[1024]{0}, u32[]) copy-start(%padded.2)
  %moved.done = bf16[1024]{0} copy-done(%moved)
  %gather = bf16[1024]{0} all-reduce(%padded)
  %gathers = (bf16[1024]{0}, bf16[1024]{0}) all-reduce(%padded, %moved.done)
  %not.zeros = bf16[1024]{0} dynamic-update-slice(%ones, %block, %i)
  %sum = bf16[1024]{0} all-reduce(%not.zeros)
  %sums = (bf16[], bf16[1024]{0}) all-reduce(%loss, %grad)
  %part = bf16[1024]{0} get-tuple-element(%sums), index=1
  %total = bf16[] get-tuple-element(%sums), index=0
  %shard = bf16[256]{0} dynamic-slice(%part, %i), dynamic_slice_sizes={256}
  ROOT %out = (bf16[1024], bf16[1024], bf16[256]) tuple(%gather, %sum, %shard)
"""


def test_a_gather_written_as_a_sum_of_zero_padded_buffers_counts_as_a_gather():
    ops = {op.name: op for op in parse_collectives(TPU_HLO).ops}
    gather = ops["gather"]
    assert (gather.kind, gather.written) == (
        "all-gather", "all-reduce of a zero-padded buffer")
    assert gather.bytes == bytes_moved("all-gather", 2048, 4) == 1536
    # two combined (one moved to another memory first): one gather of both
    gathers = ops["gathers"]
    assert (gathers.kind, gathers.bytes) == ("all-gather", 2 * 1536)
    assert gathers.written == "all-reduce of zero-padded buffers"
    # a buffer of ones with a block in place is a sum, not a gather
    assert (ops["sum"].kind, ops["sum"].written) == ("all-reduce", "")
    assert ops["sum"].bytes == bytes_moved("all-reduce", 2048, 4)


def test_a_reduce_scatter_written_as_an_all_reduce_and_a_slice_keeps_its_bytes():
    sums = next(op for op in parse_collectives(TPU_HLO).ops if op.name == "sums")
    assert sums.kind == "all-reduce"
    assert sums.written.startswith("all-reduce, then only sliced")
    assert sums.bytes == bytes_moved("all-reduce", 2 + 2048, 4)


# XLA:GPU's way: each matmul a dot inside a fused computation (its operands
# the computation's parameters), one of them in a loop of 3 trips.
GPU_HLO = """HloModule m, is_scheduled=true
%gemm (p0: bf16[8,16], p1: bf16[16,4]) -> bf16[8,4] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,4]{1,0} parameter(1)
  ROOT %d = bf16[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}
}
%body (t: (s32[], bf16[8,16], bf16[16,4])) -> (s32[], bf16[8,16], bf16[16,4]) {
  %t = (s32[], bf16[8,16], bf16[16,4]) parameter(0)
  %a = bf16[8,16]{1,0} get-tuple-element(%t), index=1
  %b = bf16[16,4]{1,0} get-tuple-element(%t), index=2
  %f = bf16[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm
  ROOT %r = (s32[], bf16[8,16], bf16[16,4]) tuple(%i, %a, %b)
}
ENTRY %main (x: bf16[8,16], y: bf16[16,4]) -> bf16[8,4] {
  %x = bf16[8,16]{1,0} parameter(0)
  %y = bf16[16,4]{1,0} parameter(1)
  %t0 = (s32[], bf16[8,16], bf16[16,4]) tuple(%z, %x, %y)
  %w = (s32[]) while(%t0), body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %once = bf16[8,4]{1,0} fusion(%x, %y), kind=kCustom, calls=%gemm
}
"""


def test_the_matmul_flops_of_a_program_without_a_cost_analysis():
    # one matmul of 2 * 8 * 4 * 16 FLOPs, run once and 3 times in the loop
    assert matmul_flops(GPU_HLO) == 4 * 2 * 8 * 4 * 16
    assert matmul_flops(TPU_HLO) is None  # no matmul at all


@pytest.mark.parametrize("argv", [
    ["plan", "--devices", "16", "--target", "h100", "-s", "DP"],
    ["show", "psum_scatter", "--hlo", "--target", "h100", "--mesh", "16"],
], ids=["plan", "show"])
def test_a_target_without_its_compiler_says_how_to_install_it(argv, capsys):
    if importlib.util.find_spec("jax_plugins") is not None:
        pytest.skip("a compiler plugin is installed here")
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--target h100" in err, err
    assert "pip install 'jax[tpu,cuda12-local]'" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_target_with_no_shipped_interconnect_asks_for_one(capsys):
    argv = ["plan", "--devices", "16", "--target", "v6e", "-s", "DP"]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--target v6e: no interconnect profile for TPU v6e" in err, err
    assert "--interconnect" in err


# -- compiled by the targets' own compilers --------------------------------

MODEL = Model(name="target-test", width=2048, layers=64, seq=64, batch=2048,
              heads=16, ffn=8192)
"""Small enough to compile in seconds at 2048 devices (a plan compiles one
unit of two blocks), wide enough for FSDP to split every parameter 2048
ways, as deep as the 8B model (32 units a step)."""
PARAMETERS = MODEL.layers * (2 * MODEL.width * MODEL.ffn + MODEL.ffn + MODEL.width)


def _compiler(target: str) -> None:
    wanted = {"cuda": "jax_plugins.xla_cuda12", "tpu": "libtpu"}
    module = wanted[TARGETS[target].platform]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"needs the {target} compiler: pip install "
                    "'jax[tpu,cuda12-local]' (no accelerator needed)")


@pytest.fixture(scope="module")
def target_plans():
    """``(target, devices) -> Plan`` of DP and FSDP, each compiled once."""
    from collectives.plan import load_profiles
    from collectives.plan import plan
    from collectives.plan._command import interconnect_for

    done = {}

    def get(target, devices):
        if (target, devices) not in done:
            _compiler(target)
            mesh = {"data": devices // 8, "model": 8}
            # the target's own network: a DGX H100 cluster, a v5p torus
            links = interconnect_for(TARGETS[target].interconnect, mesh,
                                     load_profiles())
            done[target, devices] = plan(
                MODEL, mesh, interconnect=links, recipes=["dp_mlp", "fsdp_mlp"],
                target=target, timeout=900)
        return done[target, devices]

    return get


@pytest.mark.parametrize("devices", [64, 2048])
@pytest.mark.parametrize("target", ["h100", "v5p"])
def test_dp_sends_an_all_reduce_of_every_gradient(target_plans, target, devices):
    p = target_plans(target, devices)
    assert p.compiler.startswith({"h100": "XLA:GPU", "v5p": "TPU compiler"}[target])
    assert f"topology {TARGETS[target].topology(devices)}" in p.compiler
    row = p.row("DP")
    want = 2 * (devices - 1) / devices * PARAMETERS * MODEL.itemsize
    assert row.sent == pytest.approx(want, rel=0.02)
    assert set(row.collectives) == {"all-reduce"}


def test_dp_on_2048_h100s_turns_communication_bound_near_the_books_figure(
        target_plans):
    # the scaling book's GPU chapter: about 2,475 tokens per GPU, where the
    # gradients' sum across nodes leaves each GPU an eighth of them, over
    # its own 400 Gb/s NIC (NVLink inside the node, pipelined with it). The
    # book counts bandwidth alone; the plan adds each all-reduce's latency
    # (XLA:GPU sums a unit's gradients in 5 all-reduces, 160 a step)
    from collectives.plan import load_profiles

    profiles = load_profiles()
    row = target_plans("h100", 2048).row("DP")
    latency = row.collectives["all-reduce"] * (
        profiles["ib-ndr"].link.alpha + profiles["nvlink-h100"].link.alpha)
    bandwidth_share = (row.comm_s - latency) / row.comm_s
    assert row.critical_tokens_per_device * bandwidth_share == pytest.approx(
        2475, rel=0.02)
    assert row.critical_tokens_per_device < 1.25 * 2475


@pytest.mark.parametrize("devices", [64, 2048])
def test_fsdp_on_h100s_gathers_twice_and_scatters_once(target_plans, devices):
    # ZeRO-3 re-gathering: the forward's and the backward's gathers and one
    # reduce-scatter of the gradients, 3 (n-1)/n P (the last layer's
    # backward re-gather is the forward's, kept: within 2 %)
    row = target_plans("h100", devices).row("FSDP")
    want = 3 * (devices - 1) / devices * PARAMETERS * MODEL.itemsize
    assert row.sent == pytest.approx(want, rel=0.02)
    assert row.collectives["reduce-scatter"] >= 1
    # XLA:GPU gives no cost analysis: the compiled program's matmuls, which
    # are the model's 6NT within 1 %
    assert row.flops_source == "matmuls"
    assert row.flops == pytest.approx(row.model_flops, rel=0.01)


@pytest.mark.parametrize("devices", [64, 2048])
def test_fsdp_on_tpu_v5p_is_counted_by_what_each_op_moves(target_plans, devices):
    # The TPU compiler writes each gather as an all-reduce of a zero-padded
    # buffer (a gather's bytes, counted as one) and the gradients'
    # reduce-scatter as an all-reduce then a slice (an all-reduce's bytes):
    # 2 (n-1)/n P gathered, less the last layer's kept re-gather, plus
    # 2 (n-1)/n P summed.
    row = target_plans("v5p", devices).row("FSDP")
    scale = (devices - 1) / devices * PARAMETERS * MODEL.itemsize
    assert 3.7 * scale <= row.sent <= 4.02 * scale, row.sent / scale
    assert row.collectives.get("reduce-scatter", 0) == 0
    sliced = [n for how, n in row.rewritten.items() if "only sliced" in how]
    padded = [n for how, n in row.rewritten.items() if "zero-padded" in how]
    assert sliced and padded, row.rewritten
    assert row.flops_source == "compiled" and row.flops > 0


@pytest.mark.parametrize("devices", [64, 2048])
def test_the_h100_schedule_hides_part_of_fsdps_collectives_and_not_the_rest(
        target_plans, devices):
    # XLA:GPU runs FSDP's gathers and the gradients' reduce-scatter
    # asynchronously; within one unit some gathers have matmuls between
    # their start and done, the reduce-scatter at the unit's end has none
    schedule = target_plans("h100", devices).row("FSDP").schedule
    assert schedule is not None and schedule["async"] >= schedule["ops"] - 1
    assert 0 < schedule["hidden_s"] < schedule["comm_s"]
    assert schedule["exposed_s"] == pytest.approx(
        schedule["comm_s"] - schedule["hidden_s"])


# -- show --hlo --target: one recipe, as the target's compiler builds it -------

@pytest.mark.parametrize("target", ["h100", "v5p"])
def test_show_hlo_for_a_target_prints_that_compilers_program(target, capsys):
    # psum_scatter over 16 devices; each device's block holds 16 chunks (one
    # per device) of the example's 2 x 3 float32: 384 bytes. A reduce-scatter
    # sends (n-1)/n of it; XLA:GPU writes one. The TPU compiler writes an
    # all-reduce and a slice instead: 2 (n-1)/n, twice the bytes, and the
    # view says that this differs from the cost model.
    _compiler(target)
    argv = ["show", "psum_scatter", "--hlo", "--target", target, "--mesh", "16"]
    assert _cli.main(argv) == 0
    out = capsys.readouterr().out
    block, n = 4 * 16 * 2 * 3, 16
    compiler = {"h100": "XLA:GPU", "v5p": "TPU compiler"}[target]
    assert out.splitlines()[0].startswith(
        f"psum_scatter on mesh {{'i': 16}}, compiled by {compiler} "), out
    if target == "h100":
        want = (f"reduce-scatter over i: f32, group of 16, {block * (n - 1) // n} "
                "bytes sent per device")
        assert out.count("axis i: meets its cost model") == 2, out
    else:
        want = (f"all-reduce over i: f32, group of 16, {2 * block * (n - 1) // n} "
                "bytes sent per device")
        assert out.count("axis i: DIFFERS from its cost model") == 2, out
    assert out.count(want) == 2, out  # the shard_map form and the jit form
    assert out.count("memory per device (the compiler's analysis)") == 2, out
