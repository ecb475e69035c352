"""``python -m collectives plan``: the flags and what the command prints."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from collectives import _args
from collectives._facts.pipeline import SCHEDULES
from collectives._registry import RECIPES
from collectives.plan import _book as book
from collectives.plan._model import DEFAULT_MODEL
from collectives.plan._model import MODELS
from collectives.plan._model import Model
from collectives.plan._model import model_from
from collectives.plan._plan import MAX_DEVICES
from collectives.plan._plan import PRECISIONS
from collectives.plan._plan import Plan
from collectives.plan._plan import default_mesh
from collectives.plan._plan import fitting
from collectives.plan._plan import plan
from collectives.plan._plan import planned_recipes
from collectives.plan._profiles import MEASURED
from collectives.plan._profiles import Profile
from collectives.plan._profiles import load_profiles
from collectives.plan._profiles import measured_profile
from collectives.plan._report import crossovers
from collectives.plan._report import duration
from collectives.plan._report import fits
from collectives.plan._report import mesh_text
from collectives.plan._report import plot
from collectives.plan._report import size
from collectives.plan._report import table_lines
from collectives.plan._targets import TARGETS
from collectives.plan._targets import target_of_topology
from collectives.plan._versus import table_lines as versus_lines
from collectives.plan._versus import versus_bench

SEARCH_MODEL_AXES = (2, 4, 8, 16, 32, 64)
"""The model-axis sizes ``plan --search`` tries (a pipeline or ring compiles
one step per device along that axis: longer ones take minutes)."""
BOOK_TOLERANCE = 0.10
"""How far ``plan --scaling-book`` lets a threshold stray from the book's
before it exits 1 (each difference is named beside the table)."""
DATACENTER = "dgx-h100"
"""The default interconnect: a cluster of DGX H100 nodes."""
DATACENTER_TEXT = ("nvlink-h100 on the last axis where it has 8 devices or fewer "
                   "(one node), ib-ndr on every other axis")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` flags."""
    parser.add_argument(
        "--devices", nargs="+", default=[MAX_DEVICES], metavar="N",
        type=_args.whole("a device count of 1 or more", low=1),
        help=f"device counts to plan for, each a mesh data x model with 8 on "
        f"model (default: {MAX_DEVICES}; at most {MAX_DEVICES}); several make a "
        "sweep")
    parser.add_argument(
        "--mesh", metavar="AXIS=SIZE,...", type=_mesh_arg,
        help="the mesh instead of --devices, e.g. data=256,model=8 (one or two "
        "axes; strategies over one axis run over the last)")
    parser.add_argument(
        "--model", nargs="+", default=[DEFAULT_MODEL], metavar="NAME",
        help=f"model sizes: {', '.join(MODELS)} (default: {DEFAULT_MODEL}); the "
        "flags below change a field of each")
    for field, what in (("width", "model width"), ("layers", "layers"),
                        ("seq", "tokens per sequence"),
                        ("batch", "sequences per step"), ("heads", "attention heads"),
                        ("ffn", "an expert's hidden width")):
        parser.add_argument(f"--{field}", metavar="N", help=what,
                            type=_args.whole("a whole number of 1 or more", low=1))
    parser.add_argument("--dtype", type=_args.dtype,
                        help="parameters' and activations' dtype "
                        "(default: bfloat16)")
    parser.add_argument(
        "--interconnect", metavar="PROFILE|AXIS=PROFILE,...",
        help=f"the interconnect profile of every axis, or one per axis (e.g. "
        f"model=nvlink-h100,data=ib-ndr); default: {DATACENTER} ({DATACENTER_TEXT}); "
        f"{MEASURED}: bench's fit on this machine; --list-profiles shows the "
        "others")
    _choice(parser, "--precision", PRECISIONS, "mixed",
            "how weights, gradients and Adam's moments are kept")
    parser.add_argument("--profiles", action="append", default=[], metavar="FILE",
                        help="add named profiles from a TOML or JSON file")
    parser.add_argument("--list-profiles", action="store_true",
                        help="print the named profiles with their sources and exit")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure the 'measured' profile again (else cached)")
    parser.add_argument(
        "--target", choices=tuple(TARGETS),
        help="compile with the target's own compiler, without the hardware: "
        "h100 with XLA:GPU, v5p, v5e or v6e with the TPU compiler, for its "
        "topology of as many devices as the mesh (needs pip install "
        "'jax[tpu,cuda12-local]', the target extra); the collectives, bytes and "
        "memory are then its program's")
    parser.add_argument(
        "--topology", metavar="NAME",
        help="compile with the TPU compiler for this TPU topology, e.g. "
        "v5p:8x16x16 (as many devices as the mesh; needs pip install "
        "'jax[tpu,cuda12-local]', no TPU)")
    parser.add_argument(
        "--microbatches", metavar="M", type=_args.whole("a whole number of 1 or more",
                                                        low=1),
        help="the pipeline's microbatches (default: the recipe's, 4): its bubble "
        "is (S - 1) / (M + S - 1) of a stage's ticks")
    _choice(parser, "--schedule", SCHEDULES, "gpipe", "the pipeline's schedule")
    parser.add_argument("--form", choices=("shard_map", "jit"), default="shard_map",
                        help="the form compiled (default: %(default)s)")
    parser.add_argument("-s", "--strategies", nargs="+", metavar="NAME",
                        help="strategies to plan, by label (FSDP) or recipe "
                        "(fsdp_mlp); default: all")
    parser.add_argument("--memory-per-device", type=_gigabytes, metavar="GB",
                        help="device memory in GB (1e9 bytes), e.g. 80: the "
                        "crossovers then name the strategies that fit")
    parser.add_argument(
        "--versus-bench", action="store_true",
        help="also time each strategy's collectives with bench on this machine "
        "and compare with the prediction (a 1-D --mesh, the measured profile; "
        "e.g. --mesh data=8 --model laptop)")
    parser.add_argument(
        "--search", action="store_true",
        help="plan every data x model split of one --devices count (model axes "
        f"of {', '.join(map(str, SEARCH_MODEL_AXES))} devices) and rank the "
        "whole-model strategies that fit --memory-per-device by predicted step "
        "time")
    parser.add_argument(
        "--scaling-book", action="store_true",
        help="reproduce the scaling book's critical batch sizes (part 5, TPU "
        "v5p) from compiled programs and print them beside the book's; exits 1 "
        f"where one differs by more than {BOOK_TOLERANCE * 100:.0f} %% from the "
        "book's "
        "formula counted the plan's way")
    parser.add_argument("--json", metavar="FILE", type=_args.output_file,
                        help="write the plans as JSON (- : standard output, "
                        "the table then on stderr)")
    parser.add_argument("--plot", metavar="FILE", type=_args.plot_file,
                        help="draw step time and memory against devices, "
                        "to FILE for a desktop's column and to NAME.narrow.EXT "
                        "beside it for a phone's (needs the bench extra)")
    parser.add_argument("--timeout", type=_args.real("a positive number", above=0),
                        default=600, metavar="SECONDS",
                        help="limit for compiling one mesh (default: %(default)s)")


