"""Typed user code: mypy checks the public annotations; tests/test_typing_checks.py runs it."""
