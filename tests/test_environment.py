"""The variables JAX and XLA read as they start, refused in one line with
exit status 2 before ``python -m collectives`` imports JAX
(collectives._environment)."""

import os
import subprocess
import sys

import pytest

from collectives import _environment


def _command(tmp_path, *argv, **variables):
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # XLA is asked afresh
    for name in ("JAX_NUM_CPU_DEVICES", "JAX_ENABLE_X64", "XLA_FLAGS"):
        env.pop(name, None)
    env.update(variables)
    argv = argv or ("check", "psum", "--json", "rows.json")
    return subprocess.run([sys.executable, "-m", "collectives", *argv], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


REFUSED = [
    ("JAX_NUM_CPU_DEVICES", "abc", "not a number of devices"),
    ("JAX_NUM_CPU_DEVICES", "0", "not a number of devices"),
    ("JAX_NUM_CPU_DEVICES", "-4", "not a number of devices"),
    ("JAX_NUM_CPU_DEVICES", "8.5", "not a number of devices"),
    ("JAX_ENABLE_X64", "maybe", "neither true nor false"),
    ("JAX_ENABLE_X64", "2", "neither true nor false"),
    ("JAX_ENABLE_X64", "", "neither true nor false"),
    ("XLA_FLAGS", "xla_cpu_foo", "is not an XLA flag"),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=abc", "not a number"),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=0", "not a number"),
    ("XLA_FLAGS", "--xla_backend_optimization_level=0 ---x", "is not an XLA flag"),
    ("XLA_FLAGS", "--xla_bogus_flag", "XLA refuses it: Unknown flag"),
    ("XLA_FLAGS", "--xla_backend_optimization_level=0 --not_a_flag=1",
     "XLA refuses it: Unknown flag"),
]


@pytest.mark.parametrize("name,value,says", REFUSED)
def test_a_bad_variable_is_one_line_and_exit_2_before_any_work(
        name, value, says, tmp_path):
    done = _command(tmp_path, **{name: value})
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith("python -m collectives check: error: "), lines
    assert f"{name}={value!r}" in lines[0] and says in lines[0], lines
    assert "Fix:" in lines[0], lines
    assert done.stdout == "" and not (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("name,value", [
    ("JAX_NUM_CPU_DEVICES", "3"), ("JAX_ENABLE_X64", "TRUE"),
    ("JAX_ENABLE_X64", "off"),
    ("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                  "--xla_force_host_platform_device_count=2"),
])
def test_good_values_run_the_command(name, value, tmp_path):
    done = _command(tmp_path, "list", **{name: value})
    assert done.returncode == 0 and "psum" in done.stdout, done.stderr
    if name == "XLA_FLAGS":  # XLA's answer remembered: not asked again
        remembered = tmp_path / "cache" / "jax-collectives" / "accepted-xla-flags.json"
        assert value in remembered.read_text()


def test_every_problem_is_named_and_only_the_problems():
    assert _environment.problems({"JAX_NUM_CPU_DEVICES": "x", "JAX_ENABLE_X64": "1",
                                  "XLA_FLAGS": "bad"}, probe=False) == [
        _environment._whole_number("JAX_NUM_CPU_DEVICES", "x"),
        _environment._xla_flags("bad", probe=False)]
    assert _environment.problems({"JAX_NUM_CPU_DEVICES": " 16 ", "XLA_FLAGS": "",
                                  "JAX_ENABLE_X64": "No"}, probe=False) == []
    # JAX's own reading agrees on what is true and false
    from jax._src import config

    for value in _environment.TRUE + _environment.FALSE:
        os.environ["COLLECTIVES_TEST_TRUTH"] = value.upper()
        try:
            assert config.bool_env("COLLECTIVES_TEST_TRUTH", False) == (
                value in _environment.TRUE)
        finally:
            del os.environ["COLLECTIVES_TEST_TRUTH"]
