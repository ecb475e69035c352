"""The "Choosing a strategy" page's tables, from the package and from the
plans committed beside the page.

* ``{plan-units}``: what ``plan`` compiles of each strategy (the registry's
  ``PlanSpec`` facts);
* ``{plan-profiles}``: the named interconnect profiles and their sources;
* ``{plan-table} FILE``: one plan of a ``plan --json`` file (options
  ``:devices:`` and ``:model:``);
* ``{plan-crossovers} FILE``: where the sweep's answer changes (option
  ``:memory:``, GB per device);
* ``{plan-versus-bench} FILE``: predicted against measured (``plan
  --versus-bench --json``);
* ``{plan-scaling-book} FILE``: the scaling book's thresholds beside the
  plan's (``plan --scaling-book --json``).

The files are written by the commands on the page; a row whose cost model
differed at that scale is a build warning (an error under ``-W``), except
where the TPU compiler compiled it (its own choices, reported).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar

from collective_facts import _table
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


class _FromFile(SphinxDirective):
    required_arguments = 1

    def document(self) -> dict:
        path = Path(self.env.srcdir) / self.arguments[0]
        self.env.note_dependency(str(path))
        return json.loads(path.read_text())

    def plans(self):
        from collectives.plan import Plan

        return [Plan.from_json(p) for p in self.document()["plans"]]


class PlanUnits(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        import collectives as cx

        rows = []
        for name, recipe in cx.RECIPES.items():
            spec = recipe.plan
            if spec is None:
                continue
            over = ("every mesh axis" if spec.axis == "all" else "the last mesh axis")
            scope = "the whole model" if spec.scope == "model" else "one kind of layer"
            if spec.replicas_sum_gradients:
                scope += " (+ its replicas' gradient sum, added)"
            rows.append([spec.label, name, spec.unit, over, scope])
        return [_table(["strategy", "recipe", "one compiled unit", "runs over",
                        "trains"], rows, code_columns=(1,))]


class PlanProfiles(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        from collectives.plan import load_profiles

        def peaks(p):
            return ", ".join(f"{dtype} {flops / 1e12:g}"
                             for dtype, flops in p.peak_flops.items()) or "none"

        rows = [[name, p.description, f"{p.link.alpha * 1e6:g} us",
                 f"{p.link.busbw / 1e9:g} GB/s", f"{p.chip}: {peaks(p)}",
                 f"{p.source} Peak: {p.peak_source}"]
                for name, p in load_profiles().items()]
        return [_table(["profile", "what", "alpha", "busbw", "chip, peak TFLOP/s",
                        "source"], rows, code_columns=(0,))]


class PlanTable(_FromFile):
    option_spec: ClassVar[dict] = {"devices": int, "model": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from collectives.plan._report import COLUMNS
        from collectives.plan._report import chip_text
        from collectives.plan._report import compiled_here
        from collectives.plan._report import mesh_text
        from collectives.plan._report import notes
        from collectives.plan._report import row_cells

        plans = self.plans()
        want_devices = self.options.get("devices")
        want_model = self.options.get("model")
        chosen = [p for p in plans
                  if want_devices in (None, math.prod(p.mesh.values()))
                  and want_model in (None, p.model.name)]
        if not chosen:
            raise self.error(f"plan-table: no plan for devices={want_devices} "
                             f"model={want_model} in {self.arguments[0]}")
        p = chosen[0]
        rows = []
        for row in p.rows:
            if row.skipped:
                continue
            if row.cost_model is not None and compiled_here(p):
                logger.warning(f"plan-table: {row.label}: the cost model differs: "
                               f"{row.cost_model}",
                               location=(self.env.docname, self.lineno))
            rows.append(list(row_cells(p, row)))
        links = "; ".join(f"{axis}: {profile.name}"
                          for axis, profile in p.interconnect.items())
        caption = nodes.paragraph(text=(
            f"{p.model.describe()}. Mesh {mesh_text(p.mesh)}, {p.form} form, "
            f"compiled by JAX {p.jax} ({p.compiler}) in {p.seconds:.1f} s; "
            f"interconnect {links}; chip {chip_text(p)}."))
        legend = nodes.bullet_list()
        for note in notes(p):
            item = nodes.list_item()
            item += nodes.paragraph(text=note)
            legend += item
        # two tables of the strategy and a few columns each, so each fits
        # the content column: what a step sends and takes, then where it
        # runs, when it is communication-bound, its memory and cost model
        parts = [[COLUMNS.index(c) for c in names] for names in (
            ("strategy", "collectives/step", "sent/device", "comm", "compute",
             "step", "MFU"),
            ("strategy", "over", "comm-bound below", "memory/device", "cost model"))]
        tables = [_table([COLUMNS[i] for i in part],
                         [[row[i] for i in part] for row in rows], code_columns=())
                  for part in parts]
        return [caption, *tables, legend]


class PlanCrossovers(_FromFile):
    option_spec: ClassVar[dict] = {"memory": float}

    def run(self) -> list[nodes.Node]:
        from collectives.plan._report import crossovers

        memory = self.options.get("memory")
        lines = crossovers(self.plans(), None if memory is None else memory * 1e9)
        bullets = nodes.bullet_list()
        for line in lines:
            item = nodes.list_item()
            item += nodes.paragraph(text=line)
            bullets += item
        return [bullets]


class PlanVersusBench(_FromFile):
    def run(self) -> list[nodes.Node]:
        doc = self.document()
        rows = []
        for result in doc["versus_bench"][0]:
            rows.append([
                result["label"], str(result["ops"]),
                f"{result['predicted'] * 1e3:.3f} ms",
                f"{result['measured'] * 1e3:.3f} ms "
                f"[{result['low'] * 1e3:.3f}, {result['high'] * 1e3:.3f}]",
                f"{result['ratio']:.2f} [{result['ratio_low']:.2f}, "
                f"{result['ratio_high']:.2f}]"])
        return [_table(["strategy", "collectives per unit", "predicted (plan)",
                        "measured (bench) [95 %]", "predicted / measured [95 %]"],
                       rows, code_columns=())]


class PlanScalingBook(_FromFile):
    def run(self) -> list[nodes.Node]:
        doc = self.document()
        rows = [[c["name"], f"{c['book']:,.0f} ({c['book_formula']})",
                 f"{c['plan']:,.0f}", f"{c['ratio']:.3f}", c["plan_how"],
                 f"{c['compiled']:,.0f}", c["why"]]
                for c in doc["cases"]]
        return [_table(["layout", "book", "plan, as the book counts", "plan / book",
                        "the plan's figure", "a step as sent",
                        "how that differs from the book"],
                       rows, code_columns=())]


def setup(app: Sphinx) -> dict:
    app.add_directive("plan-units", PlanUnits)
    app.add_directive("plan-profiles", PlanProfiles)
    app.add_directive("plan-table", PlanTable)
    app.add_directive("plan-crossovers", PlanCrossovers)
    app.add_directive("plan-versus-bench", PlanVersusBench)
    app.add_directive("plan-scaling-book", PlanScalingBook)
    return {"version": "1", "parallel_read_safe": True}
