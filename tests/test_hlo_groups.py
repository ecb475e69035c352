"""The mesh axes of compiled collectives, on every supported JAX release.

``tests/data/hlo/jax-<version>.json`` holds, per release, the collective
lines that release compiles for a fixed set of programs (jit on Auto and
Explicit axes, shard_map's collectives) and the axes each program is known
to run its collectives over, from how it is written
(``tools/hlo_samples.py`` made them). Every line must read back as those
axes: the releases print the groups four ways (ids, iota, permute pairs, a
mesh whose axis names are XLA's own for jit on 0.10 to 0.11.1), and a
reader that trusted the printed names got those jit programs wrong.
"""

import functools
import json
import math
import re
from pathlib import Path

import pytest

import collectives as cx
from collectives._hlo_groups import parse_groups
from collectives._hlo_groups import spanned_axes
from collectives.hlo import parse_collectives
from collectives.plan import Link
from collectives.plan import Profile
from collectives.plan._plan import link_for
from helpers import ROOT
from helpers import load_matrix

SAMPLES = sorted((ROOT / "tests" / "data" / "hlo").glob("jax-*.json"))


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.stem))


@functools.cache
def _sample(path: Path) -> dict:
    return json.loads(path.read_text())


@functools.cache
def _mesh(shape: tuple[int, ...], names: tuple[str, ...]):
    return cx.make_mesh(shape, names)


def read_axes(line: str, mesh) -> tuple[str, ...]:
    """What ``Collective.mesh_axes`` says of one compiled line."""
    stats = parse_collectives(f"HloModule sample, num_partitions={mesh.size}\n{line}")
    (op,) = stats.ops
    return op.mesh_axes(mesh)


def old_parse_groups(attrs: str):
    """The reader before the mesh form was read as groups: it returned the
    names in the braces, which on JAX 0.10 and 0.11 (up to 0.11.1) are
    XLA's for jit programs, not the mesh's."""
    match = re.search(r"replica_groups=mesh\[([^\]]*)\][^{,]*\{([^}]*)\}", attrs)
    if match:
        return (), tuple(re.findall(r"'([^']+)'", match.group(2)))
    return parse_groups(attrs)


def old_read_axes(line: str, mesh) -> tuple[str, ...]:
    groups, names = old_parse_groups(line)
    return spanned_axes(groups, names, mesh.axis_names, mesh.devices.shape)


def mismatches(sample: dict, read=read_axes) -> list[str]:
    """Each program whose collectives do not all read as its known axes."""
    wrong = []
    for program in sample["programs"]:
        mesh = _mesh(tuple(program["mesh_shape"]), tuple(program["mesh_names"]))
        for line in program["collectives"]:
            got = read(line, mesh)
            if got != tuple(program["axes"]):
                wrong.append(f"{program['program']} on {program['mesh_shape']}: "
                             f"expected {program['axes']}, read {list(got)} "
                             f"from {line}")
    return wrong


def test_every_listed_release_has_its_samples():
    have = {_sample(path)["jax"] for path in SAMPLES}
    missing = [r for r in load_matrix().read_releases() if r not in have]
    assert not missing, (f"no tests/data/hlo/jax-<V>.json for {missing}. Fix: "
                         "python tools/hlo_samples.py --releases "
                         f"{' '.join(missing)} --uv $(which uv), and commit "
                         "the files")


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_collective_reads_as_the_axes_its_program_runs_over(path):
    sample = _sample(path)
    assert len(sample["programs"]) == 63
    for program in sample["programs"]:
        assert program["collectives"], f"{program['program']}: no collective"
        mesh = _mesh(tuple(program["mesh_shape"]), tuple(program["mesh_names"]))
        n = math.prod(mesh.shape[axis] for axis in program["axes"])
        for line in program["collectives"]:
            groups, _ = parse_groups(line)
            # a format the reader misses would read as "every device"
            assert groups or "replica_groups={}" in line, line
            (op,) = parse_collectives(f"HloModule m, num_partitions=8\n{line}").ops
            if op.kind != "collective-permute":
                assert op.group_size == n, line
    assert mismatches(sample) == []


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_wrong_expectation_is_caught(path):
    # every program's axes swapped for other axes: every line is reported
    sample = _sample(path)
    swap = {("data",): ["model"], ("model",): ["data", "model"],
            ("data", "model"): ["data"]}
    mutated = {"programs": [
        {**p, "axes": [] if len(p["mesh_names"]) == 1 else swap[tuple(p["axes"])]}
        for p in sample["programs"]]}
    assert len(mismatches(mutated)) == sum(
        len(p["collectives"]) for p in sample["programs"])


def test_the_name_reading_parser_fails_on_the_releases_that_print_xla_names():
    internal = {}  # release -> its lines the old reader gets wrong
    for path in SAMPLES:
        sample = _sample(path)
        prints_xla_names = any("'axis_0'" in line for p in sample["programs"]
                               for line in p["collectives"])
        wrong = mismatches(sample, read=old_read_axes)
        # shard_map prints ids, or the mesh's own names
        assert all(w.startswith("jit-") for w in wrong)
        if prints_xla_names:
            internal[sample["jax"]] = len(wrong)
        else:
            assert not wrong, wrong[0]
    assert {"0.10.0", "0.10.1", "0.10.2", "0.11.0", "0.11.1"} <= set(internal)
    assert all(internal.values()), internal


# -- the mesh form, written by hand ---------------------------------------------


