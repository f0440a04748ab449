"""Launch a worker script under ``torchrun`` (two gloo ranks on CPU) for the tests.

One launcher for every torchrun test: a free port, one intra-op thread per rank, the
workers' Python stacks printed on a native crash (``PYTHONFAULTHANDLER``), and a time
limit. A launch whose worker was killed by a signal is run once more: gloo's transport
threads can abort a process natively ("terminate called without an active exception",
seen once in CI on a loaded 2-core runner). That is a crash outside the library and
outside the property under test; a Python exception in a worker (exit code 1), a
wrong result or a second crash still fails the test.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# torchrun's failure report gives a worker killed by a signal a negative exit code
_KILLED_BY_SIGNAL = re.compile(r"exitcode\s*:\s*-\d+")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(script: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:                      # pragma: no cover
        pytest.fail(f"torchrun timed out:\n{exc.stdout}\n{exc.stderr}")


def run_two_ranks(script: Path, *args: str, timeout: float = 240) -> None:
    """Run ``script`` on two ranks; fail the test with the workers' output unless both
    exit cleanly (one relaunch when a worker died by a signal, see the module note)."""
    res = _launch(script, list(args), timeout)
    if res.returncode != 0 and _KILLED_BY_SIGNAL.search(res.stderr + res.stdout):
        res = _launch(script, list(args), timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
