"""Figures and tables computed at build time by running the collectives.

* ``{collective-diagram} NAME``: the before/after picture of one collective,
  from :func:`collectives.diagram` (the recipe's shard_map form run on
  labelled blocks), written as SVG to ``_generated/diagrams/``.
* ``{collective-costs}``: per core collective, the HLO ops each form compiles
  to and the bytes each device sends, counted by
  :func:`collectives.hlo.collective_stats` and checked against the cost
  model (:func:`collectives.hlo.bytes_moved`); a mismatch is a build warning.

JAX runs in the Sphinx process on 8 simulated CPU devices (conf.py sets them
up before anything starts JAX).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from collectives import _figure

logger = logging.getLogger(__name__)

N_DEVICES = 8
_DIAGRAMS: dict = {}  # name -> Diagram, drawn once per build process

# The cost model's ``V`` for each HLO kind, in terms of ``b``, the bytes of
# one device's input block (the core recipes' own ``hlo`` facts give the
# kind and the bytes; this is only how the page writes ``V``).
V_TEXT = {
    "all-reduce": "b", "all-gather": "n * b", "reduce-scatter": "b",
    "all-to-all": "n * b", "collective-permute": "b",
}


def hlo_formulas() -> dict[str, str]:
    """The "bytes sent per device" column of ``collectives.hlo``'s cost table.

    Read from the module docstring itself, so this page states the model in
    the same words as the code that computes it.
    """
    from collectives import hlo

    lines = (hlo.__doc__ or "").splitlines()
    rule = next(line for line in lines if line.startswith("===="))
    third = [i for i in range(1, len(rule)) if rule[i] == "=" and rule[i - 1] == " "][1]
    formulas = {}
    for line in lines:
        kind = re.match(r"``([a-z-]+)``\s", line)
        formula = re.search(r"``([^`]+)``", line[third:])
        if kind and formula and kind.group(1) in hlo.KINDS:
            formulas[kind.group(1)] = formula.group(1)
    missing = set(hlo.KINDS) - set(formulas)
    if missing:
        raise ValueError(f"collectives.hlo's cost table has no row for {missing}")
    return formulas


def draw(name: str, srcdir) -> str:
    """Draw NAME's diagram once per build; its image URI (from the source root).

    Raises:
        ValueError: NAME has no diagram (from :func:`collectives.diagram`).
    """
    import collectives as cx

    if name not in _DIAGRAMS:
        out = Path(srcdir) / "_generated" / "diagrams"
        out.mkdir(parents=True, exist_ok=True)
        diagram = cx.diagram(name)
        for width, path in _figure.columns(out / f"{name}.svg"):
            diagram.save(str(path), width=width)
        _DIAGRAMS[name] = diagram
    return f"/_generated/diagrams/{name}.svg"


class CollectiveDiagram(SphinxDirective):
    """``{collective-diagram} NAME``: a figure of one collective's before/after."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        return figure(self, self.arguments[0])


def figure(directive: SphinxDirective, name: str, label: str | None = None
           ) -> list[nodes.Node]:
    """NAME's diagram as a captioned figure; ``label`` makes it a ref target."""
    try:
        uri = draw(name, directive.env.srcdir)
    except ValueError as error:
        return [directive.state.document.reporter.warning(
            f"collective-diagram: {error}", line=directive.lineno)]
    diagram = _DIAGRAMS[name]
    image = nodes.image(uri=uri, alt=diagram.text())
    image["classes"].append("collective-diagram")
    caption = nodes.caption(
        "", "", nodes.literal(name, name),
        nodes.Text(f": {diagram.summary}. {diagram.n_devices} devices "
                   "(columns); each input element is "
                   "10 \N{MULTIPLICATION SIGN} device + position, "
                   "coloured by the device it came from"
                   + ("; grey, hatched: combined from every device."
                      if any((s < 0).any() for s in diagram.after_source)
                      else ".")))
    node = nodes.figure("", image, caption)
    if label is None:
        node["ids"].append(f"diagram-{name.replace('_', '-')}")
    else:
        node["ids"].append(label.replace("_", "-"))
        node["names"].append(label)
        directive.state.document.note_explicit_target(node)
    return [node]


class CollectiveDiagrams(SphinxDirective):
    """``{collective-diagrams} FAMILY``: every diagram of a family, in registry order.

    Each figure is a reference target ``collective-NAME`` (``{ref}`psum
    <collective-psum>```), so that every core collective has an anchor.
    """

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        import collectives as cx

        out: list[nodes.Node] = []
        for name, recipe in cx.RECIPES.items():
            if recipe.family == self.arguments[0] and recipe.diagram is not None:
                out += figure(self, name, label=f"collective-{name}")
        return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}"


