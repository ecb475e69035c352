"""Ctrl-C at any moment of ``python -m collectives``: one line, exit 130, no
output file, no temporary and no process left (collectives._interrupt)."""

import gc
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from collectives import _interrupt

# The moments, as the imports ``python -X importtime`` reports finished:
# jaxlib, numpy, JAX's binding to jaxlib (its gc callback), jax, every recipe
# registered (the command not yet parsed); then the first row of the
# command's table. (Before the package's first line runs, Python's own
# Ctrl-C is all there is.)
MOMENTS = ("jaxlib", "numpy", "jax._src.lib", "jax", "collectives._facts",
           "first row")


def _env():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return env


def _interrupt_at(moment, argv, cwd, timeout=120):
    """Start ``python -X importtime -m collectives *argv``, send SIGINT when
    ``moment`` is reached; (exit code, stdout, stderr without the import
    times)."""
    command = [sys.executable, "-X", "importtime", "-m", "collectives", *argv]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=cwd, env=_env()) as proc:
        streams = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
        deadline = time.monotonic() + timeout
        sent = False
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select(list(streams), [], [], 0.1)
            for fd in ready:
                streams[fd] += os.read(fd, 65536)
            out, err = streams[proc.stdout.fileno()], streams[proc.stderr.fileno()]
            reached = (b"\n" in out.strip() if moment == "first row" else
                       any(line.rsplit(b"|", 1)[-1].strip() == moment.encode()
                           for line in err.splitlines() if b"|" in line))
            if reached and not sent:
                proc.send_signal(signal.SIGINT)
                sent = True
        if proc.poll() is None:
            proc.kill()
            pytest.fail(f"still running {timeout} s after Ctrl-C at {moment}")
        out = streams[proc.stdout.fileno()] + proc.stdout.read()
        err = streams[proc.stderr.fileno()] + proc.stderr.read()
    assert sent, f"{moment} never reached:\n{err.decode()[-2000:]}"
    err_lines = [line for line in err.decode().splitlines()
                 if not line.startswith("import time:")]
    return proc.returncode, out.decode(), "\n".join(err_lines)


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_during_start_up_or_the_command_is_one_line_and_130(moment, tmp_path):
    argv = ["check", "psum", "pmean", "pmax", "pmin", "--json", "rows.json"]
    code, out, err = _interrupt_at(moment, argv, cwd=tmp_path)
    assert (code, err.strip()) == (130, "check: interrupted"), (moment, code, err)
    assert os.listdir(tmp_path) == [], "no rows.json, no temporary"
    if moment != "first row":
        assert out == "", out


def test_a_ctrl_c_inside_a_garbage_collection_callback_is_taken_after_it(capsys):
    # Python drops an exception a gc callback raises ("Exception ignored"),
    # and the command would run on to exit 0.
    armed, calls = [], []

    def callback(phase, info):
        if armed and phase == "start" and not calls:
            calls.append(phase)
            signal.raise_signal(signal.SIGINT)  # its handler runs in here
            sum(range(1000))

    gc.callbacks.append(callback)
    try:
        with pytest.raises(KeyboardInterrupt), _interrupt.during_command("test"):
            armed.append(True)
            gc.collect()
            for _ in range(200):  # taken here, a moment later
                time.sleep(0.01)
            pytest.fail("the Ctrl-C was lost")
    finally:
        gc.callbacks.remove(callback)
    assert calls == ["start"]
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is not _interrupt._during_command


def test_a_ctrl_c_inside_a_jax_host_callback_is_the_commands_not_the_computations():
    # Raised inside the callback, XLA would report a failed computation.
    def slow(x):
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.3)  # the handler runs in here, and declines
        return x

    f = jax.jit(lambda x: jax.pure_callback(
        slow, jax.ShapeDtypeStruct((), np.float32), x))
    with pytest.raises(KeyboardInterrupt), _interrupt.during_command("test"):
        f(jnp.float32(1)).block_until_ready()
        for _ in range(200):
            time.sleep(0.01)
        pytest.fail("the Ctrl-C was lost")


def test_a_ctrl_c_caught_on_the_way_still_ends_the_command():
    # JAX's plugin start-up has a bare ``except:``: the command would run on
    ran_on = []
    with pytest.raises(KeyboardInterrupt), _interrupt.during_command("test"):
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(1)
        except BaseException:  # as the bare except does
            pass
        ran_on.append(True)
    assert ran_on == [True]
    assert signal.getsignal(signal.SIGINT) is not _interrupt._during_command


HELD = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    import jax, jax.numpy as jnp, numpy as np
    from collectives import _interrupt

    def held(x):  # the main thread in a callback, never back in Python
        time.sleep(60)
        return x

    x = jnp.float32(1)
    f = jax.jit(lambda x: jax.pure_callback(
        held, jax.ShapeDtypeStruct((), np.float32), x)).lower(x).compile()
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    partial = Path("half.json.tmp")
    with _interrupt.during_command("held"), _interrupt.temporary(partial), \\
            _interrupt.on_hard_exit(child.kill):
        partial.write_text('{"half": ')
        print(child.pid, flush=True)
        f(x).block_until_ready()
""")


def test_a_ctrl_c_the_main_thread_cannot_take_ends_the_process_and_cleans_up(tmp_path):
    (tmp_path / "held.py").write_text(HELD)
    with subprocess.Popen([sys.executable, "held.py"], cwd=tmp_path, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        child = int(proc.stdout.readline())
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    assert (proc.returncode, err.strip()) == (130, "held: interrupted"), err
    assert took < _interrupt.GRACE_SECONDS + 20, took  # not the callback's 60 s
    assert os.listdir(tmp_path) == ["held.py"], "the temporary is removed"
    for _ in range(100):  # killed; reaped by init once its parent is gone
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the registered child {child} outlived the Ctrl-C")


@pytest.mark.parametrize("argv,as_command,name", [
    ("python -m collectives check psum", True, "check"),
    ("python -X importtime -m collectives --help", True, "collectives"),
    ("python -m collectives launch -n 2 -- check", True, "launch"),
    ("python -m pytest tests", False, "collectives"),
    ("python script.py -m collectives.bench", False, "collectives"),
])
def test_only_the_command_line_program_takes_ctrl_c_at_import(argv, as_command, name):
    # A program that imports the package keeps Python's own Ctrl-C.
    assert _interrupt.run_as_command(argv.split()) is as_command
    assert _interrupt.command_name(argv.split()) == name
