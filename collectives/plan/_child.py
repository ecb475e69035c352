"""The child processes a plan starts: one JAX backend sized to the mesh.

The CPU backend's device count is fixed when it starts, so compiling for a
mesh (``_worker``) and timing on its devices (``_versus``) each run in a
fresh ``python -m MODULE REQUEST`` with ``JAX_NUM_CPU_DEVICES`` set; the
request goes in as a JSON file, the answer comes back as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any


def run_child(module: str, request: Mapping[str, Any], *, devices: int | None,
              timeout: float, what: str,
              env: Mapping[str, str] | None = None) -> Any:
    """Run ``python -m module REQUEST`` and return the JSON it prints.

    Args:
      module: the child's module, e.g. ``"collectives.plan._worker"``.
      request: what it reads (written to a temporary JSON file).
      devices: simulated CPU devices for its backend; ``None`` leaves the
        environment as it is (a TPU topology compiles without them).
      timeout: seconds before the child is killed.
      what: what the child does, for the error messages.
      env: variables to set in its environment besides.

    Raises:
      ValueError: the child stopped on a bad argument (its last line names
        the flag, e.g. ``--topology ...``).
      RuntimeError: it failed otherwise or ran past ``timeout``; the message
        holds its last output.
    """
    env = dict(os.environ) | dict(env or {})
    if devices is not None:
        env |= {"JAX_NUM_CPU_DEVICES": str(devices), "JAX_PLATFORMS": "cpu"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        done = subprocess.run([sys.executable, "-m", module, f.name],
                              capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"plan: {what} ran past {timeout:g} s and was "
                           "stopped.") from None
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [""]
        if last[0].startswith("--"):
            raise ValueError(last[0])
        raise RuntimeError(f"plan: {what} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout)
