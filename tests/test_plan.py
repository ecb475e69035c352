"""``python -m collectives plan``: groups to mesh axes, profiles, the step
arithmetic, the model and mesh checks, and the command end to end on 64
devices with its numbers checked against formulas written here."""

import dataclasses
import json
import math
import re

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _cli
from collectives._hlo_groups import parse_groups
from collectives._hlo_groups import spanned_axes
from collectives.hlo import collective_stats
from collectives.plan import MODELS
from collectives.plan import Link
from collectives.plan import Profile
from collectives.plan import default_mesh
from collectives.plan import load_profiles
from collectives.plan import measured_profile
from collectives.plan import model_from
from collectives.plan import plan as plan_for
from collectives.plan import read_profiles
from collectives.plan._command import parse_mesh
from collectives.plan._plan import check_mesh
from collectives.plan._plan import link_for
from collectives.plan._plan import step_row
from collectives.plan._profiles import _machine_key
from helpers import run_python

# -- which mesh axes a compiled collective runs over ----------------------------


@pytest.mark.parametrize("attrs,groups,names", [
    ("replica_groups={{0,2,4,6},{1,3,5,7}}, to_apply=%add",
     ((0, 2, 4, 6), (1, 3, 5, 7)), ()),
    ("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}",
     ((0, 4), (1, 5), (2, 6), (3, 7)), ()),
    ("replica_groups=[2,4]<=[8], to_apply=%add", ((0, 1, 2, 3), (4, 5, 6, 7)), ()),
    ("replica_groups=mesh['i'=4,'j'=2]{'j'}, to_apply=%add",
     ((0, 1), (2, 3), (4, 5), (6, 7)), ()),
    ("source_target_pairs={{0,1},{1,0}}, channel_id=2", ((0, 1), (1, 0)), ()),
    ("replica_groups={}, to_apply=%add", (), ()),
])
def test_parse_groups_reads_every_way_xla_writes_them(attrs, groups, names):
    assert parse_groups(attrs) == (groups, names)


def test_spanned_axes_are_the_axes_along_which_ids_differ():
    assert spanned_axes([(0, 4), (1, 5)], (), ("i", "j"), (2, 4)) == ("i",)
    assert spanned_axes([(0, 1, 2, 3)], (), ("i", "j"), (2, 4)) == ("j",)
    # a ring over both axes: the first pair alone moves along j only
    ring = [(k, (k + 1) % 8) for k in range(8)]
    assert spanned_axes(ring, (), ("i", "j"), (2, 4)) == ("i", "j")
    assert spanned_axes((), ("j", "i"), ("i", "j"), (2, 4)) == ("i", "j")


@pytest.mark.parametrize("axis,want", [("i", ("i",)), ("j", ("j",)),
                                       (("i", "j"), ("i", "j"))])
def test_compiled_collectives_name_the_mesh_axes_they_run_over(axis, want):
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    n = math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))
    for body in (lambda x: jax.lax.psum(x, axis),
                 lambda x: jax.lax.all_gather(x, axis, tiled=True),
                 lambda x: jax.lax.ppermute(x, axis, [(k, (k + 1) % n)
                                                      for k in range(n)])):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P(("i", "j")),
                                  out_specs=jax.P(("i", "j")), check_vma=False))
        stats = collective_stats(f, jax.ShapeDtypeStruct((8, 4), np.float32))
        assert [op.mesh_axes(mesh) for op in stats.ops] == [want]
        assert stats.ops[0].dtype == "f32"


# -- interconnect profiles ------------------------------------------------------


def test_shipped_profiles_each_say_where_their_figures_come_from():
    profiles = load_profiles()
    assert {"nvlink-h100", "ib-ndr", "tpu-v5p-ici", "tpu-v5p-dcn"} <= set(profiles)
    for name, p in profiles.items():
        assert len(p.source) > 40 and p.description, name
        assert p.link.alpha > 0 and p.link.busbw > 1e9, name
    ib = profiles["ib-ndr"]
    assert ib.seconds("all-reduce", 50e9) == pytest.approx(1 + 20e-6)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_profiles_from_a_file_with_per_kind_figures(tmp_path, suffix):
    table = {"lab": {"alpha_us": 5, "busbw_GBps": 100, "source": "our nccl-tests",
                     "kinds": {"all-to-all": {"busbw_GBps": 25}}}}
    path = tmp_path / f"p{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(table))
    else:
        path.write_text('[lab]\nalpha_us = 5\nbusbw_GBps = 100\nsource = "our '
                        'nccl-tests"\n[lab.kinds.all-to-all]\nbusbw_GBps = 25\n')
    lab = read_profiles(path)["lab"]
    assert lab.seconds("all-reduce", 1e9) == pytest.approx(5e-6 + 0.01)
    assert lab.seconds("all-to-all", 1e9) == pytest.approx(5e-6 + 0.04)
    assert "lab" in load_profiles(path) and "ib-ndr" in load_profiles(path)


