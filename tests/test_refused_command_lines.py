"""Bad command lines are refused before any work: exit code 2 and one line on
stderr that names the flag, the value and the fix; never a traceback, a
hang, a segfault or a silent wrong answer. Outputs are written whole or not
at all, and bench's ``#wrong`` counts every part of a value.

The commands run in this process (``_cli.main``): a refusal happens while the
command line is parsed, or right after the devices start, before any
compile.
"""

import argparse
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from collectives import _args
from collectives import _cli
from collectives import bench
from collectives.bench._cases import count_wrong
from collectives.distributed import _worker
from helpers import SLOW
from helpers import examples
from helpers import only_with_marker
from helpers import run_python

MISSING = "/nonexistent/dir/x.json"

REFUSED = {  # command line: words the one line must hold (flag, value, fix)
    "check psum --devices 100000": ["--devices", "'100000'", "1 to 2048"],
    "check psum --devices 2049": ["--devices", "'2049'", "XLA's CPU client"],
    "check psum --devices 0": ["--devices", "'0'", "Fix:"],
    "check psum --seed -1": ["--seed", "'-1'", "non-negative"],
    "check psum --dtype float99": ["--dtype", "'float99'", "float32"],
    # a 64-bit type JAX would compute as its 32-bit twin, labelled 64-bit
    "check psum --dtype complex128": ["--dtype complex128", "complex64", "--x64"],
    "check psum --dtype float32 float64": ["--dtype float64", "float32", "--x64"],
    "run psum --dtype int64": ["--dtype int64", "int32", "--x64"],
    "bench -d uint64": ["--dtype uint64", "uint32", "--x64"],
    "plan --dtype float99": ["--dtype", "'float99'", "Fix:"],
    "run psum --mesh 16": ["--mesh 16", "16 devices", "--devices 16"],
    "run psum --dtype float99": ["--dtype", "'float99'", "Fix:"],
    "worker --coordinator 127.0.0.1:notaport -- check": [
        "--coordinator", "'127.0.0.1:notaport'", "1 to 65535"],
    "worker --coordinator localhost -- check": ["--coordinator", "'localhost'",
                                                "HOST:PORT"],
    "worker --coordinator 127.0.0.1:99999 -- check": ["--coordinator", "99999",
                                                      "1 to 65535"],
    "worker --cpu-devices 0 -- check": ["--cpu-devices", "'0'", "Fix:"],
    "check psum --dims 100000 100000": ["--dims 100000 100000", "GiB", "Fix:"],
    "launch -n 100000 -- check": ["num_processes: 100000", "at most", "Fix:"],
    "bench -n 99999999999999": ["--iters", "'99999999999999'", "int32", "Fix:"],
    "bench -w 99999999": ["--warmup", "1,000,000", "Fix:"],
    "bench -r 10000000": ["--samples", "1,000,000", "Fix:"],
    "worker --coordinator 127.0.0.1:1234 --num-processes 2 --process-id 5 -- check": [
        "--process-id 5", "from 0 to 1", "Fix:"],
    "worker --process-id 5 --num-processes 2 -- check psum": [
        "--coordinator missing", "together", "Fix:"],
    "worker --coordinator 127.0.0.1:1234 -- check": [
        "--num-processes, --process-id missing", "Fix:"],
    "launch -n 2 -- python no_such_script.py": ["no script 'no_such_script.py'",
                                                "Fix:"],
    "worker -- python no_such_script.py --flag": ["no script", "Fix:"],
    "plan --mesh data=2,data=4": ["--mesh", "'data' is named twice", "Fix:"],
    "plan --mesh data=0": ["--mesh", "size 0", "Fix:"],
    f"check psum --json {MISSING}": ["--json", MISSING, "existing folder"],
    f"bench --json {MISSING}": ["--json", MISSING, "existing folder"],
    f"bench --csv {MISSING}": ["--csv", MISSING, "existing folder"],
    f"plan --json {MISSING}": ["--json", MISSING, "existing folder"],
    "check psum --json .": ["--json", "not a folder", "Fix:"],
    "bench -f nan": ["--stepfactor", "'nan'", "above 1"],
    "bench -f 1": ["--stepfactor", "'1'", "above 1"],
    "bench -n 0": ["--iters", "'0'", "a count from 1 to 2147483647"],
    "bench -r 0": ["--samples", "'0'", "a count from 1 to 1,000,000"],
    "bench -w -1": ["--warmup", "'-1'", "a count from 0 to 1,000,000"],
    "bench --budget inf": ["--budget", "'inf'", "0 or more"],
    "bench --precision 0": ["--precision", "'0'", "positive"],
    "bench -d float99": ["--dtype", "'float99'", "Fix:"],
    "launch -n 0 -- check": ["--num-processes", "'0'", "1 or more"],
    "launch --port 70000 -- check": ["--port", "'70000'", "65535"],
    "launch --timeout nan -- check": ["--timeout", "'nan'", "positive"],
    "launch --stall-timeout -1 -- check": ["--stall-timeout", "'-1'", "0 or more"],
    "worker --stall-timeout inf -- check": ["--stall-timeout", "'inf'", "0 or more"],
    "launch -- check --seed -1": ["--seed", "'-1'", "non-negative"],
}


