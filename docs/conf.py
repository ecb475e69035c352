"""Sphinx configuration for the collectives documentation site.

Build: ``tox -e docs``, or, with the ``docs`` extra installed,
``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``.
The build runs every file in ``recipes/`` (the gallery), runs the core
collectives to draw their diagrams and count their bytes, and fails on any
warning, including an undocumented public name.
"""

import os
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
    "strategy_facts",
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
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

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
    ("py:class", r"DiagramSpec|BenchSpec"),
    ("py:data", r"DEFAULT_RANGE|EXACT_RANGE"),
]

# -- the recipe gallery ---------------------------------------------------------
gallery_recipes_dir = "../recipes"
# The gallery's sections, cards and diagrams come from the registry: each
# recipe names its file (``source``), its family and its diagram.

# -- HTML -----------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"collectives {release}"
html_static_path = ["_static", "_theme"]
html_css_files = ["collectives.css"]
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "use_download_button": False,
    "navigation_with_keys": False,
    # The side-by-side code and the wide tables get the page's full width.
    "secondary_sidebar_items": {"**": ["page-toc"], "migration": [],
                                "concepts": []},
}
html_show_sourcelink = False
