"""collectives.bench: a tiny sweep end to end (no timing assertions), the
correctness check, the repetition loop's structure, memory, the JSON schema and
CSV. The statistics are tested on synthetic samples in test_bench_stats.py."""

import copy
import csv
import io
import json
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _figure
from collectives import bench
from collectives._cli import build_parser
from collectives._cli import main
from collectives._facts.ring_algorithms import RING_OF
from collectives.bench import _cases
from collectives.bench import _report
from collectives.bench._command import progress_stream
from collectives.bench._overhead import run_overhead
from collectives.bench._stats import Stopping
from collectives.bench._stats import median_interval
from collectives.bench._timing import Timing
from collectives.hlo import collective_stats
from helpers import run_python

FAST = dict(samples=2, warmup=0, iters=2, min_time=0.0, budget=0.0)


@pytest.fixture(scope="module")
def axes():
    return cx.RECIPES["psum"].axes(cx.make_mesh((8,), "i"))


SWEPT = (*_cases.DEFAULT_COLLECTIVES, "pmean", "all_gather_stacked")


@pytest.fixture(scope="module")
def sweep():
    return bench.run(SWEPT, sizes=(8,), memory=False, **FAST)


def test_cli_smoke_prints_the_table_and_valid_json_and_csv(tmp_path):
    out_json, out_csv = tmp_path / "bench.json", tmp_path / "bench.csv"
    result = run_python("-m", "collectives", "bench", "-c", "psum", "-b", "1K",
                        "-e", "16K", "-f", "4", "-r", "2", "-w", "0", "-n", "2",
                        "--forms", "pmap", "shard_map", "jit",
                        "--budget", "0", "--json", str(out_json), "--csv",
                        str(out_csv), "-q")
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "algbw(GB/s)" in line)
    for column in ("size", "count", "type", "form", "time(us)", "±95%",
                   "busbw(GB/s)", "busbw/copy", "args", "out", "temp", "#wrong"):
        assert column in header
    rows = [line.split() for line in lines
            if line and not line.startswith("#") and line.split()[0].isdigit()]
    # 3 sizes x (copy + pmap, shard_map, jit)
    forms = {row[3] for row in rows}
    assert forms == {"copy", "pmap", "shard_map", "jit"}
    assert len(rows) == 3 * len(forms)
    assert all(row[-1] == "0" for row in rows)  # #wrong
    assert {int(row[0]) for row in rows} == {1024, 4096, 16384}
    assert "# Out of bounds values : 0 OK" in result.stdout
    assert "# Cost model: time = alpha + beta * S * bus factor" in result.stdout
    doc = json.loads(out_json.read_text())
    assert bench.schema_errors(doc) == []
    assert len(doc["results"]) == len(rows)
    assert {(f["collective"], f["form"]) for f in doc["fit"]} == {
        ("psum", form) for form in forms}
    records = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert len(records) == len(rows)
    assert {"time_us_low", "time_us_high", "memory_temp_bytes",
            "model_error"} <= set(records[0])
    assert "time_us_samples" not in records[0]


PROGRESS = re.compile(r"# (\d+)/6 rows \| psum (1K|4K) \| \d+:\d\d elapsed, "
                      r"(about \d+:\d\d left|time left unknown)")


