"""Sphinx configuration for mlpapers (builds offline; ``sphinx-build -W`` in CI)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlpapers

project = "mlpapers"
author = "mlpapers developers"
copyright = "2026, mlpapers developers"
version = release = mlpapers.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

# intersphinx needs the network; enable it only when asked (never in CI).
if os.environ.get("MLPAPERS_DOCS_INTERSPHINX"):
    extensions.append("sphinx.ext.intersphinx")
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "torch": ("https://pytorch.org/docs/stable", None),
        "sklearn": ("https://scikit-learn.org/stable", None),
    }

# Fail the build on cross-references that resolve to nothing (with ``-W``), so a
# mistyped or moved target is an error rather than plain text.
nitpicky = True
# Except references into other projects: the docs build offline, without intersphinx,
# so their inventories are never fetched and these targets can never resolve. Only
# these packages' own names are ignored; every ``mlpapers`` target must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|scipy|sklearn|networkx)(\..*)?"),
    (r"py:.*", r"importlib(\..*)?"),  # Python standard library
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py",
                    "auto_examples/*.zip", "**.md5"]
autosummary_generate = True
autodoc_default_options = {"members": True}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "plot_gallery": "True",
    "within_subsection_order": "FileNameSortKey",
    # two examples at a time (joblib): the docs build took 113 s instead of 148 s on 2 cores
    "parallel": 2,
}

html_theme = "pydata_sphinx_theme"
html_title = "mlpapers"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path = []
suppress_warnings = ["config.cache"]


def _skip_member(app, what, name, obj, skip, options):
    """Hide the metadata-routing ``set_*_request`` methods scikit-learn generates:
    they are not ours, and their docstrings reference scikit-learn's own glossary."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def _drop_builtin_docstring(app, what, name, obj, options, lines):
    """A module constant (a tuple of accepted names) has no docstring of its own:
    autodoc would show the docstring of ``tuple``; the API page gives the text."""
    if what == "data" and getattr(obj, "__doc__", None) is type(obj).__doc__:
        lines.clear()


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-docstring", _drop_builtin_docstring)
