"""``python -m collectives.plan._worker REQUEST``: the process that compiles.

Started by :func:`collectives.plan.compile_units` with ``JAX_NUM_CPU_DEVICES``
set to the mesh's size (the CPU backend's device count is fixed when it
starts); reads the request (JSON: the mesh, the model or the example
``dims``, the recipes and forms) and prints one JSON document on stdout.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import jax

from collectives._costs import compiling_for
from collectives._devices import make_mesh
from collectives.plan._compile import compile_unit
from collectives.plan._compile import planned_recipe
from collectives.plan._compile import unsupported
from collectives.plan._model import Model
from collectives.plan._targets import TARGETS
from collectives.plan._targets import compiler_text
from collectives.plan._targets import target_mesh


def run(request: dict[str, Any]) -> dict[str, Any]:
    names, shape = request["mesh_names"], request["mesh_shape"]
    start = time.perf_counter()
    topology = request.get("topology")
    if topology:
        chosen = TARGETS[request["target"]]
        mesh = target_mesh(chosen, topology, shape, names)
        platform = "gpu" if chosen.platform == "cuda" else chosen.platform
        compiler = compiler_text(chosen, topology)
        def target():
            return compiling_for(platform)
    else:
        mesh = make_mesh(tuple(shape), tuple(names))
        platform, compiler = jax.default_backend(), "XLA:CPU, simulated devices"
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
                                        dtype=request.get("dtype", "float32"),
                                        axis=tuple(request.get("axis") or ()) or None)
            except (TypeError, ValueError) as err:
                row["skipped"] = f"does not fit: {err}"
            except Exception as err:  # the target's compiler: out of memory
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                oom = str(err).split("RESOURCE_EXHAUSTED:", 1)[1].split(". HLO")[0]
                row["skipped"] = f"does not fit in device memory:{oom}"
            units.append(row)
    return {"jax": jax.__version__, "devices": mesh.devices.size,
            "platform": platform, "compiler": compiler,
            "mesh_names": names, "mesh_shape": shape, "units": units,
            "seconds": time.perf_counter() - start}


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    json.dump(run(request), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
