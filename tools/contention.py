"""``check`` repeated under CPU contention: a hunt for rows that are wrong once.

A result that changes between runs is a bug, never noise. This script runs
``collectives.check`` again and again, in fresh processes, while busy
processes (``python -c 'while 1: pass'``) compete for the cores, and reports
every row that disagreed with the oracle. What varies between tries:

* ``--busy N``: busy processes beside the checks (ended by pid at the end);
* ``--parallel P``: checks running side by side, each in its own process;
* ``--reps K``: ``check`` K times in one process (compiled once, run K times);
* ``--shuffle``: each process checks the recipes in another order;
* ``--global-mesh``: ``jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y")))``
  first, as a user who set a mesh globally;
* ``--before NAME ...``: recipes checked first in each process (state that
  other recipes leave behind);
* ``--xla-flags``: added to ``XLA_FLAGS`` (e.g. XLA:CPU's thread settings);
  ``--threads N`` sets ``PJRT_NPROC``, the CPU client's thread pool;
* ``--cache DIR``: JAX's persistent compilation cache, shared by the checks.

::

    python tools/contention.py ring_attention ring_attention_causal pipeline_mlp \\
        --busy 6 --runs 20 --parallel 2 --reps 3 --shuffle
    python tools/contention.py --busy 4 --runs 2          # every recipe
    python tools/contention.py ring_attention --busy 8 --recompile 8

``--recompile N`` asks the other question: whether tracing and XLA's
compiler give one program every time (each form compiled ``N`` times from
nothing, beside the busy processes; :func:`unstable_programs`).

It prints one line per wrong row and a summary; the exit status is 1 when
any row was wrong. The process that saw a wrong row asks it again before it
goes on (:func:`diagnose`): the same row as it is, then recompiled from
nothing, with a digest of each form's optimized program both times, so a
wrong row says whether its program or its run was wrong.
``tests/test_contention.py`` runs :func:`wrong_rows` inside :func:`busy` on
every recipe (``-m slow``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUSY = "while 1: pass"
CHILDREN: list[subprocess.Popen] = []  # the checks started, ended at exit


@contextlib.contextmanager
def busy(n: int) -> Iterator[list[int]]:
    """``n`` busy processes (``python -c 'while 1: pass'``) for the length of
    the block; yields their pids and ends each of them by pid afterwards."""
    processes = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        yield [process.pid for process in processes]
    finally:
        _stop(processes)


def _stop(processes: Iterable[subprocess.Popen]) -> None:
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()


def first_config(name: str) -> list[Any]:
    """The first of ``check``'s standard configurations that ``name`` runs
    on: its one cheapest row."""
    import collectives as cx
    from collectives._check import standard_configs

    recipe = cx.RECIPES[name]
    for config in standard_configs():
        shape, names, axis = config
        if recipe.unsupported_reason(recipe.axes(cx.make_mesh(shape, names),
                                                 axis)) is None:
            return [config]
    raise ValueError(f"{name}: runs on none of check's standard configurations")


def wrong_rows(names: Sequence[str], *, reps: int = 5, full: Sequence[str] = (),
               forms: Callable[..., Any] | None = None
               ) -> tuple[int, list[tuple[int, Any]]]:
    """``check`` ``reps`` times over ``names``: every standard row of the
    recipes in ``full``, the first row the others run on (float32). Returns
    how many rows ran, and each wrong row with its repetition."""
    import collectives as cx

    configs = {name: None if name in full else first_config(name) for name in names}
    ran, wrong = 0, []
    for rep in range(reps):
        for name in names:
            rows = cx.check([name], configs=configs[name], forms=forms)
            ran += len(rows)
            wrong += [(rep, row) for row in rows if not row.ok]
    return ran, wrong


def config_of(row: Any) -> Any:
    """The standard configuration ``(shape, names, axis)`` of a ``check`` row."""
    import collectives as cx
    from collectives._check import standard_configs

    recipe = cx.RECIPES[row.recipe]
    for shape, names, axis in standard_configs():
        axes = recipe.axes(cx.make_mesh(shape, names), axis)
        if ("x".join(map(str, shape)), ",".join(axes.names)) == (row.mesh, row.axis):
            return shape, names, axis
    raise ValueError(f"{row.recipe}: no standard configuration gives mesh "
                     f"{row.mesh} axis {row.axis}")


def program_digests(name: str, config: Any) -> dict[str, str]:
    """Each form's optimized program for ``config`` (pmap's too), as a short
    SHA-256 of its HLO text: what this process compiles, to set beside
    another's."""
    import hashlib

    import collectives as cx
    from collectives._recipe import PLACED_FORMS
    from collectives._recipe import pmap_callable
    from collectives._stacked import stack_args

    recipe = cx.RECIPES[name]
    shape, names, axis = config
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axes.names)
    lowered = {}
    for form in PLACED_FORMS:
        if recipe.unrunnable_form(form, axes) is None:
            placed = recipe.place(*args, axes=axes, form=form)
            lowered[form] = recipe.compiled(form, axes).lower(*placed)
    if recipe.unrunnable_form("pmap", axes) is None:
        lowered["pmap"] = pmap_callable(recipe, axes).lower(
            *stack_args(recipe, axes, args))
    return {form: hashlib.sha256(program_only(low.compile().as_text()).encode()
                                 ).hexdigest()[:12]
            for form, low in lowered.items()}