def _choice(parser: argparse.ArgumentParser, flag: str,
            choices: Mapping[str, str], default: str, what: str) -> None:
    """A flag of named choices, each explained in its help."""
    parser.add_argument(
        flag, choices=tuple(choices), default=default,
        help=f"{what}: " + "; ".join(f"{name}: {text}"
                                     for name, text in choices.items())
        + " (default: %(default)s)")


def _gigabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of GB (1e9 bytes), e.g. 80, got {text!r}")
    return value * 1e9


def _mesh_arg(text: str) -> dict[str, int]:
    try:
        return parse_mesh(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_mesh(text: str) -> dict[str, int]:
    """``data=256,model=8`` -> ``{"data": 256, "model": 8}``.

    Raises:
      ValueError: not of that form.
    """
    mesh = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip().isdigit():
            raise ValueError(f"{text!r}: expected AXIS=SIZE,... (e.g. "
                             "data=256,model=8).")
        if name.strip() in mesh:
            raise ValueError(f"{text!r}: axis {name.strip()!r} is named twice. "
                             "Fix: name each axis once, e.g. data=8,model=4.")
        if int(value) < 1:
            raise ValueError(f"{text!r}: axis {name.strip()!r} has size "
                             f"{int(value)}. Fix: every axis has 1 device or more.")
        mesh[name.strip()] = int(value)
    return mesh


def interconnect_for(text: str, mesh: Mapping[str, int], profiles: dict[str, Profile],
                     remeasure: bool = False) -> dict[str, Profile]:
    """One profile per mesh axis from ``--interconnect``.

    Raises:
      ValueError: an unknown profile name, or axes that are not the mesh's.
    """
    axes = list(mesh)
    if text == DATACENTER:
        inner = axes[-1]
        chosen = {axis: "nvlink-h100" if axis == inner and mesh[axis] <= 8
                  else "ib-ndr" for axis in axes}
    elif "=" in text:
        chosen = {}
        for part in text.split(","):
            axis, _, name = part.partition("=")
            chosen[axis.strip()] = name.strip()
        if set(chosen) != set(axes):
            raise ValueError(f"--interconnect: names axes {sorted(chosen)}, the mesh "
                             f"has {list(axes)}. Fix: give a profile for every axis, "
                             "or one name for all.")
    else:
        chosen = dict.fromkeys(axes, text.strip())
    known = [DATACENTER, MEASURED, *profiles]
    out = {}
    for axis, name in chosen.items():
        if name == MEASURED:
            out[axis] = measured_profile(remeasure=remeasure, log=sys.stderr)
        elif name in profiles:
            out[axis] = profiles[name]
        else:
            raise ValueError(f"--interconnect: unknown profile {name!r}; known: "
                             f"{', '.join(known)}. Fix: pick one, or add yours with "
                             "--profiles FILE.")
    return {axis: out[axis] for axis in axes}  # in the mesh's order


def _strategies(wanted: Sequence[str] | None) -> list[str]:
    names = planned_recipes()
    if not wanted:
        return names
    by_label = {RECIPES[n].plan.label.lower(): n for n in names}
    chosen = []
    for item in wanted:
        name = item if item in names else by_label.get(item.lower())
        if name is None:
            raise ValueError(
                f"--strategies: unknown {item!r}; expected one of "
                f"{', '.join(RECIPES[n].plan.label for n in names)} (or their "
                f"recipes: {', '.join(names)}).")
        chosen.append(name)
    return chosen


def list_profiles(profiles: dict[str, Profile]) -> None:
    print(f"{DATACENTER}: the default: {DATACENTER_TEXT}")
    print(f"{MEASURED}: this machine, measured by bench's alpha-beta fit per "
          "collective kind and a matmul's FLOP/s (cached after the first plan)")
    for name, p in profiles.items():
        peaks = ", ".join(f"{dtype} {flops / 1e12:g}"
                          for dtype, flops in p.peak_flops.items()) or "none"
        print(f"{name}: {p.description}; alpha {p.link.alpha * 1e6:g} us, busbw "
              f"{p.link.busbw / 1e9:g} GB/s; {p.chip or 'no chip'}, peak TFLOP/s: "
              f"{peaks}\n    source: {p.source}\n    peak: {p.peak_source}")


def main(args: argparse.Namespace) -> int:
    """Run ``plan`` with parsed arguments."""
    try:
        return _main(args)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    profiles = load_profiles(*args.profiles)
    if args.list_profiles:
        list_profiles(profiles)
        return 0
    if args.scaling_book:
        return _scaling_book(args)
    wanted = request(args, profiles)
    return report(wanted, plans(wanted))


@dataclasses.dataclass(frozen=True)
class Request:
    """One ``plan`` command, read from its flags once: what to plan on which
    meshes and networks (``links[i]`` for ``meshes[i]``), with which options,
    and where the report goes. Everything a flag can get wrong is refused
    while it is built, before any compile."""

    models: tuple[Model, ...]
    meshes: tuple[dict[str, int], ...]
    links: tuple[dict[str, Profile], ...]
    recipes: tuple[str, ...]
    options: dict[str, Any]
    search: bool = False
    memory: float | None = None
    versus_bench: bool = False
    json: str | None = None
    plot: str | None = None


def request(args: argparse.Namespace, profiles: dict[str, Profile]) -> Request:
    """The :class:`Request` that ``args`` (parsed flags) make.

    Raises:
      ValueError: a flag's value, or flags that contradict each other.
    """
    compiled_here = not (args.topology or args.target)
    for n in args.devices if not args.mesh and compiled_here else ():
        if n > MAX_DEVICES:
            raise ValueError(f"--devices: {n}; at most {MAX_DEVICES} (XLA's CPU "
                             "client refuses more).")
    if args.versus_bench and args.interconnect not in (None, MEASURED):
        raise ValueError("--versus-bench: compares bench's times here with the "
                         "measured profile; drop --interconnect.")
    interconnect = args.interconnect or (MEASURED if args.versus_bench
                                         else _target_interconnect(args))
    overrides = {f: getattr(args, f) for f in
                 ("width", "layers", "seq", "batch", "heads", "ffn", "dtype")}
    models = tuple(model_from(name, **overrides) for name in args.model)
    recipes = _strategies(args.strategies)
    options = {"form": args.form, "topology": args.topology, "target": args.target,
               "precision": args.precision, "schedule": args.schedule,
               "microbatches": args.microbatches, "timeout": args.timeout}
    outputs = {"memory": args.memory_per_device, "json": args.json}
    if args.search:
        meshes = _search_meshes(args)
        # a strategy over every axis plans alike on each split: only those
        # that use the model axis are searched
        return Request(models, meshes, tuple(
            interconnect_for(interconnect, mesh, profiles, args.remeasure)
            for mesh in meshes),
            tuple(n for n in recipes if RECIPES[n].plan.scope == "model"),
            options, search=True, **outputs)
    meshes = ((args.mesh,) if args.mesh else
              tuple(dict(zip(*default_mesh(n), strict=True)) for n in args.devices))
    # --mesh gives one mesh; --devices gives data x model meshes: one set of
    # axis names, so one interconnect serves every plan of the run
    links = interconnect_for(interconnect, meshes[0], profiles, args.remeasure)
    return Request(models, meshes, (links,) * len(meshes), tuple(recipes), options,
                   versus_bench=args.versus_bench, plot=args.plot, **outputs)


def _search_meshes(args: argparse.Namespace) -> tuple[dict[str, int], ...]:
    """``plan --search``'s meshes: every data x model split of its devices."""
    if args.mesh or len(args.devices) != 1:
        raise ValueError("--search: give one --devices N (it tries every data x "
                         "model split of them), not --mesh or several counts.")
    devices = args.devices[0]
    splits = [m for m in SEARCH_MODEL_AXES if devices % m == 0 and m < devices]
    if not splits:
        raise ValueError(f"--search: {devices} devices have no model axis of "
                         f"{', '.join(map(str, SEARCH_MODEL_AXES))} with data "
                         "beside it. Fix: pick a device count divisible by 4 or "
                         "more.")
    return tuple({"data": devices // m, "model": m} for m in splits)


def plans(wanted: Request) -> list[Plan]:
    """Every model on every mesh of ``wanted``, planned; each plan's table
    printed as it is made (not for a search, which ranks them all at the
    end)."""
    out: list[Plan] = []
    for model in wanted.models:
        for mesh, links in zip(wanted.meshes, wanted.links, strict=True):
            out.append(plan(model, mesh, interconnect=links,
                            recipes=list(wanted.recipes), **wanted.options))
            if not wanted.search:
                if len(out) > 1:
                    print()
                print("\n".join(table_lines(out[-1])), flush=True)
    return out


def report(wanted: Request, made: Sequence[Plan]) -> int:
    """What ``plan`` prints and writes after its plans: the search's ranking,
    or the crossovers, the comparison with bench; the JSON and the plot. The
    exit status: 1 where a cost model differs from XLA:CPU's program."""
    versus = []
    if wanted.search:
        for line in search_lines(made, wanted.memory):
            print(line)
    else:
        if len(made) > 1 or wanted.memory:
            print()
            if wanted.memory:
                print(f"# which strategy has the fastest predicted step among "
                      f"those whose step fits in {size(wanted.memory)} per device:")
            for line in crossovers(made, wanted.memory):
                print(line)
        for p in made if wanted.versus_bench else ():
            mine = versus_bench(p)
            versus.append(mine)
            print(f"\n# {p.model.name} on {mesh_text(p.mesh)}: per compiled unit, "
                  "predicted (measured profile) and measured by bench here")
            print("\n".join(versus_lines(mine)))
    if wanted.json:
        _args.write_text_atomic(wanted.json, json.dumps(
            _doc(made) | ({"versus_bench": versus} if versus else {}), indent=1))
    if wanted.plot:
        plot(made, wanted.plot, wanted.memory)
    if wanted.search:
        return 0
    # a cost model that differs from XLA:CPU's program is a bug to fix; the
    # TPU compiler's own choices (combined, all-reduce-based gathers) are news
    bad = [row for p in made for row in p.rows if row.cost_model and not row.skipped
           and p.compiler.startswith("XLA:CPU")]
    return 1 if bad else 0


def _target_interconnect(args: argparse.Namespace) -> str:
    """The default interconnect: the target's own network, else a DGX H100
    cluster's."""
    target = (target_of_topology(args.topology) if args.topology
              else TARGETS.get(args.target or ""))
    if target is None:
        return DATACENTER
    if target.interconnect is None:
        raise ValueError(
            f"--target {target.name}: no interconnect profile for {target.chip} "
            "ships. Fix: give --interconnect with a profile of yours (--profiles "
            "FILE; --list-profiles shows the fields).")
    return target.interconnect


def search_lines(plans: Sequence[Plan], memory: float | None) -> list[str]:
    """The ranking of ``plan --search``, per model: every planned (strategy,
    mesh), each run the fastest way that fits ``memory`` (as planned, with
    its layers rematerialized, its gradients accumulated over microbatches:
    :func:`collectives.plan._plan.fitting`), by predicted step time; those
    that fit no way last, by the least memory they need."""
    out = []
    for name in dict.fromkeys(p.model.name for p in plans):
        rows, seen = [], set()
        for p in (p for p in plans if p.model.name == name):
            for row in p.rows:
                # a strategy over every axis plans alike on each split
                same = (row.label, row.step_s, row.memory_bytes)
                if not row.skipped and same not in seen:
                    seen.add(same)
                    rows.append((fitting(p, row, memory), p))
        ranked = sorted(rows, key=lambda rp: (
            not fits(rp[0], memory),
            rp[0].step_s if fits(rp[0], memory) else rp[0].memory_bytes))
        limit = f" in {size(memory)} per device" if memory else ""
        out.append(f"# {rows[0][1].model.describe() if rows else name}")
        out.append(f"{'rank':>4s}  {'strategy':10s}  {'mesh':22s}  {'run as':22s}  "
                   f"{'step':>9s}  {'MFU':>4s}  {'memory':>9s}  fits{limit}")
        for i, (row, p) in enumerate(ranked, 1):
            mfu = "-" if row.mfu is None else f"{row.mfu:.0%}"
            out.append(f"{i:4d}  {row.label:10s}  {mesh_text(p.mesh):22s}  "
                       f"{run_as(row):22s}  {duration(row.step_s):>9s}  {mfu:>4s}  "
                       f"{size(row.memory_bytes):>9s}  "
                       f"{'yes' if fits(row, memory) else 'no'}")
        best = next((rp for rp in ranked if fits(rp[0], memory)), None)
        out.append(f"{name}: best: {best[0].label} on {mesh_text(best[1].mesh)}, "
                   f"{duration(best[0].step_s)} a step" if best else
                   f"{name}: nothing fits{limit}")
    return out


def run_as(row: Any) -> str:
    """How a searched row's step runs: its microbatches and remat."""
    parts = [f"{row.accumulation} microbatches" if row.accumulation > 1
             else "one batch"]
    if row.remat:
        parts.append("remat")
    return ", ".join(parts)


def _scaling_book(args: argparse.Namespace) -> int:
    found = book.cases(timeout=args.timeout)
    print("\n".join(book.table_lines(found)))
    if args.json:
        _args.write_text_atomic(args.json, json.dumps(book.as_json(found), indent=1))
    off = [c.name for c in found if abs(c.ratio - 1) > BOOK_TOLERANCE]
    if off:
        print(f"# more than {BOOK_TOLERANCE:.0%} from the book's formula: "
              f"{', '.join(off)}")
    return 1 if off else 0


def _doc(plans: Sequence[Plan]) -> dict[str, Any]:
    return {"plans": [p.as_json() for p in plans],
            "devices": [math.prod(p.mesh.values()) for p in plans]}
