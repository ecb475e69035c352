"""The environment variables JAX and XLA read as they start, checked before
``python -m collectives`` imports JAX.

A bad value there fails inside JAX's import or XLA's start-up: a 30-line
traceback (``JAX_NUM_CPU_DEVICES=abc``, ``JAX_ENABLE_X64=maybe``) or an XLA
fatal error with its list of several hundred flags
(``XLA_FLAGS=--xla_force_host_platform_device_count=abc``, an unknown flag).
The command refuses each with one line naming the variable, the value and
the fix, exit status 2, before any work. ``JAX_PLATFORMS`` naming a backend
the machine cannot start is refused where JAX says so (``collectives._cli``).

``XLA_FLAGS`` is checked by XLA itself: a child process starts the CPU
backend with it (about a second), once per value and jaxlib version; the
values XLA accepted are remembered in ``$XDG_CACHE_HOME/jax-collectives``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from collectives._args import write_text_atomic

TRUE = ("1", "y", "yes", "t", "true", "on")
FALSE = ("0", "n", "no", "f", "false", "off")
"""The truth values JAX's boolean variables accept (any case)."""

_FLAG = re.compile(r"--[A-Za-z0-9_]+(=.*)?")
_XLA_SAYS = re.compile(r"(Unknown flags? in XLA_FLAGS: .*|Couldn't interpret value .*)")
_PROBE = "import jax; jax.devices('cpu')"


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/jax-collectives`` (``~/.cache/jax-collectives``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jax-collectives"


def _whole_number(name: str, value: str, *, undo: str = "unset it") -> str | None:
    text = value.strip()
    if not text.lstrip("-").isdigit() or int(text) < 1:
        return (f"{name}={value!r} is not a number of devices of at least 1. "
                f"Fix: {undo} (python -m collectives simulates --devices N, "
                "default 8), or make it a whole number such as 8.")
    return None


def _truth(name: str, value: str) -> str | None:
    if value.strip().lower() not in TRUE + FALSE:
        return (f"{name}={value!r} is neither true nor false for JAX. Fix: set "
                f"it to 1 or 0 (JAX also takes {', '.join(TRUE[1:])} and "
                f"{', '.join(FALSE[1:])}), or unset it.")
    return None


def _xla_flags(value: str, *, probe: bool = True) -> str | None:
    for token in value.split():
        if not _FLAG.fullmatch(token):
            return (f"XLA_FLAGS={value!r}: {token!r} is not an XLA flag "
                    "(--name or --name=value). Fix: separate the flags with "
                    "spaces, each starting with --, or unset XLA_FLAGS.")
        name, _, number = token.partition("=")
        if name == "--xla_force_host_platform_device_count":
            problem = _whole_number(name[2:], number, undo="remove the flag")
            if problem:
                return f"XLA_FLAGS={value!r}: {problem}"
    return _ask_xla(value) if probe and value.strip() else None


def _ask_xla(value: str) -> str | None:
    """What XLA says of ``value`` as it starts the CPU backend in a child
    process; ``None`` where it starts (remembered per jaxlib version)."""
    key = f"{_jaxlib_version()} {value}"
    remembered = cache_folder() / "accepted-xla-flags.json"
    try:
        accepted = json.loads(remembered.read_text())
    except (OSError, ValueError):
        accepted = []
    if not isinstance(accepted, list):
        accepted = []
    if key in accepted:
        return None
    env = {**os.environ, "XLA_FLAGS": value, "JAX_PLATFORMS": "cpu"}
    try:
        child = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                               capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None  # nothing known against it: the command will tell
    if child.returncode != 0:
        said = _XLA_SAYS.search(child.stderr)
        if said is None:
            return None  # another failure: the command's own error names it
        return (f"XLA_FLAGS={value!r}: XLA refuses it: {said.group(1).strip()}. "
                "Fix: correct or remove that flag (this jaxlib's XLA may not "
                "know a newer or older one), or unset XLA_FLAGS.")
    with contextlib.suppress(OSError):
        remembered.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(remembered, json.dumps([*accepted, key][-64:]))
    return None


def _jaxlib_version() -> str:
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return "unknown"


def problems(environ: Mapping[str, str], *, probe: bool = True) -> list[str]:
    """One line for each variable JAX or XLA would fail on as it starts."""
    found = []
    for name, check in (("JAX_NUM_CPU_DEVICES", _whole_number),
                        ("JAX_ENABLE_X64", _truth)):
        if name in environ:
            found.append(check(name, environ[name]))
    if "XLA_FLAGS" in environ:
        found.append(_xla_flags(environ["XLA_FLAGS"], probe=probe))
    return [line for line in found if line]


def refuse_bad_environment(command: str) -> None:
    """Exit with status 2 and one line per bad variable, before JAX starts.
    A ``worker`` rank skips asking XLA: its launcher adds flags of its own
    to the ``XLA_FLAGS`` it checked."""
    lines = problems(os.environ, probe=command != "worker")
    for line in lines:
        print(f"python -m collectives {command}: error: {line}", file=sys.stderr)
    if lines:
        raise SystemExit(2)