@pytest.mark.parametrize("attrs,groups", [
    # no device order: row-major
    ("replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}",
     ((0, 2, 4, 6), (1, 3, 5, 7))),
    # an iota device order; the size-1 axis is no group axis
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], "
     "device_ids=([4,2]T(1,0)) {'axis_0'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) "
     "{'axis_1'}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    # an explicit device list, with or without its shape
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=(0,2,1,3) {'a'}",
     ((0, 1), (2, 3))),
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=([2,2]0,2,1,3) {'b'}",
     ((0, 2), (1, 3))),
    # the user's names (JAX 0.12), both axes, a size-1 axis in the braces
    ("replica_groups=mesh['X'=4,'Y'=2] {'X','Y'}", (tuple(range(8)),)),
    ("replica_groups=mesh['X'=8,'Y'=1] {'Y'}", tuple((k,) for k in range(8))),
    # no axes: groups of one device
    ("replica_groups=mesh['X'=4,'Y'=2] {}", tuple((k,) for k in range(8))),
    # sub-axes: X=8 as 2 x 2 x 2, the middle one, then the first and last
    ("replica_groups=mesh['X'=8] {'X':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("replica_groups=mesh['X'=8] {'X':(1)2,'X':(4)2}",
     ((0, 1, 4, 5), (2, 3, 6, 7))),
    # unquoted names
    ("replica_groups=mesh[i=2,j=4] {j}", ((0, 1, 2, 3), (4, 5, 6, 7))),
])
def test_the_mesh_form_is_read_as_groups(attrs, groups):
    assert parse_groups(attrs + ", to_apply=%add") == (groups, ())


@pytest.mark.parametrize("attrs,match", [
    ("replica_groups=mesh['a'=2,'b'=4] {'c'}", "'c' is not one of"),
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=(0,1,1,3) {'a'}",
     "permutation of 0..3"),
])
def test_a_mesh_form_that_is_no_mesh_is_named(attrs, match):
    with pytest.raises(ValueError, match=match):
        parse_groups(attrs)


def test_the_printed_names_are_not_read_as_the_mesh_names():
    # XLA's axis_0 of a 2 x 1 x 4 mesh is the (4, 2) mesh's second axis
    line = ("%ar = f32[4]{0} all-reduce(f32[4]{0} %p), channel_id=1, "
            "replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], "
            "device_ids=([4,2]T(1,0)) {'axis_0'}, use_global_device_ids=true, "
            "to_apply=%add")
    assert read_axes(line, _mesh((4, 2), ("axis_0", "axis_1"))) == ("axis_1",)
    assert read_axes(line, _mesh((4, 2), ("data", "model"))) == ("model",)


# -- the plan's link per collective ---------------------------------------------

FAST = Profile("fast", Link(alpha=1e-6, busbw=400e9))
SLOW = Profile("slow", Link(alpha=20e-6, busbw=50e9))
LINKS = {"data": FAST, "model": SLOW}  # data fast: the slowest would be wrong


@pytest.mark.parametrize("path", [p for p in SAMPLES if _version(p) >= (0, 10)],
                         ids=lambda p: p.stem)
def test_the_plan_charges_a_jit_collective_over_data_the_data_link(path):
    for program in _sample(path)["programs"]:
        if program["program"].startswith("jit-") and program["axes"] == ["data"] \
                and len(program["mesh_names"]) == 2:
            mesh = _mesh(tuple(program["mesh_shape"]), tuple(program["mesh_names"]))
            for line in program["collectives"]:
                assert link_for(read_axes(line, mesh), LINKS) is FAST, line
                if "'axis_0'" in line:  # the name-reading parser charged model's
                    old = link_for(old_read_axes(line, mesh), LINKS)
                    assert old.seconds("all-reduce", 1e9) == SLOW.seconds(
                        "all-reduce", 1e9), line


@pytest.mark.parametrize("shape", [(4, 2), (2, 4)])
def test_the_plan_charges_a_compiled_explicit_sum_over_data_the_data_link(shape):
    import jax
    import numpy as np
    from jax.sharding import AxisType
    from jax.sharding import NamedSharding

    mesh = jax.make_mesh(shape, ("data", "model"),
                         axis_types=(AxisType.Explicit, AxisType.Explicit))
    x = jax.ShapeDtypeStruct((16, 4), np.float32,
                             sharding=NamedSharding(mesh, jax.P("data")))
    text = jax.jit(lambda x: x.sum(0)).lower(x).compile().as_text()
    (op,) = parse_collectives(text).ops
    assert op.mesh_axes(mesh) == ("data",)
    assert link_for(op.mesh_axes(mesh), LINKS) is FAST


def test_a_mesh_of_reordered_devices_reads_the_same_axes():
    # the groups number partitions (the mesh's devices in row-major order),
    # not device ids, so a mesh in another device order reads the same
    import jax
    import numpy as np
    from jax.sharding import AxisType
    from jax.sharding import Mesh
    from jax.sharding import NamedSharding

    devices = np.array(jax.devices()[:8])[[3, 1, 7, 5, 0, 2, 6, 4]].reshape(4, 2)
    mesh = Mesh(devices, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    for axis in mesh.axis_names:
        x = jax.ShapeDtypeStruct((16, 4), np.float32,
                                 sharding=NamedSharding(mesh, jax.P(axis)))
        f = jax.jit(lambda x: x.sum(0), out_shardings=NamedSharding(mesh, jax.P()))
        (op,) = parse_collectives(f.lower(x).compile().as_text()).ops
        assert op.mesh_axes(mesh) == (axis,)
