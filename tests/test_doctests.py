"""Run the ``Examples`` sections of every public docstring as doctests.

The user guide's code blocks are copied by users as often as the docstrings are, but
they need the optional extras and minutes of fitting; the docstring examples are small
by convention, so they run in the default suite and cannot drift from the code.
"""

import doctest
import importlib
import os
import pkgutil

import pytest

import mlpapers

# Modules that need an optional extra at import time: skipped only when the extra
# itself is missing (CI installs every extra, so they run there).
OPTIONAL_IMPORTS = {
    "mlpapers.federated.clove._flower": "flwr",
    "mlpapers.federated.flower": "flwr",
}


def _module_names():
    return sorted(
        info.name
        for info in pkgutil.walk_packages(mlpapers.__path__, prefix="mlpapers.")
        if info.name != "mlpapers.__main__"
    )


@pytest.mark.parametrize("name", _module_names())
def test_docstring_examples(name, tmp_path):
    if name in OPTIONAL_IMPORTS:
        pytest.importorskip(OPTIONAL_IMPORTS[name])
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    # examples that save files write them in a fresh directory, not the checkout
    report = []
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for test in finder.find(module, name, module=module):
            runner.run(test, out=report.append)
    finally:
        os.chdir(cwd)
    assert runner.failures == 0, "".join(report)
