"""The registry of recipes by name: ``collectives.RECIPES``."""

from __future__ import annotations

import difflib
import hashlib
import sys
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path

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


class RecipeFileChanged(RuntimeError):
    """A recipe's file changed on disk after this process imported it: its
    forms would run the code imported then, not the file as it is."""


_IMPORTED: dict[Path, str | None] = {}
"""Each recipe file's digest when this process imported it."""


def _file_of(recipe: Recipe) -> Path | None:
    """The file of the module ``collectives.recipes.<file>`` the recipe's
    functions come from, where this process imported one (in a checkout,
    ``recipes/<file>``: the file a user edits, not the package's link)."""
    stem = Path(recipe.recipe_file).stem if recipe.recipe_file else None
    module = sys.modules.get(f"collectives.recipes.{stem}") if stem else None
    where = getattr(module, "__file__", None)
    return Path(where).resolve() if where else None


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # gone, or unreadable
        return None


def _as_imported(path: Path) -> str | None:
    """``path``'s digest as this process imported it: taken the first time
    it is asked (at registration, or for a file imported on first use,
    ``optax_training.py``, when a row first asks)."""
    if path not in _IMPORTED:
        _IMPORTED[path] = _digest(path)
    return _IMPORTED[path]


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES`; names are unique. Its recipe file's
    digest is taken now, as imported (:func:`file_changed` compares)."""
    if recipe.name in RECIPES:
        raise ValueError(
            f"a recipe named {recipe.name!r} is already registered. Fix: choose "
            "another name.")
    path = _file_of(recipe)
    if path is not None:
        _as_imported(path)
    rank = {family: index for index, family in enumerate(FAMILIES)}
    ordered = sorted([*RECIPES.values(), recipe], key=lambda r: rank[r.family])
    RECIPES._recipes = {r.name: r for r in ordered}  # type: ignore[attr-defined]
    return recipe


def file_changed(recipe: Recipe) -> RecipeFileChanged | None:
    """The error to report where ``recipe``'s file is no longer what this
    process imported (edited, replaced or deleted since), else ``None``.

    A process runs the code it imported: a recipe file edited while a
    notebook or a long ``check`` holds the old import would otherwise be
    reported on as if its new text had run (``importlib.reload`` does not
    reach the functions the registry holds).
    """
    path = _file_of(recipe)
    if path is None:  # not imported (yet): nothing ran from it
        return None
    then, now = _as_imported(path), _digest(path)
    if now == then:
        return None
    state = "is gone" if now is None else "changed on disk"
    return RecipeFileChanged(
        f"{recipe.name}: {path} {state} since this process imported it (sha256 "
        f"{(then or '?')[:12]} then, {(now or 'none')[:12]} now): its forms would "
        "run the code imported then, not the file as it is. Fix: run check in a "
        "new process (importlib.reload does not reach the registered recipe).")


def no_recipe(name: str) -> str:
    """The message for an unknown recipe ``name``: the closest names ("did
    you mean"), then every name."""
    close = difflib.get_close_matches(name, list(RECIPES), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return f"no recipe named {name!r}.{hint} Known recipes: {', '.join(RECIPES)}."