def unstable_programs(names: Sequence[str], recompiles: int
                      ) -> dict[tuple[str, str], set[tuple]]:
    """Each form of ``names`` at every standard mesh compiled ``recompiles``
    times, every trace and compiled program dropped in between: the
    ``(recipe, mesh/axis)`` whose programs differed, with the digests seen.
    Empty: tracing and XLA's compiler gave the same program every time."""
    import collectives as cx
    from collectives._check import standard_configs
    from collectives._recipe import clear_caches

    seen: dict[tuple[str, str], set[tuple]] = {}
    for _ in range(recompiles):
        for name in names:
            recipe = cx.RECIPES[name]
            for config in standard_configs():
                shape, mesh_names, axis = config
                axes = recipe.axes(cx.make_mesh(shape, mesh_names), axis)
                if recipe.unsupported_reason(axes) is not None:
                    continue
                where = f"{'x'.join(map(str, shape))}/{','.join(axes.names)}"
                digests = tuple(sorted(program_digests(name, config).items()))
                seen.setdefault((name, where), set()).add(digests)
            clear_caches()
    return {key: found for key, found in seen.items() if len(found) > 1}


_SOURCE_TABLE = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames|\d+ )")
_METADATA = re.compile(r", metadata=\{[^}]*\}")


def program_only(text: str) -> str:
    """Optimized HLO text without where it was traced from: the source
    tables and each instruction's ``metadata`` (a column of the caller's
    line differs from one trace to the next; the program does not)."""
    return "\n".join(_METADATA.sub("", line) for line in text.splitlines()
                     if not _SOURCE_TABLE.match(line))


def diagnose(row: Any, forms: Callable[..., Any] | None = None) -> dict[str, Any]:
    """What a wrong row is made of, asked in the process that saw it: the
    row checked again as it is (``again``: right or wrong), then after every
    compiled program and trace was dropped (``recompiled``), and each placed
    form's program digest before and after the drop. Wrong again but right
    recompiled, with other digests, is a program traced or compiled wrong in
    this process; right again is a wrong run of a right program."""
    import collectives as cx
    from collectives._recipe import clear_caches

    config = config_of(row)

    def right() -> bool:
        return all(r.ok for r in cx.check([row.recipe], configs=[config],
                                          forms=forms))

    found: dict[str, Any] = {"again": right(),
                             "digests": program_digests(row.recipe, config)}
    clear_caches()
    found["recompiled"] = right()
    found["digests_recompiled"] = program_digests(row.recipe, config)
    return found


