"""Peak resident memory of one call, measured in a fresh interpreter.

``peak_mb(setup, call)`` runs ``setup`` then ``call`` (Python source) in a new process
and returns the peak resident set size reached *during* ``call`` minus the resident size
just before it, in MB. A fresh process makes the figure independent of what the test
session allocated before (a heap already full of holes hides growth). The peak is reset
through ``/proc/self/clear_refs`` (Linux), so tests using it skip elsewhere.

Typical use: compare the peak at ``n`` and ``4 n`` rows; a chunked computation whose
blocks are bounded grows by about the size of its output only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_CHILD = """
import gc, json, os
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
{setup}
gc.collect()
_before = _status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
{call}
print("PEAK_JSON" + json.dumps(_status("VmHWM:") - _before))
"""


def _peak_supported() -> bool:
    return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


requires_peak_rss = pytest.mark.skipif(
    not _peak_supported(), reason="peak RSS reset needs Linux /proc/self/clear_refs")


def peak_mb(setup: str, call: str, *, timeout: float = 180.0) -> float:
    """Peak RSS increase (MB) of ``call`` after ``setup``, in a fresh process."""
    code = _CHILD.format(setup=textwrap.dedent(setup), call=textwrap.dedent(call))
    # one thread, as every test (OMP_NUM_THREADS set by tests/conftest.py)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"child failed:\n{done.stderr[-3000:]}")
    line = [s for s in done.stdout.splitlines() if s.startswith("PEAK_JSON")][-1]
    return float(json.loads(line[len("PEAK_JSON"):]))