@pytest.mark.parametrize("text,match", [
    ('[x]\nalpha_us = 5\nbusbw_GBps = -1\n', r"profile 'x': busbw_GBps=-1.*positive"),
    ('[x]\nbusbw_GBps = 10\n', r"profile 'x': alpha_us=None"),
    ('[x]\nalpha_us = 1\nbusbw_GBps = 10\n[x.kinds.psum]\nalpha_us = 1\n',
     r"kinds.psum is not a collective kind.*all-reduce"),
    ("[x\n", r"cannot read it.*TOML or JSON"),
])
def test_a_wrong_profile_file_is_named_with_the_value_and_the_fix(tmp_path, text,
                                                                  match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_profiles(path)


def test_a_collective_over_two_axes_pays_the_slower_link():
    fast = Profile("fast", Link(alpha=1e-6, busbw=400e9))
    slow = Profile("slow", Link(alpha=20e-6, busbw=50e9))
    links = {"data": slow, "model": fast}
    assert link_for(["model"], links) is fast
    assert link_for(["data"], links) is slow
    both = link_for(["data", "model"], links)
    assert both.seconds("all-gather", 1e9) == pytest.approx(20e-6 + 1e9 / 50e9)


def test_measured_profile_is_read_back_from_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "jax-collectives" / "measured-profile.json"
    cache.parent.mkdir(parents=True)
    fits = {"all-reduce": {"alpha_us": 40.0, "busbw_GBps": 4.0},
            "all-to-all": {"alpha_us": 60.0, "busbw_GBps": 0.5}}
    cache.write_text(json.dumps({"key": _machine_key(8), "fits": fits,
                                 "when": "2026-12-01"}))
    p = measured_profile(8)  # a cache without peaks: the matmul is timed
    assert p.name == "measured" and "bench's alpha-beta fit" in p.source
    assert p.peak("float32") > 0 and "matmul" in p.peak_source
    assert "peaks" in json.loads(cache.read_text())
    assert p.seconds("all-to-all", 1e9) == pytest.approx(60e-6 + 2.0)
    assert p.seconds("all-reduce", 4e9) == pytest.approx(40e-6 + 1.0)


def test_the_measured_peak_is_timed_under_a_users_global_mesh():
    """On JAX's defaults (a mesh set with jax.set_mesh) the matmul that times
    the measured profile's peak runs on one device, outside that mesh."""
    from collectives.plan._profiles import measured_peaks

    with jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y"))):
        peaks = measured_peaks(8)
    assert set(peaks) == {"float32", "bfloat16"} and min(peaks.values()) > 0


# -- the model and the mesh -----------------------------------------------------


def test_model_sizes_and_overrides():
    assert MODELS["1b"].parameters == 32 * (2 * 2048 * 8192 + 8192 + 2048)
    m = model_from("8b", width=1024, heads=8, dtype="float32")
    assert (m.width, m.layers, m.itemsize, m.name) == (1024, 64, 4, "8b*")
    with pytest.raises(ValueError, match=r"width=1000 does not divide by heads=32"):
        model_from("8b", width=1000)
    with pytest.raises(ValueError, match=r"layers=0; expected a positive integer"):
        model_from("8b", layers=0)
    with pytest.raises(ValueError, match=r"expected one of laptop, 1b, 8b, 70b, "
                                         r"llama2-13b, got '7b'"):
        model_from("7b")


def test_mesh_checks_name_the_value_and_the_fix():
    assert default_mesh(2048) == (("data", "model"), (256, 8))
    assert default_mesh(8) == (("data", "model"), (4, 2))
    with pytest.raises(ValueError, match=r"devices: 20 .*multiple of 8"):
        default_mesh(20)
    with pytest.raises(ValueError, match=r"4096 devices.*at most 2048"):
        check_mesh(("data", "model"), (512, 8))
    with pytest.raises(ValueError, match=r"one or two named axes"):
        check_mesh(("a", "b", "c"), (2, 2, 2))
    assert parse_mesh("data=256,model=8") == {"data": 256, "model": 8}
    with pytest.raises(ValueError, match=r"'256x8': expected AXIS=SIZE"):
        parse_mesh("256x8")
    with pytest.raises(ValueError, match=r"axis 'data' is named twice"):
        parse_mesh("data=2,data=4")


# -- a step from one compiled unit -----------------------------------------------


def test_a_step_counts_each_collective_per_unit_on_its_axis_link():
    slow = Profile("slow", Link(alpha=10e-6, busbw=10e9))
    fast = Profile("fast", Link(alpha=1e-6, busbw=100e9))
    unit = {"recipe": "dp_tp_mlp", "form": "shard_map", "axis": None,
            "dtype": "float32",
            "ops": [{"kind": "all-reduce", "axes": ["data"], "bytes": 4e6,
                     "group": 4, "dtype": "f32"},
                    {"kind": "all-reduce", "axes": ["model"], "bytes": 8e6,
                     "group": 2, "dtype": "f32"},
                    {"kind": "all-reduce", "axes": ["data"], "bytes": 4,
                     "group": 4, "dtype": "s32"}],
            "memory": {"params": 1000, "temp": 400}, "cost_model": None,
            "compile_s": 0.1}
    # bfloat16: f32 collectives count half; 8 tokens a step, 2 a data shard
    model = model_from("1b", layers=4, batch=2, seq=4)
    row = step_row(unit, model, {"data": 4, "model": 2},
                   {"data": slow, "model": fast})
    assert row.repeats == 2  # 4 blocks, 2 per unit
    # the second unit also sums its input's gradient over model (Megatron's
    # f): [2 tokens, 2048] in bfloat16, an all-reduce over 2 devices
    joined = 2 * (2 - 1) / 2 * 2 * 2048 * 2
    assert row.collectives == {"all-reduce": 7}
    assert row.sent_by_axes == {"data": pytest.approx(2 * (2e6 + 4)),
                                "model": pytest.approx(2 * 4e6 + joined)}
    want = 2 * ((10e-6 + 2e6 / 10e9) + (1e-6 + 4e6 / 100e9) + (10e-6 + 4 / 10e9))
    assert row.comm_s == pytest.approx(want + 1e-6 + joined / 100e9)
    # bfloat16 weights and gradients, float32 master weights and moments
    assert (row.params, row.states, row.temp) == (1000.0, 1000 / 2 * 16, 200.0)
    assert row.compute_s is None and row.mfu is None  # no peak given


def test_step_time_hides_what_overlaps_and_waits_for_what_does_not():
    """DP x TP: the model axis's activation sums are waited for; the data
    axis's gradient sum hides behind the backward pass (2/3 of the FLOPs)
    until it outlasts it; the critical tokens are where the two are equal."""
    link = Profile("l", Link(alpha=0.0, busbw=1e9))
    model = model_from("1b", layers=2)  # one unit, no unit boundary
    unit = {"recipe": "dp_tp_mlp", "form": "shard_map", "axis": None,
            "dtype": "bfloat16", "flops": 3e9, "target": None,
            "ops": [{"kind": "all-reduce", "axes": ["data"], "bytes": 1e9,
                     "group": 4, "dtype": "bf16"},
                    {"kind": "all-reduce", "axes": ["model"], "bytes": 0.5e9,
                     "group": 2, "dtype": "bf16"}],
            "memory": {"params": 1000, "temp": 0}, "cost_model": None,
            "compile_s": 0.1}
    mesh = {"data": 4, "model": 2}
    for peak, hidden_left in ((1e9, 0.0), (6e9, 1.0 - 2 / 3 * 0.5)):
        row = step_row(unit, model, mesh, {"data": link, "model": link},
                       peak=peak)
        compute = 3e9 / peak
        assert row.compute_s == pytest.approx(compute)
        assert row.comm_s == pytest.approx(1.5)
        assert row.exposed_s == pytest.approx(0.5 + hidden_left)
        assert row.step_s == pytest.approx(compute + 0.5 + hidden_left)
        tokens = model.tokens / 8
        assert row.critical_tokens_per_device == pytest.approx(
            tokens * 1.0 / (2 / 3 * compute))
        assert row.mfu == pytest.approx(row.model_flops / (row.step_s * peak))


def test_fsdp_units_inside_the_model_gather_their_first_layer_again():
    """A compiled FSDP unit takes its input as data, so its first layer
    needs no re-gather; every unit after the model's first does (and its
    input gradient's FLOPs): the plan adds them."""
    link = Profile("l", Link(alpha=0.0, busbw=1e9))
    model = model_from("1b", layers=4, width=64, ffn=128, heads=8)  # two units
    unit = {"recipe": "fsdp_mlp", "form": "shard_map", "axis": None,
            "dtype": "bfloat16", "flops": 1e6, "target": None, "ops": [],
            "memory": {"params": 0, "temp": 0}, "cost_model": None,
            "compile_s": 0.1}
    row = step_row(unit, model, {"data": 8}, {"data": link}, peak=1e12)
    layer = (64 * 128 + 128) * 2 / 8  # the first layer's block, bfloat16
    assert row.collectives == {"all-gather": 1}
    assert row.sent == pytest.approx(7 * layer)
    assert row.flops == pytest.approx(2 * 1e6 + 2 * model.tokens / 8 * 64 * 128)


# -- the command, end to end -----------------------------------------------------


def test_plan_on_64_devices_matches_formulas_written_here(tmp_path):
    out = tmp_path / "plan.json"
    done = run_python(
        "-m", "collectives", "plan", "--devices", "64", "--model", "1b",
        "--width", "1024", "--ffn", "4096", "--heads", "8", "--interconnect",
        "model=nvlink-h100,data=ib-ndr", "--json", str(out), timeout=600)
    text = done.stdout
    for label in ("DP ", "FSDP ", "FSDP x TP", "PP ", "SP ring", "EP (MoE)"):
        assert label in text, text
    assert "DIFFERS" not in text and "holds" in text
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["mesh"] == {"data": 8, "model": 8}
    rows = {row["label"]: row for row in plan["rows"]}
    profiles = load_profiles()
    ib, nvlink = profiles["ib-ndr"], profiles["nvlink-h100"]
    n, w, f, layers, item = 64, 1024, 4096, 32, 2  # bfloat16
    block = 2 * w * f + f + w  # an MLP's weights and biases
    unit_params = 2 * block * item  # two blocks a unit
    units = layers / 2
    # DP: one all-reduce of a unit's gradients and loss over all 64 devices,
    # 16 units per step. Over both axes it runs in phases, as NCCL's
    # hierarchical all-reduce does: reduce-scatter and all-gather inside the
    # node over NVLink (2 (8-1)/8 of the gradients), the sum of the eighth
    # each GPU holds across the nodes over its own InfiniBand NIC, pipelined:
    # the slower phase's time, every phase's latency
    dp = rows["DP"]
    grads = 2 * (n - 1) / n * unit_params
    assert dp["params"] == pytest.approx(units * unit_params)
    assert dp["sent"] == pytest.approx(units * grads, rel=1e-4)
    count = dp["collectives"]["all-reduce"]
    inside = 2 * 7 / 8 * unit_params / nvlink.link.busbw
    across = 2 * 7 / 8 * unit_params / 8 / ib.link.busbw
    comm = count * (ib.link.alpha + nvlink.link.alpha) + units * max(inside, across)
    assert dp["comm_s"] == pytest.approx(comm, rel=1e-3)
    # a flat network would charge every byte at InfiniBand's bandwidth
    assert dp["comm_s"] < units * grads / ib.link.busbw / 4
    # its FLOPs: XLA's count of the compiled units is the model's 6NT (less
    # the first layer's input gradient) per device
    tokens = 2048 * 4096 / n
    assert dp["model_flops"] == pytest.approx((6 * layers * block - 2 * w * f) * tokens)
    assert dp["flops"] == pytest.approx(dp["model_flops"], rel=0.01)
    peak = nvlink.peak("bfloat16")
    assert dp["compute_s"] == pytest.approx(dp["flops"] / peak)
    # DP's gradient sum hides behind the backward pass (4N FLOPs a token)
    # until the tokens per device fall below comm x peak / 4N: peak / busbw
    # (2 x 2N bytes) and the latency's share
    assert dp["critical_tokens_per_device"] == pytest.approx(
        comm * peak / (4 * layers * block), rel=0.01)
    # memory: 16 bytes a parameter (mixed precision), and each layer's
    # pre-activation and output: t (4F + 4D) a unit
    assert dp["memory_bytes"] == pytest.approx(
        dp["params"] / item * 16 + units * tokens * (4 * f + 4 * w) * item)
    # FSDP: each device stores 1/64 of the parameters, and sends the
    # textbook's 3 (n-1)/n of them a step (gather, re-gather, reduce-scatter),
    # less the model's first layer's re-gather, which no program needs
    fsdp = rows["FSDP"]
    assert fsdp["params"] == pytest.approx(dp["params"] / n)
    whole = layers * block * item
    assert fsdp["sent"] == pytest.approx(
        (n - 1) / n * (3 * whole - (w * f + f) * item), rel=1e-5)
    # XLA:CPU of JAX 0.10 merges the re-gathers into the forward gathers;
    # 0.12's keeps them, as a GPU or TPU compiler does: its units send what
    # the target's do, less what the plan adds for the units inside the
    # model (their first layer's re-gather)
    if fsdp["program"] is not None:
        assert "where the target keeps 7 all-gather" in fsdp["program"]
        assert fsdp["cpu_sent"] < fsdp["sent"]
    else:
        assert fsdp["sent"] - fsdp["cpu_sent"] == pytest.approx(
            (units - 1) * (n - 1) / n * (w * f + f) * item, rel=1e-6)
    for key in ("compute_s", "comm_s", "step_s", "mfu",
                "critical_tokens_per_device", "memory_bytes"):
        assert all(key in row for row in rows.values()), key
    # XLA:CPU's collectives are synchronous, not the target's: no schedule
    assert all(row["schedule"] is None for row in rows.values())
    # DP x TP, Megatron on every block (W_in by columns, W_out by rows over
    # model, m = 8): one all-reduce of [t, D] after each block's W_out and
    # one of its input's gradient, the model's first block's excepted,
    # 2 L - 1 over model; the gradients' sum over data, one a unit
    tp = rows["DP x TP"]
    m, d = 8, 8
    t = 2048 * 4096 / d
    assert tp["collectives"]["all-reduce"] == (2 * layers - 1) + units
    assert tp["sent_by_axes"]["model"] == pytest.approx(
        (2 * layers - 1) * 2 * (m - 1) / m * t * w * item)
    assert tp["params"] == pytest.approx(layers * ((2 * w * f + f) / m + w) * item)
    assert tp["flops"] == pytest.approx(tp["model_flops"], rel=0.01)
    # pipeline: 8 stages on model, 32/8 blocks each (2F/D = 8 of its
    # [D, D] layers a block); its 8 replicas on data sum their stage's
    # gradients: the one all-reduce the plan adds
    pp = rows["PP"]
    stage = (layers / 8) * (2 * f / w) * (w * w + w) * item
    assert pp["axis"] == "model" and set(pp["sent_by_axes"]) == {"model", "data"}
    assert pp["params"] == pytest.approx(stage)
    assert pp["sent_by_axes"]["data"] == pytest.approx(2 * 7 / 8 * stage)
    assert "over data" in pp["added"] and "not compiled" in pp["added"]
    assert nvlink.link.busbw > ib.link.busbw


@pytest.mark.parametrize("argv,match", [
    (["--devices", "4096"], r"--devices: 4096; at most 2048"),
    (["--devices", "64", "--interconnect", "infiniband"],
     r"unknown profile 'infiniband'; known: dgx-h100, measured, nvlink-h100"),
    (["--devices", "64", "--interconnect", "data=ib-ndr"],
     r"names axes \['data'\], the mesh has \['data', 'model'\]"),
    (["--devices", "64", "-s", "zero3", "--interconnect", "ib-ndr"],
     r"--strategies: unknown 'zero3'; expected one of .*FSDP"),
    (["--mesh", "a=2,b=2,c=2", "--interconnect", "ib-ndr"], r"one or two named axes"),
    (["--devices", "64", "--versus-bench", "--interconnect", "ib-ndr"],
     r"--versus-bench: .*measured profile; drop --interconnect"),
])
def test_plan_errors_name_the_argument_and_the_fix(capsys, argv, match):
    assert _cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(match, err), err


def test_list_profiles_prints_each_source(capsys):
    assert _cli.main(["plan", "--list-profiles"]) == 0
    out = capsys.readouterr().out
    assert "measured:" in out
    for name, p in load_profiles().items():
        assert f"{name}: " in out and p.source[:30] in out




def test_a_topology_without_the_tpu_compiler_says_how_to_install_it(capsys):
    pytest.importorskip("jax")
    try:
        import libtpu  # noqa: F401
        pytest.skip("the TPU compiler is installed here")
    except ImportError:
        pass
    argv = ["plan", "--devices", "8", "--topology", "v5p:2x2x2", "--interconnect",
            "ib-ndr", "-s", "DP"]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--topology 'v5p:2x2x2'" in err, err
    assert "pip install 'jax[tpu,cuda12-local]'" in err, err


def test_a_topology_plan_reads_the_tpu_compilers_collectives(tmp_path):
    pytest.importorskip("libtpu", reason="needs pip install 'jax[tpu]' (no TPU)")
    out = tmp_path / "tpu.json"
    run_python("-m", "collectives", "plan", "--devices", "8", "--topology",
               "v5p:2x2x2", "--model", "laptop", "--interconnect", "tpu-v5p-ici",
               "--json", str(out), timeout=600)
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["compiler"].startswith("TPU compiler (libtpu ")
    assert "TPU v5p, topology v5p:2x2x2" in plan["compiler"]
    rows = {row["label"]: row for row in plan["rows"]}
    assert rows["PP"]["collectives"]["collective-permute"] > 0


def test_the_default_interconnect_is_a_cluster_of_dgx_h100_nodes():
    from collectives.plan._command import DATACENTER
    from collectives.plan._command import interconnect_for

    profiles = load_profiles()
    links = interconnect_for(DATACENTER, {"data": 256, "model": 8}, profiles)
    assert {a: p.name for a, p in links.items()} == {"data": "ib-ndr",
                                                      "model": "nvlink-h100"}
    one_node = interconnect_for(DATACENTER, {"data": 8}, profiles)
    assert one_node["data"].name == "nvlink-h100"
    across = interconnect_for(DATACENTER, {"data": 64}, profiles)
    assert across["data"].name == "ib-ndr"


@pytest.mark.parametrize("mesh,recipe", [({"data": 8}, "dp_mlp"),
                                         ({"data": 4, "model": 2}, "dp_tp_mlp")])
def test_the_activation_formula_meets_a_whole_step_compile(mesh, recipe):
    """A model of four layers is one unit: its compile is the whole step, and
    XLA's temporaries are the activations it keeps for the backward pass.
    (FSDP's recipe rematerializes each layer; XLA:CPU drops that barrier and
    keeps what DP keeps, so its temporaries are no check of FSDP's.)"""
    model = model_from("laptop", width=512)  # 4 layers, float32
    plan = plan_for(model, mesh, recipes=[recipe],
                        interconnect=load_profiles()["ib-ndr"])
    (row,) = plan.rows
    assert row.repeats == 1
    assert row.activations == pytest.approx(row.temp, rel=0.10)
    assert row.activations_remat < row.activations


def test_8b_fits_no_80_gb_device_with_data_parallelism():
    """Mixed precision keeps 16 bytes a parameter: 137 GB for 8.6B on every
    device under DP; the step's memory counts them with the activations."""
    from collectives.plan._plan import state_bytes_per_parameter
    from collectives.plan._report import fits

    model = MODELS["8b"]
    assert state_bytes_per_parameter("mixed", model.itemsize) == 16
    assert state_bytes_per_parameter("pure", model.itemsize) == 8
    plan = plan_for(model, {"data": 8, "model": 8}, recipes=["dp_mlp"],
                        interconnect=load_profiles()["ib-ndr"])
    (row,) = plan.rows
    assert row.states == pytest.approx(model.parameters * 16, rel=1e-3)
    assert row.memory_bytes > row.states > 80e9 and not fits(row, 80e9)


def test_crossovers_rank_whole_model_strategies_that_fit():
    from collectives.plan import Plan
    from collectives.plan import PlanRow
    from collectives.plan._report import crossovers

    def sweep_point(devices, dp_memory):
        rows = (PlanRow("DP", "dp_mlp", step_s=1.0, memory_bytes=dp_memory),
                PlanRow("FSDP", "fsdp_mlp", step_s=2.0, memory_bytes=1e9),
                PlanRow("SP ring", "ring_attention", step_s=0.1, scope="layer"))
        return Plan(model=MODELS["1b"], mesh={"data": devices // 2, "model": 2},
                    form="shard_map", interconnect={}, rows=rows, jax="x",
                    seconds=0.0)

    plans = [sweep_point(8, 90e9), sweep_point(64, 20e9)]
    lines = crossovers(plans, memory=80e9)
    assert lines[:2] == [
        "1b: from 8 devices the fastest step that fits: FSDP",
        "1b: crossover at 64 devices: DP takes over from FSDP"]
    assert "1b: DP fits in 80.0 GB per device from 64 devices" in lines
    assert not any("SP ring" in line for line in lines)
    # without a memory limit DP is the fastest everywhere
    assert crossovers(plans) == [
        "1b: from 8 devices the fastest step that fits: DP"]


def test_search_ranks_every_split_by_step_time_and_names_the_best(tmp_path):
    out = tmp_path / "search.json"
    done = run_python(
        "-m", "collectives", "plan", "--devices", "8", "--search", "--model",
        "laptop", "--interconnect", "ib-ndr", "--memory-per-device", "1",
        "-s", "DP", "FSDP x TP", "PP", "--json", str(out), timeout=600)
    lines = done.stdout.splitlines()
    ranked = [line.split() for line in lines if line[:4].strip().isdigit()]
    meshes = {" ".join(row[2:5]) for row in ranked if row[1] == "PP"}
    assert meshes == {"data=4 x model=2", "data=2 x model=4"}
    plans = json.loads(out.read_text())["plans"]
    steps = {(row["label"], tuple(p["mesh"].values())): row["step_s"]
             for p in plans for row in p["rows"] if not row["skipped"]}
    # each strategy on each split (DP, over every axis, plans alike on
    # each: listed once), fastest first
    assert {label for label, _ in steps} == {"DP", "FSDP x TP", "PP"}
    assert len(ranked) == len(steps) - 1
    best = min(steps, key=steps.get)
    assert ranked[0][1] == best[0].split()[0]
    assert lines[-1].startswith(f"laptop: best: {best[0]} on ")


def test_plan_help_names_every_flag(capsys):
    with pytest.raises(SystemExit) as done:
        _cli.main(["plan", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--precision", "--schedule", "--microbatches", "--search",
                 "--scaling-book", "--interconnect"):
        assert flag in out


@pytest.mark.parametrize("command", sorted(
    _cli.build_parser()._subparsers._group_actions[0].choices))
def test_every_commands_help_prints(capsys, command):
    """A literal percent sign in a help text breaks argparse's --help."""
    with pytest.raises(SystemExit) as done:
        _cli.main([command, "--help"])
    assert done.value.code == 0 and command in capsys.readouterr().out


def test_search_needs_one_device_count(capsys):
    assert _cli.main(["plan", "--devices", "16", "64", "--search"]) == 2
    assert "--search: give one --devices N" in capsys.readouterr().err


def test_the_books_threshold_counts_every_collective_as_overlapped():
    """FSDP x TP: the gathers do not grow with the tokens, the activation
    sums and the computation do; where the two meet."""
    from collectives.plan import PlanRow
    from collectives.plan._book import _all_overlapped
    from collectives.plan._book import book_profile

    row = PlanRow("FSDP x TP", "fsdp_tp_mlp", comm_s=3.0, serial_s=1.0,
                  compute_s=5.0, tokens_per_device=1000.0)
    # at t tokens: gathers 2, sums t / 1000, computation 5 t / 1000
    assert _all_overlapped(row) == pytest.approx(500.0)
    three = book_profile(3)
    assert three.link.busbw == pytest.approx(3 * 1.8e11)
    assert three.peak("bfloat16") == pytest.approx(4.59e14)


def test_the_books_gpu_chapter_on_the_default_profiles():
    # H100s: C / W inside a node (NVLink, 2200 tokens a GPU) and across
    # nodes (a node's eight NICs, 2475), for DP and FSDP, on the default
    # profiles with their latency left out and their buffers whole (as the
    # book counts)
    from collectives.plan._book import gpu_cases

    found = {case.name: case for case in gpu_cases()}
    assert [round(case.book) for case in found.values()] == [2200, 2475, 2475]
    peak = load_profiles()["nvlink-h100"].peak("bfloat16")
    for case in found.values():
        assert case.ratio == pytest.approx(1, rel=0.01), case
    # as sent: inside the node a ring of 8 sends 7/8 of the buffer (the
    # profile's 989.4 TFLOP/s beside the book's 990); across 256 nodes the
    # ring's 255/256 is within 1 % of the book
    node = found["DP, one H100 node"]
    assert node.compiled == pytest.approx(peak / 4.5e11 * 7 / 8, rel=0.01)
    assert found["DP, 2048 H100s"].compiled == pytest.approx(2475, rel=0.01)
    assert found["FSDP, 2048 H100s"].compiled == pytest.approx(2475, rel=0.01)


def test_fsdp_x_tp_meets_the_books_inequality_at_every_split():
    """The book's FSDP x TP bound (part 5): alpha / (M_X b Y) + alpha Y /
    (M_Y F) < 1 from the forward pass, M_X = 2, M_Y = 1, whole buffers:
    b = alpha / (2 Y (1 - alpha Y / F)); 1010 at Y = 2, 952 at 3, 1216 at 4.
    A whole step as sent: the activation sums twice (forward and backward)
    against three times the FLOPs, a ring's (Y - 1)/Y of each."""
    from collectives.plan._book import FSDP_WAYS
    from collectives.plan._book import ICI
    from collectives.plan._book import PEAK
    from collectives.plan._book import fsdp_tp_bounds

    alpha, ffn = PEAK / ICI, MODELS["llama2-13b"].ffn
    forward, step = fsdp_tp_bounds()
    for y, found in forward.items():
        term = alpha * y / ffn
        want = math.inf if term >= 1 else alpha / (2 * y * (1 - term))
        assert found == pytest.approx(want, rel=0.02), y
    for y, found in step.items():
        # the computation left to hide the gathers, 1 - term, within a
        # point (near Y = 8 the bound moves 7 times faster than that share)
        term = alpha * y / ffn * 2 * (y - 1) / (3 * y)
        gathers = (FSDP_WAYS - 1) / FSDP_WAYS
        assert alpha * gathers / (2 * y * found) == pytest.approx(1 - term,
                                                                  abs=0.01), y
    assert min(forward.values()) == pytest.approx(2 * alpha ** 2 / ffn, rel=0.05)
    # the forward pass binds: at every split it turns communication-bound
    # at more tokens than the whole step does
    assert all(forward[y] > step[y] for y in forward)


def test_plan_each_wants_a_list_of_interconnects():
    from collectives.plan import plan_each

    ib = load_profiles()["ib-ndr"]
    for bad in ([], ib, {"data": ib}):
        with pytest.raises(ValueError, match=r"interconnects: .*Fix: pass"):
            plan_each(MODELS["laptop"], {"data": 8}, interconnects=bad)


def test_a_whole_buffers_profile_leaves_the_ring_out():
    from collectives.plan._plan import collective_seconds

    ib = load_profiles()["ib-ndr"]
    book = dataclasses.replace(ib, whole_buffers=True)
    mesh, v = {"data": 8, "model": 4}, 1e9
    for kind, sent, whole in (("all-reduce", 2 * 7 / 8 * v, 2 * v),
                              ("all-gather", 7 / 8 * v, v),
                              ("collective-permute", v, v)):
        assert collective_seconds(kind, ["data"], sent, 1, mesh, {"data": ib}) == (
            pytest.approx(ib.link.alpha + sent / ib.link.busbw))
        assert collective_seconds(kind, ["data"], sent, 1, mesh,
                                  {"data": book}) == pytest.approx(
            ib.link.alpha + whole / ib.link.busbw)
    # in phases, each phase its whole buffer: over one network, 2 V + 2 V/4
    sent = 2 * 31 / 32 * v
    assert collective_seconds("all-reduce", ["data", "model"], sent, 1, mesh,
                              {"data": book, "model": book}) == pytest.approx(
        2 * ib.link.alpha + (2 * v + 2 * v / 4) / ib.link.busbw)
    # a file may say so; it reads back
    from collectives.plan._profiles import profile_from
    from collectives.plan._profiles import profile_json

    assert profile_from("b", profile_json(book), "here").whole_buffers
    with pytest.raises(ValueError, match=r"whole_buffers='yes'; expected true"):
        profile_from("b", profile_json(ib) | {"whole_buffers": "yes"}, "here")


def test_the_pipeline_bubble_is_in_the_step_and_1f1b_keeps_fewer_activations():
    """GPipe's scan computes on every tick: its FLOPs grow as (M + S - 1) / M
    (the model's own, and the stage's extras, do not change with M), so MFU
    is at most 1 - bubble; 1F1B keeps min(M, S) microbatches' activations
    where the scan keeps every tick's."""
    from collectives import bubble_fraction

    links = load_profiles()["ib-ndr"]
    mesh, stages = {"data": 2, "model": 4}, 4
    rows = {}
    for schedule, m in (("gpipe", 4), ("gpipe", 16), ("1f1b", 16)):
        (rows[schedule, m],) = plan_for(
            model_from("laptop", width=2048, ffn=2048), mesh,
            recipes=["pipeline_mlp"], interconnect=links,
            schedule=schedule, microbatches=m).rows
    for m in (4, 16):
        row = rows["gpipe", m]
        assert row.cost_model is None  # the recipe compiled with M microbatches
        assert row.mfu <= 1 - bubble_fraction(stages, m) + 1e-6
        assert f"{m} microbatches over {stages} stages" in row.note
    # (within 5 %: XLA drops what no stage uses, e.g. the forward of the
    # last ticks on the first stages)
    assert rows["gpipe", 4].flops / rows["gpipe", 16].flops == pytest.approx(
        (4 + stages - 1) / 4 / ((16 + stages - 1) / 16), rel=0.05)
    assert rows["gpipe", 16].mfu > rows["gpipe", 4].mfu
    assert rows["1f1b", 16].activations == pytest.approx(
        rows["gpipe", 16].activations * stages / (16 + stages - 1))
    assert rows["1f1b", 16].step_s == rows["gpipe", 16].step_s


def test_the_plot_is_drawn_for_both_columns_and_reads_in_each(tmp_path):
    # The docs' plan (three models, four device counts), drawn again from its
    # JSON: a row of two panels per model for a desktop's column, the panels
    # stacked for a phone's, each with its text >= 9 px on screen and the
    # one legend under the panels, over no line.
    pytest.importorskip("matplotlib")
    from pathlib import Path

    from collectives import _figure
    from collectives.plan._plan import Plan
    from collectives.plan._report import plot

    doc = json.loads((Path(__file__).parents[1] / "docs" / "_static"
                      / "plan_gpu.json").read_text())
    path = tmp_path / "plan.png"
    plot([Plan.from_json(p) for p in doc["plans"]], str(path), 80e9)
    for width, drawn in (("wide", path), ("narrow", tmp_path / "plan.narrow.png")):
        facts = _figure.read_record(drawn)
        assert facts["width_px"] <= _figure.COLUMN_PX[width]
        assert _figure.problems(facts, width) == [], width


def test_accumulating_microbatches_keeps_one_microbatchs_activations():
    from collectives.plan._plan import REMAT_COMPUTE
    from collectives.plan._plan import accumulated
    from collectives.plan._plan import fitting
    from collectives.plan._plan import max_accumulation

    model = model_from("laptop", batch=64)
    p = plan_for(model, {"data": 8}, interconnect=load_profiles()["ib-ndr"],
             recipes=["dp_mlp", "fsdp_mlp"])
    dp, fsdp = p.row("DP"), p.row("FSDP")
    assert max_accumulation(p, dp) == 64 // 8
    assert (dp.accumulation, dp.remat, fsdp.remat) == (1, False, True)
    # DP: one batch of activations split in 4; the gradients summed once,
    # the same computation: the step takes as long
    four = accumulated(p, dp, 4)
    assert four.memory_bytes == pytest.approx(dp.states + dp.activations / 4)
    assert (four.sent, four.step_s, four.accumulation) == (dp.sent, dp.step_s, 4)
    # rematerialized: each layer's one kept tensor, one more forward pass
    remat = accumulated(p, dp, 1, remat=True)
    assert remat.memory_bytes == pytest.approx(dp.states + dp.activations_remat)
    assert remat.compute_s == pytest.approx(dp.compute_s * REMAT_COMPUTE)
    # FSDP gathers its weights again for each microbatch; its own remat is
    # not paid twice
    again = accumulated(p, fsdp, 4, remat=True)
    gathered = sum(fsdp.gather_sent_by_axes.values())
    assert gathered > 0
    assert again.sent == pytest.approx(fsdp.sent + 3 * gathered)
    assert again.collectives["all-gather"] == 4 * fsdp.collectives["all-gather"]
    assert again.compute_s == pytest.approx(fsdp.compute_s)
    with pytest.raises(ValueError, match="accumulation: 16 microbatches for DP"):
        accumulated(p, dp, 16)
    # the fastest way that fits: 2 microbatches where half the activations
    # fit, as planned where everything does
    budget = dp.states + 0.6 * dp.activations
    chosen = fitting(p, dp, budget)
    assert chosen.memory_bytes <= budget and chosen.accumulation >= 2
    assert fitting(p, dp, dp.memory_bytes) is dp


def test_search_never_ranks_a_layout_that_does_not_fit_above_one_that_does():
    from collectives.plan._command import search_lines

    model = model_from("laptop", batch=64)
    p = plan_for(model, {"data": 4, "model": 2}, interconnect=load_profiles()["ib-ndr"],
             recipes=["dp_mlp", "fsdp_mlp", "dp_tp_mlp"])
    dp = p.row("DP")
    # DP's states alone do not fit; the others fit once accumulated
    budget = dp.states * 0.9
    lines = search_lines([p], budget)
    verdicts = [line.split()[-1] for line in lines if line[:4].strip().isdigit()]
    assert verdicts == sorted(verdicts, key=lambda v: v != "yes"), lines
    assert "yes" in verdicts and verdicts[-1] == "no"
    assert " microbatches" in "\n".join(lines[2:]), lines
    assert lines[-1].startswith("laptop*: best: ")


def test_a_collective_over_nodes_runs_in_phases_one_per_axis():
    from collectives.plan._plan import collective_seconds

    profiles = load_profiles()
    nvlink, ib = profiles["nvlink-h100"], profiles["ib-ndr"]
    mesh, links = {"data": 256, "model": 8}, {"data": ib, "model": nvlink}
    v = 1e9  # the gradients, summed over every GPU of 256 nodes
    sent = 2 * 2047 / 2048 * v
    # inside each node over NVLink (a reduce-scatter and a gather), then
    # across the nodes on an eighth of it, each GPU over its own NIC; the
    # phases pipelined: the slower one's time, every phase's latency
    inside = 2 * 7 / 8 * v / nvlink.link.busbw
    across = 2 * 255 / 256 * (v / 8) / ib.link.busbw
    assert collective_seconds("all-reduce", ["data", "model"], sent, 1, mesh,
                              links) == pytest.approx(
        max(inside, across) + ib.link.alpha + nvlink.link.alpha)
    # 8 times faster than charging every byte to InfiniBand
    flat = sent / ib.link.busbw
    assert flat / max(inside, across) == pytest.approx(8, rel=0.01)
    # one axis, or a kind that does not split: that link's (the slowest's)
    assert collective_seconds("all-reduce", ["model"], sent, 2, mesh, links) == (
        pytest.approx(2 * nvlink.link.alpha + sent / nvlink.link.busbw))
    assert collective_seconds("all-to-all", ["data", "model"], v, 1, mesh,
                              links) == pytest.approx(ib.link.alpha + v / ib.link.busbw)
    # both axes on one network (one profile, not a torus): the phases take
    # turns on its links, and their bandwidth terms add up to the flat
    # collective's, whichever axis is inside
    for shape in ({"data": 4, "model": 2}, {"data": 2, "model": 4}):
        one = {"data": ib, "model": ib}
        sent = 2 * 7 / 8 * v
        assert collective_seconds("all-reduce", ["data", "model"], sent, 1, shape,
                                  one) == pytest.approx(
            2 * ib.link.alpha + sent / ib.link.busbw)


def test_a_mesh_axis_over_several_torus_axes_uses_all_their_links():
    from collectives.plan._plan import torus_spans

    profiles = load_profiles()
    ici, ib = profiles["tpu-v5p-ici"], profiles["ib-ndr"]
    assert ici.torus == "v5p" and not ib.torus
    # 256 chips are a 4x8x8 torus: one mesh axis over all of it spans 3
    assert torus_spans({"data": 256}, {"data": ici}) == {"data": 3}
    # 2048 chips are 8x16x16: model=8 one torus axis, data=256 the other two
    assert torus_spans({"data": 256, "model": 8}, {"data": ici, "model": ici}) == {
        "data": 2, "model": 1}
    assert torus_spans({"data": 256}, {"data": ib}) == {"data": 1}
    p = plan_for(model_from("laptop", batch=256), {"data": 256}, interconnect=ici,
                 recipes=["fsdp_mlp"])
    link = p.interconnect["data"]
    assert link.name == "tpu-v5p-ici x3" and link.link.busbw == 3 * ici.link.busbw
