"""The benchmark's outputs: the nccl-tests-style table, the JSON schema and its
checker, and the plot."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from collectives.hlo import KINDS

SCHEMA_ID = "collectives-bench/1"

_NUMBER = {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_TEXT = {"type": "string"}
_ROW_FORMS = ["pmap", "shard_map", "jit", "ring", "copy"]

ROW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["collective", "kind", "form", "size", "count", "type", "devices",
                 "iters", "time_us", "time_us_samples", "spread", "algbw_gbps",
                 "busbw_gbps", "copy_fraction", "wrong"],
    "additionalProperties": False,
    "properties": {
        "collective": _TEXT,
        "kind": {"enum": [*KINDS, "copy"]},
        "form": {"enum": _ROW_FORMS},
        "size": {"type": "integer", "minimum": 1},
        "count": {"type": "integer", "minimum": 1},
        "type": _TEXT,
        "devices": {"type": "integer", "minimum": 1},
        "iters": {"type": "integer", "minimum": 1},
        "time_us": {"type": "number", "minimum": 0},
        "time_us_samples": {"type": "array", "items": _NUMBER},
        "spread": {"type": "number", "minimum": 0},
        "algbw_gbps": {"type": "number", "minimum": 0},
        "busbw_gbps": {"type": "number", "minimum": 0},
        "copy_fraction": {"type": ["number", "null"]},
        "wrong": _COUNT,
    },
}

OVERHEAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "collective", "numerator", "denominator", "ratio",
                 "spread", "target", "met", "samples"],
    "additionalProperties": False,
    "properties": {
        "name": _TEXT, "collective": _TEXT, "numerator": _TEXT, "denominator": _TEXT,
        "ratio": {"type": "number", "minimum": 0},
        "spread": {"type": "number", "minimum": 0},
        "target": {"type": ["number", "null"]},
        "met": {"type": ["boolean", "null"]},
        "samples": {"type": "integer", "minimum": 1},
    },
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "machine", "settings", "results", "skipped", "summary"],
    "properties": {
        "schema": {"enum": [SCHEMA_ID]},
        "machine": {
            "type": "object",
            "required": ["backend", "device_kind", "devices", "simulated", "jax",
                         "python", "cpu_count"],
            "properties": {
                "backend": _TEXT, "device_kind": _TEXT,
                "devices": {"type": "integer", "minimum": 1},
                "simulated": {"type": "boolean"}, "jax": _TEXT, "python": _TEXT,
                "cpu_count": {"type": ["integer", "null"]},
            },
        },
        "settings": {
            "type": "object",
            "required": ["collectives", "forms", "dtype", "sizes", "samples",
                         "warmup", "iters", "min_time_s"],
            "properties": {
                "collectives": {"type": "array", "items": _TEXT},
                "forms": {"type": "array", "items": _TEXT},
                "dtype": _TEXT,
                "sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "samples": {"type": "integer", "minimum": 1},
                "warmup": _COUNT,
                "iters": {"type": ["integer", "null"], "minimum": 1},
                "min_time_s": {"type": "number", "minimum": 0},
            },
        },
        "results": {"type": "array", "items": ROW_SCHEMA},
        "skipped": {
            "type": "array",
            "items": {"type": "object", "required": ["collective", "form", "reason"],
                      "properties": {"collective": _TEXT, "form": _TEXT,
                                     "reason": _TEXT}},
        },
        "summary": {
            "type": "object",
            "required": ["avg_busbw_gbps", "wrong", "by_collective"],
            "properties": {
                "avg_busbw_gbps": {"type": ["number", "null"]},
                "wrong": _COUNT,
                "by_collective": {"type": "object"},
            },
        },
        "overhead": {"type": "array", "items": OVERHEAD_SCHEMA},
    },
}
"""The JSON document ``bench --json`` writes, as a JSON Schema (a subset:
``type``, ``enum``, ``required``, ``properties``, ``additionalProperties``,
``items``, ``minimum``), checked by :func:`schema_errors`."""

_TYPES: Mapping[str, Any] = {
    "object": dict, "array": list, "string": str, "boolean": bool,
    "integer": int, "number": (int, float), "null": type(None),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def schema_errors(value: Any, schema: Mapping[str, Any] = SCHEMA,
                  where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"$.path: problem"`` lines."""
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, name) for name in names):
            return [*errors, f"{where}: expected {' or '.join(names)}, got "
                             f"{type(value).__name__} {value!r:.60}"]
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        errors.append(f"{where}: {value} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{where}: missing required key {key!r}")
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unexpected key {key!r}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{index}]")
    return errors


