"""API reference generated from each module's public names, checked for gaps.

``{public-api} MODULE`` documents every public name of ``MODULE`` with
autodoc: the names in ``__all__``, or, for a module without one, its
top-level functions and classes (and constants that carry a docstring)
whose names do not start with ``_`` (pytest hook implementations excluded).

At the end of reading, every public module of the package (every module
whose dotted path has no part starting with ``_``) must have been given to
the directive, every public name must have been documented, and each must
have a docstring; anything missing is a build warning, so an error under
``-W``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)


# The recipe and guide files (``collectives.recipes`` and
# ``collectives.guides``, the files in ``recipes/`` and ``guides/``) are
# documented whole, one gallery page each (docs/_ext/gallery.py), not here.
GALLERY_PACKAGES = ("recipes", "guides")


def public_modules(package: str) -> list[str]:
    """The package and its submodules whose dotted paths have no ``_`` part,
    less the recipe and guide files the gallery documents."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        parts = info.name.split(".")
        if parts[1] in GALLERY_PACKAGES:
            continue
        if not any(part.startswith("_") for part in parts):
            found.append(info.name)
    return sorted(found)


def public_names(module_name: str) -> list[str]:
    """``__all__``, or the top-level public definitions of the module's source."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    tree = ast.parse(inspect.getsource(module))
    documented_data = {name for (_, name) in
                       ModuleAnalyzer.for_module(module_name).find_attr_docs()}
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            candidates = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            candidates = [t.id for t in targets if isinstance(t, ast.Name)
                          and t.id in documented_data]
        else:
            continue
        names += [n for n in candidates
                  if not n.startswith("_") and not n.startswith("pytest_")]
    return names


def _defining_module(module_name: str, name: str) -> str:
    """Follow ``from X import name`` until the module that assigns ``name``."""
    for _ in range(8):
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
        source = next((node.module for node in tree.body
                       if isinstance(node, ast.ImportFrom) and node.module
                       and any((a.asname or a.name) == name and a.name == name
                               for a in node.names)), None)
        if source is None:
            return module_name
        module_name = source
    return module_name


def _canonical(module_name: str, name: str, obj: object) -> bool:
    """Whether ``module_name`` is where ``name`` is indexed (not a re-export).

    A name re-exported from another public module that also lists it (e.g.
    ``collectives.collective_stats`` from ``collectives.hlo``) is indexed
    there; here it is shown without an index entry.
    """
    home = getattr(obj, "__module__", None)
    if not home or home == module_name or any(
            part.startswith("_") for part in home.split(".")):
        return True
    try:
        return name not in public_names(home)
    except (ImportError, OSError, TypeError):
        return True


def _rst(module_name: str, name: str) -> tuple[list[str], bool]:
    """RST for one public name, and whether it has a docstring."""
    obj = getattr(importlib.import_module(module_name), name)
    target = f"{module_name}.{name}"
    if not _canonical(module_name, name, obj):
        # Documented where it is defined; here a pointer to it.
        home = f"{obj.__module__}.{name}"
        kind = "class" if inspect.isclass(obj) else (
            "function" if callable(obj) else "data")
        role = {"class": "class", "function": "func", "data": "data"}[kind]
        return [f".. py:{kind}:: {name}", f"   :module: {module_name}",
                "   :no-index:", "", f"   The same object as :{role}:`{home}`."], True
    index: list[str] = []
    if inspect.isclass(obj):
        lines = [f".. autoclass:: {target}", "   :members:", *index]
        if issubclass(obj, BaseException):
            lines.append("   :show-inheritance:")
        return lines, bool(inspect.getdoc(obj)) and not undocumented_members(obj)
    if inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__")):
        return [f".. autofunction:: {target}", *index], bool(inspect.getdoc(obj))
    home = _defining_module(module_name, name)
    doc = ModuleAnalyzer.for_module(home).find_attr_docs().get(("", name), [])
    lines = [f".. py:data:: {name}", f"   :module: {module_name}", *index, ""]
    lines += [f"   {line}" if line.strip() else "" for line in doc]
    return lines, any(line.strip() for line in doc)


def undocumented_members(cls: type) -> list[str]:
    """Public methods and properties defined on ``cls`` without a docstring.

    ``:members:`` would silently leave them out of the reference.
    """
    missing = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        getter = member.fget if isinstance(member, property) else member
        if not inspect.isfunction(getter) or not getter.__qualname__.startswith(
                cls.__qualname__ + "."):
            continue  # e.g. a function stored as a dataclass field's default
        if not (member.__doc__ or "").strip():
            missing.append(name)
    return missing


class PublicAPI(SphinxDirective):
    """``{public-api} MODULE``: autodoc entries for public names of ``MODULE``.

    Options:
      names: the names to document here, space-separated; default: every
        public name that no earlier ``public-api`` on this page documented.
    """

    required_arguments = 1
    option_spec: ClassVar[dict] = {"names": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        env = self.env
        _store(env, "public_api_modules").setdefault(env.docname, set()).add(
            module_name)
        seen = _store(env, "public_api_documented").setdefault(env.docname, set())
        public = public_names(module_name)
        if "names" in self.options:
            names = self.options["names"].split()
            unknown = [n for n in names if n not in public]
            if unknown:
                logger.warning(f"public-api: {module_name} has no public name(s) "
                               f"{unknown}", location=(env.docname, self.lineno))
        else:
            names = [n for n in public if f"{module_name}.{n}" not in seen]
        rst = []
        for name in names:
            lines, has_doc = _rst(module_name, name)
            if not has_doc:
                obj = getattr(importlib.import_module(module_name), name)
                members = (undocumented_members(obj) if inspect.isclass(obj)
                           else [])
                what = (f"{module_name}.{name} has public members without a "
                        f"docstring: {', '.join(members)}" if members
                        else f"{module_name}.{name} has no docstring")
                logger.warning(f"public-api: {what}",
                               location=(env.docname, self.lineno))
            seen.add(f"{module_name}.{name}")
            rst += [*lines, ""]
        text = "```{eval-rst}\n" + "\n".join(rst) + "\n```\n"
        container = nodes.container()
        self.state.nested_parse(StringList(text.splitlines(), source=env.docname),
                                self.content_offset, container)
        return container.children


def _store(env: BuildEnvironment, attr: str) -> dict:
    """A dict kept on the build environment (pickled with it)."""
    if not hasattr(env, attr):
        setattr(env, attr, {})
    return getattr(env, attr)


def _record(app: Sphinx, what: str, name: str, obj: object, options: dict,
            lines: list[str]) -> None:
    """Public methods and properties documented by ``:members:`` need docstrings."""
    if (what in ("method", "property") and not any(line.strip() for line in lines)
            and not name.rsplit(".", 1)[-1].startswith("_")):
        logger.warning(f"public-api: {name} has no docstring", location=app.env.docname)


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    for attr in ("public_api_documented", "public_api_modules"):
        _store(env, attr).pop(docname, None)


def _merge(app: Sphinx, env: BuildEnvironment, docnames, other: BuildEnvironment):
    for attr in ("public_api_documented", "public_api_modules"):
        mine = _store(env, attr)
        for docname, values in _store(other, attr).items():
            mine.setdefault(docname, set()).update(values)


def _check(app: Sphinx, env: BuildEnvironment) -> None:
    documented = set().union(*_store(env, "public_api_documented").values())
    covered = set().union(*_store(env, "public_api_modules").values())
    for module_name in public_modules(app.config.public_api_package):
        if module_name not in covered:
            logger.warning(
                f"public-api: module {module_name} is public but no page has "
                f"```{{public-api}} {module_name}``` (add it to an api page)")
            continue
        for name in public_names(module_name):
            if f"{module_name}.{name}" not in documented:
                logger.warning(f"public-api: {module_name}.{name} is public but "
                               "was not documented")


def resolve_short_names(app: Sphinx, env: BuildEnvironment, node, contnode):
    """Resolve a short Python reference (``Recipe.forms``, ``KINDS``) uniquely.

    Docstrings name objects as their own module sees them; in the reference,
    each object lives under its public module. A target that matches the
    end of exactly one documented object's full name links to it.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    objects = env.get_domain("py").objects
    matches = [name for name in objects
               if name == target or name.endswith("." + target)]
    if len(matches) != 1:
        return None
    entry = objects[matches[0]]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id,
                        contnode, matches[0])