def test_progress_line_goes_to_stderr_only_and_counts_the_rows(capsys):
    argv = ["bench", "-c", "psum", "-b", "1K", "-e", "4K", "-f", "4", "--forms",
            "shard_map", "jit", "-r", "2", "-w", "0", "-n", "2", "--budget", "0",
            "--no-memory"]
    assert main([*argv, "--progress"]) == 0  # forced: stderr is not a terminal
    out, err = capsys.readouterr()
    lines = err.splitlines()
    matches = [PROGRESS.fullmatch(line) for line in lines[:-1]]
    assert all(matches), lines
    # 2 sizes x (copy + shard_map + jit): one line as each size starts
    assert [(int(m[1]), m[2]) for m in matches] == [(0, "1K"), (3, "4K")]
    assert "about" in matches[1][3]  # estimated from the rows done
    assert re.fullmatch(r"# 6 rows in \d+:\d\d", lines[-1])
    assert "rows |" not in out and "rows in" not in out
    assert len([line for line in out.splitlines() if line.split()[0].isdigit()]) == 6
    assert main(argv) == 0  # not a terminal, not forced: nothing on stderr
    assert capsys.readouterr().err == ""


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_unless_quiet_and_can_be_forced(capsys):
    def stream(*flags, to):
        args = build_parser().parse_args(["bench", *flags])
        return progress_stream(args, to)

    terminal, log = Terminal(), io.StringIO()
    assert stream(to=terminal) is terminal
    assert stream("-q", to=terminal) is None
    assert stream(to=log) is None
    assert stream("--progress", to=log) is log
    with pytest.raises(SystemExit):
        stream("--progress", "-q", to=terminal)
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_default_sweep_times_each_program_once(axes):
    # The rings built from ppermute mirror a collective's facts, and were once
    # swept twice by default: as collectives and as that collective's ring form.
    assert set(bench.DEFAULT_COLLECTIVES).isdisjoint(RING_OF.values())
    programs = []
    for name in bench.DEFAULT_COLLECTIVES:
        for form in bench.BENCH_FORMS:
            case = _cases.plan(name, form, axes, 1024, "float32")
            if not isinstance(case, str):
                # the ring form is the ring recipe under shard_map
                programs.append((case.recipe.name,
                                 "shard_map" if form == "ring" else form))
    assert len(programs) == len(set(programs))
    assert ("ring_all_reduce", "shard_map") in programs


def test_one_device_runs_say_that_they_time_no_link():
    result = run_python("-m", "collectives", "bench", "--devices", "1", "-c",
                        "ppermute_ring", "-b", "64", "-e", "64", "-r", "2", "-w", "0",
                        "-n", "2", "--budget", "0", "--no-memory", "-q")
    assert "on 1 device every collective is the identity" in result.stdout
    # (nccl-tests' permute factor is 1 on any n; no link, no bus bandwidth)
    assert "busbw = algbw * 0 on 1 devices" in result.stdout
    assert "Use 2 or more devices" in result.stdout
    assert "# Out of bounds values : 0 OK" in result.stdout


def test_every_collective_and_form_is_right_on_every_device(sweep):
    rows = sweep["results"]
    assert bench.schema_errors(json.loads(json.dumps(sweep))) == []
    assert sweep["summary"]["wrong"] == 0
    assert all(row["wrong"] == 0 for row in rows)
    timed = {(r["collective"], r["form"]) for r in rows if r["form"] != "copy"}
    for name in SWEPT:
        ring = RING_OF.get(name) in cx.RECIPES
        expected = {"pmap", "shard_map", "jit"} | ({"ring"} if ring else set())
        assert {form for n, form in timed if n == name} == expected, name
    skipped = {(s["collective"], s["form"]) for s in sweep["skipped"]}
    assert ("all_to_all", "ring") in skipped
    assert (("psum", "ring") in skipped) == ("ring_all_reduce" not in cx.RECIPES)


@pytest.mark.parametrize(("name", "unit"), [
    ("psum", 4), ("all_gather", 8 * 4), ("psum_scatter", 8 * 4),
    ("all_to_all", 8 * 4), ("ppermute_ring", 4)])
def test_sizes_follow_the_nccl_tests_convention(sweep, axes, name, unit):
    # 8 bytes is below one element per device for the gathers and scatters:
    # the size rounds up to the smallest valid buffer, as nccl-tests does.
    rows = [r for r in sweep["results"] if r["collective"] == name]
    assert {r["size"] for r in rows} == {max(8, unit)}
    for row in rows:
        assert row["count"] * 4 == row["size"]
        assert row["busbw_gbps"] == pytest.approx(
            row["algbw_gbps"] * (1.0 if row["form"] == "copy"
                                 else cx.hlo.bus_factor(row["kind"], 8)))
    case = _cases.plan(name, "shard_map", axes, 4096, "float32")
    block = 4096 // (8 if name == "all_gather" else 1)  # bytes each device sends in
    assert (case.size, case.count) == (4096, 1024)
    assert int(np.prod(case.shape)) * 4 == 8 * block