# -- the table -----------------------------------------------------------------

COLUMNS = ("size", "count", "type", "form", "iters", "time", "spread", "algbw",
           "busbw", "busbw/copy", "#wrong")
_HEAD = ("#      size      count      type       form  iters    time(us)  spread  "
         "algbw(GB/s)  busbw(GB/s)  busbw/copy  #wrong")
_UNITS = "#       (B) (elements)"


def header_lines() -> list[str]:
    return [_HEAD, _UNITS]


def format_row(row: Mapping[str, Any]) -> str:
    fraction = row["copy_fraction"]
    frac = "-" if fraction is None else f"{fraction:.2f}"
    return (f"{row['size']:>11} {row['count']:>10} {row['type']:>9} "
            f"{row['form']:>10} {row['iters']:>6} {row['time_us']:>11.2f} "
            f"{100 * row['spread']:>6.1f}% {row['algbw_gbps']:>12.3f} "
            f"{row['busbw_gbps']:>12.3f} {frac:>11} {row['wrong']:>7}")


def averages(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Average busbw per collective and form (copy rows left out)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row["form"] == "copy":
            continue
        sums.setdefault(row["collective"], {}).setdefault(row["form"], []).append(
            row["busbw_gbps"])
    return {name: {form: sum(v) / len(v) for form, v in forms.items()}
            for name, forms in sums.items()}


def format_overhead(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"# {'ratio':<62} {'median':>7} {'spread':>7} {'target':>7}  met"]
    for row in rows:
        target = "-" if row["target"] is None else f"<={row['target']:.2f}"
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        lines.append(f"  {row['name']:<62} {row['ratio']:>7.3f} "
                     f"{100 * row['spread']:>6.1f}% {target:>7}  {met}")
    return lines


# -- the plot ------------------------------------------------------------------

def plot(doc: Mapping[str, Any], path: str) -> None:
    """busbw against size, one panel per collective, one line per form.

    Raises:
      RuntimeError: matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib, which is not installed. Fix: pip install "
            "'collectives[bench]' (or pip install matplotlib).") from None
    rows = doc["results"]
    names = list(dict.fromkeys(r["collective"] for r in rows if r["form"] != "copy"))
    cols = min(3, max(1, len(names)))
    grid = -(-max(1, len(names)) // cols)
    fig, axs = plt.subplots(grid, cols, figsize=(4.6 * cols, 3.6 * grid),
                            squeeze=False, sharey=True)
    machine = doc["machine"]
    for index, ax in enumerate(axs.flat):
        if index >= len(names):
            ax.set_visible(False)
            continue
        name = names[index]
        mine = [r for r in rows if r["collective"] == name]
        kind = next(r["kind"] for r in mine if r["form"] != "copy")
        for form in dict.fromkeys(r["form"] for r in mine):
            pts = sorted((r["size"], r["busbw_gbps"])
                         for r in mine if r["form"] == form)
            style = dict(color="black", linestyle="--") if form == "copy" else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=form,
                    **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name} ({kind})", fontsize=10)
        ax.set_xlabel("size S (bytes)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for row_axes in axs:
        row_axes[0].set_ylabel("busbw (GB/s)")
    where = (f"{machine['devices']} simulated CPU devices" if machine["simulated"]
             else f"{machine['devices']} x {machine['device_kind']}")
    fig.suptitle(f"collectives bench, {doc['settings']['dtype']}\n{where}, "
                 f"JAX {machine['jax']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
