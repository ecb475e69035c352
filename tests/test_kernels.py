"""The kernel family as a whole: where it runs, what check says, no hang.

Each kernel's own file (tests/test_kernel_<name>.py) proves it against its
``lax`` collective; tests/test_kernel_bugs.py plants bugs in them.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _compat
from collectives import _kernels
from helpers import SLOW
from helpers import only_with_marker

KERNELS = [name for name, recipe in cx.RECIPES.items() if recipe.family == "kernel"]

needs_interpret = pytest.mark.skipif(
    not _compat.HAS_INTERPRET_KERNELS,
    reason=f"the kernels need JAX 0.10.2 or newer (this is {jax.__version__})")


def test_the_family_holds_the_kernels_after_the_other_families():
    assert "kernel_all_gather" in KERNELS
    families = [recipe.family for recipe in cx.RECIPES.values()]
    assert families[-len(KERNELS):] == ["kernel"] * len(KERNELS)


@pytest.mark.parametrize("name", KERNELS)
def test_a_kernel_has_no_pmap_form_and_says_why(name):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((8,), "i")
    assert "pmap" not in recipe.forms(mesh)
    x = recipe.example_args(mesh)
    with pytest.raises(NotImplementedError, match=r"only jax\.shard_map gives it"):
        recipe.pmap(*x, mesh=mesh)


@pytest.mark.parametrize("name", KERNELS)
def test_a_kernel_over_two_mesh_axes_is_refused_with_the_fix(name):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = recipe.example_args(mesh, "i")
    with pytest.raises(ValueError, match="axis=<one mesh axis name>"):
        recipe.shard_map(*x, mesh=mesh, axis=("i", "j"))


def test_check_skips_a_kernel_with_the_reason_where_this_jax_cannot_run_it(
        monkeypatch):
    monkeypatch.setattr(_compat, "HAS_INTERPRET_KERNELS", False)
    rows = cx.check(["kernel_all_gather"], configs=[((8,), ("i",), None)])
    assert [(row.ok, row.skipped) for row in rows] == [(True, True)]
    assert "needs JAX 0.10.2 or newer" in rows[0].detail


def test_check_family_kernel_checks_every_kernel(capsys):
    from collectives._cli import main
    main(["check", "--family", "kernel", "--mesh", "8"])
    out = capsys.readouterr().out
    for name in KERNELS:
        assert f"\n{name} " in out, out
    rows = [line for line in out.splitlines() if line.split(" ")[0] in KERNELS]
    assert len(rows) == len(KERNELS), out
    if _compat.HAS_INTERPRET_KERNELS:
        assert all(line.rstrip().endswith(" ok") for line in rows), out


@needs_interpret
def test_a_kernel_of_1_mib_a_device_finishes_under_check_without_pjrt_nproc(tmp_path):
    # A fresh process, as a user's: no PJRT_NPROC in its environment. With
    # XLA:CPU's default pool (the cores, at least the devices) interpret mode
    # hangs on 1 MiB a device; the CLI's use_cpu_devices gives it the threads.
    env = {key: value for key, value in os.environ.items()
           if key not in ("PJRT_NPROC", "JAX_NUM_CPU_DEVICES")}
    env["COLLECTIVES_KERNEL_TIMEOUT"] = "120"
    env.setdefault("JAX_PLATFORMS", "cpu")
    result = subprocess.run(
        [sys.executable, "-m", "collectives", "check", "kernel_all_gather", "--mesh",
         "8", "--dims", "256", "1024"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=240)
    assert "1 agree, 0 disagree" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
@needs_interpret
def test_a_check_with_one_thread_a_device_ends_by_its_kernel_timeout_or_agrees(
        tmp_path, request):
    # 8 XLA:CPU threads for 8 devices and 1 MiB a device. Whether every
    # thread ends up inside interpret mode's callbacks depends on the release
    # and on when the threads are scheduled: on JAX 0.10.2 each device's
    # _allocate_buffer callback waits for its value, which only a free thread
    # computes, and they all wait (3 of 3 runs, idle); on 0.12.0.1 the same
    # check agreed in 5 of 5 idle runs and starved under load. Either way the
    # check ends: agreeing, or stopped by its kernel timeout with status 1 and
    # one line, nothing more run on the starved devices (no hang, no
    # traceback, no abort in Python's exit: 134).
    only_with_marker(request, "slow", SLOW)
    env = {key: value for key, value in os.environ.items()
           if key != "JAX_NUM_CPU_DEVICES"}
    env.update(PJRT_NPROC="8", COLLECTIVES_KERNEL_TIMEOUT="10")
    env.setdefault("JAX_PLATFORMS", "cpu")
    result = subprocess.run(
        [sys.executable, "-m", "collectives", "check", "kernel_all_gather",
         "kernel_psum", "--mesh", "8", "--dims", "256", "1024"], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    if result.returncode == 0:
        assert "2 agree, 0 disagree" in result.stdout, result.stdout
        return
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("KernelTimeout: ") and "PJRT_NPROC" in last, last
    rows = [line for line in result.stdout.splitlines() if line.startswith("kernel_")]
    assert rows and rows[-1].endswith("FAIL (kernel: hang)"), result.stdout


def test_a_check_stops_where_a_stopped_kernel_still_holds_the_threads(monkeypatch):
    # The starved state made by hand: the first row's kernel is stopped and
    # its threads never return. Nothing more may run on the CPU devices (it
    # would wait forever): not the explicit form by itself, not the next row.
    from collectives import _check
    monkeypatch.setattr(_kernels, "_WEDGED", [])
    rows_run = []

    def starved(recipe, *args, **kwargs):
        rows_run.append(recipe.name)
        error = _kernels.KernelTimeout(f"{recipe.name}: still holds the threads")
        _kernels._WEDGED.append(error)
        raise error

    def must_not_run(*args, **kwargs):
        raise AssertionError("the explicit form ran on starved devices")

    monkeypatch.setattr(_check, "_agreement", starved)
    monkeypatch.setattr(_check, "_explicit_alone", must_not_run)
    seen = []
    with pytest.raises(_kernels.KernelTimeout, match="psum: still holds"):
        cx.check(["psum", "pmax"], configs=[((8,), ("i",), None)],
                 progress=seen.append)
    assert rows_run == ["psum"]
    assert [(row.recipe, row.ok) for row in seen] == [("psum", False)]
    assert seen[0].explicit == "-" or seen[0].explicit.startswith("skipped"), seen


def test_use_cpu_devices_leaves_a_pjrt_nproc_the_user_set(monkeypatch):
    monkeypatch.setenv("PJRT_NPROC", "3")
    _kernels.cpu_threads_for(8)
    assert os.environ["PJRT_NPROC"] == "3"
    monkeypatch.delenv("PJRT_NPROC")
    _kernels.cpu_threads_for(8)
    assert int(os.environ["PJRT_NPROC"]) >= 2 * 8


def test_a_bad_kernel_limit_names_the_variable(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_KERNEL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="COLLECTIVES_KERNEL_TIMEOUT='soon'"):
        _kernels.current_limit_s()


@needs_interpret
def test_a_kernel_inside_the_callers_jit_is_the_kernel_itself():
    # Bounded calls wrap the placed form; traced inside a caller's jit it is
    # the plain jitted function (no thread, no limit).
    recipe = cx.RECIPES["kernel_all_gather"]
    mesh = cx.make_mesh((8,), "i")
    (x,) = recipe.example_args(mesh, exact=True)
    axes = recipe.axes(mesh)
    (placed,) = recipe.place(x, axes=axes)
    fn = recipe.compiled("shard_map", axes)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(placed)), x)


def test_bench_says_why_it_does_not_time_a_kernel_in_interpret_mode():
    from collectives import bench

    doc = bench.run(["all_gather"], ["kernel"], sizes=(1024,), samples=1,
                    min_time=0.0)
    assert not [row for row in doc["results"] if row["form"] == "kernel"]
    (skip,) = [s for s in doc["skipped"] if s["form"] == "kernel"]
    assert "interpret mode" in skip["reason"] and "not timed" in skip["reason"]
    assert "check kernel_all_gather" in skip["reason"]
