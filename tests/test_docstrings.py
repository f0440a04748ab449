"""The public API's docstrings follow numpydoc, as CONVENTIONS.md requires.

Every public class and function (the ``__all__`` of every public module) and every
public method those classes define has a docstring whose ``Parameters`` section names
exactly the signature's parameters, each with a description, and a ``Returns`` section
when it returns a value; public classes and functions carry an ``Examples`` section (run
by ``test_doctests.py``). Objects are discovered, so new code is checked without editing
this file. numpydoc is in the ``docs`` extra: CI installs it.
"""

import ast
import dataclasses
import inspect
import re

import pytest

from mlpapers._base import _same_param
from tests._public import package_modules

validate = pytest.importorskip("numpydoc.validate").validate
NumpyDocString = pytest.importorskip("numpydoc.docscrape").NumpyDocString

# PR01: a parameter is not documented; PR02: a documented parameter is not in the
# signature; PR07: a parameter has no description; RT01: no Returns section;
# GL08: no docstring.
CHECKS = ("PR01", "PR02", "PR07", "RT01", "GL08")


def _public_objects():
    """``{qualified name: object}`` of the public classes and functions, and
    ``{qualified name: function}`` of the public methods the classes define."""
    objects, methods = {}, {}
    for module in package_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__module__.startswith("mlpapers"):
                continue
            qual = f"{obj.__module__}.{obj.__qualname__}"
            objects[qual] = obj
            if not inspect.isclass(obj):
                continue
            for klass in obj.__mro__:  # methods inherited from our own base classes too
                if not klass.__module__.startswith("mlpapers"):
                    continue
                for mname, member in vars(klass).items():
                    func = member.__func__ if isinstance(member, classmethod | staticmethod) \
                        else member
                    if mname.startswith("_") or not inspect.isfunction(func):
                        continue
                    if not getattr(func, "__module__", "").startswith("mlpapers"):
                        continue  # e.g. sklearn's generated set_*_request
                    methods.setdefault(f"{klass.__module__}.{klass.__qualname__}.{mname}",
                                       func)
    return objects, methods


OBJECTS, METHODS = _public_objects()


def _errors(qualname, obj, codes):
    report = validate(qualname)
    errors = [(code, msg) for code, msg in report["errors"] if code in codes]
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        # a result container: its fields are documented under Attributes (checked below)
        errors = [(c, m) for c, m in errors if c not in ("PR01", "PR02", "PR07")]
    return errors


@pytest.mark.parametrize("qualname", sorted(OBJECTS))
def test_public_object_docstring(qualname):
    obj = OBJECTS[qualname]
    errors = _errors(qualname, obj, (*CHECKS, "EX01"))
    assert not errors, "\n".join(f"{qualname}: {c} {m}" for c, m in errors)


@pytest.mark.parametrize("qualname", sorted(METHODS))
def test_public_method_docstring(qualname):
    errors = _errors(qualname, METHODS[qualname], CHECKS)
    assert not errors, "\n".join(f"{qualname}: {c} {m}" for c, m in errors)


@pytest.mark.parametrize("qualname", sorted(q for q, o in OBJECTS.items()
                                            if dataclasses.is_dataclass(o)))
def test_result_fields_are_documented_as_attributes(qualname):
    obj = OBJECTS[qualname]
    doc = inspect.getdoc(obj) or ""
    section = doc.split("Attributes\n----------", 1)
    assert len(section) == 2, f"{qualname} has no Attributes section"
    documented = set(re.findall(r"^(\w+)\s*:", section[1], flags=re.M))
    missing = [f.name for f in dataclasses.fields(obj) if f.name not in documented]
    assert not missing, f"{qualname}: fields {missing} are not under Attributes"


_DEFAULT = re.compile(r"default\s*=\s*(.+)$")
_PROSE = object()


def _documented_value(text):
    """The value a ``default=...`` type line states (a literal, or arithmetic such as
    ``2**24`` or ``(3/4, 4/3)``), or ``_PROSE`` for words (``default=ImageNet's``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if re.fullmatch(r"[\d\s.eE*/+\-(),]+", text):
        return eval(text, {"__builtins__": {}})  # digits and operators only
    return _PROSE


def _same(documented, default):
    if isinstance(documented, bool) or isinstance(default, bool):
        return documented is default  # (True == 1 and False == 0 otherwise)
    return _same_param(documented, default)  # (lists and tuples alike, as set_params)


DOCUMENTED = {q: o for q, o in {**OBJECTS, **METHODS}.items() if not dataclasses.is_dataclass(o)}


@pytest.mark.parametrize("qualname", sorted(DOCUMENTED))
def test_documented_defaults_are_the_signatures(qualname):
    """A ``default=`` in a Parameters type line (one value, or one per name of a
    grouped entry) equals the signature's default: the API reference cannot drift from
    the code."""
    obj = DOCUMENTED[qualname]
    signature = inspect.signature(obj).parameters
    for entry in NumpyDocString(inspect.getdoc(obj) or "")["Parameters"]:
        match = _DEFAULT.search(entry.type)
        value = _documented_value(match.group(1).strip()) if match else _PROSE
        if value is _PROSE:
            continue
        names = [n.strip() for n in entry.name.split(",")]
        # a grouped entry states one value per name, or one value for all of them
        grouped = len(names) > 1 and isinstance(value, tuple) and len(value) == len(names)
        values = value if grouped else (value,) * len(names)
        for name, documented in zip(names, values, strict=True):
            default = signature[name].default
            assert default is not inspect.Parameter.empty, f"{qualname}({name}) is required"
            assert _same(documented, default), (
                f"{qualname}({name}): documented default={documented!r}, "
                f"signature {default!r}")


def test_discovery_finds_the_public_api():
    names = {q.rsplit(".", 1)[-1] for q in OBJECTS}
    assert {"SCENTClassifier", "ReflectiveHMC", "RADDetector", "CLoVE", "AmortizedMIPS",
            "CLAPPEncoder", "RelevanceBasedRetriever", "BottleneckNodeAssigner"} <= names
    assert any(q.endswith("SCENTClassifier.fit") for q in METHODS)
