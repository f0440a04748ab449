import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _harness import Case, benchmark_main, format_table, run_cases  # noqa: E402


def test_run_cases_times_metrics_and_ratios():
    calls = []

    def slow():
        calls.append("slow")
        time.sleep(0.02)
        return {"acc": 0.5}

    def fast():
        return {"acc": 1.0}

    def broken():
        raise RuntimeError("boom")

    res = run_cases([Case("slow", slow), Case("fast", fast), Case("broken", broken)],
                    warmup=1, repeats=2, verbose=False)
    assert len(calls) == 3  # 1 warm-up + 2 repeats
    assert res[0].time_s >= 0.02 and res[1].time_s < res[0].time_s
    assert res[2].error == "RuntimeError: boom"
    table = format_table(res, baseline="slow")
    lines = table.splitlines()
    assert "time / slow" in lines[0] and "acc / slow" in lines[0]
    fast_row = [c.strip() for c in lines[3].split("|")]
    assert fast_row[1] == "fast" and fast_row[-3] == "2"  # acc ratio 1.0 / 0.5


def test_peak_memory_sees_a_large_allocation():
    import numpy as np

    res = run_cases([Case("alloc", lambda: {"s": float(np.ones(40_000_000).sum())})],
                    warmup=0, repeats=1, verbose=False)
    assert res[0].peak_mem_mb > 100  # 320 MB array


def test_benchmark_main_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    benchmark_main(lambda quick: [Case("a", lambda: {"m": 1.0})], baseline="a", title="T",
                   argv=["--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["quick"] and data["results"][0]["metrics"] == {"m": 1.0}
    assert "| a |" in capsys.readouterr().out
