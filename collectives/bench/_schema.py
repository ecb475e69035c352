"""The JSON document ``bench --json`` writes: its schema and a checker.

The schema lives in ``schema.json`` beside this module (package data), as a
JSON Schema; :func:`schema_errors` checks the subset of keywords it uses
(``type``, ``enum``, ``required``, ``properties``, ``additionalProperties``,
``items``, ``minItems``, ``maxItems``, ``minimum``), so no JSON Schema library
is needed. The schema's ``$id`` carries its version: a document says which one
it follows in its ``schema`` key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

SCHEMA: dict[str, Any] = json.loads(
    resources.files("collectives.bench").joinpath("schema.json").read_text())
"""The JSON Schema of the document ``bench --json`` writes (``schema.json``)."""
SCHEMA_ID: str = SCHEMA["$id"]
"""The schema's name and version, ``collectives-bench/2``."""

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
    if isinstance(value, list):
        least, most = schema.get("minItems", 0), schema.get("maxItems", len(value))
        if len(value) < least:
            errors.append(f"{where}: {len(value)} items, fewer than {least}")
        if len(value) > most:
            errors.append(f"{where}: {len(value)} items, more than {most}")
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
