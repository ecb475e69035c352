"""Multi-process runs: 2 processes x 4 devices against 1 process x 8, and faults.

Every test that starts processes is marked ``multiprocess`` (deselect with
``-m 'not multiprocess'``). Whatever happens, the launcher stops every process
it started; the fault tests check that nothing survives.
"""

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _cli
from collectives import _layout
from collectives import distributed
from collectives._registry import core_names
from collectives.distributed import _forms as _process_forms
from collectives.distributed import _launcher
from collectives.distributed._results import worker_argv
from helpers import SLOW
from helpers import only_with_marker
from helpers import run_python

CORE = (*core_names(), "dp_grads")
FORMS = ("pmap", "shard_map", "jit")
BOUND_SECONDS = 60  # the launcher must give up on a failed run within this


def _state(pid):
    """The /proc state letter of ``pid``, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _alive(pid):
    return _state(pid) not in (None, "Z")  # a zombie is dead, only unreaped


def _group_members(pgid):
    """Live processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _assert_nothing_left(pids, grace=5.0):
    # SIGKILL is sent before launch returns; on a loaded machine the kernel
    # may take a moment to finish the processes it killed.
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(
            _alive(pid) or _group_members(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        assert not _alive(pid), f"process {pid} outlived the launch"
        assert not _group_members(pid), f"process group {pid} outlived the launch"


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="orphan checks read /proc (Linux)")


# -- 2 x 4 against 1 x 8, bit for bit ----------------------------------------

def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one_process_bit_for_bit(request, tmp_path):
    only_with_marker(request, "slow", SLOW)
    out = run_python(
        "-m", "collectives", "launch", "-n", "2", "--devices-per-process", "4",
        "--", "check", *CORE, "--exact", "--save", str(tmp_path)).stdout
    assert re.search(r"^0 .* ok .*agree, 0 disagree", out, re.M), out
    assert re.search(r"^1 .* ok .*agree, 0 disagree", out, re.M), out
    saved = [dict(np.load(tmp_path / f"process-{i}.npz")) for i in range(2)]
    assert saved[0].keys() == saved[1].keys()
    for key in saved[0]:
        assert _same_bits(saved[0][key], saved[1][key]), f"processes differ: {key}"
    compared = set()
    for key in saved[0]:
        name, shape, axis, dtype = key.split(":")[:4]
        if (name, shape, axis, dtype) in compared:
            continue
        compared.add((name, shape, axis, dtype))
        recipe = cx.RECIPES[name]
        sizes = tuple(int(s) for s in shape.split("x"))
        mesh = cx.make_mesh(sizes, ("i", "j")[: len(sizes)])
        axes = tuple(axis.split(","))
        args = recipe.example_args(mesh, axes, dtype=dtype, exact=True)
        prefix = f"{name}:{shape}:{axis}:{dtype}"
        leaves = _leaves(args)
        for index, leaf in enumerate(leaves):
            assert _same_bits(leaf, saved[0][f"{prefix}:input:{index}"]), prefix
        want = _leaves(recipe.reference(*args, mesh=mesh, axis=axes))
        for form, run in recipe.forms(mesh=mesh, axis=axes).items():
            if form == "reference":
                continue
            one_process = _leaves(run(*args))
            for index, (single, oracle) in enumerate(zip(one_process, want,
                                                         strict=True)):
                two = saved[0][f"{prefix}:{form}:{index}"]
                assert _same_bits(two, single), (
                    f"{prefix} {form} output {index}: 2x4 {two} != 1x8 {single}")
                np.testing.assert_array_equal(two, oracle,
                                              err_msg=f"{prefix} {form} vs NumPy")
    # every core recipe ran on every standard mesh, in every form
    assert {c[0] for c in compared} == set(CORE)
    assert {c[1:3] for c in compared} >= {("8", "i"), ("4x2", "i,j"), ("4x2", "i"),
                                          ("4x2", "j")}
    for key in compared:
        for form in FORMS:
            assert f"{':'.join(key)}:{form}:0" in saved[0]


def _leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.mark.multiprocess
def test_run_target_prints_every_form_on_every_process():
    result = distributed.launch(["run", "psum_scatter", "--mesh", "2x2"],
                                num_processes=2, devices_per_process=2, echo="none")
    assert result.ok, result.report()
    outputs = [p.output for p in result.processes]
    for output in outputs:
        for form in ("pmap:", "shard_map:", "jit:", "reference:"):
            assert form in output
    # both processes print the same gathered results
    assert outputs[0].split("pmap:", 1)[1] == outputs[1].split("pmap:", 1)[1]


def test_pmap_copies_may_differ_in_the_last_bits_across_processes_but_no_more():
    # pmap's stacked view of a [2] output replicated over a 4x2 mesh: copies
    # differing by one rounding (gloo sums chunks of a buffer in different
    # orders) are one value; copies that differ more are reported.
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    spec = jax.sharding.PartitionSpec()
    value = np.array([109.100624, -3.5], np.float32)
    copies = np.broadcast_to(value, (4, 2, 2)).copy()
    copies[1, 1, 0] = np.nextafter(value[0], np.float32(200))
    aligned = _process_forms._align_copies(copies, mesh, spec, n_terms=8)
    np.testing.assert_array_equal(
        _layout.from_stacked(aligned, mesh, spec, lambda: "out"), value)
    copies[1, 1, 0] = value[0] + 1
    aligned = _process_forms._align_copies(copies, mesh, spec, n_terms=8)
    with pytest.raises(cx.ReplicationError, match="copies differ"):
        _layout.from_stacked(aligned, mesh, spec, lambda: "out")
    exact = np.broadcast_to(np.arange(2, dtype=np.int32), (4, 2, 2)).copy()
    exact[3, 0, 1] += 1
    with pytest.raises(cx.ReplicationError, match="copies differ"):
        _layout.from_stacked(_process_forms._align_copies(exact, mesh, spec, 8),
                             mesh, spec, lambda: "out")


# -- faults ------------------------------------------------------------------

FAULTY = textwrap.dedent("""
    import os, signal, subprocess, sys
    import jax
    from jax.experimental import multihost_utils

    mode, out = sys.argv[1], sys.argv[2]
    # A child in the worker's process group: it must not outlive the launch.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(out, f"child-{jax.process_index()}"), "w") as f:
        f.write(str(child.pid))
    multihost_utils.sync_global_devices("everyone is here")
    if jax.process_index() == 1:
        print("process 1 about to fail", flush=True)
        if mode == "raise":
            raise RuntimeError("boom in process 1")
        if mode == "exit":
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    # process 0 waits in a collective that process 1 never joins
    multihost_utils.sync_global_devices("process 1 never gets here")
""")


@needs_proc
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode,because", [
    ("raise", "RuntimeError: boom in process 1"),
    ("exit", "exited with code 3"),
])
def test_a_failing_worker_stops_the_launch(tmp_path, mode, because):
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    start = time.monotonic()
    result = distributed.launch(["python", str(script), mode, str(tmp_path)],
                                num_processes=2, devices_per_process=1, echo="none")
    assert time.monotonic() - start < BOUND_SECONDS
    assert not result.ok and result.returncode == 1
    assert result.culprit == 1
    assert result.message.startswith("launch failed: process 1 ")
    assert because in result.message
    culprit = result.failed[0]
    assert culprit.index == 1 and "process 1 about to fail" in culprit.output
    assert "process 1 about to fail" in result.report()
    children = [int((tmp_path / f"child-{i}").read_text()) for i in range(2)]
    _assert_nothing_left([p.pid for p in result.processes] + children)