# One collective before the loop and one inside it (the ring: two rounds of
# its ppermutes): XLA neither hoisted the collective out of the timed loop nor
# merged the repetitions, which would time nothing.
LOOPED = {
    "psum": {"all-reduce": 2}, "all_gather": {"all-gather": 2},
    "psum_scatter": {"reduce-scatter": 2}, "all_to_all": {"all-to-all": 2},
    "ppermute_ring": {"collective-permute": 2},
}
RING_PERMUTES = {"psum": 2 * 2 * 7, "all_gather": 2 * 7, "psum_scatter": 2 * 7}


@pytest.mark.parametrize("name", sorted(LOOPED))
def test_the_timed_loop_runs_the_collective_every_time_round(axes, name):
    for form in _cases.BENCH_FORMS:
        case = _cases.plan(name, form, axes, 1024, "float32")
        if isinstance(case, str):
            continue
        x = _cases.make_input(case.shape, "float32")
        (spec,) = case.recipe.in_specs(axes)
        fn = _cases._program(form, case.recipe, axes)
        if form == "pmap":
            args = (_cases.to_device_stacked(x, axes, spec), np.int32(3))
        else:
            args = (case.recipe.place(x, axes=axes)[0],
                    _cases._iters_array(axes.mesh, 3))
        expected = LOOPED[name]
        if form == "ring":
            expected = {"collective-permute": RING_PERMUTES[name]}
        elif form == "jit" and name == "psum_scatter":
            expected = {"all-reduce": 2}  # see test_hlo: CPU keeps the all-reduce
        if form == "jit" and name == "psum_scatter" and \
                jax.default_backend() != "cpu":
            continue
        assert collective_stats(fn, *args).nonzero() == expected, (name, form)


def test_the_check_counts_wrong_elements_on_every_device_copy(axes):
    case = _cases.plan("psum", "shard_map", axes, 64, "float32")
    x = _cases.make_input(case.shape, "float32")
    call, expected = _cases.bind(case, x)
    assert _cases.check(case, call, expected, x) == 0
    wrong = expected.copy()
    wrong[0, 1] += 1
    # psum's result is replicated: each of the 8 device copies disagrees once
    assert _cases.check(case, call, wrong, x) == 8
    pcase = _cases.plan("all_gather", "pmap", axes, 256, "float32")
    px = _cases.make_input(pcase.shape, "float32")
    pcall, pexpected = _cases.bind(pcase, px)
    assert _cases.check(pcase, pcall, pexpected, px) == 0
    pexpected = pexpected.copy()
    pexpected[3] += 1  # pmap's stacked layout: device 3's whole copy
    assert _cases.check(pcase, pcall, pexpected, px) == pexpected[3].size


def test_schema_checker_reports_each_problem(sweep):
    doc = copy.deepcopy(sweep)
    assert bench.schema_errors(doc) == []
    del doc["results"][0]["busbw_gbps"]
    doc["results"][1]["wrong"] = -1
    doc["results"][2]["form"] = "nccl"
    doc["results"][3]["time_us"] = "fast"
    doc["results"][4]["extra"] = 1
    doc["results"][5]["time_us_ci"] = [1.0]
    errors = bench.schema_errors(doc)
    assert any("$.results[0]: missing required key 'busbw_gbps'" in e for e in errors)
    assert any("$.results[1].wrong: -1 is below the minimum 0" in e for e in errors)
    assert any("$.results[2].form: 'nccl' is not one of" in e for e in errors)
    assert any("$.results[3].time_us: expected number" in e for e in errors)
    assert any("$.results[4]: unexpected key 'extra'" in e for e in errors)
    assert any("$.results[5].time_us_ci: 1 items, fewer than 2" in e for e in errors)
    assert len(errors) == 6


