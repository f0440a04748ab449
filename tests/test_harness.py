import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _harness import (  # noqa: E402
    Case,
    benchmark_main,
    benchmark_parser,
    format_table,
    ints_at_least,
    positive_float,
    run_cases,
)


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


def test_help_lists_the_scripts_own_options(capsys):
    # the scripts parsed their options with an add_help=False parser and passed the rest
    # on: --help showed only the harness' four options, never --threads or --no-wiki
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--threads", type=int, help="torch threads")
    parser = benchmark_parser("T", parents=[extra])
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--threads" in text and "--repeats" in text
    args = parser.parse_args(["--threads", "3", "--quick"])
    assert args.threads == 3 and args.quick
    out = benchmark_main(lambda quick: [Case("a", lambda: {"m": float(quick)})],
                         baseline=None, title="T", args=args)
    assert out[0].metrics == {"m": 1.0}


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--warmup", "-1"], ["--repeats", "x"]])
def test_bad_repeat_counts_are_refused(argv, capsys):
    # --repeats 0 was run once and a negative --warmup as none, silently
    with pytest.raises(SystemExit):
        benchmark_main(lambda quick: [Case("a", lambda: {})], baseline=None, title="T",
                       argv=argv)
    assert "expected an integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        run_cases([Case("a", lambda: {}, repeats=0)], verbose=False)


@pytest.mark.parametrize("out, match", [("{tmp}/no/such/dir/r.json", "does not exist"),
                                        ("{tmp}", "is a directory")])
def test_a_bad_out_path_is_refused_before_any_case_runs(tmp_path, capsys, out, match):
    # the path was opened after the whole run: minutes of results lost to a traceback
    ran = []
    with pytest.raises(SystemExit):
        benchmark_main(lambda quick: [Case("a", lambda: ran.append(1) or {})],
                       baseline=None, title="T", argv=["--out", out.format(tmp=tmp_path)])
    assert match in capsys.readouterr().err and not ran


def test_list_and_float_option_types():
    import argparse

    assert ints_at_least(1)("10, 200") == [10, 200]
    assert positive_float("3e-3") == 3e-3
    for parse, text in [(ints_at_least(1), "10,0"), (ints_at_least(1), "a"),
                        (positive_float, "0"), (positive_float, "-1"), (positive_float, "nan"),
                        (positive_float, "inf"), (positive_float, "x")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def _row(table, name):
    for line in table.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(name)


def test_ratios_of_signed_metrics_are_not_shown():
    """A negative baseline (a log-risk) or a negative value has no meaningful ratio: the
    old table showed -1.9 / -2.0 = 0.95 for a worse objective and -inf for a diverged one."""
    from _harness import Result

    res = [Result("ref", 1.0, [1.0], 0.0, {"objective": -2.0, "gap": 0.5}),
           Result("worse", 2.0, [2.0], 0.0, {"objective": -1.9, "gap": 1.0}),
           Result("diverged", 2.0, [2.0], 0.0, {"objective": float("inf"), "gap": -0.5})]
    table = format_table(res, baseline="ref")
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    col = {h: i for i, h in enumerate(header)}
    worse, diverged = _row(table, "worse"), _row(table, "diverged")
    assert worse[col["objective / ref"]] == "–" and diverged[col["objective / ref"]] == "–"
    assert worse[col["gap / ref"]] == "2" and diverged[col["gap / ref"]] == "–"
    assert worse[col["time / ref"]] == "2"


def test_cuda_peak_memory_is_the_extra_above_entry(monkeypatch):
    """On CUDA the peak must not count memory allocated before the case (the old code
    reported ``max_memory_allocated`` itself: 1 GiB held by the script + 10 MiB of work
    read as 1034 MB of peak extra memory)."""
    import types

    from _harness import _PeakMemory

    state = {"allocated": 2**30, "peak": 2**30}
    cuda = types.SimpleNamespace(
        is_available=lambda: True, synchronize=lambda: None,
        reset_peak_memory_stats=lambda: state.update(peak=state["allocated"]),
        memory_allocated=lambda: state["allocated"], max_memory_allocated=lambda: state["peak"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    with _PeakMemory() as mem:
        state["peak"] = state["allocated"] + 10 * 2**20  # a case that used 10 MiB more
    assert 10 <= mem.extra_mb < 20


def test_given_repeats_and_warmup_replace_the_cases_own_counts():
    """Rows with their own counts (``warmup=0, repeats=1``) ignored ``--repeats 3``."""
    calls = {"own": 0, "fixed": 0}

    def count(name):
        return lambda: calls.__setitem__(name, calls[name] + 1) or {}

    cases = [Case("own", count("own"), warmup=0, repeats=1),
             Case("fixed", count("fixed"), warmup=0, repeats=1, fixed=True)]
    benchmark_main(lambda quick: cases, baseline=None, title="T",
                   argv=["--repeats", "3", "--warmup", "1"])
    assert calls == {"own": 4, "fixed": 1}
    calls.update(own=0)
    benchmark_main(lambda quick: cases, baseline=None, title="T", argv=[])
    assert calls["own"] == 1  # without the options, the case's own counts


def test_out_is_strict_json_with_nan_as_null(tmp_path):
    """``json.dump`` wrote bare ``NaN`` tokens (clove's first_round_ari1, rad's pixel_auroc)."""
    from _harness import read_results

    out = tmp_path / "r.json"
    benchmark_main(lambda quick: [Case("a", lambda: {"m": float("nan"), "k": float("inf")})],
                   baseline=None, title="T", argv=["--quick", "--out", str(out)])

    def refuse(token):
        raise ValueError(token)
    data = json.loads(out.read_text(), parse_constant=refuse)
    assert data["results"][0]["metrics"] == {"m": None, "k": None}
    back = read_results(str(out))["results"][0]
    assert back.metrics["m"] != back.metrics["m"]  # NaN again


def test_out_records_the_options_and_the_scripts_settings(tmp_path):
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--probe-pool", type=int, default=None)
    args = benchmark_parser("T", parents=[extra]).parse_args(
        ["--quick", "--probe-pool", "1", "--out", str(tmp_path / "r.json")])
    benchmark_main(lambda quick: [Case("a", lambda: {})], baseline=None, title="T",
                   args=args, settings={"epochs": 2})
    settings = json.loads((tmp_path / "r.json").read_text())["settings"]
    assert settings == {"probe_pool": 1, "quick": True, "repeats": None, "warmup": None,
                        "epochs": 2}


def test_a_baseline_per_group_of_rows():
    """Each problem's rows against its own reference row ("wiki: brute force")."""
    from _harness import PerGroup, Result

    res = [Result("brute force", 1.0, [1.0], 0.0, {"hit": 1.0}),
           Result("A B=20", 2.0, [2.0], 0.0, {"hit": 0.5}),
           Result("wiki: brute force", 4.0, [4.0], 0.0, {"hit": 1.0}),
           Result("wiki: A B=20", 2.0, [2.0], 0.0, {"hit": 0.25}),
           Result("other: A", 2.0, [2.0], 0.0, {"hit": 0.25})]
    table = format_table(res, PerGroup("brute force"))
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    col = {h: i for i, h in enumerate(header)}
    assert _row(table, "A B=20")[col["time / brute force"]] == "2"
    assert _row(table, "wiki: A B=20")[col["time / brute force"]] == "0.5"
    assert _row(table, "wiki: A B=20")[col["hit / brute force"]] == "0.25"
    assert _row(table, "other: A")[col["time / brute force"]] == "–"  # no reference row
