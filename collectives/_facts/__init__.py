"""Every recipe's facts, registered in the order :data:`collectives.RECIPES`
lists them.

Each module here imports the algorithms of one recipe file
(``collectives.recipes.<file>``, the files in ``recipes/``) and registers
them with what the library needs to know about them: layouts, validation,
cost model, tolerance, bench and diagram facts.

Importing this package imports every module in it, in name order (a module
named like its recipe file: ``reductions.py`` for ``recipes/reductions.py``);
:data:`collectives.RECIPES` then lists the recipes by family (core, pattern,
strategy: :data:`collectives.FAMILIES`), in import order within one. So adding
a recipe takes its recipe file and its facts module, and no edit here.
"""

import importlib
import pkgutil


def _import_all() -> None:
    found = {info.name for info in pkgutil.iter_modules(__path__)
             if not info.name.startswith("_")}
    for name in sorted(found):
        importlib.import_module(f"{__name__}.{name}")


_import_all()
