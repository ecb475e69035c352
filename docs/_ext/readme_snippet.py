"""``{readme-snippet}``: the README's first Python block, run, with its output.

The landing page shows the same code as the README, and underneath it what
that code printed when this build ran it (in a subprocess, on simulated CPU
devices, from a temporary directory). The output is never typed by hand: a
snippet that fails, or prints nothing, is a build warning (an error under
``-W``). The output is cached by the code and the Python that ran it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_code(readme: Path) -> str:
    """The first fenced Python block of ``readme``.

    Raises:
        ValueError: ``readme`` has no fenced Python block.
    """
    match = FENCE.search(readme.read_text())
    if match is None:
        raise ValueError(f"{readme} has no ```python block")
    return match.group(1)


def run_code(code: str, cache_dir: Path, timeout: float = 300) -> tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of ``python -c code`` (cached on success)."""
    key = hashlib.sha256((code + sys.executable).encode()).hexdigest()
    cache = cache_dir / "readme_snippet.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached["key"] == key:
            return 0, cached["stdout"], ""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=timeout)
    if result.returncode == 0:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "stdout": result.stdout}))
    return result.returncode, result.stdout, result.stderr


class ReadmeSnippet(SphinxDirective):
    """The README's snippet as a code block, then its output as a text block."""

    def run(self) -> list[nodes.Node]:
        readme = Path(self.env.srcdir).parent / "README.md"
        self.env.note_dependency(str(readme))
        code = readme_code(readme)
        cache_dir = Path(self.env.srcdir) / "_generated" / ".cache"
        returncode, stdout, stderr = run_code(code, cache_dir)
        if returncode != 0 or not stdout.strip():
            return [self.state.document.reporter.warning(
                f"readme-snippet: the README's snippet exited {returncode} and "
                f"printed {len(stdout)} characters:\n{stderr[-3000:]}",
                line=self.lineno)]
        source = nodes.literal_block(code, code, language="python")
        caption = nodes.paragraph("", "It prints (run when this page was built):")
        output = nodes.literal_block(stdout, stdout.rstrip(), language="text",
                                     classes=["readme-output"])
        return [source, caption, output]


def setup(app: Sphinx) -> dict:
    app.add_directive("readme-snippet", ReadmeSnippet)
    return {"version": "1", "parallel_read_safe": True}
