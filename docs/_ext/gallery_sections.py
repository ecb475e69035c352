"""Which recipe files the gallery shows, in which sections: read from the
registry, with no Sphinx import (the tests import it to follow a new
recipe into the gallery)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

# The gallery's sections: the registry's families in the order the registry
# first names them, then the files no recipe names as its source.
FAMILY_TITLES = {"core": "Core collectives", "pattern": "Patterns",
                 "strategy": "Parallelism strategies",
                 "kernel": "Kernels: collectives from the inside"}
UNNAMED = [("Sharp edges", "sharp_edges_*"),
           ("Arrays, training, migration and processes", "*")]


def sections(paths: list[Path]) -> list[tuple[str, list[tuple[Path, list[str]]]]]:
    """``[(title, [(file, [recipe names]), ...]), ...]`` from the registry.

    Files appear in the order of their first recipe in ``collectives.RECIPES``;
    the files that no recipe names are split into sharp edges and the rest.
    """
    import collectives

    by_stem = {p.stem: p for p in paths}
    families: dict[str, dict[str, list[str]]] = {}
    for recipe_name, recipe in collectives.RECIPES.items():
        stem = Path(recipe.recipe_file).stem
        if stem in by_stem:
            files = families.setdefault(recipe.family, {})
            files.setdefault(stem, []).append(recipe_name)
    named = {stem for files in families.values() for stem in files}
    out = [(FAMILY_TITLES.get(family, family.capitalize()),
            [(by_stem[stem], names) for stem, names in files.items()])
           for family, files in families.items()]
    rest = [p for p in paths if p.stem not in named]
    for title, pattern in UNNAMED:
        members = [p for p in rest if fnmatch.fnmatch(p.stem, pattern)]
        rest = [p for p in rest if p not in members]
        if members:
            out.append((title, [(p, []) for p in members]))
    return out


def diagrams_by_file() -> dict[str, list[str]]:
    """File stem -> the names of its recipes that have a diagram, in order."""
    import collectives

    out: dict[str, list[str]] = {}
    for recipe_name, recipe in collectives.RECIPES.items():
        if recipe.diagram is not None:
            out.setdefault(Path(recipe.recipe_file).stem, []).append(recipe_name)
    return out
