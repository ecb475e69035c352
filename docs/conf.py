"""Sphinx configuration for the collectives documentation site.

Build: ``tox -e docs``, or, with the ``docs`` extra installed,
``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``.
The build runs every file in ``recipes/`` (the gallery), runs the core
collectives to draw their diagrams and count their bytes, and fails on any
warning, including an undocumented public name.
"""

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

# The diagrams and the cost table run collectives in this process: 8
# simulated CPU devices, set before anything starts JAX's backends.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import collectives  # noqa: E402

collectives.use_cpu_devices(8)

project = "collectives"
author = "The collectives authors"
copyright = "2026, The collectives authors"
release = version = collectives.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_design",
    "gallery",
    "collective_facts",
    "kernel_diagrams",
    "strategy_facts",
    "plan_facts",
    "public_api",
    "compat_matrix",
    "readme_snippet",
    "jax_links",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated/**/.cache", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

# -- MyST -----------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven",
                "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen",
                "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
                "twenty-one")


def pitfall_count() -> int:
    """The pitfalls of sharp_edges.md: the rows of its summary table."""
    text = (DOCS / "sharp_edges.md").read_text()
    return len(re.findall(r"^\| \{ref\}`\d+ <pitfall-\d+>` \|", text, re.M))


def number_word(n: int) -> str:
    """``13`` -> ``"thirteen"`` (digits past twenty)."""
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


# Counts in prose come from what they count: ``{{ pitfalls }}`` in a page
# (``{{ pitfalls | capitalize }}`` to open a sentence) is the number of rows
# of the sharp edges' table, in words.
myst_substitutions = {"pitfalls": number_word(pitfall_count())}

# -- autodoc / napoleon ---------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
autodoc_default_options = {"exclude-members": "__init__, __new__"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = False

# Types from other libraries stay plain text: the docs build offline, without
# intersphinx inventories.
nitpick_ignore_regex = [
    ("py:class", r"(jax|jaxlib|numpy|np|hypothesis|pytest|_pytest|argparse|"
                 r"collections|typing|typing_extensions|matplotlib|os|subprocess|"
                 r"types|dataclasses|pathlib|concurrent)(\..*)?"),
    ("py:class", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|IO|"
                 r"NamedTuple|SearchStrategy|P|Mesh|NamedSharding|PartitionSpec|"
                 r"Array|ArrayLike|DTypeLike|Shape|AxisArg|PyTree|Path|"
                 r"ShapeDtypeStruct|Figure|Namespace|ArgumentParser|Popen)"),
    ("py:obj", r"(jax|numpy|np|typing|collections)\..*"),
    ("py:class", r"collectives\..*\._[A-Za-z].*"),
    ("py:class", r"(st|strategies)\..*|SpecArg|ShapeArg|DtypeArg"),
    # Private helpers and types that public docstrings mention by name.
    ("py:func", r"standard_configs|expert_capacity"),
    ("py:class", r"DiagramSpec|BenchSpec|UnitBoundary"),
    ("py:data", r"DEFAULT_RANGE|EXACT_RANGE"),
]

# -- the recipe gallery ---------------------------------------------------------
gallery_recipes_dir = "../recipes"
gallery_guides_dir = "../guides"
# The gallery's sections, cards and diagrams come from the registry: each
# recipe names its file (``source``), its family and its diagram.

# -- HTML -----------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"collectives {release}"
html_static_path = ["_static", "_theme"]
html_css_files = ["collectives.css"]
html_js_files = ["collectives.js"]
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "use_download_button": False,
    "navigation_with_keys": False,
    # The side-by-side code, the wide tables and the landing page's snippet
    # get the page's full width.
    "secondary_sidebar_items": {"**": ["page-toc"], "migration": [],
                                "concepts": [], "index": [], "compatibility": [],
                                "gallery": []},
}
html_show_sourcelink = False

# -- figures --------------------------------------------------------------------
# Every figure is drawn for two content columns (collectives/_figure.py): a
# desktop's and a phone's. Where ``NAME.narrow.EXT`` sits beside ``NAME.EXT``
# the page carries both, and CSS shows the one drawn for the screen's width
# (``figure-wide`` and ``figure-narrow`` in _theme/collectives.css). Raster
# plots are shown at their natural width at most and open full size on a
# click. Each file records its smallest text and whether a legend covers
# data; docs/browser_check.py reads that record and checks the text on
# screen.


def mark_figures(app, doctree) -> None:
    """Give each figure with a narrow drawing its narrow twin, and each
    raster plot a link to its full-size file.

    A ``scale`` makes Sphinx write the image's natural width and height and
    wrap it in a link to the image file itself (``html_scaled_image_link``).
    """
    from docutils import nodes

    from collectives import _figure

    docdir = Path(app.env.doc2path(app.env.docname)).parent
    for image in list(doctree.findall(nodes.image)):
        uri = image["uri"]
        if "://" in uri or not uri.endswith((".png", ".svg")):
            continue
        path = (Path(app.srcdir) / uri.lstrip("/") if uri.startswith("/")
                else docdir / uri)
        if uri.endswith(".png"):
            image["classes"].append("plot")
            image["scale"] = 100
        narrow = _figure.narrow_path(path)
        if ".narrow." in uri or not narrow.exists():
            continue
        target = image.parent if isinstance(image.parent, nodes.reference) else image
        twin = target.deepcopy()
        twin_image = twin if isinstance(twin, nodes.image) else next(
            iter(twin.findall(nodes.image)))
        twin_image["uri"] = str(Path(uri).with_name(narrow.name))
        if isinstance(twin, nodes.reference):
            twin["refuri"] = str(Path(twin["refuri"]).with_name(narrow.name))
        image["classes"].append("figure-wide")
        twin_image["classes"].append("figure-narrow")
        target.parent.insert(target.parent.index(target) + 1, twin)


def setup(app) -> None:
    # (before Sphinx collects the images, so that it copies the twins too)
    app.connect("doctree-read", mark_figures, priority=400)
