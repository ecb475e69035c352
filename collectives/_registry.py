"""The registry of recipes by name: ``collectives.RECIPES``."""

from __future__ import annotations

import types

from collectives._forms import Recipe

_RECIPES: dict[str, Recipe] = {}

RECIPES = types.MappingProxyType(_RECIPES)
"""Every recipe by name (read-only); ``python -m collectives list`` prints it."""


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES`; names are unique."""
    if recipe.name in _RECIPES:
        raise ValueError(
            f"a recipe named {recipe.name!r} is already registered. Fix: choose "
            "another name.")
    _RECIPES[recipe.name] = recipe
    return recipe
