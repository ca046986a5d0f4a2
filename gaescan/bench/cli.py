"""The ``gaescan`` command: ``gaescan bench``, ``info``, ``warmup``, ``gpu-check``.

This module imports only :mod:`argparse` at import time; each subcommand
imports what it needs when it runs (NumPy for the options, Numba and the
backends for a run, CuPy only for the ``cuda`` column), so ``gaescan --help``
starts quickly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

_BENCH_DESCRIPTION = ("Time the serial loop, the published chunk-scan and gaescan's backends on GAE "
                      "problems; every cell is checked against a float64 reference before it is timed.")

_BENCH_EPILOG = """\
examples:
  gaescan bench                                  quick default set (well under a minute on 2 cores)
  gaescan bench --full                           + the published shapes 256x131072 and 128x65536
  gaescan bench --shapes 256x131072,8x1024 --flags dones --json out.json
  gaescan bench --layout time-major --dtype float32,float64 --backends serial,numba
  gaescan bench --plot bench.png --csv bench.csv

Exit status: 0 if every cell that ran was correct, 1 if any was wrong or raised."""


def _csv_list(choices: Sequence[str] | None = None, extra: Sequence[str] = ()):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if choices is not None:
            bad = [t for t in items if t not in choices and t not in extra]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"invalid choice(s) {', '.join(bad)} (choose from {', '.join([*choices, *extra])})")
        return items

    return parse


def _shapes(text: str):
    from .runner import parse_shapes

    try:
        return parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``gaescan bench`` (also ``python -m gaescan.bench``)."""
    from .runner import DTYPES, FLAGS, LAYOUTS

    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="full", action="store_false",
                      help="the quick default shape set 8x1024, 1024x1024, 64x16384, 16x131072 (the default)")
    size.add_argument("--full", dest="full", action="store_true",
                      help="the published shapes 256x131072 and 128x65536 as well (minutes)")
    p.set_defaults(full=False)
    p.add_argument("--shapes", type=_shapes, metavar="BxT[,BxT...]",
                   help="rows of the table instead of a preset, e.g. 256x131072,8x1024")
    p.add_argument("--dtype", type=_csv_list(DTYPES), default=["float32"], metavar="DTYPE[,...]",
                   help=f"input and output dtype(s): {', '.join(DTYPES)} (default float32)")
    p.add_argument("--backends", "--methods", dest="methods", type=str, default=None, metavar="NAME[,...]",
                   help="columns: serial, chunk64, chunk128, chunk256, numpy, numba, cuda, or the groups "
                        "'baselines' and 'gaescan' (default: all; cuda only when a GPU is present)")
    p.add_argument("--layout", type=_csv_list(LAYOUTS), default=["batch-major"], metavar="LAYOUT[,...]",
                   help="batch-major ([B, T], axis=-1) and/or time-major ([T, B], axis=0)")
    p.add_argument("--flags", type=_csv_list(FLAGS), default=["none", "dones"], metavar="FLAGS[,...]",
                   help="none, dones (p=1e-3), masks (10%% padding), packed (1-D, cu_seqlens, about B "
                        "segments); default none,dones")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per cell; the median is reported (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing (default 1, minimum 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--json", metavar="PATH", help="write every cell (with each run's time) as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one CSV row per cell")
    p.add_argument("--plot", metavar="PATH.png", help="plot time vs T per method, log-log (needs matplotlib)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="progress bar on stderr (tqdm if installed); default: when stderr is a terminal")
    prog.add_argument("--no-progress", dest="progress", action="store_false")


def run_bench(args: argparse.Namespace) -> int:
    """Run ``gaescan bench`` with parsed options; print the table; return the exit status."""
    from . import runner, table

    if args.shapes is not None:
        shapes = args.shapes
    else:
        shapes = list(runner.QUICK_SHAPES) + (list(runner.PUBLISHED_SHAPES) if args.full else [])
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - fail before the run, not after it
        except ImportError:
            print("gaescan bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    methods = None
    if args.methods and args.methods.strip() != "all":
        methods = [t.strip() for t in args.methods.split(",") if t.strip()]
    cfg = runner.Config(shapes=shapes, dtypes=args.dtype, layouts=args.layout, flags=args.flags,
                        methods=methods, repeat=max(args.repeat, 1), warmup=max(args.warmup, 1), seed=args.seed,
                        progress=sys.stderr.isatty() if args.progress is None else args.progress)
    try:
        result = runner.run(cfg)
    except ValueError as exc:  # bad --backends names
        print(f"gaescan bench: {exc}", file=sys.stderr)
        return 2
    print(table.format_table(result), flush=True)
    if args.json:
        table.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.csv:
        table.write_csv(result, args.csv)
        print(f"wrote {args.csv}")
    if args.plot:
        table.plot(result, args.plot)
        print(f"wrote {args.plot}")
    bad = [r for r in result["results"] if r["status"] in ("wrong", "error")]
    return 1 if bad else 0


def run_info(args: argparse.Namespace) -> int:
    """Print ``gaescan info`` (or its JSON with ``--json``)."""
    from . import info

    data = info.collect()
    if args.json:
        import json

        print(json.dumps(data, indent=1))
    else:
        print(info.format_info(data))
    return 0


def run_warmup(args: argparse.Namespace) -> int:
    """Compile every CPU kernel build into Numba's disk cache, with progress
    on stderr (a tqdm bar if tqdm is installed, else a counter line)."""
    import time

    from ..kernels import cpu

    total = sum(1 for _ in cpu.builds())
    bar = None
    if not args.quiet:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="gaescan warmup", unit="kernel", file=sys.stderr)
        except ImportError:
            bar = None

    def progress(done: int, n: int, name: str) -> None:
        if args.quiet:
            return
        if bar is not None:
            bar.set_postfix_str(name, refresh=False)
            bar.update(1)
        else:
            end = "\n" if done == n else ""
            print(f"\rgaescan warmup: {done}/{n} {name:<48s}", end=end, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        n = cpu.compile_all(progress)
    finally:
        if bar is not None:
            bar.close()
    print(f"compiled or loaded {n} kernel builds in {time.perf_counter() - t0:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``gaescan`` argument parser with its subcommands."""
    ap = argparse.ArgumentParser(prog="gaescan", description="gaescan command-line tools")
    sub = ap.add_subparsers(dest="command", metavar="{bench,info,warmup,gpu-check}")
    pb = sub.add_parser("bench", help="time GAE methods on this machine (the published table)",
                        description=_BENCH_DESCRIPTION,
                        epilog=_BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(pb)
    pi = sub.add_parser("info", help="versions, available backends, threads, CUDA device, kernel cache")
    pi.add_argument("--json", action="store_true", help="print JSON")
    pw = sub.add_parser("warmup", help="compile every CPU kernel into Numba's disk cache now "
                                       "(for images that want the cache baked in)")
    pw.add_argument("--quiet", action="store_true", help="no progress output")
    sub.add_parser("gpu-check", add_help=False,
                   help="the CUDA backend's GPU check (python -m gaescan.bench.gpu_check; "
                        "'gaescan gpu-check --help' for its options)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gaescan`` console script and ``python -m gaescan``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "gpu-check":
        # Forwarded untouched: gpu_check parses its own options.
        from . import gpu_check

        return gpu_check.main(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "info":
        return run_info(args)
    if args.command == "warmup":
        return run_warmup(args)
    ap.print_help()
    return 2


def bench_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gaescan.bench`` (the options of ``gaescan bench``)."""
    ap = argparse.ArgumentParser(prog="python -m gaescan.bench", description=_BENCH_DESCRIPTION,
                                 epilog=_BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    return run_bench(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