def test_plot_draws_a_png(sweep, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra")
    path = tmp_path / "busbw.png"
    _report.plot(sweep, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # drawn for a desktop's column and, beside it, a phone's; each legible
    # there (text >= 9 px on screen, no legend over a line)
    for width, drawn in (("wide", path), ("narrow", tmp_path / "busbw.narrow.png")):
        facts = _figure.read_record(drawn)
        assert facts["width_px"] <= _figure.COLUMN_PX[width]
        assert _figure.problems(facts, width) == []


def test_plot_without_matplotlib_says_how_to_get_it(sweep, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(RuntimeError,
                       match=r"pip install matplotlib \(jax-collectives' 'bench'"):
        _report.plot(sweep, str(tmp_path / "busbw.png"))


def test_overhead_ratios_are_reported_with_their_targets(axes):
    stopping = Stopping(budget=0.0, min_samples=3)
    rows = run_overhead(("psum", "all_to_all"), axes, size=256, dtype="float32",
                        stopping=stopping, min_time=0.0)
    assert [r["name"] for r in rows] == [
        "psum: recipe shard_map / bare shard_map", "psum: jit / recipe shard_map",
        "psum: pmap host input / pmap device input",
        "all_to_all: recipe shard_map / bare shard_map",
        "all_to_all: jit / recipe shard_map",
        "all_to_all: pmap host input / pmap device input"]
    assert [r["target"] for r in rows] == [1.03, 1.10, None, 1.03, None, None]
    row_schema = bench.SCHEMA["properties"]["overhead"]["items"]
    for row in rows:
        low, high = row["ratio_ci"]
        assert 0 < low <= row["ratio"] <= high and row["samples"] >= 3
        assert (row["verdict"] is None) == (row["target"] is None)
        assert bench.schema_errors(row, row_schema) == []


def test_two_runs_with_a_generous_target_give_the_same_verdicts(axes):
    # Real timings differ between the runs; the verdicts must not. A target far
    # above any plausible ratio, enough rounds that a few slow calls cannot
    # move the median's interval, and a seeded bootstrap make them reproducible.
    stopping = Stopping(precision=0.05, budget=0.2, min_samples=15)
    runs = [run_overhead(("psum",), axes, size=256, dtype="float32",
                         stopping=stopping, min_time=0.001, recipe_target=10.0,
                         jit_target=10.0) for _ in range(2)]
    verdicts = [[row["verdict"] for row in rows] for rows in runs]
    assert verdicts[0] == verdicts[1] == ["met", "met", None]


def test_overhead_cli_writes_valid_json(tmp_path, capsys):
    out_json = tmp_path / "overhead.json"
    assert main(["bench", "--overhead", "-c", "psum", "--overhead-size", "64",
                 "--min-time", "0", "-r", "3", "--budget", "0", "--json",
                 str(out_json), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "psum: recipe shard_map / bare shard_map" in printed
    assert "95 % interval" in printed and "verdict" in printed
    doc = json.loads(out_json.read_text())
    assert bench.schema_errors(doc) == []
    assert len(doc["overhead"]) == 3 and doc["overhead"][0]["samples"] >= 3
    assert doc["overhead"][0]["verdict"] in ("met", "not met", "inconclusive")


def test_sizes_and_statistics_helpers():
    assert bench.parse_size("2k") == 2048 and bench.parse_size("1G") == 1 << 30
    assert bench.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert bench.size_sweep(1024, 1024, 1) == [1024]
    with pytest.raises(ValueError, match="size: expected a positive number"):
        bench.parse_size("64Q")
    with pytest.raises(ValueError, match="-b 64 is larger than -e 8"):
        bench.size_sweep(64, 8, 2)
    timing = Timing(iters=4, samples=(1.0, 2.0, 3.0, 4.0, 100.0))
    assert timing.median == 3.0
    assert timing.interval.low <= 3.0 <= timing.interval.high
    assert timing.interval == median_interval(timing.samples)


def test_unknown_names_fail_clearly(capsys):
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        bench.run(("allreduce",), sizes=(8,), **FAST)
    with pytest.raises(ValueError, match="unknown form 'xla'"):
        bench.run(("psum",), ("xla",), sizes=(8,), **FAST)
    with pytest.raises(ValueError, match="--dtype: 'floaty' is not a dtype"):
        bench.run(("psum",), sizes=(8,), dtype="floaty", **FAST)
    assert main(["bench", "-c", "nope", "-q"]) == 2
    assert "error: --collectives: unknown collective 'nope'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--precision: expected a fraction above 0"):
        bench.run(("psum",), sizes=(8,), **{**FAST, "precision": 0})
    with pytest.raises(SystemExit) as refused:  # refused as it is parsed
        main(["bench", "-c", "psum", "--budget", "-1", "-q"])
    assert refused.value.code == 2
    assert "--budget: '-1': expected seconds, 0 or more" in capsys.readouterr().err



@pytest.mark.parametrize("sizes, error, message", [
    ([0], ValueError, r"sizes: 0 bytes is no buffer size\. Fix: e\.g\."),
    ([64, -8], ValueError, "sizes: -8 bytes is no buffer size"),
    ([1.5], TypeError, "sizes: 1.5 is not a whole number of bytes"),
    ([True], TypeError, "sizes: True is not a whole number"),
    (1024, TypeError, r"sizes=1024: expected a list of buffer sizes\. Fix: e\.g\."),
    ("1K", TypeError, "sizes='1K': expected a list"),
    ([], ValueError, r"sizes=\[\]: no buffer size\. Fix:"),
    ([10**15], ValueError, r"sizes: \S+ a device over 8 devices needs [\d,]+ GiB"),
])
def test_sizes_are_refused_before_any_work(sizes, error, message, capsys):
    with pytest.raises(error, match=message):
        bench.run(("psum",), ("jit",), sizes=sizes, out=sys.stdout, **FAST)
    assert capsys.readouterr().out == ""  # no heading, no row


def test_a_narrowed_dtype_is_refused_and_a_name_alone_is_one_name():
    if not jax.config.jax_enable_x64:
        with pytest.raises(ValueError, match=r"--dtype complex128: computed as "
                           r"complex64 while 64-bit types are off.*Fix: --x64"):
            bench.run(("psum",), ("jit",), sizes=(64,), dtype="complex128", **FAST)
    doc = bench.run("psum", "jit", sizes=(64,), **FAST)
    assert [(r["collective"], r["form"]) for r in doc["results"]] == [
        ("psum", "copy"), ("psum", "jit")]
    assert all(r["wrong"] == 0 for r in doc["results"])


def test_a_size_beyond_memory_is_refused_on_the_command_line(capsys):
    assert main(["bench", "-c", "psum", "-b", "4096G", "-e", "4096G", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "error: sizes: 4096G a device over 8 devices needs 65,536 GiB"), err


# Per device: psum's argument and output are the buffer S; all_gather's
# argument is S / 8 (S is the gathered output); the copy row has no program.
MEMORY = {"psum": (1, 1), "all_gather": (1 / 8, 1), "psum_scatter": (1, 1 / 8)}


def test_rows_carry_each_forms_memory_per_device():
    doc = bench.run(tuple(MEMORY), ("pmap", "jit"), sizes=(256,), **FAST)
    assert bench.schema_errors(doc) == []
    for row in doc["results"]:
        name = row["collective"]
        if row["form"] == "copy":
            assert row["memory"] is None
            continue
        memory = row["memory"]
        if memory is None:  # a backend without memory_analysis()
            continue
        arg, out = MEMORY[name]
        assert memory["argument_bytes"] == row["size"] * arg, row["form"]
        assert memory["output_bytes"] == row["size"] * out, row["form"]
        assert memory["temp_bytes"] >= 0


def test_memory_per_device_needs_a_jitted_callable():
    with pytest.raises(TypeError, match=r"fn: expected a jax.jit or jax.pmap"):
        bench.memory_per_device(lambda x: x, np.ones(4))


def test_the_schema_is_package_data_and_versioned():
    text = (Path(bench.__file__).parent / "schema.json").read_text()
    assert json.loads(text) == bench.SCHEMA
    assert bench.SCHEMA["$id"] == "collectives-bench/2"
    assert bench.SCHEMA["properties"]["schema"]["enum"] == ["collectives-bench/2"]
    # the JSON file spells out the HLO kinds and forms; they must be the package's
    row = bench.SCHEMA["properties"]["results"]["items"]["properties"]
    assert row["kind"]["enum"] == [*cx.hlo.KINDS, "copy"]
    assert row["form"]["enum"] == [*bench.BENCH_FORMS, "copy"]
    setup = (Path(__file__).parent.parent / "setup.cfg").read_text()
    assert "schema.json" in setup.split("[options.package_data]")[1].split("[")[0]


def test_every_default_overhead_recipe_compiles_to_its_bare_primitives_collectives(
        axes):
    # checked_calls raises an AssertionError where the recipe and the bare
    # primitive compile to other collectives (the ring recipes did, and the
    # documented `bench --overhead` crashed on them).
    from collectives.bench._overhead import OVERHEAD_COLLECTIVES
    from collectives.bench._overhead import checked_calls

    assert "psum" in OVERHEAD_COLLECTIVES
    assert "ring_all_reduce" not in OVERHEAD_COLLECTIVES
    for name in OVERHEAD_COLLECTIVES:
        assert len(checked_calls(name, axes, 256, "float32")) == 5, name
    with pytest.raises(ValueError, match=r"'ring_all_reduce' cannot be timed .*"
                                         r"--forms ring.*Fix: choose from .*psum"):
        run_overhead(("ring_all_reduce",), axes, size=256, dtype="float32",
                     stopping=Stopping(budget=0.0, min_samples=3),
                     min_time=0.0)


def test_the_recipe_form_is_called_as_the_bare_primitive_is(axes, monkeypatch):
    # With no mesh in context, every timed call reaches JAX as the bare
    # jax.jit(jax.shard_map(...)) does: no jax.set_mesh scope entered and left
    # around it. One changes JAX's context and the next dispatch pays for it
    # (axis_index's recipe / bare ratio was 1.07 to 1.10 with one per call).
    # Under a caller's mesh, or where the program reads the mesh from the
    # context (the explicit form), the scope is still entered.
    from collectives._compat import mesh_scope
    from collectives._compat import with_axis_types
    from collectives.bench._overhead import checked_calls

    scopes = []
    set_mesh = jax.set_mesh
    monkeypatch.setattr(jax, "set_mesh", lambda mesh: scopes.append(mesh) or
                        set_mesh(mesh))
    calls = checked_calls("axis_index", axes, 256, "float32")  # compiles them
    wrapped = calls["recipe shard_map"].func.__wrapped__  # the program it calls
    assert type(wrapped) is type(calls["bare shard_map"].func)  # jax.jit's
    for label, call in calls.items():
        scopes.clear()
        jax.block_until_ready(call())
        assert scopes == [], label
    recipe = cx.RECIPES["axis_index"]
    (x,) = recipe.place(np.zeros((8, 2), np.float32), axes=axes, form="explicit")
    recipe.compiled("explicit", axes)(x)
    assert len(scopes) == 1 and scopes[0].axis_types == x.sharding.mesh.axis_types
    scopes.clear()
    theirs = with_axis_types(cx.make_mesh((4, 2), ("X", "Y")), explicit=True)
    with mesh_scope(theirs):
        calls["recipe shard_map"]()
    assert scopes == [theirs, axes.mesh]
