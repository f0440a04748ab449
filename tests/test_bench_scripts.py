"""The command lines of the benchmark scripts (``benchmarks/bench_*.py``).

Every test stubs the expensive cases: they check what a script runs, refuses and
writes, never how fast or how well a method does.
"""

import argparse
import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _harness import Case  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_torch_threads(monkeypatch):
    """The scripts set torch's thread count for the whole process: not in tests."""
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)


def _script(name):
    return importlib.import_module(name)


def _strict_json(path):
    """Parse as strict JSON: bare NaN/Infinity tokens are an error."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(Path(path).read_text(), parse_constant=refuse)


# -- 1, 8: bench_clapp --out, --merge, --epochs --------------------------------------------
@pytest.fixture
def clapp(monkeypatch):
    mod = _script("bench_clapp")

    def make_cases(quick):  # the rows of the requested arms, without training anything
        arms = mod.ARMS or ["CLAPP"]
        pool = float(mod.PROBE_POOL or 0)
        return [Case("random init", lambda: {"acc_all": 0.5 + pool / 10}),
                *(Case(a, lambda: {"acc_all": 0.9, "gain_all": float("nan")}) for a in arms)]

    monkeypatch.setattr(mod, "make_cases", make_cases)
    monkeypatch.setattr(mod, "ARMS", None)
    monkeypatch.setattr(mod, "EPOCHS", None)
    monkeypatch.setattr(mod, "PROBE_POOL", None)
    return mod


def test_clapp_out_records_the_runs_settings(clapp, tmp_path):
    out = tmp_path / "a.json"
    clapp.main(["--quick", "--arms", "CLAPP++DFB", "--probe-pool", "1", "--out", str(out)])
    settings = _strict_json(out)["settings"]
    assert settings["probe_pool"] == 1 and settings["arms"] == "CLAPP++DFB"
    assert settings["epochs"] == 2 and settings["quick"] is True


def test_clapp_merge_refuses_runs_with_other_settings(clapp, tmp_path, capsys):
    """A "random init" row probed with --probe-pool 1 was merged with an arm probed on its
    own grids, flipping goal 1's verdict."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    clapp.main(["--quick", "--arms", "CLAPP++DFB", "--probe-pool", "1", "--out", str(a)])
    clapp.main(["--quick", "--arms", "CLAPP 2021", "--out", str(b)])
    capsys.readouterr()
    with pytest.raises(SystemExit, match="different settings.*probe_pool"):
        clapp.main(["--merge", str(a), str(b)])


def test_clapp_merge_refuses_another_benchmarks_file(clapp, tmp_path):
    from _harness import benchmark_main

    other = tmp_path / "btsp.json"
    benchmark_main(lambda quick: [Case("x", lambda: {})], baseline=None,
                   title="BTSP-MSR node assignment", argv=["--out", str(other)])
    with pytest.raises(SystemExit, match="BTSP-MSR"):
        clapp.main(["--merge", str(other)])


def test_clapp_merge_writes_out_and_keeps_the_quick_note(clapp, tmp_path, capsys):
    a, b, merged = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "merged.json"
    clapp.main(["--quick", "--arms", "CLAPP", "--out", str(a)])
    clapp.main(["--quick", "--arms", "CLAPP++", "--out", str(b)])
    capsys.readouterr()
    clapp.main(["--merge", str(a), str(b), "--out", str(merged)])
    text = capsys.readouterr().out
    data = _strict_json(merged)
    assert [r["name"] for r in data["results"]] == ["random init", "CLAPP", "CLAPP++"]
    assert data["settings"]["arms"] == "CLAPP,CLAPP++" and data["quick"] is True
    assert "quick smoke run: 2 epochs" in text
    # a merge of merges is a merge like any other
    clapp.main(["--merge", str(merged), str(a)])


