"""Python shown with what it printed when the site was built.

* ``{readme-snippet}``: the README's first Python block (the landing page
  shows the same code as the README);
* ``{runnable}``: the directive's own content (the start page's tour).

Each is run in a subprocess, on simulated CPU devices, from a temporary
directory, and the page shows its output under the code. The output is never
typed by hand: code that fails, or prints nothing, is a build warning (an
error under ``-W``). Outputs are cached by the code and the Python that ran it.
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
    cache = cache_dir / f"snippet-{key[:16]}.json"
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


def code_and_output(directive: SphinxDirective, code: str) -> list[nodes.Node]:
    """The code block, a caption, and the output block (or a warning)."""
    cache_dir = Path(directive.env.srcdir) / "_generated" / ".cache"
    returncode, stdout, stderr = run_code(code, cache_dir)
    if returncode != 0 or not stdout.strip():
        return [directive.state.document.reporter.warning(
            f"{directive.name}: the code exited {returncode} and printed "
            f"{len(stdout)} characters:\n{stderr[-3000:]}", line=directive.lineno)]
    source = nodes.literal_block(code, code, language="python")
    caption = nodes.paragraph("", "It prints (run when this page was built):")
    output = nodes.literal_block(stdout, stdout.rstrip(), language="text",
                                 classes=["readme-output"])
    return [source, caption, output]


class ReadmeSnippet(SphinxDirective):
    """The README's snippet as a code block, then its output as a text block."""

    def run(self) -> list[nodes.Node]:
        readme = Path(self.env.srcdir).parent / "README.md"
        self.env.note_dependency(str(readme))
        return code_and_output(self, readme_code(readme))


class Runnable(SphinxDirective):
    """The directive's content as a code block, then its output."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        return code_and_output(self, "\n".join(self.content) + "\n")


def setup(app: Sphinx) -> dict:
    app.add_directive("readme-snippet", ReadmeSnippet)
    app.add_directive("runnable", Runnable)
    return {"version": "1", "parallel_read_safe": True}
