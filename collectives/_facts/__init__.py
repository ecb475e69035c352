"""Every recipe's facts, registered in the order :data:`collectives.RECIPES`
lists them.

Each module here imports the algorithms of one recipe file
(``collectives.recipes.<file>``, the files in ``recipes/``) and registers
them with what the library needs to know about them: layouts, validation,
cost model, tolerance, bench and diagram facts.

Importing this package imports the modules named in :data:`ORDER` first:
the core collectives (their names are a contract), then the patterns built
from them, then the parallelism strategies. A module not named there (a new
recipe's facts block) is imported after them, in name order, so adding a
recipe takes its recipe file and its facts module, and no edit here.
"""

import importlib
import pkgutil

ORDER: tuple[str, ...] = (
    # The core collectives, in contract order.
    "reduce",  # psum pmean pmax pmin
    "gather",  # all_gather(_stacked) psum_scatter
    "all_to_all",  # all_to_all
    "permute",  # ppermute_ring axis_index
    # Patterns built from the collectives.
    "ring", "halo", "matmul", "mlp", "grads", "batching", "montecarlo",
    # Parallelism strategies.
    "training", "fsdp", "pipeline", "attention", "moe",
)
"""The facts modules whose order is fixed; the rest follow in name order."""


def _import_all() -> None:
    found = {info.name for info in pkgutil.iter_modules(__path__)
             if not info.name.startswith("_")}
    for name in (*ORDER, *sorted(found - set(ORDER))):
        importlib.import_module(f"{__name__}.{name}")


_import_all()
