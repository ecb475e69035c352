"""``{strategy-table}``: the parallelism strategies measured at build time.

Renders :func:`collectives.strategy_table` (each strategy's recipe compiled on
8 simulated CPU devices): the collectives of one step, the bytes a device
sends (measured in the HLO, and by the cost model) and stores (measured from
the shards, and by the layout). A measurement that differs from its formula
is a build warning (an error under ``-W``); ``tests/test_memory.py`` checks
the same rows.
"""

from __future__ import annotations

from typing import ClassVar

from collective_facts import _table
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _ops(found: dict[str, int]) -> str:
    return ", ".join(f"{n} x {k}" if n > 1 else k for k, n in found.items())


class StrategyTable(SphinxDirective):
    """``{strategy-table}`` with options ``width`` and ``batch``."""

    option_spec: ClassVar[dict] = {"width": int, "batch": int}

    def run(self) -> list[nodes.Node]:
        import collectives as cx

        rows = cx.strategy_table(width=self.options.get("width", 16),
                                 batch=self.options.get("batch", 32))
        cells = []
        for row in rows:
            if abs(row.sent - row.sent_model) > 1e-6 * row.sent_model or (
                    row.params != row.params_model):
                logger.warning(
                    f"strategy-table: {row.label}: measured {row.sent} bytes sent "
                    f"and {row.params} stored per device; the model says "
                    f"{row.sent_model} and {row.params_model}",
                    location=(self.env.docname, self.lineno))
            cells.append([
                row.label, f"{row.recipe} ({row.mesh})", row.sharded,
                _ops(row.collectives), f"{row.sent:,.0f}\n({row.sent_model:,.0f})",
                f"{row.params:,} of {row.params_total:,}\n"
                f"({row.params_model:,})",
                f"{row.arguments:,}"])
        header = ["strategy", "recipe (mesh)", "split over devices",
                  "collectives per step (compiled)",
                  "bytes sent per device (model)",
                  "parameter bytes per device, of total (layout)",
                  "arguments per device (XLA)"]
        return [_table(header, cells, code_columns=(1,))]


def setup(app: Sphinx) -> dict:
    app.add_directive("strategy-table", StrategyTable)
    return {"version": "1", "parallel_read_safe": False}
