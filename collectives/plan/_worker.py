"""``python -m collectives.plan._worker REQUEST``: the process that compiles.

Started by :func:`collectives.plan.compile_units` with ``JAX_NUM_CPU_DEVICES``
set to the mesh's size (the CPU backend's device count is fixed when it
starts); reads the request (JSON: the mesh, the model or the example
``dims``, the recipes and forms) and prints one JSON document on stdout.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from typing import Any

import jax
from jax.experimental import topologies

from collectives._costs import compiling_for
from collectives._devices import make_mesh
from collectives.plan._compile import compile_unit
from collectives.plan._compile import planned_recipe
from collectives.plan._compile import unsupported
from collectives.plan._model import Model


def _topology_mesh(topology: str, shape: tuple[int, ...], names: tuple[str, ...]):
    """A mesh of a named TPU topology's devices, for compiling only."""
    try:
        topo = topologies.get_topology_desc(topology, platform="tpu")
    except Exception as err:  # no TPU compiler, or a name it does not know
        raise SystemExit(
            f"--topology {topology!r}: JAX cannot describe it ({type(err).__name__}: "
            f"{str(err)[:300]}). Fix: install the TPU compiler (pip install "
            "'jax[tpu]'; no TPU needed) and name a topology such as v5p:8x16x16 "
            "or v5e:16x16.") from None
    if len(topo.devices) != math.prod(shape):
        raise SystemExit(
            f"--topology {topology!r} has {len(topo.devices)} devices, the mesh "
            f"{dict(zip(names, shape, strict=True))} {math.prod(shape)}. Fix: give "
            "a mesh of as many devices (--mesh or --devices).")
    return topologies.make_mesh(topo, shape, names)


def run(request: dict[str, Any]) -> dict[str, Any]:
    names, shape = request["mesh_names"], request["mesh_shape"]
    start = time.perf_counter()
    topology = request.get("topology")
    if topology:
        mesh = _topology_mesh(topology, tuple(shape), tuple(names))
        def target():
            return compiling_for("tpu")
    else:
        mesh = make_mesh(tuple(shape), tuple(names))
        target = contextlib.nullcontext
    model = Model(**request["model"]) if request.get("model") else None
    units = []
    for name in request["recipes"]:
        recipe = planned_recipe(name, request.get("microbatches"))
        reason = unsupported(recipe, mesh)
        for form in request["forms"]:
            row: dict[str, Any] = {"recipe": name, "form": form}
            if reason is not None:
                units.append(row | {"skipped": reason})
                continue
            try:
                with target():
                    row |= compile_unit(recipe, mesh, form, model=model,
                                        dims=tuple(request.get("dims", (2, 3))),
                                        dtype=request.get("dtype", "float32"))
            except (TypeError, ValueError) as err:
                row["skipped"] = f"does not fit: {err}"
            except Exception as err:  # the TPU compiler: out of device memory
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                oom = str(err).split("RESOURCE_EXHAUSTED:", 1)[1].split(". HLO")[0]
                row["skipped"] = f"does not fit in device memory:{oom}"
            units.append(row)
    return {"jax": jax.__version__, "devices": mesh.devices.size,
            "platform": "tpu" if topology else jax.default_backend(),
            "mesh_names": names, "mesh_shape": shape, "units": units,
            "seconds": time.perf_counter() - start}


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    json.dump(run(request), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
