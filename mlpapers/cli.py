"""Command line: ``python -m mlpapers list`` and ``python -m mlpapers demo``."""

from __future__ import annotations

import argparse
import sys
import time

from mlpapers._registry import discover


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def cmd_list(args: argparse.Namespace) -> int:
    algos = discover()
    if not algos:
        print("No algorithms are registered yet.")
        return 0
    rows = [[a.name, a.module, a.estimator, a.paper, a.arxiv] for a in algos.values()]
    print(_table(["name", "module", "estimator", "paper", "arXiv"], rows))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    algos = discover()
    if not algos:
        print("No algorithms are registered yet: nothing to demo.")
        return 0
    names = args.names or list(algos)
    unknown = [n for n in names if n not in algos]
    if unknown:
        print(f"unknown algorithm(s): {', '.join(unknown)}; choose from {', '.join(algos)}",
              file=sys.stderr)
        return 2
    import torch

    # --threads for the demos only: main() may be called from a user's own process,
    # whose thread count is left as it was
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = []
    try:
        for name in names:
            start = time.perf_counter()
            results = algos[name].demo(args.quick)
            elapsed = time.perf_counter() - start
            for r in results:
                rows.append([
                    name, r.method, r.baseline,
                    r.metric + (" (↑)" if r.higher_is_better else " (↓)"),
                    f"{r.value:.4g}", f"{r.baseline_value:.4g}",
                    f"{r.time_s:.2f}", f"{r.baseline_time_s:.2f}",
                ])
            print(f"[{name}] done in {elapsed:.1f} s", file=sys.stderr)
    finally:
        torch.set_num_threads(threads)
    print(_table(["algorithm", "method", "baseline", "metric", "ours", "baseline value",
                  "ours time (s)", "baseline time (s)"], rows))
    return 0


#: the most threads --threads takes (torch's set_num_threads failed with "Overflow when
#: unpacking long" above 2**31 - 1, after the arguments were accepted)
MAX_THREADS = 1024


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer up to {MAX_THREADS}, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlpapers", description="ICML 2026 algorithms as scikit-learn-style estimators."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the registered algorithms")
    p_list.set_defaults(func=cmd_list)
    p_demo = sub.add_parser("demo", help="run algorithm demos on offline data")
    p_demo.add_argument("names", nargs="*", help="algorithms to run (default: all)")
    p_demo.add_argument("--quick", action="store_true",
                        help="smaller runs (about 5-30 s each on 2 CPU cores)")
    # The demos train small models, for which extra intra-op threads mostly add
    # synchronisation cost (and spin badly when other processes share the cores).
    p_demo.add_argument("--threads", type=_positive_int, default=1,
                        help="torch intra-op threads for the demos (default: 1, at most "
                        f"{MAX_THREADS})")
    p_demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
