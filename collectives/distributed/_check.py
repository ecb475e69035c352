"""``check`` and ``run`` inside every process of a multi-process launch.

Every process runs the same recipes on the same global inputs (one seed), on
meshes that span all processes, and compares every form with the NumPy
oracle: :func:`collectives.check` with the forms of
:func:`~collectives.distributed.process_forms`, which feed each process its
own part of the data. Each process prints its own table; the launcher reports
one line per process.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from collectives import _args
from collectives import _check
from collectives._check import CheckResult
from collectives.distributed._forms import bound_process_forms


def check_across_processes(
    names: Iterable[str] | None = None, *,
    save: dict[str, np.ndarray] | None = None, **options: Any,
) -> list[CheckResult]:
    """:func:`collectives.check` on meshes that span every process.

    Args:
      names: recipe names (default: every registered recipe).
      save: if given, filled with the inputs and every form's gathered
        result, keyed ``recipe:mesh:axis:dtype:form:leaf``.
      **options: as for :func:`collectives.check` (``dtypes``, ``configs``,
        ``seed``, ``exact``, ``progress``); the default configs span all
        devices of all processes.

    Returns:
      One :class:`~collectives.CheckResult` per recipe, mesh, axis and dtype.

    Raises:
      KeyError: a name is not a registered recipe.
    """
    return _check.check(names, forms=bound_process_forms, on_report=_recorder(save),
                        **options)


def _recorder(save: dict[str, np.ndarray] | None) -> Any:
    """An ``on_report`` hook that stores inputs and results in ``save``."""
    if save is None:
        return None

    def on_report(row: CheckResult, inputs: tuple[Any, ...], report: Any) -> None:
        key = f"{row.recipe}:{row.mesh}:{row.axis}:{row.dtype}"
        for what, tree in (("input", inputs), *report.results.items()):
            for index, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
                save[f"{key}:{what}:{index}"] = np.asarray(leaf)

    return on_report


def check_parser() -> argparse.ArgumentParser:
    """The arguments of the ``check`` target (after ``launch ... --``)."""
    p = _args.Parser(
        prog="launch ... -- check",
        description="every recipe in every form vs the NumPy oracle, on meshes "
                    "spanning every process")
    _check.add_check_arguments(p)
    p.add_argument("--save", metavar="DIR",
                   help="write inputs and gathered results to DIR/process-<i>.npz")
    return p


def run_parser() -> argparse.ArgumentParser:
    """The arguments of the ``run`` target (after ``launch ... --``)."""
    p = _args.Parser(
        prog="launch ... -- run",
        description="one recipe in every form on small integer data, every "
                    "process printing the gathered results")
    _check.add_run_arguments(p)
    return p


def _where() -> str:
    return (f"process {jax.process_index()} of {jax.process_count()}: "
            f"{jax.local_device_count()} local devices of {jax.device_count()}")


def cmd_check(argv: Sequence[str]) -> tuple[int, str]:
    """Run the ``check`` target; returns (exit code, one-line summary)."""
    args = check_parser().parse_args(list(argv))
    print(_where())
    save: dict[str, np.ndarray] | None = {} if args.save else None
    rows = _check.print_check(args, forms=bound_process_forms,
                              on_report=_recorder(save))
    if save is not None:
        out = Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / f"process-{jax.process_index()}.npz", **save)
    if not rows:
        return 1, "nothing checked: no recipe accepts these meshes and dtypes"
    return (0 if all(row.ok for row in rows) else 1), _check.summarize(rows)


def cmd_run(argv: Sequence[str]) -> tuple[int, str]:
    """Run the ``run`` target; returns (exit code, one-line summary)."""
    args = run_parser().parse_args(list(argv))
    print(_where())
    _check.print_run(args, forms=bound_process_forms)
    return 0, f"{args.name}: every form ran"