PRIVATE_PATH = re.compile(r"\bcollectives(?:\.\w+)*\._\w+(?:\.\w+)*")


def public_homes(package: str) -> dict[str, str]:
    """Each public name -> the public module that lists it (the first one)."""
    homes: dict[str, str] = {}
    for module_name in public_modules(package):
        for name in public_names(module_name):
            homes.setdefault(name, module_name)
    return homes


def hide_private_paths(app: Sphinx, doctree: nodes.document) -> None:
    """In API entries, ``collectives._layout.Axes`` reads ``collectives.Axes``.

    Signatures and field types show annotations by their defining module,
    which for this package is a private one; the reader imports the name
    from its public module (or, for a type that is not exported, sees its
    bare name). References are retargeted the same way, so they resolve.
    """
    homes = public_homes(app.config.public_api_package)

    def public(match: re.Match) -> str:
        parts = match.group(0).split(".")
        last_private = max(i for i, part in enumerate(parts) if part.startswith("_"))
        rest = parts[last_private + 1:]
        for i, part in enumerate(rest):  # past public submodules of private ones
            if part in homes:
                return ".".join([homes[part], *rest[i:]])
        return ".".join(rest[-1:])

    for desc in doctree.findall(addnodes.desc):
        for xref in desc.findall(addnodes.pending_xref):
            target = xref.get("reftarget", "")
            if PRIVATE_PATH.search(target):
                xref["reftarget"] = PRIVATE_PATH.sub(public, target)
        for text in list(desc.findall(nodes.Text)):
            if PRIVATE_PATH.search(text.astext()):
                new = nodes.Text(PRIVATE_PATH.sub(public, text.astext()))
                text.parent.replace(text, new)


def skip_pointers_in_viewcode(app: Sphinx, doctree: nodes.document) -> None:
    """Pointer entries (``:no-index:``) get no "[source]" link.

    Otherwise the source page's "[docs]" link for the object would point at
    the pointer's module path, an anchor that no page has.
    """
    for desc in doctree.findall(addnodes.desc):
        if desc.get("no-index") or desc.get("noindex"):
            for signature in desc.findall(addnodes.desc_signature):
                signature["module"] = None


def setup(app: Sphinx) -> dict:
    app.add_config_value("public_api_package", "collectives", "env")
    app.add_directive("public-api", PublicAPI)
    app.connect("autodoc-process-docstring", _record)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check)
    app.connect("missing-reference", resolve_short_names)
    app.connect("doctree-read", hide_private_paths)
    # Before sphinx.ext.viewcode's own doctree-read (priority 500).
    app.connect("doctree-read", skip_pointers_in_viewcode, priority=400)
    return {"version": "1", "parallel_read_safe": True}
