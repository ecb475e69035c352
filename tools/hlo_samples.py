"""Compiled collectives of every JAX release, as test data for the group reader.

Run under one JAX release, this script compiles a fixed set of programs on 8
simulated CPU devices and writes ``tests/data/hlo/jax-<version>.json``: for
each program its mesh (shape and axis names), the instruction lines of the
collectives in the compiled HLO (metadata removed) and the mesh axes every
one of those collectives runs over. Those axes come from how the program is
written (a ``psum`` over ``data``, a ``sum`` of an array sharded over
``data``), never from reading the HLO, so ``tests/test_hlo_groups.py`` can
check ``collectives.hlo``'s reading of the lines against them. Only jax and
numpy are imported: the package itself is not needed. ::

    python tools/hlo_samples.py                  # this interpreter's JAX
    python tools/hlo_samples.py --releases all --uv PATH   # every listed release
    python tools/hlo_samples.py --releases 0.8.0 0.12.0.1 --uv PATH

With ``--releases`` (``all``: every release of ``tools/jax_releases.txt``)
it makes one venv at a time under ``--venv-root`` with that release's
``jax``, ``jaxlib`` and ``numpy`` (by uv, or by pip without ``--uv``), runs
itself there, and deletes the venv.

The programs, on the meshes ``(4, 2)`` and ``(2, 4)`` named
``("data", "model")`` with the collective over ``data``, ``model`` and both,
and on the mesh ``(8,)`` named ``("data",)``:

* ``jit-auto/sum``, ``jit-auto/gather``: ``jax.jit`` on Auto axes, an array
  sharded along its first dimension over the axes, summed over that
  dimension, or returned replicated (an all-reduce, an all-gather);
* ``jit-explicit/sum``, ``jit-explicit/gather``: the same on Explicit axes
  (``jnp.sum``, ``jax.sharding.reshard`` to replicated);
* ``shard_map/psum``, ``all_gather``, ``ppermute`` (a ring),
  ``psum_scatter``, ``all_to_all``: ``jax.shard_map`` over the axes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "data" / "hlo"

MESHES = (((4, 2), ("data", "model")), ((2, 4), ("data", "model")),
          ((8,), ("data",)))
"""The meshes: shape and axis names."""

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
         "collective-permute")
_OPCODE = re.compile(r"\s(" + "|".join(KINDS) + r")(-start)?\(")


def collective_lines(text: str) -> list[str]:
    """The instruction lines of ``text`` whose opcode is a collective (or the
    ``-start`` half of one), stripped, with their ``metadata={...}`` removed."""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if "=" in line and _OPCODE.search(line.split("=", 1)[1]):
            lines.append(_without(line, ", metadata={"))
    return lines


def _without(line: str, attr: str) -> str:
    """``line`` less the attribute starting ``attr`` (its braces balanced)."""
    start = line.find(attr)
    if start < 0:
        return line
    depth, i = 0, start + len(attr) - 1
    for i in range(start + len(attr) - 1, len(line)):
        depth += {"{": 1, "}": -1}.get(line[i], 0)
        if depth == 0:
            break
    return line[:start] + line[i + 1:]


# -- the programs (run under the release being sampled) ------------------------

def programs():
    """``(name, mesh shape, mesh names, axes, function, argument)`` for
    every program: ``function(argument)`` runs collectives over ``axes``
    only."""
    import jax
    import numpy as np
    from jax.sharding import AxisType
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    for shape, names in MESHES:
        targets = [(name,) for name in names] + ([names] if len(names) > 1 else [])
        for axes in targets:
            n = int(np.prod([shape[names.index(a)] for a in axes]))
            spec = P(axes if len(axes) > 1 else axes[0])
            for kind, axis_type in (("jit-auto", AxisType.Auto),
                                    ("jit-explicit", AxisType.Explicit)):
                mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))
                x = jax.ShapeDtypeStruct((16, 4), np.float32,
                                         sharding=NamedSharding(mesh, spec))
                replicated = NamedSharding(mesh, P())
                if kind == "jit-auto":
                    total = jax.jit(lambda x: x.sum(0), out_shardings=replicated)
                    gather = jax.jit(lambda x: x * 2, out_shardings=replicated)
                else:
                    total = jax.jit(lambda x: jax.numpy.sum(x, axis=0))
                    gather = jax.jit(lambda x, r=replicated: jax.sharding.reshard(x, r))
                yield f"{kind}/sum", shape, names, axes, total, x
                yield f"{kind}/gather", shape, names, axes, gather, x
            mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))
            every = P(names if len(names) > 1 else names[0])
            x = jax.ShapeDtypeStruct((64, 8), np.float32,
                                     sharding=NamedSharding(mesh, every))
            ring = [(k, (k + 1) % n) for k in range(n)]
            a = axes if len(axes) > 1 else axes[0]
            bodies = {
                "psum": lambda x, a=a: jax.lax.psum(x, a),
                "all_gather": lambda x, a=a: jax.lax.all_gather(x, a, tiled=True),
                "ppermute": lambda x, a=a, ring=ring: jax.lax.ppermute(x, a, ring),
                "psum_scatter": lambda x, a=a: jax.lax.psum_scatter(
                    x, a, scatter_dimension=0, tiled=True),
                "all_to_all": lambda x, a=a: jax.lax.all_to_all(x, a, 0, 1, tiled=True),
            }
            for op, body in bodies.items():
                f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=every,
                                          out_specs=every, check_vma=False))
                yield f"shard_map/{op}", shape, names, axes, f, x


def sample() -> dict:
    """Every program's mesh, collective lines and axes under this JAX."""
    import jax
    import jaxlib

    rows = []
    for name, shape, names, axes, fn, arg in programs():
        text = fn.lower(arg).compile().as_text()
        rows.append({"program": name, "mesh_shape": list(shape),
                     "mesh_names": list(names), "axes": list(axes),
                     "collectives": collective_lines(text)})
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": ".".join(map(str, sys.version_info[:2])),
            "generated_by": "tools/hlo_samples.py", "programs": rows}


