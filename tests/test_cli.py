import subprocess
import sys

import pytest

from mlpapers import _registry
from mlpapers._registry import DemoResult, register
from mlpapers.cli import main


def test_list_and_demo_run(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    algos = _registry.discover()
    if algos:
        for name in algos:
            assert name in out
    else:
        assert "No algorithms" in out


def test_demo_table_with_a_registered_demo(capsys, monkeypatch):
    monkeypatch.setattr(_registry, "_REGISTRY", {})

    import torch

    seen = []

    @register("toy", module="mlpapers.toy", estimator="Toy", paper="A toy", arxiv="0000.00000")
    def _demo(quick):
        seen.append(torch.get_num_threads())
        return [DemoResult("toy", "base", "accuracy", 0.9, 0.5, 0.01, 0.02)]

    monkeypatch.setattr(_registry, "discover", lambda: dict(_registry._REGISTRY))
    monkeypatch.setattr("mlpapers.cli.discover", _registry.discover)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["demo", "toy", "--quick", "--threads", "1"]) == 0
        # the demo ran on 1 thread; the caller's count is restored (main may run inside
        # a user's process), also when the names are refused before any demo runs
        assert seen == [1] and torch.get_num_threads() == 2
        out = capsys.readouterr().out
        assert "| toy" in out and "0.9" in out and "accuracy (↑)" in out
        assert main(["demo", "nope", "--threads", "1"]) == 2
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "mlpapers", "list"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit):
        main(["frobnicate"])


@pytest.mark.parametrize("threads", ["0", "-2", "two", "3000000000"])  # (the last overflowed torch)
def test_bad_thread_count_exits_with_usage(threads, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--threads", threads])
    assert exc.value.code == 2
    assert "--threads" in capsys.readouterr().err


def test_the_amips_demo_trains_with_the_clis_thread_count(monkeypatch, capsys):
    # the demo set one thread itself, overriding --threads
    import torch

    from mlpapers.retrieval import amips

    seen = []
    fit = amips.AmortizedMIPS.fit

    def recording_fit(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(amips.AmortizedMIPS, "fit", recording_fit)
    before = torch.get_num_threads()
    try:
        assert main(["demo", "amips", "--quick", "--threads", "2"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [2, 2]
