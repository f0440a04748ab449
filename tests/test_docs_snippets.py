"""The Python snippets of the README and of the user guide run as written.

Users copy these first. Each document's blocks run in order in one fresh process
(later blocks of a page reuse the names of earlier ones), in a temporary directory.
"""

import ast
import importlib
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from tests._public import OPTIONAL_IMPORTS

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "user_guide"

# Blocks that are not self-contained programs: templates around the user's own
# objects (a data loader, a Flower app) or a script meant for ``torchrun``.
NOT_RUNNABLE = (
    "# dataset, loader, model and opt are your own",
    "# server_app.py",
    "# train_clapp.py",
)

# Pages whose snippets fit the slow suite; amips.rst (a 3000-step fit, about 4 min)
# and clapp.rst (three 20-epoch fits, about 1 min) are run by hand before a release.
SLOW_PAGES = ("btsp", "clove", "rad", "rbe", "rehmc", "scent")


def _rst_blocks(path):
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = re.match(r"(\s*)\.\. code-block:: python\s*$", lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group(1))
        i += 1
        body = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            if not lines[i].lstrip().startswith(":"):  # directive options
                body.append(lines[i])
            i += 1
        blocks.append(textwrap.dedent("\n".join(body)))
    return blocks


def _markdown_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def _run(blocks, tmp_path):
    code = "\n".join(b for b in blocks if not any(mark in b for mark in NOT_RUNNABLE))
    assert code.strip(), "no runnable snippet found"
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_snippets_run(tmp_path):
    _run(_markdown_blocks(ROOT / "README.md"), tmp_path)


def test_rst_block_parser_reads_every_guide_block():
    # guards the parser: every code-block directive of the guide is found
    for page in GUIDE.glob("*.rst"):
        n_directives = page.read_text().count(".. code-block:: python")
        assert len(_rst_blocks(page)) == n_directives, page.name


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES)
def test_user_guide_snippets_run(page, tmp_path):
    if page == "rad":
        pytest.importorskip("efficientnet_lite_pytorch")  # the `pretrained` extra
    _run(_rst_blocks(GUIDE / f"{page}.rst"), tmp_path)


def test_api_page_templates_are_where_sphinx_looks_for_them():
    # autosummary resolves ``:template: NAME`` against the ``templates_path`` folders;
    # a template elsewhere is silently replaced by Sphinx's default one (which, for
    # classes, drops the methods inherited from our own base classes)
    used = set()
    for page in (ROOT / "docs" / "api").glob("*.rst"):
        used.update(re.findall(r":template:\s*(\S+)", page.read_text()))
    assert used, "no :template: option found in docs/api"
    for name in used:
        assert (ROOT / "docs" / "_templates" / name).is_file(), name
    assert ":inherited-members:" in (ROOT / "docs" / "_templates" / "class.rst").read_text()


def _public_names(module_name, path):
    """A module's ``__all__``; read from its source when the module needs an optional
    extra to import (the Flower adapter), so that the check runs without the extra."""
    try:
        return getattr(importlib.import_module(module_name), "__all__", [])
    except ImportError as exc:
        if getattr(exc, "name", None) not in OPTIONAL_IMPORTS:
            raise
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in node.targets)):
            return ast.literal_eval(node.value)
    return []


def test_api_pages_list_every_public_name():
    api_words = set()
    for page in (ROOT / "docs" / "api").glob("*.rst"):
        api_words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", page.read_text()))
    missing, n_modules = {}, 0
    for path in sorted((ROOT / "mlpapers").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) == 1 or any(p.startswith("_") for p in parts[1:]):
            continue  # the top level exports the subpackages; private modules
        n_modules += 1
        names = [n for n in _public_names(".".join(parts), path) if n not in api_words]
        if names:
            missing[".".join(parts)] = names
    assert n_modules > 10
    assert not missing, missing


def test_gallery_examples_import_only_public_names():
    # users copy the gallery: an import from a private module (or of a private name)
    # would teach them an interface that may change without notice
    private = []
    for script in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlpapers"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("mlpapers")]
            else:
                continue
            private += [f"{script.name}: {n}" for n in names
                        if any(part.startswith("_") for part in n.split(".")[1:])]
    assert not private, private
