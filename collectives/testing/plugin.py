"""pytest plugin: simulated CPU devices, mesh fixtures, a device-count marker.

Installed with the package and loaded automatically (entry point ``pytest11``
named ``collectives``; ``-p no:collectives`` turns it off). It changes
nothing unless asked:

* ``--cpu-devices N`` (or the ini setting ``cpu_devices = N``) simulates N
  CPU devices. It is applied before conftest files and test modules are
  imported, so before JAX can start its backends. Precedence: the command
  line, then ``$JAX_NUM_CPU_DEVICES``, then the ini setting. If something
  started JAX earlier with another count, the run stops with a usage error
  that says how to fix it. On a machine with a GPU or TPU the simulated CPU
  devices are then the ones tests see (``jax_platforms = "cpu"``), unless
  ``$JAX_PLATFORMS`` is set: ``JAX_PLATFORMS=cuda pytest ...`` runs on the
  accelerator instead.
* ``@pytest.mark.devices(n)`` skips a test, with a reason, when JAX has
  fewer than ``n`` devices.
* Fixtures ``mesh_1d`` (axis ``"i"``) and ``mesh_2d`` (axes ``"i", "j"``):
  meshes over the test's ``devices`` count, or over every device.
* The ini setting ``hypothesis_profile = ci`` registers the profiles ``ci``,
  ``deep`` and ``dev`` (see :func:`collectives.testing.register_profiles`)
  and loads that one, or the one ``$HYPOTHESIS_PROFILE`` names;
  ``--hypothesis-profile`` still wins. This part needs ``hypothesis``; the
  rest of the plugin needs only jax and pytest.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import pytest

from collectives import _compat
from collectives import _kernels
from collectives._devices import make_mesh
from collectives._devices import use_cpu_devices
from collectives.testing._profiles import register_profiles

ENV = "JAX_NUM_CPU_DEVICES"
_CONFIGURED = pytest.StashKey[tuple[int | None, str] | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("collectives", "JAX devices and meshes (collectives)")
    group.addoption(
        "--cpu-devices", type=int, default=None, metavar="N", dest="cpu_devices",
        help="simulate N CPU devices (before JAX starts); overrides "
             f"${ENV} and the cpu_devices ini setting")
    parser.addini("cpu_devices", type="string", default="",
                  help="simulate this many CPU devices (see --cpu-devices)")
    parser.addini("hypothesis_profile", type="string", default="",
                  help="register the collectives hypothesis profiles (ci, deep, "
                       "dev) and load this one unless $HYPOTHESIS_PROFILE names "
                       "another")


def _wanted_devices(config: pytest.Config) -> tuple[int | None, str] | None:
    """``(count, source)`` from the command line, the environment or the ini;
    count ``None`` when JAX reads ``$JAX_NUM_CPU_DEVICES`` itself."""
    option = getattr(config.known_args_namespace, "cpu_devices", None)
    if option is None:  # the plugin was loaded after the first parse
        option = config.getoption("cpu_devices", default=None)
    if option is not None:
        return _positive(option, "--cpu-devices"), "--cpu-devices"
    text = str(config.getini("cpu_devices")).strip()
    if not text:
        return None
    if os.environ.get(ENV):
        return None, f"${ENV}, over the ini setting"
    try:
        value = int(text)
    except ValueError:
        raise pytest.UsageError(
            f"ini setting cpu_devices = {text!r}: expected a whole number of "
            "devices, such as 8.") from None
    return _positive(value, "ini setting cpu_devices"), "ini cpu_devices"


def _positive(value: int, source: str) -> int:
    if value < 1:
        raise pytest.UsageError(f"{source} = {value}: expected at least 1 device.")
    return value


def _configure_devices(config: pytest.Config) -> None:
    if config.stash.get(_CONFIGURED, None) is not None:
        return
    wanted = _wanted_devices(config)
    if wanted is None:
        config.stash[_CONFIGURED] = None
        return
    count, source = wanted
    config.stash[_CONFIGURED] = wanted
    if count is None:  # JAX reads the count; the threads the kernels need, still
        if os.environ.get(ENV, "").strip().isdigit():
            _kernels.cpu_threads_for(int(os.environ[ENV]))
        return
    try:
        if not os.environ.get("JAX_PLATFORMS") and not _compat.backends_initialized():
            # Otherwise an accelerator would be the default backend and the
            # simulated devices unused: tests asking for 8 devices would see 1 GPU.
            jax.config.update("jax_platforms", "cpu")
        use_cpu_devices(count)
    except RuntimeError:
        have = len(jax.devices("cpu"))
        raise pytest.UsageError(
            f"{source} {count}: JAX's backends already started with {have} CPU "
            "device(s) before the collectives plugin could configure them, and the "
            "count cannot change afterwards. Something ran a JAX operation first: "
            "another plugin, a sitecustomize, or pytest.main() in a process that "
            f"already used JAX. Fix: set {ENV}={count} in the environment before "
            "Python starts, or find what starts JAX early.") from None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Before conftest files are imported: they may start JAX at import time.
    _configure_devices(early_config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "devices(n): skip the test unless JAX has at least n devices "
                   "(simulate them with --cpu-devices n)")
    _configure_devices(config)  # when the plugin was loaded late (conftest)
    profile = str(config.getini("hypothesis_profile")).strip()
    if profile:
        try:  # optional: the test extra
            import hypothesis  # noqa: F401
        except ImportError as err:
            raise pytest.UsageError(
                f"ini setting hypothesis_profile = {profile!r} needs hypothesis "
                f"({err}). Fix: pip install hypothesis (jax-collectives' 'test' "
                "extra; in a checkout: pip install '.[test]').") from None
        try:
            register_profiles(default=profile)
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None


def pytest_report_header(config: pytest.Config) -> str | None:
    wanted = config.stash.get(_CONFIGURED, None)
    if wanted is None:
        return None
    return (f"collectives: {jax.device_count()} {jax.default_backend()} device(s) "
            f"(from {wanted[1]})")


def _marked_devices(item: pytest.Item) -> int | None:
    marker = item.get_closest_marker("devices")
    if marker is None:
        return None
    args = marker.args
    if (len(args) != 1 or marker.kwargs or isinstance(args[0], bool)
            or not isinstance(args[0], int) or args[0] < 1):
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.devices{args!r}: expected one positive "
            "int, the number of devices the test needs, e.g. "
            "@pytest.mark.devices(8).")
    return args[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    needs = {item: _marked_devices(item) for item in items}
    if not any(needs.values()):
        return  # nothing asks: leave JAX alone
    have = jax.device_count()
    for item, need in needs.items():
        if need is not None and have < need:
            item.add_marker(pytest.mark.skip(reason=(
                f"needs {need} devices, JAX has {have} {jax.default_backend()} "
                f"device(s); simulate more with `pytest --cpu-devices {need}` or "
                f"`cpu_devices = {need}` in the pytest ini")))


def _count(request: pytest.FixtureRequest) -> int:
    return _marked_devices(request.node) or jax.device_count()


@pytest.fixture
def mesh_1d(request: pytest.FixtureRequest) -> Any:
    """A 1-D mesh, axis ``"i"``, over the ``devices`` mark's count (or all)."""
    return make_mesh((_count(request),), ("i",))


@pytest.fixture
def mesh_2d(request: pytest.FixtureRequest) -> Any:
    """A 2-D mesh ``(n // 2, 2)``, axes ``("i", "j")``, over the ``devices``
    mark's count (or all devices); skips unless that count is even and >= 4."""
    n = _count(request)
    if n < 4 or n % 2:
        pytest.skip(f"mesh_2d needs an even number of devices >= 4, got {n}; "
                    "simulate more with `pytest --cpu-devices 8`")
    return make_mesh((n // 2, 2), ("i", "j"))
