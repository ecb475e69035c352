"""The kernel family's page, computed at build time from the kernels themselves.

* ``{kernel-recipes}``: for every recipe with ``family == "kernel"``, in
  registry order, a section with its summary, its per-device body (the
  recipe file's ``body`` region, else its ``shard_map`` region, included
  from the file), its step
  diagram (a real interpret-mode run, recorded by
  :func:`collectives._kernel_trace.record`, drawn by
  :mod:`collectives._kernel_trace_plot`, written as SVG to
  ``_generated/kernels/``) and its cost next to the ``lax`` collective's.
* ``{kernel-costs}``: the same costs as one table: the ``lax`` collective's
  HLO op and bytes per device (its cost model), the kernel's steps and
  bytes (its facts module's ``dma_cost``), and what the recording counted.
  A recording whose bytes a device disagree with ``dma_cost`` is a build
  warning (its steps may differ: ``dma_cost`` counts a kernel whose DMAs all
  fly at once as one step a DMA).
* ``{kernel-planted-bugs}``: ``tests/test_kernel_bugs.py``'s ``PLANTED``
  and ``NOT_CAUGHT``, read with ``ast`` (the test is the table's source).
* ``{kernel-timeout-message}``: the message a hung kernel raises.

Each kernel is recorded and drawn once per build process (``_TRACES``).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import textwrap
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

N_DEVICES = 8
DIMS = (4, 128)  # each device's block: float32[4, 128], 2 KiB
BUGS_FILE = Path(__file__).resolve().parents[2] / "tests" / "test_kernel_bugs.py"

_TRACES: dict[str, Any] = {}  # name -> KernelTrace, recorded and drawn once


def kernel_names() -> list[str]:
    """Every kernel recipe, in registry order."""
    import collectives as cx
    return [name for name, recipe in cx.RECIPES.items() if recipe.family == "kernel"]


def trace(name: str, srcdir: str | Path) -> tuple[Any, str]:
    """Record kernel ``name`` once per build and draw it for both columns;
    the trace and its image URI (from the source root)."""
    from collectives import _kernel_trace
    from collectives import _kernel_trace_plot

    if name not in _TRACES:
        out = Path(srcdir) / "_generated" / "kernels"
        out.mkdir(parents=True, exist_ok=True)
        recorded = _kernel_trace.record(name, dims=DIMS)
        _kernel_trace_plot.save(recorded, out / f"{name}.svg")
        _TRACES[name] = recorded
    return _TRACES[name], f"/_generated/kernels/{name}.svg"


def dma_cost_function(name: str) -> Any:
    """The ``dma_cost`` of the facts module that registers kernel ``name``
    (``collectives._facts.<file>``, named like the recipe file):
    ``NAME_dma_cost`` where a module registers several kernels, else
    ``dma_cost``."""
    from collectives import RECIPES

    stem = Path(RECIPES[name].recipe_file).stem
    module = importlib.import_module(f"collectives._facts.{stem}")
    found = getattr(module, f"{name}_dma_cost", None) or getattr(
        module, "dma_cost", None)
    if found is None:
        raise LookupError(f"kernel recipe {name!r}: no dma_cost in "
                          f"collectives/_facts/{stem}.py")
    return found


def lax_recipe(name: str) -> Any:
    """The recipe of the ``lax`` collective kernel ``name`` implements, by
    name (``kernel_X`` or ``kernel_X_bidirectional``: ``X``, else
    ``X_ring``), or None; the table then shows the kernel's jit form's
    collective (the same global program)."""
    import collectives as cx

    stem = name.removeprefix("kernel_").removesuffix("_bidirectional")
    for candidate in (stem, f"{stem}_ring"):
        found = cx.RECIPES.get(candidate)
        if found is not None and found.family != "kernel":
            return found
    return None


def _literal(node: ast.AST, names: dict[str, Any] | None = None) -> Any:
    """``ast.literal_eval`` that also joins and repeats strings (``" " * 8 +
    "x"``), as the planted-bug table writes indented lines, and reads the
    ``names`` given (constants the file defines earlier)."""
    names = names or {}
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _literal(node.left, names), _literal(node.right, names)
        return left + right if isinstance(node.op, ast.Add) else left * right
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(item, names) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        return {_literal(k, names): _literal(v, names)
                for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def size_text(n_bytes: float) -> str:
    from collectives._kernel_trace_plot import size_text as text
    return text(n_bytes)


def costs(name: str, srcdir: str | Path) -> dict[str, str]:
    """Kernel ``name``'s costs on :data:`N_DEVICES` devices and blocks of
    :data:`DIMS`, as the table writes them."""
    import collectives as cx

    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((N_DEVICES,), "i")
    axes = recipe.axes(mesh, "i")
    args = recipe.example_args(mesh, "i", dims=DIMS, exact=True)
    native = lax_recipe(name)
    lax = (native.expected_costs("shard_map", axes, args)[0] if native is not None
           else recipe.expected_costs("jit", axes, args)[0])
    lax_text = "; ".join(
        f"{kind}: {size_text(lax.bytes[kind])}" if kind in lax.bytes else kind
        for kind, count in lax.counts.items() if count) or "none"
    model = dma_cost_function(name)(axes, args)
    recorded, _ = trace(name, srcdir)
    remote = recorded.remote_dmas()
    devices = range(recorded.n_devices)
    sent = {sum(d.bytes for d in remote if d.device == device) for device in devices}
    count = {sum(d.device == device for d in remote) for device in devices}
    rounds = {len({d.step for d in remote if d.device == device})
              for device in devices}
    if max(sent) != model.sent:
        logger.warning(
            f"kernel-costs: {name}: the recorded run sent {max(sent):,} bytes from "
            f"one device; dma_cost says {model.sent:,.0f}")
    recorded_text = (f"{_counted(max(count), 'remote DMA')} in "
                     f"{_counted(max(rounds), 'step')}, {size_text(max(sent))} "
                     + ("a device" if len(sent) == 1 else "from the busiest device"))
    return {
        "kernel": name,
        "lax": lax_text,
        "model": (f"{model.steps} x {size_text(model.bytes_per_step)} = "
                  f"{size_text(model.sent)}"),
        "recorded": recorded_text,
    }


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _table(header: list[str], rows: list[list[str]], code: tuple[int, ...] = (0,)
           ) -> nodes.table:
    table = nodes.table(classes=["collective-costs"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    for cells, part, is_head in ((header, head, True),
                                 *((row, body, False) for row in rows)):
        row = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            for line in text.split("\n"):  # (a line break: a paragraph a line)
                para = nodes.paragraph()
                para += (nodes.literal(line, line) if i in code and not is_head
                         else nodes.Text(line))
                entry += para
            row += entry
        part += row
    return table


COST_HEADER = ["kernel", "lax collective: HLO op, bytes per device",
               "kernel: steps x bytes a step = bytes per device",
               "recorded run"]


class KernelCosts(SphinxDirective):
    """``{kernel-costs}``: every kernel's cost next to its ``lax`` collective's."""

    def run(self) -> list[nodes.Node]:
        rows = []
        for name in kernel_names():
            found = costs(name, self.env.srcdir)
            rows.append([found[k] for k in ("kernel", "lax", "model", "recorded")])
        return [_table(COST_HEADER, rows)]


def body_region(path: Path) -> str:
    """The tagged region of a kernel's recipe file that holds the per-device
    body: ``body`` where the file tags one, else ``shard_map``."""
    return "body" if "# [start:body]" in path.read_text() else "shard_map"


class KernelRecipes(SphinxDirective):
    """``{kernel-recipes}``: a section per kernel recipe (see the module)."""

    def run(self) -> list[nodes.Node]:
        import collectives as cx

        out: list[nodes.Node] = []
        for name in kernel_names():
            recipe = cx.RECIPES[name]
            section = nodes.section(ids=[f"kernel-{name.replace('_', '-')}"],
                                    names=[name])
            section += nodes.title(name, "", nodes.literal(name, name))
            rel = f"../recipes/{recipe.recipe_file}"
            region = body_region(Path(self.env.srcdir) / rel)
            stem = Path(rel).stem
            where = (f" (from {{doc}}`{Path(rel).name} </_generated/gallery/{stem}>`)"
                     if f"_generated/gallery/{stem}" in self.env.found_docs else "")
            text = [f"In short: {recipe.summary}. The body each device runs{where}:",
                    "",
                    f"```{{literalinclude}} {rel}",
                    ":language: python",
                    f':start-after: "# [start:{region}]"',
                    f':end-before: "# [end:{region}]"',
                    "```", ""]
            self.state.nested_parse(StringList(text, self.env.docname),
                                    self.content_offset, section)
            section += self._figure(name)
            try:
                found = costs(name, self.env.srcdir)
            except Exception as error:  # a build warning (an error under -W)
                section += self.state.document.reporter.warning(
                    f"kernel-recipes {name}: {type(error).__name__}: {error}",
                    line=self.lineno)
                out.append(section)
                continue
            para = nodes.paragraph()
            para += nodes.Text(
                f"Cost on {N_DEVICES} devices, float32[{DIMS[0]}, {DIMS[1]}] "
                f"blocks: the lax collective sends {found['lax']} per device; "
                f"the kernel {found['model']} per device; the recorded run: "
                f"{found['recorded']}.")
            section += para
            out.append(section)
        return out

    def _figure(self, name: str) -> list[nodes.Node]:
        try:
            recorded, uri = trace(name, self.env.srcdir)
        except Exception as error:  # a build warning (an error under -W)
            return [self.state.document.reporter.warning(
                f"kernel-recipes {name}: {type(error).__name__}: {error}",
                line=self.lineno)]
        image = nodes.image(uri=uri, alt=recorded.summary())
        image["classes"].append("collective-diagram")
        from collectives._kernel_trace_plot import shown_senders

        remote = recorded.remote_dmas()
        sending = len({dma.step for dma in remote})
        shown = ("" if len(shown_senders(recorded)) == recorded.n_devices else
                 " Only device 0's DMAs are drawn: every device sends the "
                 "same, shifted by its index.")
        caption = nodes.caption(
            "", "", nodes.literal(name, name),
            nodes.Text(f" as it ran: {recorded.n_devices} devices (rows), "
                       f"{recorded.steps} steps (columns), {sending} of them "
                       f"with remote DMAs ({len(remote) // recorded.n_devices} "
                       "a device). A step ends where a device waits on a "
                       "semaphore (black bar); an arrow is one remote DMA, "
                       f"from sender to receiver.{shown}"))
        figure = nodes.figure("", image, caption)
        figure["ids"].append(f"kernel-diagram-{name.replace('_', '-')}")
        return [figure]


def planted_bugs(path: Path = BUGS_FILE) -> tuple[list[tuple], dict[str, str]]:
    """``PLANTED`` and ``NOT_CAUGHT`` of ``tests/test_kernel_bugs.py``, read
    without importing it (the test imports pytest and the test helpers)."""
    tree = ast.parse(path.read_text())
    found: dict[str, Any] = {}
    constants: dict[str, Any] = {}  # upper-case literals defined before the tables
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign)
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        if target.id in ("PLANTED", "NOT_CAUGHT"):
            found[target.id] = _literal(node.value, constants)
        elif target.id.isupper():
            # (not a literal, a call or a path: not one the tables use)
            with contextlib.suppress(ValueError):
                constants[target.id] = _literal(node.value, constants)
    missing = {"PLANTED", "NOT_CAUGHT"} - set(found)
    if missing:
        raise LookupError(f"{path.name} no longer defines {', '.join(sorted(missing))}")
    return found["PLANTED"], found["NOT_CAUGHT"]


class KernelPlantedBugs(SphinxDirective):
    """``{kernel-planted-bugs}``: each planted bug, its one-line edit and
    what catches it; then the ones nothing here catches, and why."""

    def run(self) -> list[nodes.Node]:
        try:
            planted, not_caught = planted_bugs()
        except (OSError, LookupError, ValueError, SyntaxError) as error:
            return [self.state.document.reporter.warning(
                f"kernel-planted-bugs: {error}", line=self.lineno)]
        rows = [[f"{bug} ({file})", f"{old.strip()}\n{new.strip() or '(deleted)'}",
                 " or ".join(words)]
                for file, bug, old, new, words in planted]
        table = _table(["planted bug (file)", "the line, then its edit",
                        "check_kernel reports"], rows, code=(1,))
        out: list[nodes.Node] = [table]
        if not_caught:
            para = nodes.paragraph()
            para += nodes.Text("Not caught:")
            items = nodes.bullet_list()
            for bug, why in not_caught.items():
                item = nodes.list_item()
                text = nodes.paragraph()
                text += nodes.strong(bug, bug)
                text += nodes.Text(f": {why}")
                item += text
                items += item
            out += [para, items]
        return out


class KernelTimeoutMessage(SphinxDirective):
    """``{kernel-timeout-message}``: what a hung kernel form raises, as
    :func:`collectives._kernels.call_bounded` words it, with PJRT_NPROC
    unset."""

    def run(self) -> list[nodes.Node]:
        import os

        from collectives import _kernels

        saved = os.environ.pop("PJRT_NPROC", None)
        try:
            text = _kernels._timeout_message("kernel_all_gather",
                                             _kernels.DEFAULT_LIMIT_S)
        finally:
            if saved is not None:
                os.environ["PJRT_NPROC"] = saved
        text = "\n".join(textwrap.wrap(f"collectives.KernelTimeout: {text}", 76))
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app: Sphinx) -> dict:
    app.add_directive("kernel-recipes", KernelRecipes)
    app.add_directive("kernel-costs", KernelCosts)
    app.add_directive("kernel-planted-bugs", KernelPlantedBugs)
    app.add_directive("kernel-timeout-message", KernelTimeoutMessage)
    return {"version": "1", "parallel_read_safe": False}