def _one_line_refusal(capsys, argv):
    try:
        code = _cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work (and any process start) recorded and refused."""
    started = []

    def work(name):
        def refuse(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} started before the refusal")
        return refuse
    for owner, name in ((_cli, "print_run"), (_cli, "print_check"),
                        (_cli, "plan_main"), (bench, "main"), (_worker, "main"),
                        (subprocess, "Popen")):
        monkeypatch.setattr(owner, name, work(f"{owner.__name__}.{name}"))
    return started


@pytest.mark.parametrize("command", list(REFUSED))
def test_a_bad_command_line_is_refused_in_one_line_before_any_work(
        capsys, no_work, command):
    code, out, err = _one_line_refusal(capsys, command.split())
    assert code == 2 and not no_work, (command, out, err, no_work)
    assert len(err.strip().splitlines()) == 1, err
    for words in REFUSED[command]:
        assert words in err, (command, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("argv,words", [
    (["bench", "--json", "b.json", "--csv", "b.json"], ["--json and --csv", "b.json"]),
    (["bench", "--json", "-", "--csv", "-"], ["--json and --csv", "'-'"]),
    (["bench", "--csv", "b.csv", "--json", "./b.csv"], ["--json and --csv"]),
    (["check", "psum", "--json", "out/"], ["--json", "'out/'", "not a folder"]),
    (["check", "psum", "--json", ""], ["--json", "not an empty one"]),
    (["bench", "--plot", "-"], ["--plot", "'-'", "plot.png"]),
    (["check", "psum", "--json", "/proc/collectives.json"],
     ["--json", "/proc", "files can be created"]),
])
def test_an_output_path_that_cannot_be_written_whole_is_refused_first(
        capsys, no_work, tmp_path, monkeypatch, argv, words):
    # two flags on one file (the second would overwrite the first), a
    # folder, an empty name, a picture to standard output, a folder where no
    # file can be created (procfs)
    monkeypatch.chdir(tmp_path)
    code, out, err = _one_line_refusal(capsys, argv)
    assert code == 2 and not no_work, (argv, out, err, no_work)
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (argv, err)
    assert not any(tmp_path.iterdir())


def test_json_to_standard_output_is_the_data_alone(capsys):
    # `--json -`: the JSON alone on standard output (the table on stderr),
    # so that it pipes into jq
    assert _cli.main(["check", "psum", "--mesh", "8", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert [row["recipe"] for row in rows] == ["psum"]
    assert "1 agree, 0 disagree" in err


def test_a_device_or_fifo_is_written_in_place_never_replaced(tmp_path, capsys):
    # a FIFO the test makes (and, where it may, a character device standing
    # for /dev/null: never the real one) gets the bytes; the node stays
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = __import__("threading").Thread(
        target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert _cli.main(["check", "psum", "--mesh", "8", "--json", str(fifo)]) == 0
    reader.join(timeout=60)
    assert json.loads(got[0])["rows"][0]["recipe"] == "psum"
    assert fifo.is_fifo()
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    assert _cli.main(["check", "psum", "--mesh", "8", "--json", str(null)]) == 0
    assert null.is_char_device() and not null.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "null"]
    capsys.readouterr()


def test_plot_without_matplotlib_is_refused_at_the_start(capsys, monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "matplotlib" else real(name, *args)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for argv in (["bench", "--plot", "b.png"], ["plan", "--plot", "p.png"]):
        code, _, err = _one_line_refusal(capsys, argv)
        assert code == 2 and "--plot" in err and "pip install matplotlib" in err, err


def test_ctrl_c_ends_a_command_in_one_line(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(_cli, "cmd_list", interrupted)
    code, _, err = _one_line_refusal(capsys, ["list"])
    assert code == 130 and err.strip() == "list: interrupted", err


# -- outputs are whole or absent -------------------------------------------------

def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('{"old": true}')

    def half_then_interrupt(temporary):
        temporary.write_text('{"new": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _args.write_atomic(path, half_then_interrupt)
    assert json.loads(path.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["rows.json"]
    _args.write_text_atomic(path, '{"new": 1}')
    assert json.loads(path.read_text()) == {"new": 1}
    assert os.listdir(tmp_path) == ["rows.json"]


def test_check_writes_its_json_whole(tmp_path, capsys):
    path = tmp_path / "check.json"
    assert _cli.main(["check", "psum", "--mesh", "8", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["recipe"] for row in rows] == ["psum"] and rows[0]["ok"]
    assert os.listdir(tmp_path) == ["check.json"]


# -- bench's #wrong ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["complex64", "float32"])
def test_wrong_counts_every_part_of_a_value(mesh, dtype):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    want = (np.arange(16) + (1j * np.arange(16) if "complex" in dtype else 0)
            ).astype(dtype)
    out = jax.device_put(want, NamedSharding(mesh, P("i")))
    assert count_wrong(out, want, rtol=1e-6, atol=0) == 0
    planted = want.copy()
    planted[3] += 1j if "complex" in dtype else 1  # a wrong imaginary part
    bad = jax.device_put(planted, NamedSharding(mesh, P("i")))
    assert count_wrong(bad, want, rtol=1e-6, atol=0) == 1


# -- a fuzz of the command line ----------------------------------------------------

FLAGS = {
    "check": ["--devices", "--seed", "--dtype", "--mesh", "--axis", "--json",
              "--exact"],
    "run": ["--devices", "--dtype", "--mesh", "--axis"],
    "bench": ["--devices", "-f", "-n", "-w", "-r", "-b", "-e", "-d", "--budget",
              "--precision", "--json", "--csv", "--forms", "-c"],
    "plan": ["--devices", "--mesh", "--model", "--dtype", "--json", "--timeout",
             "--interconnect", "-s", "--width", "--layers"],
    "worker": ["--coordinator", "--cpu-devices", "--num-processes", "--process-id",
               "--timeout", "--stall-timeout"],
    "launch": ["-n", "--devices-per-process", "--port", "--timeout",
               "--stall-timeout"],
}
JUNK = st.sampled_from(["-1", "0", "nan", "inf", "1e400", "", "x", "99999", "4x0",
                        "2049", "data=2,data=4", "127.0.0.1:", ":80", "float99",
                        MISSING, "--", "-", "=", "1.5", "abc:def", "\x00"])


def _parses(command, argv):
    parser = _cli.build_parser()
    try:
        parser.parse_args([command, *argv])
    except SystemExit as exit_:
        return exit_.code
    return 0


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(FLAGS)), data=st.data())
def test_fuzzed_command_lines_parse_or_are_refused_in_one_line(capsys, command,
                                                               data):
    words = data.draw(st.lists(st.one_of(st.sampled_from(FLAGS[command]), JUNK),
                               max_size=6))
    code = _parses(command, words)
    _, err = capsys.readouterr()
    assert code in (0, 2), (command, words, code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (command, words, err)
        assert "Traceback" not in err


# Whole commands, each in a fresh process as a user runs it: every command
# line that parses must run to the end (exit 0) or be refused in one line
# (exit 2), within a bound; never a traceback, a crash or a hang. Each starts
# from a small piece of work (one recipe, one size, a laptop model) that the
# drawn words extend or break.
WHOLE = {
    "check": (["check", "psum"], ["--devices", "--seed", "--dtype", "--mesh",
                                  "--axis", "--exact"]),
    "run": (["run", "all_gather"], ["--devices", "--dtype", "--mesh", "--axis"]),
    "bench": (["bench", "-c", "psum", "-b", "1K", "-e", "4K", "-n", "1", "-w", "0",
               "-r", "1", "--forms", "shard_map", "--no-memory"],
              ["--devices", "-f", "-n", "-w", "-r", "-d", "--precision"]),
    "plan": (["plan", "--model", "laptop", "-s", "dp"], ["--devices", "--dtype"]),
    # (no --num-processes: a rank told to wait for peers that never come
    # waits --startup-timeout, tested in test_clusters)
    "worker": (["worker"], ["--coordinator", "--cpu-devices", "--process-id",
                            "--timeout", "--stall-timeout"]),
}
VALUES = st.sampled_from(["1", "2", "4", "8", "0", "-1", "nan", "2049", "x", "",
                          "4x2", "8", "i", "float32", "int32", "float99",
                          "127.0.0.1:1", "1.5", "--"])


# What else a user's shell hands a command: the variables JAX and XLA read
# as they start (good and bad values), an output that is not a plain new file
# (standard output, a character device the test makes standing for
# /dev/null, a file in /proc, a folder, an existing file), and a Ctrl-C at
# a drawn moment.
ENVIRONMENT = st.sampled_from([
    {}, {"JAX_NUM_CPU_DEVICES": "4"}, {"JAX_NUM_CPU_DEVICES": "x"},
    {"JAX_NUM_CPU_DEVICES": "0"}, {"JAX_ENABLE_X64": "1"},
    {"JAX_ENABLE_X64": "perhaps"}, {"XLA_FLAGS": "--xla_no_such_flag"},
    {"XLA_FLAGS": "--xla_force_host_platform_device_count=x"},
    {"XLA_FLAGS": "-x"}, {"JAX_PLATFORMS": "cpu"}, {"JAX_PLATFORMS": "tpu"}])
OUTPUTS = st.sampled_from([None, "-", "device", "/proc/out.json", "folder/",
                           "existing.json", "new.json"])
INTERRUPT = st.one_of(st.none(), st.floats(0.05, 6.0))
WRITES = {"check": "--json", "bench": "--json", "plan": "--json"}


def _output(where, tmp_path):
    """The ``--json`` argument for ``where``, made in ``tmp_path``."""
    if where == "device":
        try:
            os.mknod(tmp_path / "null", 0o666 | __import__("stat").S_IFCHR,
                     os.makedev(1, 3))
        except PermissionError:
            return "-"
        return str(tmp_path / "null")
    if where == "existing.json":
        (tmp_path / where).write_text('{"old": true}')
    return where


def _run_interrupted(argv, cwd, env, after):
    """``python -m collectives *argv``, SIGINT ``after`` seconds in (if it
    still runs); (exit code, stdout, stderr)."""
    import signal
    import sys
    import time

    from helpers import rank_env

    full_env = {**rank_env(), **env}
    with subprocess.Popen([sys.executable, "-m", "collectives", *argv], cwd=cwd,
                          env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        if after is not None:
            time.sleep(after)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"{argv} {env}: still running after 180 s\n{err[-2000:]}")
    return proc.returncode, out, err


@pytest.mark.slow
@settings(max_examples=examples(8), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(WHOLE)), data=st.data())
def test_fuzzed_whole_commands_finish_or_are_refused_in_one_line(
        request, tmp_path_factory, command, data):
    if settings.get_current_profile_name() != "deep":  # (the deep run: always)
        only_with_marker(request, "slow", SLOW)
    tmp_path = tmp_path_factory.mktemp("fuzz")
    base, flags = WHOLE[command]
    words = data.draw(st.lists(st.one_of(st.sampled_from(flags), VALUES),
                               max_size=4))
    env = data.draw(ENVIRONMENT)
    where = data.draw(OUTPUTS) if command in WRITES else None
    after = data.draw(INTERRUPT)
    output = [] if where is None else [WRITES[command], _output(where, tmp_path)]
    argv = [*base, *output, *words] if command != "worker" else [
        *base, *words, "--", "check", "psum"]
    code, out, err = _run_interrupted(argv, tmp_path, env, after)
    why = (argv, env, after, code, out[-2000:], err[-2000:])
    assert code in (0, 2, 130), why
    assert "Traceback" not in err + out, why
    if code in (2, 130):
        assert len(err.strip().splitlines()) == 1, why
    if code != 0 and where == "existing.json":  # never half a file
        assert json.loads((tmp_path / where).read_text()) == {"old": True}, why
    if where == "device":
        assert (tmp_path / "null").is_char_device(), why
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert not leftovers, (why, leftovers)


def test_every_refusal_type_names_the_value_and_a_fix():
    for parse, bad in ((_args.devices, "0"), (_args.seed, "-1"),
                       (_args.dtype, "float99"), (_args.coordinator, "x"),
                       (_args.output_file, MISSING)):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"'{bad}'.*Fix:"):
            parse(bad)


@pytest.mark.parametrize("argv,close", [
    (["check", "psumm"], "Did you mean 'psum'?"),
    (["check", "psum", "fsdp"], "Did you mean 'fsdp_mlp'"),
    (["run", "pmaxx"], "Did you mean 'pmax' or 'pmean'?"),
    (["show", "ring_all_reduc"], "Did you mean 'ring_all_reduce'"),
    (["check", "zzz"], "Known recipes: all_gather"),
])
def test_a_near_miss_recipe_name_is_refused_with_the_closest_names(
        capsys, argv, close):
    # one line, exit 2, before the table's header (nothing on stdout)
    code = _cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and not out, (argv, out, err)
    assert len(err.strip().splitlines()) == 1 and close in err, err


def test_a_backend_this_machine_cannot_start_is_one_line_naming_jax_platforms():
    # JAX_PLATFORMS=gpu on a machine without one: 29-46 lines of JAX's
    # traceback before; one line naming the variable and the fix now
    import shutil

    if shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
        pytest.skip("this machine may have a GPU")
    result = run_python("-m", "collectives", "check", "psum",
                        env={"JAX_PLATFORMS": "gpu"}, check=False)
    assert result.returncode == 2 and not result.stdout, result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "JAX_PLATFORMS='gpu'" in result.stderr and "Fix:" in result.stderr
