"""Links to JAX: API names to JAX's documentation, issue numbers to GitHub.

* An inventory of JAX's public API is written at build time from the
  installed ``jax`` (``_generated/jax-objects.inv``, the ``objects.inv``
  format) and given to intersphinx, so the build stays offline: roles such
  as ``{py:func}`jax.shard_map``` and JAX types in the API signatures link to
  https://docs.jax.dev.
* Inline code in prose that is exactly a JAX name in that inventory
  (```jax.shard_map```, ```jax.lax.psum(x, "i")``` is not: it is a call) becomes
  such a link too, on every page, with no markup in the sources.
* ``jax-ml/jax#NNNN``, ``jax#NNNN`` and "jax issue NNNN" in prose link to the
  issue on GitHub.
"""

from __future__ import annotations

import importlib
import inspect
import re
import zlib
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.config import Config

JAX_DOCS = "https://docs.jax.dev/en/latest/"
ISSUES = "https://github.com/jax-ml/jax/issues/"
# The modules whose public names the inventory lists.
MODULES = ("jax", "jax.lax", "jax.sharding", "jax.random", "jax.distributed",
           "jax.tree_util", "jax.numpy")
# Names JAX documents under another name (jax.P is its own small subclass).
ALIASES = {"jax.P": "jax.sharding.PartitionSpec"}
ISSUE = re.compile(r"\b(?:jax-ml/)?jax#(\d+)|\bjax issue (\d+)", re.IGNORECASE)
CALL_SUFFIX = re.compile(r"\(\)$")
REFTYPES = {"py:module": "mod", "py:class": "class", "py:function": "func"}


def jax_objects() -> dict[str, tuple[str, str]]:
    """``{full name: (py role, URI relative to JAX's docs)}`` from installed jax."""
    objects: dict[str, tuple[str, str]] = {}
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # pragma: no cover - all exist on JAX >= 0.8
            continue
        objects[module_name] = ("py:module", f"{module_name}.html")
        for name in dir(module):
            if name.startswith("_"):
                continue
            try:
                obj = getattr(module, name)
            except Exception:  # deprecated names may raise on access
                continue
            if inspect.ismodule(obj):
                continue
            full = f"{module_name}.{name}"
            if inspect.isclass(obj):
                role = "py:class"
            elif callable(obj):
                role = "py:function"
            else:
                continue
            sharding = importlib.import_module("jax.sharding")
            if module_name == "jax.sharding":
                uri = f"jax.sharding.html#{full}"
            elif inspect.isclass(obj) and getattr(sharding, obj.__name__, None) is obj:
                # jax.P, jax.NamedSharding: documented under jax.sharding
                uri = f"jax.sharding.html#jax.sharding.{obj.__name__}"
            else:
                uri = f"_autosummary/{full}.html"
            objects[full] = (role, uri)
    for alias, target in ALIASES.items():
        if alias in objects and target in objects:
            objects[alias] = objects[target]
    return objects


def write_inventory(path: Path, objects: dict[str, tuple[str, str]],
                    version: str) -> None:
    """Write ``objects`` as a Sphinx inventory (version 2) to ``path``."""
    header = ("# Sphinx inventory version 2\n# Project: JAX\n"
              f"# Version: {version}\n"
              "# The remainder of this file is compressed using zlib.\n")
    body = "".join(f"{name} {role} 1 {uri} -\n"
                   for name, (role, uri) in sorted(objects.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = header.encode() + zlib.compress(body.encode())
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


_OBJECTS: dict[str, tuple[str, str]] = {}


def make_inventory(app: Sphinx, config: Config) -> None:
    import jax

    _OBJECTS.update(jax_objects())
    path = Path(app.srcdir) / "_generated" / "jax-objects.inv"
    write_inventory(path, _OBJECTS, jax.__version__)
    config.intersphinx_mapping = {
        **(config.intersphinx_mapping or {}), "jax": (JAX_DOCS, str(path))}


def _in(node: nodes.Node, kinds: tuple) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, kinds):
            return True
        parent = parent.parent
    return False


def link_prose(app: Sphinx, doctree: nodes.document) -> None:
    """Inline JAX names become intersphinx references; issue numbers links."""
    skip = (nodes.reference, addnodes.pending_xref, nodes.literal_block,
            addnodes.desc_signature, nodes.title, nodes.raw)
    for literal in list(doctree.findall(nodes.literal)):
        text = CALL_SUFFIX.sub("", literal.astext())
        if text not in _OBJECTS or _in(literal, skip):
            continue
        reftype = REFTYPES[_OBJECTS[text][0]]
        xref = addnodes.pending_xref("", refdomain="py", reftype=reftype,
                                     reftarget=text, refexplicit=True, refwarn=False)
        literal.replace_self(xref)
        xref += literal
    for text in list(doctree.findall(nodes.Text)):
        if _in(text, (*skip, nodes.literal)) or not ISSUE.search(text.astext()):
            continue
        parts: list[nodes.Node] = []
        source = text.astext()
        last = 0
        for match in ISSUE.finditer(source):
            number = match.group(1) or match.group(2)
            parts.append(nodes.Text(source[last:match.start()]))
            parts.append(nodes.reference(match.group(0), match.group(0),
                                         refuri=f"{ISSUES}{number}"))
            last = match.end()
        parts.append(nodes.Text(source[last:]))
        text.parent.replace(text, parts)


def setup(app: Sphinx) -> dict:
    app.setup_extension("sphinx.ext.intersphinx")
    # Before intersphinx normalises the mapping (its own config-inited).
    app.connect("config-inited", make_inventory, priority=100)
    app.connect("doctree-read", link_prose)
    return {"version": "1", "parallel_read_safe": True}
