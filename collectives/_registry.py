"""The registry of recipes by name: ``collectives.RECIPES``."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping

from collectives._recipe import Recipe

CORE: tuple[str, ...] = (
    "psum", "pmean", "pmax", "pmin", "all_gather", "all_gather_stacked",
    "psum_scatter", "all_to_all", "ppermute_ring", "axis_index")
"""The core recipe names, a contract; they come first in :data:`RECIPES`."""


class _Registry(Mapping[str, Recipe]):
    """A read-only mapping: the core recipes in :data:`CORE` order, then the
    pattern recipes in the order they were registered."""

    def __init__(self) -> None:
        self._recipes: dict[str, Recipe] = {}

    def __getitem__(self, name: str) -> Recipe:
        return self._recipes[name]

    def __iter__(self) -> Iterator[str]:
        yield from (name for name in CORE if name in self._recipes)
        yield from (name for name in self._recipes if name not in CORE)

    def __len__(self) -> int:
        return len(self._recipes)

    def __repr__(self) -> str:
        return f"RECIPES({', '.join(self)})"


RECIPES: Mapping[str, Recipe] = _Registry()
"""Every recipe by name (read-only); ``python -m collectives list`` prints it."""


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES`; names are unique."""
    if recipe.name in RECIPES:
        raise ValueError(
            f"a recipe named {recipe.name!r} is already registered. Fix: choose "
            "another name.")
    RECIPES._recipes[recipe.name] = recipe  # type: ignore[attr-defined]
    return recipe