@pytest.mark.parametrize("option", [["--quick"], ["--epochs", "3"], ["--arms", "CLAPP"],
                                    ["--probe-pool", "2"], ["--repeats", "2"]])
def test_clapp_merge_refuses_options_of_a_run(clapp, tmp_path, capsys, option):
    with pytest.raises(SystemExit):
        clapp.main(["--merge", str(tmp_path / "a.json"), *option])
    assert f"cannot use {option[0]}" in capsys.readouterr().err


def test_clapp_quick_honours_epochs(clapp, tmp_path, capsys):
    """``--quick --epochs 5`` trained 2 epochs and said so."""
    out = tmp_path / "a.json"
    clapp.main(["--quick", "--epochs", "5", "--out", str(out)])
    assert "quick smoke run: 5 epochs" in capsys.readouterr().out
    assert clapp._epochs(True) == 5 and _strict_json(out)["settings"]["epochs"] == 5


# -- 2, 11: bench_scent --out, one parser, warnings -----------------------------------------
@pytest.fixture
def scent(monkeypatch):
    mod = _script("bench_scent")
    sections = tuple((key, lambda quick, key=key: [Case(f"{key} row", lambda: {"m": 1.0})],
                      None, f"section {key}") for key, *_ in mod.SECTIONS)
    monkeypatch.setattr(mod, "SECTIONS", sections)
    return mod


@pytest.mark.parametrize("out, files", [
    ("noext", ["noext_dro", "noext_pauc"]),
    ("res.json.d/out.json", ["res.json.d/out_dro.json", "res.json.d/out_pauc.json"]),
])
def test_scent_out_adds_the_section_to_the_stem(scent, tmp_path, out, files):
    """``str.replace(".json", ...)`` wrote both sections to ``noext`` and renamed the
    directory ``res.json.d``."""
    (tmp_path / "res.json.d").mkdir()
    scent.main(["--only", "dro", "--only", "pauc", "--out", str(tmp_path / out)])
    titles = {_strict_json(tmp_path / name)["title"] for name in files}
    assert titles == {"section dro", "section pauc"}


def test_scent_has_one_parser_for_every_option(scent, capsys):
    with pytest.raises(SystemExit):
        scent.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--only", "--repeats", "--warmup", "--quick", "--out"):
        assert option in text
    with pytest.raises(SystemExit):
        scent.main(["--bogus"])
    err = capsys.readouterr().err
    assert "--only" in err and "--bogus" in err


def test_scent_forwards_repeats(scent, monkeypatch):
    calls = []
    monkeypatch.setattr(scent, "SECTIONS", (
        ("dro", lambda quick: [Case("r", lambda: calls.append(1) or {}, warmup=0,
                                    repeats=1)], None, "T"),))
    scent.main(["--repeats", "2", "--warmup", "1"])
    assert len(calls) == 3


def test_scent_grid_search_shows_only_the_kept_candidates_warnings(scent):
    from sklearn.exceptions import ConvergenceWarning

    def run(lr):
        warnings.warn(f"lr={lr} did not converge", ConvergenceWarning, stacklevel=1)
        return {1.0: 3.0, 2.0: 1.0, 3.0: 2.0}[lr]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best, results = scent._grid_search((1.0, 2.0, 3.0), run, key=lambda v: v)
    assert best == 2.0 and results == {1.0: 3.0, 2.0: 1.0, 3.0: 2.0}
    assert [str(w.message) for w in caught] == ["lr=2.0 did not converge"]