def test_the_report_keeps_the_error_when_the_runtime_logs_after_it():
    # Under load, a failed process's runtime can log many lines after its
    # traceback (the coordination service closing its socket); the report's
    # window ends at the traceback, so the error and what the process printed
    # before it stay in view, and the noise is counted, not shown whole.
    traceback = ["Traceback (most recent call last):",
                 '  File "faulty.py", line 15, in <module>',
                 '    raise RuntimeError("boom in process 1")',
                 "RuntimeError: boom in process 1",
                 "note: a hint added with add_note"]
    noise = [f"E1202 15:04:{i:02d}.000000 123 coordination_service_agent.cc:"
             f"{i}] Socket closed" for i in range(30)]
    output = "\n".join(["process 1 about to fail", *traceback, *noise])
    failed = distributed.ProcessResult(index=1, pid=11, status="failed",
                                       returncode=1, seconds=1.0,
                                       summary="raised", output=output)
    stopped = distributed.ProcessResult(index=0, pid=10, status="stopped",
                                        returncode=1, seconds=1.0,
                                        summary="stopped", output="")
    result = distributed.LaunchResult(
        ok=False, returncode=1, message="launch failed: process 1 ...",
        processes=(stopped, failed), coordinator="127.0.0.1:1",
        devices_per_process=1, culprit=1)
    report = result.report(lines=20).splitlines()
    start = report.index("process 1 about to fail")
    assert report[start + 1:start + 6] == traceback
    assert report[start + 6] == "... 25 more lines after the traceback; the last 5:"
    assert report[start + 7:start + 12] == noise[-5:]
    assert report[-1] == "launch failed: process 1 ..."
    # Without a traceback, the window is the output's last lines.
    plain = dataclasses.replace(failed, output="\n".join(noise))
    assert plain.tail(3) == "\n".join(noise[-3:])
    # A window shorter than the traceback ends at its exception line.
    assert failed.tail(2).splitlines()[:2] == traceback[3:5]


