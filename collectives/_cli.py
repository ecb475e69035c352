"""``python -m collectives``: list, show, run and check the recipes."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence

import numpy as np

DEFAULT_DEVICES = 8


def _parse_mesh(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mesh {text!r}: expected sizes joined by 'x', e.g. 8 or 4x2") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--mesh {text!r}: sizes must be >= 1")
    return shape


def _device_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--devices", type=int, default=DEFAULT_DEVICES, metavar="N",
        help="simulated CPU devices (default: %(default)s); ignored where JAX "
             "runs on accelerators")
    parent.add_argument(
        "--x64", action="store_true", help="enable 64-bit types (jax_enable_x64)")
    return parent


def _setup(args: argparse.Namespace) -> None:
    import jax

    from collectives import use_cpu_devices

    if args.x64:
        jax.config.update("jax_enable_x64", True)
    use_cpu_devices(args.devices)


def _mesh_names(shape: tuple[int, ...]) -> tuple[str, ...]:
    return ("i", "j", "k", "l")[: len(shape)]


def cmd_list(args: argparse.Namespace) -> int:
    from collectives import RECIPES

    width = max(map(len, RECIPES))
    for name, recipe in RECIPES.items():
        print(f"{name:<{width}}  {recipe.summary}")
    return 0


def _lookup(name: str):
    from collectives import RECIPES

    if name not in RECIPES:
        print(f"error: no recipe named {name!r}. Known recipes: "
              f"{', '.join(RECIPES)}", file=sys.stderr)
        return None
    return RECIPES[name]


def cmd_show(args: argparse.Namespace) -> int:
    recipe = _lookup(args.name)
    if recipe is None:
        return 2
    print(f"# {recipe.name}: {recipe.summary}\n")
    for label, fn in (("per-shard body (pmap and shard_map forms)", recipe.body),
                      ("global program (jit form)", recipe.program),
                      ("NumPy oracle", recipe.oracle)):
        print(f"# -- {label} --")
        print(inspect.getsource(fn))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _setup(args)
    from collectives import make_mesh

    recipe = _lookup(args.name)
    if recipe is None:
        return 2
    shape = args.mesh or (args.devices,)
    mesh = make_mesh(shape, _mesh_names(shape))
    axis = tuple(args.axis.split(",")) if args.axis else None
    inputs = recipe.example_args(mesh, axis, dtype=args.dtype, exact=True)
    np.set_printoptions(linewidth=100, threshold=200)
    for name, value in zip(recipe.arg_names, inputs, strict=True):
        print(f"{name} =\n{value}\n")
    import jax

    for form, fn in recipe.forms(mesh=mesh, axis=axis).items():
        print(f"{form}:\n{jax.tree_util.tree_map(np.asarray, fn(*inputs))}\n")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    _setup(args)
    from collectives._check import check
    from collectives._check import standard_configs

    configs = None
    if args.mesh:
        names = _mesh_names(args.mesh)
        axis = tuple(args.axis.split(",")) if args.axis else None
        configs = [(args.mesh, names, axis)]
    header = (f"{'recipe':<22} {'mesh':<5} {'axis':<5} {'dtype':<9} "
              f"{'forms':<26} {'max error':>10}  status")
    print(header)
    print("-" * len(header))

    def show(row) -> None:
        forms = "+".join(f for f in row.forms if f != "reference") or "-"
        print(f"{row.recipe:<22} {row.mesh:<5} {row.axis:<5} {row.dtype:<9} "
              f"{forms:<26} {row.max_error:>10.3g}  {'ok' if row.ok else 'FAIL'}",
              flush=True)

    rows = check(args.names or None, dtypes=args.dtype, progress=show,
                 configs=configs or standard_configs())
    failed = [row for row in rows if not row.ok]
    print("-" * len(header))
    print(f"{len(rows) - len(failed)} agree, {len(failed)} disagree "
          "(each form vs the NumPy oracle and vs the pmap form)")
    for row in failed:
        print(f"\nFAIL {row.recipe} mesh={row.mesh} axis={row.axis} "
              f"dtype={row.dtype}:\n{row.detail}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m collectives",
        description="JAX collectives in pmap, shard_map and jit form, checked "
                    "against NumPy.")
    sub = parser.add_subparsers(dest="command", required=True)
    devices = _device_options()

    p = sub.add_parser("list", help="recipe names, one line each")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="print a recipe's source for copy-paste")
    p.add_argument("name")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("run", parents=[devices],
                       help="run one recipe in every form on small integer data")
    p.add_argument("name")
    p.add_argument("--mesh", type=_parse_mesh, help="mesh shape, e.g. 8 or 4x2")
    p.add_argument("--axis", help="collective axes, e.g. i or i,j (default: all)")
    p.add_argument("--dtype", default="int32")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", parents=[devices],
                       help="every recipe in every form vs the NumPy oracle")
    p.add_argument("names", nargs="*", help="recipes to check (default: all)")
    p.add_argument("--dtype", nargs="+", default=["float32"],
                   help="input dtypes (default: float32)")
    p.add_argument("--mesh", type=_parse_mesh,
                   help="one mesh shape instead of the standard set")
    p.add_argument("--axis", help="with --mesh: collective axes, e.g. i,j")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
