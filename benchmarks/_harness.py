"""Side-by-side benchmark harness shared by every ``bench_<algo>.py`` script.

Each case is a named callable returning a dict of quality metrics. The harness
runs all cases in one process on the same data, with warm-up and repeats, and
records the median wall time, the peak extra memory (resident set size sampled
in a background thread on CPU; ``torch.cuda.max_memory_allocated`` on CUDA) and
the metrics of the last repeat. It prints a Markdown table with ratios against a
chosen baseline and writes JSON with ``--out``.

Usage in a script::

    from _harness import Case, benchmark_main

    def cases(quick):
        X = ...
        return [Case("ours", lambda: {"accuracy": ...}),
                Case("baseline", lambda: {"accuracy": ...})]

    if __name__ == "__main__":
        benchmark_main(cases, baseline="baseline", title="...")

A script with options of its own passes them as a parent parser, so that ``--help``
lists them with the common ones::

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--threads", type=int, default=2)
    OPTIONS = benchmark_parser("...", parents=[extra]).parse_args()
    benchmark_main(cases, baseline="baseline", title="...", args=OPTIONS)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class Case:
    """A named benchmark case.

    Parameters
    ----------
    name : str
        Row label.
    fn : callable
        ``fn() -> dict[str, float]`` of quality metrics. Called ``warmup +
        repeats`` times.
    warmup : int or None
        Override of the harness' warm-up count for this case (e.g. 0 for a slow
        peer library).
    repeats : int or None
        Override of the repeat count.
    note : str
        Free text shown in the table (e.g. "peer: faiss").
    fixed : bool
        The counts are part of the case's design (it times itself inside ``fn`` or
        caches its work): ``--repeats``/``--warmup`` do not change them. Otherwise a
        ``--repeats``/``--warmup`` given on the command line replaces ``warmup`` and
        ``repeats`` (they are the case's defaults, not limits).
    """

    name: str
    fn: Callable[[], dict[str, float]]
    warmup: int | None = None
    repeats: int | None = None
    note: str = ""
    fixed: bool = False


@dataclass(frozen=True)
class PerGroup:
    """A baseline per group of rows: row ``"wiki: x"`` is compared with ``"wiki: <name>"``,
    a row without ``sep`` with ``name`` itself (a script running several problems, each
    with its own reference row, e.g. ``PerGroup("brute force")``)."""

    name: str
    sep: str = ": "

    def __call__(self, row: str) -> str:
        head, found, _ = row.partition(self.sep)
        return f"{head}{self.sep}{self.name}" if found else self.name


@dataclass
class Result:
    name: str
    time_s: float
    times_s: list[float]
    peak_mem_mb: float
    metrics: dict[str, float]
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _PeakMemory:
    """Peak resident memory above the level at entry, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak = 0

    def __enter__(self):
        self.base = _rss_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._cuda = _cuda_reset()
        # max_memory_allocated counts what was allocated before entry too (data and models
        # moved to the GPU by the script): subtract it, as base is subtracted from the RSS
        self._cuda_base = self._cuda.cuda.memory_allocated() if self._cuda is not None else 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            self._stop.wait(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.extra_mb = (self.peak - self.base) / 2**20
        if self._cuda is not None:
            self.extra_mb = max(self.extra_mb, (self._cuda.cuda.max_memory_allocated()
                                                - self._cuda_base) / 2**20)
        return False


def _cuda_reset():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch
    return None


def _sync():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def run_cases(cases: Sequence[Case], *, warmup: int = 1, repeats: int = 3,
              verbose: bool = True) -> list[Result]:
    """Run every case; a case that raises is reported with its error, not fatal."""
    results = []
    for case in cases:
        n_warm = case.warmup if case.warmup is not None else warmup
        n_rep = case.repeats if case.repeats is not None else repeats
        if n_rep < 1 or n_warm < 0:
            raise ValueError(f"case {case.name!r}: repeats must be >= 1 and warmup >= 0, "
                             f"got repeats={n_rep}, warmup={n_warm}.")
        times, metrics, peak, error = [], {}, 0.0, None
        try:
            for _ in range(n_warm):
                case.fn()
            for _ in range(n_rep):
                with _PeakMemory() as mem:
                    _sync()
                    start = time.perf_counter()
                    metrics = case.fn() or {}
                    _sync()
                    times.append(time.perf_counter() - start)
                peak = max(peak, mem.extra_mb)
        except Exception as exc:  # noqa: BLE001 -- a failing peer must not hide the others
            error = f"{type(exc).__name__}: {exc}"
        res = Result(case.name, statistics.median(times) if times else float("nan"), times,
                     peak, {k: float(v) for k, v in metrics.items()}, case.note, error)
        results.append(res)
        if verbose:
            status = f"error: {error}" if error else f"{res.time_s:.3f} s"
            print(f"  {case.name}: {status}", file=sys.stderr)
    return results


def _fmt(x: float) -> str:
    if x != x:  # NaN
        return "–"
    return f"{x:.4g}"


def format_table(results: Sequence[Result], baseline: str | PerGroup | None = None) -> str:
    """Markdown table: metrics, median time, peak memory, and ratios to ``baseline``.

    ``baseline`` is a row name, or a :class:`PerGroup` (each group of rows against its
    own reference row). A metric ratio is shown only where the baseline's value is
    positive and the row's is not negative ("–" otherwise): ratios of signed values do
    not order the rows.
    """
    metric_names: list[str] = []
    for r in results:
        metric_names += [m for m in r.metrics if m not in metric_names]
    by_name = {r.name: r for r in results}
    base_of = baseline if isinstance(baseline, PerGroup) else (lambda _row: baseline)
    bases = [by_name.get(base_of(r.name)) for r in results]
    label = baseline.name if isinstance(baseline, PerGroup) else baseline
    headers = ["method", *metric_names, "time (s)", "peak mem (MB)"]
    show = any(b is not None for b in bases)
    if show:
        headers += [f"time / {label}", *(f"{m} / {label}" for m in metric_names)]
    headers.append("note")
    rows = []
    for r, base in zip(results, bases):
        row = [r.name, *(_fmt(r.metrics.get(m, float("nan"))) for m in metric_names),
               _fmt(r.time_s), _fmt(r.peak_mem_mb)]
        if show and base is None:  # a group without its reference row
            row += ["–"] * (1 + len(metric_names))
        elif show:
            row.append(_fmt(r.time_s / base.time_s) if base.time_s > 0 else "–")
            for m in metric_names:
                a, b = r.metrics.get(m, float("nan")), base.metrics.get(m, float("nan"))
                # a ratio reads "x times the baseline" only for a positive baseline and a
                # value of the same sign: with signed metrics (a log-risk of -2) it would
                # invert the order (-1.9 / -2.0 = 0.95 for a worse value) or change sign
                row.append(_fmt(a / b) if b > 0 and a >= 0 else "–")
        row.append(r.error or r.note)
        rows.append(row)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "cpus": os.cpu_count()}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
    return info


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (0 timed repeats used to become 1
    and a negative warm-up 0, silently)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def ints_at_least(minimum: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each >= ``minimum``."""
    one = int_at_least(minimum)

    def parse(text: str) -> list[int]:
        return [one(part.strip()) for part in text.split(",")]
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (a step size, a temperature)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def writable_file(text: str) -> str:
    """An argparse type: a file path that can be written (checked before the run: a
    bad ``--out`` used to fail after the whole benchmark, losing its results)."""
    path = os.path.abspath(text)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, expected a file path")
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"the directory of {text!r} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path)
                                          and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def env_threads(default: int = 1) -> int:
    """Torch threads from ``BENCH_THREADS`` (``default`` when unset); a bad value stops
    the script with a message naming the variable (it used to end in a traceback from
    ``int()`` or ``torch.set_num_threads``)."""
    text = os.environ.get("BENCH_THREADS", "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"error: BENCH_THREADS must be a positive integer, got {text!r}")
    return value


def _json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities as ``None``: ``json.dump`` writes them as bare
    ``NaN``/``Infinity`` tokens, which are not JSON (strict parsers reject the file)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` as strict JSON (NaN and infinities as ``null``)."""
    with open(path, "w") as f:
        json.dump(_json_safe(payload), f, indent=2, allow_nan=False)


def read_results(path: str) -> dict[str, Any]:
    """A payload written by :func:`benchmark_main`, its ``results`` as :class:`Result`
    (``null`` numbers, NaN when written, read back as NaN)."""
    with open(path) as f:
        payload = json.load(f)
    nan = float("nan")
    results = []
    for d in payload["results"]:
        d = dict(d)
        d["metrics"] = {k: nan if v is None else v for k, v in d["metrics"].items()}
        d["time_s"] = nan if d["time_s"] is None else d["time_s"]
        d["peak_mem_mb"] = nan if d["peak_mem_mb"] is None else d["peak_mem_mb"]
        results.append(Result(**d))
    payload["results"] = results
    return payload


_HELP = {
    "--quick": "small sizes for a smoke run",
    "--out": "write results as JSON to this path",
    "--repeats": "timed repeats of every row (>= 1; default 3, 1 with --quick, or the "
                 "row's own count where the script sets one)",
    "--warmup": "untimed warm-up runs of every row (>= 0; default 1, 0 with --quick, or "
                "the row's own count where the script sets one)",
}


def benchmark_parser(title: str, *, parents: Sequence[argparse.ArgumentParser] = (),
                     help_text: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The command line of a benchmark: ``--quick``, ``--out``, ``--repeats``,
    ``--warmup``, and the options of the ``parents`` (built with ``add_help=False``),
    all listed by ``--help``. ``help_text`` replaces the help text of the common options
    (a script whose rows use one of them differently says so there)."""
    texts = {**_HELP, **(help_text or {})}
    parser = argparse.ArgumentParser(description=title, parents=list(parents))
    parser.add_argument("--quick", action="store_true", help=texts["--quick"])
    parser.add_argument("--out", type=writable_file, help=texts["--out"])
    parser.add_argument("--repeats", type=int_at_least(1), default=None,
                        help=texts["--repeats"])
    parser.add_argument("--warmup", type=int_at_least(0), default=None,
                        help=texts["--warmup"])
    return parser


def _given_counts(cases: Sequence[Case], args: argparse.Namespace) -> list[Case]:
    """``cases`` with the ``--repeats``/``--warmup`` of the command line in place of
    their own counts (a script's per-row counts are defaults: they used to override
    the options silently), except for ``fixed`` cases."""
    given = {k: None for k in ("repeats", "warmup") if getattr(args, k) is not None}
    return [c if c.fixed or not given else dataclasses.replace(c, **given) for c in cases]


def benchmark_main(
    make_cases: Callable[[bool], Sequence[Case]],
    *,
    baseline: str | PerGroup | None,
    title: str,
    argv: list[str] | None = None,
    args: argparse.Namespace | None = None,
    settings: dict[str, Any] | None = None,
) -> list[Result]:
    """Run the cases, print and save the table.

    ``args`` are the options parsed by :func:`benchmark_parser` (a script with
    options of its own parses them first); without them ``argv`` (default: the
    command line) is parsed here. The JSON of ``--out`` records every option but
    ``--out`` under ``settings``, updated with ``settings`` (values the script
    derived from them, e.g. the epochs a default stands for), so that runs made with
    different settings can be told apart.
    """
    if args is None:
        args = benchmark_parser(title).parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    cases = _given_counts(make_cases(args.quick), args)
    print(f"# {title}{' (quick)' if args.quick else ''}", file=sys.stderr)
    results = run_cases(cases, warmup=warmup, repeats=repeats)
    print(f"\n## {title}\n")
    print(format_table(results, baseline))
    if args.out:
        options = {k: v for k, v in vars(args).items() if k != "out"}
        base = (baseline if baseline is None or isinstance(baseline, str)
                else {"per_group": baseline.name, "sep": baseline.sep})
        payload = {"title": title, "quick": args.quick, "baseline": base,
                   "settings": {**options, **(settings or {})},
                   "environment": environment(),
                   "results": [r.__dict__ for r in results]}
        write_json(args.out, payload)
    return results