@needs_proc
@pytest.mark.multiprocess
def test_a_killed_worker_stops_the_command_line_launcher(tmp_path):
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    start = time.monotonic()
    result = run_python("-m", "collectives", "launch", "-n", "2",
                        "--devices-per-process", "1", "--", "python", str(script),
                        "kill", str(tmp_path), check=False)
    assert time.monotonic() - start < BOUND_SECONDS
    assert result.returncode == 1, result.stdout + result.stderr
    assert "launch failed: process 1 " in result.stderr
    assert "was killed by signal SIGKILL" in result.stderr
    assert "process 1 about to fail" in result.stderr
    pids = [int(m) for m in re.findall(r"^[01] +(\d+) ", result.stderr, re.M)]
    assert len(pids) == 2, result.stderr
    children = [int((tmp_path / f"child-{i}").read_text()) for i in range(2)]
    _assert_nothing_left(pids + children)


@needs_proc
@pytest.mark.multiprocess
def test_a_missing_worker_fails_start_up_clearly(tmp_path):
    # Process 1 hangs before it can start (a stuck import, say).
    (tmp_path / "sitecustomize.py").write_text(
        "import os, time\n"
        "if os.environ.get('COLLECTIVES_PROCESS_ID') == '1':\n"
        "    time.sleep(600)\n")
    start = time.monotonic()
    result = distributed.launch(["check", "psum"], num_processes=2,
                                devices_per_process=1, startup_timeout=8,
                                env={"PYTHONPATH": str(tmp_path)}, echo="none")
    assert time.monotonic() - start < BOUND_SECONDS
    assert not result.ok
    assert "start-up timed out after 8 s" in result.message
    # (process 0 counts as never started too if the machine is slow to import)
    assert re.search(r"process\(es\) \[(0, )?1\] never started", result.message)
    assert result.processes[1].status == "not started"
    assert result.failed[0].status == "not started"
    _assert_nothing_left([p.pid for p in result.processes])


