"""The pytest plugin, run the way users run it: pytest in a fresh process, in a
directory outside this repository, finding the plugin through its entry point."""

import os
import shutil
import subprocess
import sys
import textwrap
import types
from importlib import metadata

import pytest

from collectives.testing import plugin
from helpers import ROOT

EXAMPLE = ROOT / "examples" / "downstream" / "test_my_shard_map.py"

# Variables that would leak this run's configuration into the fresh process.
LEAKS = ("JAX_NUM_CPU_DEVICES", "HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS",
         "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "XLA_FLAGS")


def run_pytest(where, *args, env=None):
    """``python -m pytest *args`` in ``where``; the CompletedProcess."""
    full = {k: v for k, v in os.environ.items() if k not in LEAKS} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args],
        cwd=where, env=full, capture_output=True, text=True, timeout=300)


def output(result):
    return f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


@pytest.fixture
def downstream(tmp_path):
    """A user's project: the example test module and an ini, nothing else."""
    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    (tmp_path / "pytest.ini").write_text("[pytest]\nhypothesis_profile = ci\n")
    return tmp_path


def test_the_plugin_is_registered_as_an_entry_point():
    found = {ep.name: ep.value for ep in metadata.entry_points(group="pytest11")}
    assert found.get("collectives") == "collectives.testing.plugin", (
        "the pytest11 entry point is missing: reinstall the package "
        "(pip install -e .) so its metadata lists collectives.testing.plugin")


def test_downstream_example_passes_with_cpu_devices_8(downstream):
    # The dev profile (4 examples) keeps this quick; the suite itself runs the
    # example in process under the ci profile.
    result = run_pytest(downstream, "--cpu-devices", "8",
                        env={"HYPOTHESIS_PROFILE": "dev"})
    assert result.returncode == 0, output(result)
    assert "collectives: 8 cpu device(s) (from --cpu-devices)" in result.stdout
    assert "5 passed" in result.stdout, output(result)


def test_downstream_example_skips_what_needs_more_devices(downstream):
    result = run_pytest(downstream, "--cpu-devices", "2", "-k", "2d_mesh or wrong")
    assert result.returncode == 0, output(result)
    assert "2 skipped, 3 deselected" in result.stdout, output(result)
    assert ("test_my_shard_map.py:" in result.stdout
            and "needs 8 devices, JAX has 2 cpu device(s); simulate more with "
                "`pytest --cpu-devices 8`" in result.stdout), output(result)
    assert "needs 4 devices, JAX has 2 cpu device(s)" in result.stdout


def test_ini_settings_fixtures_and_profiles(tmp_path):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ncpu_devices = 4\nhypothesis_profile = ci\n")
    # A conftest that starts JAX at import: the devices must be set by then.
    (tmp_path / "conftest.py").write_text(
        "import jax\n\nSEEN_AT_IMPORT = jax.device_count()\n")
    (tmp_path / "test_plugin_use.py").write_text(textwrap.dedent("""
        import jax
        import pytest
        from hypothesis import settings

        import conftest


        def test_devices_were_set_before_conftest_import():
            assert conftest.SEEN_AT_IMPORT == jax.device_count() == 4


        def test_the_simulated_devices_are_the_platform():
            # (an accelerator would otherwise be the default backend; the
            # plugin leaves a $JAX_PLATFORMS the user set alone)
            assert jax.config.jax_platforms == "cpu"
            assert jax.default_backend() == "cpu"


        def test_environment_picks_the_profile():
            assert settings.get_current_profile_name() == "dev"
            assert settings.default.max_examples == 4


        def test_meshes(mesh_1d, mesh_2d):
            assert dict(mesh_1d.shape) == {"i": 4}
            assert dict(mesh_2d.shape) == {"i": 2, "j": 2}


        @pytest.mark.devices(2)
        def test_marked_mesh_uses_the_marked_count(mesh_1d):
            assert mesh_1d.size == 2


        @pytest.mark.devices(5)
        def test_needs_five():
            raise AssertionError("must be skipped")
    """))
    result = run_pytest(tmp_path, env={"HYPOTHESIS_PROFILE": "dev"})
    assert result.returncode == 0, output(result)
    assert "5 passed, 1 skipped" in result.stdout, output(result)
    assert "collectives: 4 cpu device(s) (from ini cpu_devices)" in result.stdout
    assert "needs 5 devices, JAX has 4 cpu device(s)" in result.stdout


def test_jax_started_too_early_is_a_usage_error(tmp_path):
    (tmp_path / "start_jax.py").write_text("import jax\n\njax.devices()\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = run_pytest(tmp_path, "-p", "start_jax", "--cpu-devices", "8",
                        env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output(result)
    assert ("--cpu-devices 8: JAX's backends already started with 1 CPU device(s) "
            "before the collectives plugin could configure them") in result.stderr
    assert "Fix: set JAX_NUM_CPU_DEVICES=8 in the environment" in result.stderr


def test_plugin_and_assertions_import_without_hypothesis():
    # The entry point loads the plugin wherever the package is installed, also
    # without the test extra: only the profiles and the strategies need it.
    script = ("import sys; sys.modules['hypothesis'] = None\n"
              "import collectives.testing.plugin, collectives.testing\n"
              "try:\n    import collectives.testing.strategies\n"
              "except ImportError:\n    print('strategies need hypothesis')\n")
    env = {k: v for k, v in os.environ.items() if k not in LEAKS}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, output(result)
    assert result.stdout.strip() == "strategies need hypothesis"


# -- where the device count comes from (in process) ---------------------------

def fake_config(option=None, ini=""):
    return types.SimpleNamespace(
        known_args_namespace=types.SimpleNamespace(cpu_devices=option),
        getoption=lambda name, default=None: default,
        getini=lambda name: {"cpu_devices": ini}[name])


@pytest.mark.parametrize(("option", "env", "ini", "want"), [
    (None, None, "", None),                                   # plugin stays inert
    (8, None, "4", (8, "--cpu-devices")),                     # command line wins
    (8, "3", "4", (8, "--cpu-devices")),
    (None, "3", "4", (None, "$JAX_NUM_CPU_DEVICES, over the ini setting")),
    (None, None, " 4 ", (4, "ini cpu_devices")),
    (None, "3", "", None),                                    # JAX reads it itself
])
def test_device_count_precedence(monkeypatch, option, env, ini, want):
    if env is None:
        monkeypatch.delenv(plugin.ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV, env)
    assert plugin._wanted_devices(fake_config(option, ini)) == want


@pytest.mark.parametrize(("option", "ini", "words"), [
    (0, "", "--cpu-devices = 0: expected at least 1 device"),
    (None, "eight", "cpu_devices = 'eight': expected a whole number"),
    (None, "-2", "ini setting cpu_devices = -2"),
])
def test_bad_device_counts_are_usage_errors(monkeypatch, option, ini, words):
    monkeypatch.delenv(plugin.ENV, raising=False)
    with pytest.raises(pytest.UsageError, match=words):
        plugin._wanted_devices(fake_config(option, ini))


def test_a_malformed_devices_marker_is_a_usage_error():
    item = types.SimpleNamespace(
        nodeid="test_x.py::test_y",
        get_closest_marker=lambda name: pytest.mark.devices("8").mark)
    with pytest.raises(pytest.UsageError, match=r"devices\('8',\): expected one "
                                                r"positive int"):
        plugin._marked_devices(item)
