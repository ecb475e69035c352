"""The registry of recipes by name: ``collectives.RECIPES``."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from collections.abc import Mapping

from collectives._recipe import FAMILIES
from collectives._recipe import Recipe


class _Registry(Mapping[str, Recipe]):
    """A read-only mapping, by family (:data:`FAMILIES` order), then in
    registration order (``collectives._facts`` imports its modules in name
    order)."""

    def __init__(self) -> None:
        self._recipes: dict[str, Recipe] = {}

    def __getitem__(self, name: str) -> Recipe:
        return self._recipes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._recipes)

    def __len__(self) -> int:
        return len(self._recipes)

    def __repr__(self) -> str:
        return f"RECIPES({', '.join(self)})"


RECIPES: Mapping[str, Recipe] = _Registry()
"""Every recipe by name (read-only); ``python -m collectives list`` prints it."""


def core_names() -> tuple[str, ...]:
    """The names of the core recipes (``family="core"``), a contract."""
    return tuple(name for name, recipe in RECIPES.items() if recipe.family == "core")


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES`; names are unique."""
    if recipe.name in RECIPES:
        raise ValueError(
            f"a recipe named {recipe.name!r} is already registered. Fix: choose "
            "another name.")
    rank = {family: index for index, family in enumerate(FAMILIES)}
    ordered = sorted([*RECIPES.values(), recipe], key=lambda r: rank[r.family])
    RECIPES._recipes = {r.name: r for r in ordered}  # type: ignore[attr-defined]
    return recipe


def no_recipe(name: str) -> str:
    """The message for an unknown recipe ``name``: the closest names ("did
    you mean"), then every name."""
    close = difflib.get_close_matches(name, list(RECIPES), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return f"no recipe named {name!r}.{hint} Known recipes: {', '.join(RECIPES)}."