def test_scent_shows_each_kind_of_warning_once(scent, monkeypatch, capsys):
    """A kept run warned after every epoch, each time with its source line."""
    from sklearn.exceptions import ConvergenceWarning

    def row():
        for loss in (1992, 1854.5, 1755):
            warnings.warn(f"ended with a training loss of {loss}", ConvergenceWarning,
                          stacklevel=1)
        return {}

    monkeypatch.setattr(scent, "SECTIONS", (("dro", lambda quick: [Case("r", row)], None,
                                             "T"),))
    scent.main(["--quick"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert lines == ["warning: ConvergenceWarning: ended with a training loss of 1992 "
                     "(2 more like it)"]


# -- 3: --repeats / --warmup are honoured -----------------------------------------------
def test_rehmc_chain_rows_honour_repeats(monkeypatch):
    import numpy as np

    rehmc = _script("bench_rehmc")
    runs = []

    class FakeHMC:
        def __init__(self, *args, **kwargs):
            pass

        def sample(self, n, n_chains, warmup):
            runs.append(n_chains)
            rng = np.random.default_rng(len(runs))
            return argparse.Namespace(samples=rng.normal(size=(max(n_chains, 2), n, 2)),
                                      accept_rate=np.ones(n_chains), mean_leapfrog=10.0)

    monkeypatch.setattr(rehmc, "ReflectiveHMC", FakeHMC)
    monkeypatch.setattr(rehmc, "REPEATS", [3])
    from _harness import run_cases

    run_cases(rehmc.chain_cases(2, 20, 5)[:1], verbose=False)
    assert runs == [1, 1, 1]  # "1 chain" timed three times


def test_rad_speed_studies_honour_repeats(monkeypatch):
    rad = _script("bench_rad")
    monkeypatch.setattr(rad, "_OPTIONS", argparse.Namespace(repeats=None))
    assert rad._study_repeats(True, 2) == 2 and rad._study_repeats(False, 2) == 5
    monkeypatch.setattr(rad, "_OPTIONS", argparse.Namespace(repeats=3))
    assert rad._study_repeats(True, 1) == 3 and rad._study_repeats(False, 2) == 3


def test_rad_help_says_how_the_speed_rows_use_repeats(capsys):
    rad = _script("bench_rad")
    with pytest.raises(SystemExit):
        rad.main(["--help"])
    assert "speed studies" in capsys.readouterr().out


# -- 4: bench_rehmc modes ------------------------------------------------------------------
@pytest.fixture
def rehmc(monkeypatch):
    mod = _script("bench_rehmc")
    calls = {}

    def record(name):
        def fn(*args, **kwargs):
            calls[name] = (args, kwargs)
            return []
        return fn

    for name in ("sweep_cases", "seed_cases", "corner_cases", "chain_cases", "ill_cases",
                 "other_cases"):
        monkeypatch.setattr(mod, name, record(name))
    monkeypatch.setattr(mod, "_run_groups", lambda groups, q, out: calls.setdefault(
        "groups", [g[0] for g in groups]))
    monkeypatch.setattr(mod, "REPEATS", [1])
    with warnings.catch_warnings():
        yield mod, calls


@pytest.mark.parametrize("argv", [["--sweep", "--corner"], ["--seeds", "--sweep"],
                                  ["--corner", "--seeds"]])
def test_rehmc_refuses_two_modes(rehmc, capsys, argv):
    mod, calls = rehmc
    with pytest.raises(SystemExit):
        mod.main(argv)
    assert "not allowed with" in capsys.readouterr().err and "groups" not in calls


@pytest.mark.parametrize("mode, name", [("--sweep", "sweep_cases"), ("--seeds", "seed_cases"),
                                        ("--corner", "corner_cases")])
def test_rehmc_quick_scales_every_mode_down(rehmc, mode, name):
    mod, calls = rehmc
    mod.main([mode])
    full = calls.pop(name)
    calls.clear()
    mod.main([mode, "--quick"])
    quick = calls[name]
    n_full, n_quick = [c[0][1 if name == "corner_cases" else 0] for c in (full, quick)]
    assert n_quick < n_full
    if name == "seed_cases":
        assert quick[1]["seeds"] < full[1].get("seeds", 4)


def test_rehmc_out_is_strict_json(tmp_path):
    mod = _script("bench_rehmc")
    out = tmp_path / "r.json"
    mod._run_groups([("T", [Case("a", lambda: {"m": float("nan")})], None)], True, str(out))
    assert _strict_json(out)["groups"][0]["results"][0]["metrics"] == {"m": None}


# -- 5, 6: bench_rbe ------------------------------------------------------------------------
def test_rbe_ratios_are_per_problem(monkeypatch):
    from _harness import Result, format_table

    rbe = _script("bench_rbe")
    seen = {}
    monkeypatch.setattr(rbe, "benchmark_main", lambda make, **kw: seen.update(kw))
    rbe.main(["--quick"])
    base = seen["baseline"]
    res = [Result("wiki: brute force", 4.0, [4.0], 0.0, {"hit@20": 1.0}),
           Result("wiki: AnnCUR B=20", 2.0, [2.0], 0.0, {"hit@20": 0.5})]
    table = format_table(res, base)  # wiki rows alone (--no-synthetic): ratios shown
    assert "time / brute force" in table
    row = [c.strip() for c in table.splitlines()[3].split("|")[1:-1]]
    assert row[0] == "wiki: AnnCUR B=20" and row[4:6] == ["0.5", "0.5"]


def test_rbe_quick_wiki_embeds_only_the_documents_it_uses(monkeypatch):
    import mlpapers.datasets._wiki as wiki

    rbe = _script("bench_rbe")
    asked = {}

    class Stop(Exception):
        pass

    def load(embed=False, cache_dir=None, max_docs=None, **kw):
        asked["max_docs"] = max_docs
        raise Stop

    monkeypatch.setattr(wiki, "load_wiki_summaries", load)
    monkeypatch.setattr(rbe, "_OPTIONS", argparse.Namespace(
        threads=2, no_wiki=False, no_synthetic=True, wiki=True, wiki_items=2000,
        wiki_queries=1000, k=None))
    with pytest.raises(Stop):
        rbe.wiki_cases(True)
    assert asked["max_docs"] == 800 + 400 + 100  # items + training + test queries


# -- 9: bench_amips --sizes ----------------------------------------------------------------
def test_amips_sizes_keep_large_and_get_distinct_labels(monkeypatch):
    amips = _script("bench_amips")
    labels = []
    monkeypatch.setattr(amips, "make_mips_problem", lambda n, *a, **k: (n, None, None))
    monkeypatch.setattr(amips, "dataset_cases", lambda name, keys, *a, **k:
                        labels.append((name, keys)) or [])
    monkeypatch.setattr(amips, "_OPTIONS", argparse.Namespace(
        **{**vars(amips._OPTIONS), "sizes": [500, 1500, 1000], "large": True,
           "no_wiki": True}))
    amips.make_cases(False)
    assert labels == [("syn500", 500), ("syn1500", 1500), ("syn1k", 1000),
                      ("syn100k", 100_000)]


# -- 10: BENCH_THREADS ---------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_bad_bench_threads_is_a_clear_error(monkeypatch, value, capsys):
    from _harness import env_threads

    monkeypatch.setenv("BENCH_THREADS", value)
    with pytest.raises(SystemExit, match="BENCH_THREADS must be a positive integer"):
        env_threads()
    for name in ("bench_clove", "bench_clapp"):  # --help works whatever it holds
        with pytest.raises(SystemExit) as exc:
            _script(name).main(["--help"])
        assert exc.value.code == 0
    clove = _script("bench_clove")
    monkeypatch.setattr(clove, "make_cases", lambda quick: [])
    with pytest.raises(SystemExit, match="BENCH_THREADS"):
        clove.main(["--quick"])


def test_bench_threads_is_read(monkeypatch):
    from _harness import env_threads

    monkeypatch.delenv("BENCH_THREADS", raising=False)
    assert env_threads(1) == 1
    monkeypatch.setenv("BENCH_THREADS", " 3 ")
    assert env_threads(1) == 3