def _child(args: argparse.Namespace) -> None:
    """One process: ``check`` ``args.reps`` times, a JSON line per row; a
    wrong row carries its :func:`diagnose` in that process."""
    import collectives as cx

    cx.use_cpu_devices(8)
    import jax

    if args.global_mesh:
        jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y")))
    names = list(args.names) or list(cx.RECIPES)
    if args.shuffle:
        random.Random(args.seed).shuffle(names)
    for name in args.before:
        cx.check([name])
    for rep in range(args.reps):
        def show(row: Any, rep: int = rep) -> None:  # each row as it comes
            line = {"rep": rep, "recipe": row.recipe, "mesh": row.mesh,
                    "axis": row.axis, "ok": row.ok, "detail": row.detail[:600]}
            if not row.ok:
                line["diagnosis"] = diagnose(row)
            print(json.dumps(line), flush=True)

        cx.check(names, progress=show)


def _run_child(args: argparse.Namespace, index: int) -> list[dict]:
    command = [sys.executable, __file__, "--child", "--reps", str(args.reps),
               "--seed", str(args.seed + index), *args.names]
    command += ["--shuffle"] * args.shuffle + ["--global-mesh"] * args.global_mesh
    if args.before:
        command += ["--before", *args.before]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if args.xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
    if args.threads:
        env["PJRT_NPROC"] = str(args.threads)
    if args.cache:
        env["JAX_COMPILATION_CACHE_DIR"] = args.cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    CHILDREN.append(process)
    try:
        stdout, stderr = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    rows = [json.loads(line) | {"run": index}
            for line in stdout.splitlines() if line.startswith("{")]
    if process.returncode != 0:
        rows.append({"run": index, "rep": -1, "recipe": "(the process)",
                     "mesh": "-", "axis": "-", "ok": False,
                     "detail": f"exit {process.returncode}: {stderr[-600:]}"})
    return rows


def _recompile(args: argparse.Namespace) -> int:
    """``--recompile N``: :func:`unstable_programs` beside the busy
    processes; exit 1 where a program differed."""
    sys.path.insert(0, str(ROOT))  # this checkout's package, as the checks run
    import collectives as cx

    cx.use_cpu_devices(8)
    names = list(args.names) or list(cx.RECIPES)
    start = time.time()
    with busy(args.busy):
        unstable = unstable_programs(names, args.recompile)
    for (name, where), found in sorted(unstable.items()):
        print(f"DIFFERENT PROGRAMS {name} {where}: {sorted(found)}")
    print(f"{len(names)} recipes compiled {args.recompile} times at every standard "
          f"mesh, {len(unstable)} with programs that differed ({args.busy} busy "
          f"beside, {time.time() - start:.0f} s)")
    return 1 if unstable else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="recipes (default: all)")
    parser.add_argument("--busy", type=int, default=4)
    parser.add_argument("--runs", type=int, default=4, help="processes in all")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--global-mesh", action="store_true")
    parser.add_argument("--before", nargs="*", default=[])
    parser.add_argument("--xla-flags", default="")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recompile", type=int, default=0, metavar="N",
                        help="instead: compile each form N times from nothing "
                             "(in this process) and report programs that differ")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds per process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    if args.recompile:
        return _recompile(args)
    # a timeout's SIGTERM still ends the busy processes and the checks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.time()
    pool = ThreadPoolExecutor(args.parallel)
    try:
        with busy(args.busy):
            futures = [pool.submit(_run_child, args, i) for i in range(args.runs)]
            while wait(futures, timeout=1).not_done:  # a signal gets through
                pass
            results = [future.result() for future in futures]
    finally:
        _stop(CHILDREN)
        pool.shutdown(wait=False, cancel_futures=True)
    rows = [row for run in results for row in run]
    wrong = [row for row in rows if not row["ok"]]
    for row in wrong:
        print(f"WRONG process {row['run']} rep {row['rep']}: {row['recipe']} "
              f"mesh={row['mesh']} axis={row['axis']}: "
              f"{' | '.join(row['detail'].splitlines()[:4])}")
        if "diagnosis" in row:
            print(f"  in that process: {json.dumps(row['diagnosis'])}")
    print(f"{len(rows)} rows, {len(wrong)} wrong, in {args.runs} processes "
          f"({args.busy} busy beside them, {time.time() - start:.0f} s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
