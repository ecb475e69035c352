"""use_cpu_devices and make_mesh: Auto axes everywhere, clear errors."""

import subprocess
import sys
import textwrap

import jax
import pytest

import collectives as cx
from collectives import _compat


def test_make_mesh_gives_auto_axes_on_every_version():
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    assert dict(mesh.shape) == {"i": 4, "j": 2}
    assert mesh.axis_types == _compat.auto_axis_types(2)
    assert list(mesh.devices.flat) == jax.devices()[:8]


def test_make_mesh_accepts_scalars_for_1d():
    mesh = cx.make_mesh(4, "x")
    assert dict(mesh.shape) == {"x": 4}


def test_jax_make_mesh_default_axis_types_match_compat_flag():
    mesh = jax.make_mesh((8,), ("i",))
    explicit = mesh.axis_types == _compat.explicit_axis_types(1)
    assert explicit == _compat.MAKE_MESH_DEFAULTS_TO_EXPLICIT


def test_too_many_devices_says_how_to_get_more():
    with pytest.raises(ValueError) as info:
        cx.make_mesh((16,), ("i",))
    message = str(info.value)
    assert "needs 16 devices" in message and "only 8" in message
    assert "use_cpu_devices(16)" in message and "JAX_NUM_CPU_DEVICES=16" in message
    assert "before" in message


@pytest.mark.parametrize(
    ("shape", "names", "error", "words"),
    [
        ((4, 2), ("i",), ValueError, "2 sizes but 1 names"),
        ((2, 2), ("i", "i"), ValueError, "distinct"),
        ((0,), ("i",), ValueError, "at least 1"),
        ((2.0,), ("i",), TypeError, "must be a int"),
        ((2,), (3,), TypeError, "must be a str"),
        ((), (), ValueError, "at least one axis"),
    ],
)
def test_make_mesh_rejects_bad_arguments(shape, names, error, words):
    with pytest.raises(error, match=words):
        cx.make_mesh(shape, names)


def test_use_cpu_devices_is_a_no_op_with_the_same_count():
    cx.use_cpu_devices(8)
    assert jax.device_count() == 8


def test_use_cpu_devices_too_late_names_the_fix():
    with pytest.raises(RuntimeError) as info:
        cx.use_cpu_devices(4)
    message = str(info.value)
    assert "too late" in message and "8 CPU device" in message
    assert "right after `import jax`" in message and "JAX_NUM_CPU_DEVICES=4" in message


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), ("8", TypeError),
                                             (True, TypeError)])
def test_use_cpu_devices_validates_its_argument(value, error):
    with pytest.raises(error, match="use_cpu_devices"):
        cx.use_cpu_devices(value)


def test_use_cpu_devices_before_start_sets_the_count():
    script = textwrap.dedent("""
        import collectives as cx, jax
        cx.use_cpu_devices(3)
        print(len(jax.devices("cpu")))  # (a GPU machine's default is its GPU)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "3"
