"""Slow end-to-end checks: the command line as a user runs it."""

import subprocess
import sys

import pytest

from mlpapers._registry import discover


@pytest.mark.slow
def test_demo_quick_runs_every_registered_algorithm():
    proc = subprocess.run([sys.executable, "-m", "mlpapers", "demo", "--quick"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    algos = discover()
    if not algos:
        assert "No algorithms are registered yet" in proc.stdout
    for name in algos:
        assert f"| {name}" in proc.stdout, f"{name} missing from the demo table"
