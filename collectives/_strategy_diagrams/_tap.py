"""A tap on a recipe file's collectives: what each device sent in and got out.

:func:`tapped` swaps a recipe module's ``lax`` for a :class:`TapLax` for the
length of a ``with`` block (restoring it in a ``finally``). The recipe's
functions look ``lax`` up when they run, so while they are traced inside the
block, every call of a tapped name (``all_to_all``, ``pmean``, ...) goes to
the module's own ``lax`` function (the real one, or whatever stands in for it
then, e.g. a test's mutant) and is then reported with a
``jax.experimental.io_callback``: once per device per execution, with the
device's ``lax.axis_index``, the input and the output (every leaf of a
pytree) as numpy arrays. The callback returns ``0``, which is added to each
output leaf: the collective's result is not used before its report is in, so
one call site's reports from one device arrive in execution order (e.g. the
steps of a ``lax.scan``). Nothing else changes: the values the recipe
computes are the ones it computes untapped.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback


@dataclass(frozen=True, eq=False)
class Site:
    """One call of a tapped function in the traced program."""

    name: str  # e.g. "all_to_all"
    axis_name: Any
    params: dict  # the call's other arguments, e.g. split_axis=1
    treedef: Any  # the input's pytree structure


@dataclass(frozen=True, eq=False)
class Report:
    """One device's run of one call site."""

    site: int  # index into TapLax.sites: the order the body made the calls in
    device: int  # lax.axis_index over the call's axis_name
    inputs: tuple[np.ndarray, ...]  # the input's leaves on this device
    outputs: tuple[np.ndarray, ...]  # the output's leaves on this device


class TapLax:
    """Stands in for a module's ``lax``: ``names`` are reported, the rest of
    the attributes are ``inner``'s."""

    def __init__(self, inner: Any, names: tuple[str, ...]):
        self._inner = inner
        self._names = frozenset(names)
        self.sites: list[Site] = []
        self.reports: list[Report] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        return self._tap(name, attr) if name in self._names else attr

    def _tap(self, name: str, fn):
        def tapped(x, axis_name, *args, **kwargs):
            out = fn(x, axis_name, *args, **kwargs)
            site = len(self.sites)
            leaves_in, treedef = jax.tree_util.tree_flatten(x)
            leaves_out, treedef_out = jax.tree_util.tree_flatten(out)
            params = {f"arg{i}": arg for i, arg in enumerate(args)}
            params.update(kwargs)
            self.sites.append(Site(name, axis_name, params, treedef))

            def report(device, *leaves):
                arrays = tuple(np.array(leaf) for leaf in leaves)
                with self._lock:
                    self.reports.append(Report(site, int(device),
                                               arrays[:len(leaves_in)],
                                               arrays[len(leaves_in):]))
                return np.zeros((), np.int32)

            done = io_callback(report, jax.ShapeDtypeStruct((), jnp.int32),
                               jax.lax.axis_index(axis_name), *leaves_in,
                               *leaves_out)
            # + 0: whatever uses the result waits for this report
            return jax.tree_util.tree_unflatten(
                treedef_out, [leaf + done.astype(leaf.dtype) for leaf in leaves_out])

        return tapped

    def by_device(self, site: int) -> dict[int, list[Report]]:
        """``{device: its reports of call site ``site``, in execution order}``."""
        runs: dict[int, list[Report]] = {}
        for report in self.reports:
            if report.site == site:
                runs.setdefault(report.device, []).append(report)
        return dict(sorted(runs.items()))


@contextlib.contextmanager
def tapped(module: Any, *names: str) -> Iterator[TapLax]:
    """Within the block, ``module.lax`` is a :class:`TapLax` over the
    module's current ``lax`` reporting ``names``; restored afterwards."""
    inner = module.lax
    tap = TapLax(inner, names)
    module.lax = tap
    try:
        yield tap
    finally:
        module.lax = inner