def write_sample(out_dir: Path) -> Path:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    data = sample()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"jax-{data['jax']}.json"
    path.write_text(dump(data))
    return path


def dump(data: dict) -> str:
    """``data`` as JSON with one program per line (small, readable diffs)."""
    head = {key: value for key, value in data.items() if key != "programs"}
    rows = ",\n".join("  " + json.dumps(row) for row in data["programs"])
    return json.dumps(head)[:-1] + ',\n "programs": [\n' + rows + "\n ]}\n"


# -- every release, one venv at a time -----------------------------------------

def read_releases() -> dict[str, str]:
    """Release -> Python version, from ``tools/jax_releases.txt``."""
    sys.path.insert(0, str(ROOT / "tools"))
    from jax_matrix import read_releases as read

    return read()


def run_release(release: str, python: str, venv_root: Path, out_dir: Path,
                uv: str | None) -> None:
    """Sample one release in a fresh venv, which is deleted afterwards."""
    from jax_matrix import _python_env

    venv = venv_root / f"hlo-{release}"
    shutil.rmtree(venv, ignore_errors=True)
    env = _python_env()
    packages = [f"jax=={release}", f"jaxlib=={release}", "numpy"]
    exe = subprocess.run([f"python{python}", "-c", "import sys; print(sys.executable)"],
                         env=env, capture_output=True, text=True, check=True)
    try:
        if uv:
            subprocess.run([uv, "venv", "-q", "--no-python-downloads", "-p",
                            exe.stdout.strip(), str(venv)], env=env, check=True)
            subprocess.run([uv, "pip", "install", "-q", "--python",
                            str(venv / "bin" / "python"), *packages], env=env,
                           check=True)
        else:
            subprocess.run([exe.stdout.strip(), "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install",
                            "-q", *packages], check=True)
        child = {k: v for k, v in os.environ.items()
                 if k not in ("PYTHONPATH", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
        subprocess.run([str(venv / "bin" / "python"), __file__, "--out",
                        str(out_dir)], env=child, check=True)
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR,
                        help="where the JSON files go (default tests/data/hlo)")
    parser.add_argument("--releases", nargs="+", metavar="V",
                        help="sample these releases (all: every listed one), "
                             "each in its own venv, instead of this interpreter's")
    parser.add_argument("--uv", metavar="PATH", help="install the venvs with uv")
    parser.add_argument("--venv-root", type=Path, default=None,
                        help="where the venvs go (default a temporary folder)")
    args = parser.parse_args(argv)
    if not args.releases:
        print(write_sample(args.out))
        return
    listed = read_releases()
    wanted = list(listed) if args.releases == ["all"] else args.releases
    unknown = [r for r in wanted if r not in listed]
    if unknown:
        raise SystemExit(f"--releases: {unknown} not in tools/jax_releases.txt")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.venv_root or Path(tmp)
        for release in wanted:
            print(f"jax {release} (python {listed[release]})", flush=True)
            run_release(release, listed[release], root, args.out, args.uv)


if __name__ == "__main__":
    main()
