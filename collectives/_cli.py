"""``python -m collectives``: list, show, run, check, bench, plan, launch and worker."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax

from collectives import _args
from collectives import _interrupt
from collectives import bench
from collectives._arrays import narrowed
from collectives._check import add_check_arguments
from collectives._check import add_mesh_arguments
from collectives._check import add_run_arguments
from collectives._check import axis_from_args
from collectives._check import check_arguments
from collectives._check import print_check
from collectives._check import print_run
from collectives._check import write_check_json
from collectives._compiled_view import compiled_view
from collectives._compiled_view import target_view
from collectives._devices import MESH_NAMES
from collectives._devices import use_cpu_devices
from collectives._diagram import diagram
from collectives._diagram import diagram_names
from collectives._kernels import KernelTimeout
from collectives._registry import RECIPES
from collectives._registry import no_recipe
from collectives.bench import add_arguments as add_bench_arguments
from collectives.distributed._cli import add_launch_arguments
from collectives.distributed._cli import add_worker_command
from collectives.distributed._cli import run_launch_command
from collectives.plan._command import add_arguments as add_plan_arguments
from collectives.plan._command import main as plan_main
from collectives.plan._targets import TARGETS

DEFAULT_DEVICES = 8


def _device_options() -> argparse.ArgumentParser:
    parent = _args.Parser(add_help=False)
    parent.add_argument(
        "--devices", type=_args.devices, default=DEFAULT_DEVICES, metavar="N",
        help=f"simulated CPU devices, 1 to {_args.MAX_CPU_DEVICES} (default: "
             "%(default)s; JAX_NUM_CPU_DEVICES does not change it); ignored "
             "where JAX runs on accelerators")
    parent.add_argument(
        "--x64", action="store_true", help="enable 64-bit types (jax_enable_x64)")
    return parent


def _setup(args: argparse.Namespace) -> None:
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dtypes = getattr(args, "dtype", None) or ()
    for name in [dtypes] if isinstance(dtypes, str) else dtypes:
        twin = narrowed(name)
        if twin:
            raise _args.Refused(
                f"--dtype {name}: JAX computes it as {twin} while 64-bit types "
                f"are off. Fix: add --x64 (or set JAX_ENABLE_X64=1), or use {twin}.")
    use_cpu_devices(args.devices)
    mesh = getattr(args, "mesh", None)
    needed = math.prod(mesh) if mesh else 0
    if needed > jax.device_count():
        fix = (f"pass --devices {needed}" if jax.default_backend() == "cpu"
               else "use a mesh of at most the devices this machine has")
        raise _args.Refused(
            f"--mesh {'x'.join(map(str, mesh))}: needs {needed} devices, "
            f"there are {jax.device_count()}. Fix: {fix}, or a smaller mesh.")


def cmd_list(args: argparse.Namespace) -> int:
    width = max(map(len, RECIPES))
    for name, recipe in RECIPES.items():
        print(f"{name:<{width}}  {recipe.summary}")
    return 0


def _lookup(name: str):
    if name not in RECIPES:
        print(f"error: {no_recipe(name)}", file=sys.stderr)
        return None
    return RECIPES[name]


def _show_diagram(name: str) -> None:
    """The before/after grid of a core collective, as comment lines."""
    if name not in diagram_names():
        return
    try:
        text = diagram(name).text()
    except ValueError as error:  # e.g. fewer than 4 devices on an accelerator
        text = f"(no diagram: {error})"
    print("\n".join(f"# {line}".rstrip() for line in text.splitlines()) + "\n")


def cmd_show(args: argparse.Namespace) -> int:
    recipe = _lookup(args.name)
    if recipe is None:
        return 2
    if args.target or args.topology:  # compiled for devices that are not here
        if args.hlo_text:
            raise _args.Refused(
                "--hlo-text: not with --target or --topology (the target's program "
                "is read in a child process, which reports each op, not its text). "
                "Fix: drop --hlo-text.")
        shape = args.mesh or (args.devices,)
        try:
            print(target_view(recipe, shape, MESH_NAMES[:len(shape)],
                              axis_from_args(args), target=args.target,
                              topology=args.topology))
        except ValueError as err:  # no compiler, or a mesh it has no topology of
            raise _args.Refused(str(err)) from None
        return 0
    _setup(args)
    if args.hlo or args.hlo_text:
        shape = args.mesh or (args.devices,)
        print(compiled_view(recipe, shape, MESH_NAMES[:len(shape)],
                            axis_from_args(args), hlo_text=args.hlo_text))
        return 0
    _show_diagram(recipe.name)
    print(f"# {recipe.name}: {recipe.summary}\n")
    for label, fn in (("per-shard body (pmap and shard_map forms)", recipe.body),
                      ("global program (jit form)", recipe.program),
                      ("NumPy oracle", recipe.oracle)):
        fn = inspect.unwrap(fn)
        where = Path(inspect.getsourcefile(fn) or "?")
        print(f"# -- {label}: {fn.__name__} in {where.parent.name}/{where.name} --")
        print(inspect.getsource(fn))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if _lookup(args.name) is None:
        return 2
    _setup(args)
    try:
        print_run(args)
    except (KeyError, ValueError) as err:  # e.g. an axis the mesh lacks
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    _setup(args)
    try:
        check_arguments(args)  # before the devices start
        rows = print_check(args)
    except (KeyError, ValueError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    except KernelTimeout as err:  # starved of threads: nothing more runs here
        print(f"KernelTimeout: {err}", file=sys.stderr)
        return 1
    if args.json:
        write_check_json(rows, args.json)
    return 0 if rows and all(row.ok for row in rows) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    _setup(args)
    return bench.main(args)


def cmd_plan(args: argparse.Namespace) -> int:
    return plan_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _args.Parser(
        prog="python -m collectives",
        description="JAX collectives in pmap, shard_map and jit form, checked "
                    "against NumPy.")
    sub = parser.add_subparsers(dest="command", required=True)
    devices = _device_options()

    p = sub.add_parser("list", help="recipe names, one line each")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", parents=[devices],
                       help="what a collective does to the shards (a grid), and "
                            "the recipe's source for copy-paste; with --hlo, what "
                            "its forms compile to")
    p.add_argument("name")
    p.add_argument("--hlo", action="store_true",
                   help="the collectives each placed form compiles to (kind, axes, "
                        "bytes) beside the recipe's cost model, instead of the source")
    p.add_argument("--hlo-text", action="store_true",
                   help="with --hlo: each collective's HLO instruction too")
    p.add_argument("--target", choices=tuple(TARGETS),
                   help="with --hlo: compile with the target's own compiler, "
                        "without the hardware (h100: XLA:GPU; v5p, v5e, v6e: the "
                        "TPU compiler), for its topology of as many devices as "
                        "the mesh; needs the target extra")
    p.add_argument("--topology", metavar="NAME",
                   help="with --hlo: compile with the TPU compiler for this "
                        "topology, e.g. v5p:4x4x4 (as many devices as the mesh)")
    add_mesh_arguments(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("run", parents=[devices],
                       help="run one recipe in every form on small integer data")
    add_run_arguments(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", parents=[devices],
                       help="every recipe in every form vs the NumPy oracle")
    add_check_arguments(p)
    p.add_argument("--json", metavar="FILE", type=_args.output_file,
                   help="also write the rows and the JAX version to FILE as JSON "
                   "(- : standard output, the table then on stderr)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "bench", parents=[devices],
        help="nccl-tests-style benchmark of every collective in every form",
        description="Time collectives over a size sweep (-b 1K -e 4M -f 4) in "
                    "each form, with algbw, busbw, a same-run copy as the limit "
                    "and #wrong against the NumPy oracle.")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "plan", help="each strategy's collectives, bytes, memory and predicted "
                     "time per step at up to 2048 devices, compile only",
        description="Compile one unit of each parallelism strategy for the mesh "
                    "(simulated CPU devices, abstract inputs) and report per "
                    "device and training step: collectives, bytes sent, memory "
                    "and communication time on an interconnect profile.")
    add_plan_arguments(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "launch", help="run check, a recipe or a script in N local processes "
                       "joined by JAX's distributed runtime",
        description="e.g. launch -n 2 --devices-per-process 4 -- check")
    add_launch_arguments(p)
    p.set_defaults(func=run_launch_command)
    add_worker_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _interrupt.during_command(args.command):
            _args.one_output_each(args)
            with _args.tables_to_stderr(args):
                return args.func(args)
    except BrokenPipeError:  # e.g. `python -m collectives list | head`
        sys.stderr.close()
        return 0
    except _args.Refused as err:
        print(f"python -m collectives {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if "Unable to initialize backend" not in str(err):
            raise
        # JAX_PLATFORMS names a backend this machine cannot start
        print(f"python -m collectives {args.command}: error: JAX_PLATFORMS="
              f"{os.environ.get('JAX_PLATFORMS', '')!r}: {str(err).splitlines()[0]} "
              "Fix: unset JAX_PLATFORMS, or name a backend this machine has (cpu).",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback
        print(f"\n{args.command}: interrupted", file=sys.stderr)
        return 130
