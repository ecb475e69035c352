"""Diagrams of the parallelism strategies, each drawn from a real run of its
recipe file's functions: ``trace()`` runs them and records what happened,
``draw(record, path)`` writes the SVG the docs show, ``text(record)`` says the
same in a small table."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from typing import TypeVar

from collectives._compat import mesh_scope

T = TypeVar("T")


def on_its_own_mesh(trace: Callable[..., T]) -> Callable[..., T]:
    """``trace`` runs outside any mesh its caller set with ``jax.set_mesh``:
    it builds the mesh it runs its recipe on (on JAX's defaults a global
    Explicit mesh would otherwise clash with that mesh)."""

    @functools.wraps(trace)
    def traced(*args: Any, **kwargs: Any) -> T:
        with mesh_scope(None):
            return trace(*args, **kwargs)

    return traced