@needs_proc
@pytest.mark.multiprocess
def test_workers_end_when_the_launcher_is_killed(tmp_path):
    script = tmp_path / "long.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        import jax
        path = os.path.join(sys.argv[1], f"pid-{jax.process_index()}")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(600)
    """))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "collectives", "launch", "-n", "2",
         "--devices-per-process", "1", "--", "python", str(script), str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = []
    try:
        deadline = time.monotonic() + BOUND_SECONDS
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = [int(f.read_text()) for f in sorted(tmp_path.glob("pid-?"))]
        assert len(pids) == 2, "the workers did not start"
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        _assert_nothing_left(pids)
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.multiprocess
def test_a_port_taken_after_it_was_picked_is_picked_again(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        picks = [busy]
        pick = _launcher.free_port
        monkeypatch.setattr(_launcher, "free_port",
                            lambda: picks.pop() if picks else pick())
        result = distributed.launch(["python", "-c", "pass"], num_processes=2,
                                    devices_per_process=1, echo="none")
    assert result.ok, result.report()
    assert not picks and result.coordinator != f"127.0.0.1:{busy}"


def test_a_busy_port_is_refused_before_anything_starts():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(distributed.LaunchError, match=f"port {port} on 127.0.0.1 "
                           "is not free"):
            distributed.launch(["check"], port=port)
        args = _cli.build_parser().parse_args(
            ["launch", "--port", str(port), "--", "check"])
        assert args.func(args) == 2


@pytest.mark.parametrize("target,problem", [
    ([], "nothing to run"),
    (["--"], "nothing to run"),
    (["lint"], "unknown command 'lint'"),
    (["check", "psumm"], "no recipe named 'psumm'"),
    (["check", "--dtypes", "int32"], "unrecognized arguments: --dtypes"),
    (["run"], "the following arguments are required: name"),
])
def test_bad_targets_are_refused(target, problem):
    with pytest.raises(ValueError, match=problem):
        worker_argv(target)


def test_targets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    assert worker_argv(["--", "check", "psum"]) == ["check", "psum"]
    assert worker_argv(["python3.12", "x.py", "-v"]) == ["python", "x.py", "-v"]
    assert worker_argv([sys.executable, "-m", "m"]) == ["python", "-m", "m"]
    # a script that is not there is refused before any rank starts
    with pytest.raises(ValueError, match=r"no script 'y\.py' \(from .*Fix:"):
        worker_argv(["python", "y.py"])


@pytest.mark.parametrize("kwargs,problem", [
    (dict(num_processes=0), "num_processes: expected an int >= 1, got 0"),
    (dict(devices_per_process=1.5), "devices_per_process"),
    (dict(timeout=0), "timeout: expected a positive number"),
    (dict(echo="some"), "echo: expected"),
    (dict(port=70000), "port: expected an int from 1 to 65535"),
])
def test_bad_arguments_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        distributed.launch(["check"], **kwargs)


def test_the_worker_refuses_to_run_outside_a_launch_or_cluster():
    result = run_python("-m", "collectives", "worker", "--", "check", check=False)
    assert result.returncode == 2
    assert "no cluster found" in result.stderr
    assert "python -m collectives launch" in result.stderr


def test_launch_and_worker_share_one_definition_of_their_timeouts():
    import inspect

    from collectives.distributed._worker import WorkerOptions

    parser = _cli.build_parser()
    launch = parser.parse_args(["launch", "--", "check"])
    worker = parser.parse_args(["worker", "--", "check"])
    signature = inspect.signature(distributed.launch).parameters
    for name in ("startup_timeout", "heartbeat_timeout", "collective_timeout",
                 "timeout"):
        want = getattr(WorkerOptions(), name)
        assert getattr(launch, name) == getattr(worker, name) == want, name
        assert signature[name].default == want, name


@pytest.mark.multiprocess
def test_blocks_that_are_not_one_box_load_device_by_device():
    # FSDP x TP over ("i", "j") on 2 processes x 4 devices: process 0's devices
    # hold blocks (0:1), (1:2), (4:5), (5:6) of a length-8 parameter, which no
    # one slice covers; each device's block is loaded on its own.
    result = distributed.launch(
        ["check", "fsdp_tp_mlp", "--mesh", "4x2", "--axis", "i,j"],
        num_processes=2, devices_per_process=4, echo="none")
    assert result.ok, result.report()
    for process in result.processes:
        assert "1 agree, 0 disagree" in process.summary, process.output


def test_process_slice_names_the_way_out_for_blocks_that_are_not_one_box():
    # one process holding two separate blocks of a length-8 array, as a
    # device subset of a process would
    class Sharding:
        def addressable_devices_indices_map(self, shape):
            return {0: (slice(0, 1),), 1: (slice(4, 5),)}

    with pytest.raises(ValueError,
                       match=r"do not form one box.*make_array_from_callback"):
        distributed.process_slice(Sharding(), (8,))


class _Seen:
    """A worker as the launcher's verdict reads it: its index, pid, whether
    it failed, and the blame it recorded (rank, how) before it stopped."""

    def __init__(self, index, failed, blame):
        self.index, self._failed, self._blame = index, failed, blame
        self.proc = type("Proc", (), {"pid": 1000 + index})()

    def failed(self):
        return self._failed

    def blame(self):
        return self._blame


def test_a_ranks_own_verdict_beats_a_peers_guess_at_how_it_ended():
    # Rank 1 sat idle outside JAX; the verdict reached it and it stopped,
    # recording it. Under load rank 0 saw it end before the verdict did and
    # guessed it was killed. The launch names rank 1 with its own verdict.
    idle = "has been idle outside JAX for 15 s, at faults.py:12 (<module>)"
    launch = object.__new__(_launcher._Launch)
    launch.n = 2
    launch.workers = [
        _Seen(0, False, (1, "ended without reporting a result: it was killed")),
        _Seen(1, True, (1, idle))]
    culprit, message = launch._culprit()
    assert culprit.index == 1
    assert message == (f"launch failed: process 1 (pid 1001) {idle}; process(es) "
                       "[0] stopped because of it; the launcher stopped the rest.")
    # Without its own record, the peer's account stands.
    launch.workers[1] = _Seen(1, False, None)
    assert launch._culprit()[1].startswith(
        "launch failed: process 1 (pid 1001) ended without reporting a result")


class _Array:
    """Stands for a JAX array whose wait is C++: no Python frame of its own."""

    def __init__(self, lock):
        self.block_until_ready = lock.acquire  # a builtin method, as in JAX 0.10


def test_a_rank_waiting_in_a_method_call_counts_as_inside_jax():
    # out.block_until_ready() leaves the user's line as the innermost frame:
    # the call that line makes says it waits inside JAX
    import threading
    import time

    from collectives.distributed import _watch

    lock, seen = threading.Lock(), []
    out = _Array(lock)

    def look(thread):
        time.sleep(0.3)
        seen.append(_watch._where(thread))
        lock.release()

    for wait in (lambda: out.block_until_ready(),  # the line calls the method
                 lambda: lock.acquire()):  # another call: not a JAX wait
        lock.acquire()
        looker = threading.Thread(target=look, args=(threading.get_ident(),))
        looker.start()
        wait()
        looker.join()
        lock.release()
    (inside, place), (other, other_place) = seen
    assert inside and place.endswith("in .block_until_ready()"), place
    assert not other and "test_distributed.py" in other_place, other_place