class CollectiveCosts(SphinxDirective):
    """``{collective-costs}``: HLO ops and bytes per device, measured and modelled."""

    option_spec: ClassVar[dict] = {"rows": int, "cols": int}

    def run(self) -> list[nodes.Node]:
        import collectives as cx
        from collectives import hlo

        rows = self.options.get("rows", 256)
        cols = self.options.get("cols", 64)
        mesh = cx.make_mesh((N_DEVICES,), "i")
        formulas = hlo_formulas()
        table_rows = []
        for name, recipe in cx.RECIPES.items():
            if recipe.family != "core":
                continue
            axes = recipe.axes(mesh, "i")
            args = recipe.example_args(mesh, "i", dims=(rows, cols))
            placed = recipe.place(*args, axes=axes)
            block = placed[0].addressable_shards[0].data.nbytes
            # each form compiled for its own inputs (the explicit form's on
            # Explicit axes, as JAX's default mesh makes them)
            measured = {form: hlo.collective_stats(
                recipe.compiled(form, axes), *recipe.place(*args, axes=axes, form=form))
                for form in ("shard_map", "jit", "explicit")}
            (expected,) = recipe.expected_costs("shard_map", axes, args)
            kind = next(iter(expected.counts), None)
            got = measured["shard_map"].bytes()
            problem = expected.mismatch(measured["shard_map"])
            if problem is not None:
                logger.warning(
                    f"collective-costs: {name}: the shard_map form does not meet "
                    f"its cost model: {problem}",
                    location=(self.env.docname, self.lineno))
            v_text = V_TEXT.get(kind, "")

            def ops(stats) -> str:
                found = stats.nonzero()
                return ", ".join(f"{n} x {k}" if n > 1 else k
                                 for k, n in found.items()) or "none"

            # (written as HLO writes it, f32[256,64]: one piece on a line)
            shape = ",".join(map(str, placed[0].addressable_shards[0].data.shape))
            jit, explicit = (f"{ops(measured[form])}: {_fmt(measured[form].bytes())}"
                             for form in ("jit", "explicit"))
            table_rows.append([
                name, ops(measured["shard_map"]), f"f32[{shape}]: {_fmt(block)}",
                v_text or "—", formulas[kind] if kind else "0", _fmt(got),
                jit if jit == explicit else f"jit: {jit}\nexplicit: {explicit}",
            ])
        header = ["collective", "HLO op (shard_map and pmap)",
                  "block b per device: bytes",
                  "V", "bytes sent per device", f"measured, n = {N_DEVICES}",
                  "jit and explicit forms on CPU: op, bytes"]
        return [_table(header, table_rows)]


def _table(header: list[str], rows: list[list[str]],
           code_columns: tuple[int, ...] | None = None) -> nodes.table:
    """A table; body cells of ``code_columns`` (default :data:`CODE_COLUMNS`)
    are written as code."""
    table = nodes.table(classes=["collective-costs"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    head += _row(header)
    body = nodes.tbody()
    group += body
    for row in rows:
        body += _row(row, code_first=True, code_columns=code_columns)
    return table


# Body columns written as code: the collective's name, V and the formula.
CODE_COLUMNS = (0, 3, 4)


def _row(cells: list[str], code_first: bool = False,
         code_columns: tuple[int, ...] | None = None) -> nodes.row:
    row = nodes.row()
    columns = CODE_COLUMNS if code_columns is None else code_columns
    for i, text in enumerate(cells):
        entry = nodes.entry()
        code = code_first and i in columns and text not in ("—", "0")
        # (a line break in a cell: a value over its model, each on a line)
        for line in text.split("\n"):
            para = nodes.paragraph()
            para += nodes.literal(line, line) if code else nodes.Text(line)
            entry += para
        row += entry
    return row


class StrategyDiagram(SphinxDirective):
    """``{strategy-diagram} FILE``: the diagram of the strategy in
    ``recipes/FILE.py``, traced from a real run of that file's functions by
    ``collectives._strategy_diagrams.FILE`` (``trace``, ``draw``, ``text``,
    ``CAPTION``), written as SVG to ``_generated/diagrams/``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        stem = self.arguments[0]
        try:
            uri, alt = draw_strategy(stem, self.env.srcdir)
        except Exception as error:  # a build warning (an error under -W)
            return [self.state.document.reporter.warning(
                f"strategy-diagram {stem}: {type(error).__name__}: {error}",
                line=self.lineno)]
        module = _strategy_module(stem)
        image = nodes.image(uri=uri, alt=alt)
        image["classes"].append("strategy-diagram")
        # (a click opens it full size; the gallery pages sit two folders down)
        reference = nodes.reference("", "", image,
                                    refuri=f"../../_images/strategy-{stem}.svg")
        caption = nodes.caption("", module.CAPTION)
        figure = nodes.figure("", reference, caption)
        figure["classes"].append("strategy-diagram")
        figure["ids"].append(f"strategy-diagram-{stem.replace('_', '-')}")
        return [figure]


_STRATEGIES: dict[str, tuple[str, str]] = {}


def _strategy_module(stem: str):
    import importlib

    return importlib.import_module(f"collectives._strategy_diagrams.{stem}")


def draw_strategy(stem: str, srcdir) -> tuple[str, str]:
    """Trace and draw the strategy diagram of ``recipes/STEM.py`` once per
    build, for both columns; its image URI (from the source root) and its
    text."""
    if stem not in _STRATEGIES:
        module = _strategy_module(stem)
        record = module.trace()
        out = Path(srcdir) / "_generated" / "diagrams"
        out.mkdir(parents=True, exist_ok=True)
        name = f"strategy-{stem}.svg"
        for width, path in _figure.columns(out / name):
            module.draw(record, str(path), width=width)
        _STRATEGIES[stem] = (f"/_generated/diagrams/{name}", module.text(record))
    return _STRATEGIES[stem]


def strategy_diagram_files() -> set[str]:
    """The recipe files (stems) that have a strategy diagram."""
    import pkgutil

    from collectives import _strategy_diagrams

    return {info.name for info in pkgutil.iter_modules(_strategy_diagrams.__path__)}


def setup(app: Sphinx) -> dict:
    app.add_directive("strategy-diagram", StrategyDiagram)
    app.add_directive("collective-diagram", CollectiveDiagram)
    app.add_directive("collective-diagrams", CollectiveDiagrams)
    app.add_directive("collective-costs", CollectiveCosts)
    return {"version": "1", "parallel_read_safe": False}
